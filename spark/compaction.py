"""Periodic compaction: fold the ``answers`` delta log into current answers.

How it works: docs/design/internals.md, spark.compaction.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from services import codec
from spark.answer_columns import Bindings, current_answer_columns, decode_answer_values
from spark.snapshot_store import MAX_GAP_RANGES, SnapshotStore

log = logging.getLogger(__name__)

DELTA_SCHEMA = "query_id string, n long, sign int, binding string, error string, version int"

__all__ = ["DELTA_SCHEMA", "FoldReport", "SnapshotStore",
           "binding_terms", "current_key", "decode_answers", "compact_batch", "kafka_publisher", "delta_table"]


def binding_terms(binding_json: str) -> dict[str, dict[str, Any]]:
    """Inverse of :func:`canonical_binding`: canonical JSON -> Avro ``{var: SparqlTerm}``."""
    return {var: codec.term_to_avro(term) for var, term in json.loads(binding_json).items()}


current_key = codec.current_key  # the answers service writes the same keys


# ---------------------------------------------------------------- input: a batch as decoded columns


@dataclass
class DeltaTable:
    """A batch of deltas: ``table`` (``query_id, n, sign, version, bidx, partition, error``) and the
    distinct bindings ``bidx`` points into."""

    table: pa.Table
    bindings: Bindings


def delta_table(deltas: DataFrame | pa.Table) -> DeltaTable:
    """A batch as decoded columns, from raw Kafka rows (a ``value`` column of Avro ``Answer`` records, as the
    cbgpkafka source gives them) or from decoded rows (``DELTA_SCHEMA``; ``version`` optional)."""
    if isinstance(deltas, DataFrame) and "value" in deltas.columns:
        deltas = deltas.select("value", "partition", "offset")  # the other Kafka columns are not needed
    table = deltas if isinstance(deltas, pa.Table) else deltas.toArrow()
    if "value" in table.column_names:
        decoded, bindings = decode_answer_values(
            table.column("value"), table.column("partition") if "partition" in table.column_names else None,
            table.column("offset") if "offset" in table.column_names else None)
        return DeltaTable(decoded, bindings)
    n = table.num_rows
    bindings = Bindings()
    binding = table.column("binding").combine_chunks() if n else pa.array([], pa.string())
    encoded = pc.dictionary_encode(binding)
    index = np.array([-1 if b is None else bindings.add(b, None) for b in encoded.dictionary.to_pylist()], np.int64)
    codes = pc.fill_null(encoded.indices, len(index)).to_numpy(zero_copy_only=False)  # null binding: error rows
    bidx = np.r_[index, -1][codes]
    error = table.column("error") if "error" in table.column_names else pa.nulls(n, pa.string())
    version = table.column("version").cast(pa.int32()) if "version" in table.column_names else pa.array(
        np.zeros(n, np.int32))
    return DeltaTable(pa.table({
        "query_id": table.column("query_id"), "n": table.column("n").cast(pa.int64()),
        "sign": table.column("sign").cast(pa.int8()), "version": pc.fill_null(version, 0),
        "bidx": pa.array(bidx.astype(np.int32), pa.int32(), mask=bidx < 0),
        "partition": table.column("partition").cast(pa.int32()) if "partition" in table.column_names
        else pa.nulls(n, pa.int32()),
        "error": error,
    }), bindings)


def decode_answers(kafka_df: DataFrame) -> DataFrame:
    """Kafka rows (``value`` = Avro ``Answer``) -> rows ``DELTA_SCHEMA`` plus ``partition``, decoded column-wise
    in the executors.  Undecodable records are kept with ``error`` set; null values (tombstones) are skipped."""
    from spark.answer_columns import decode_answer_values as decode

    def run(batches):  # noqa: ANN001, ANN202 - Arrow record batches in and out
        for batch in batches:
            table, bindings = decode(batch.column("value"), batch.column("partition"), batch.column("offset"))
            canonical = pa.array(bindings.canonical, pa.string())
            bidx = table.column("bidx")
            yield from pa.table({
                "query_id": table.column("query_id"), "n": table.column("n"),
                "sign": table.column("sign").cast(pa.int32()),
                "binding": canonical.take(bidx) if len(canonical) else pa.nulls(table.num_rows, pa.string()),
                "error": table.column("error"), "version": table.column("version"),
                "partition": table.column("partition")}).combine_chunks().to_batches()

    return kafka_df.select("value", "partition", "offset").mapInArrow(run, DELTA_SCHEMA + ", partition int")


# ---------------------------------------------------------------- the fold


@dataclass
class FoldReport:
    """What one compaction saw besides the answers: the things an operator must know about."""

    deltas_in: int = 0
    duplicates: int = 0  # same (query_id, n) seen again: at-least-once delivery
    already_folded: int = 0  # n at or below the manifest's n for its query
    undecodable: int = 0
    errors: list[str] = field(default_factory=list)  # first few undecodable records
    # query -> [[first_missing, last_missing], ...]: the first MAX_GAP_RANGES ranges of this fold, and
    # query -> how many numbers are missing in all (a broken producer must not bloat logs or the manifest).
    gaps: dict[str, list[list[int]]] = field(default_factory=dict)
    missing: dict[str, int] = field(default_factory=dict)
    # Queries whose folded n is only a lower bound (a snapshot seeded from answers.current, spark.compaction_seed):
    # their first new delta is not checked for a gap; those left after this fold.
    lower_bound: list[str] = field(default_factory=list)
    negative: int = 0  # bindings whose multiplicity went below 0: a "-" for an absent answer
    folded_n: dict[str, int] = field(default_factory=dict)  # query -> highest n after this fold
    # query -> the registration version folded (n counts within it); a newer version replaces the query's rows
    versions: dict[str, int] = field(default_factory=dict)
    stale: int = 0  # deltas of an older version than the query's folded one (ended streams)
    changed: int = 0  # bindings touched = answers.current records published (tombstones included)
    snapshot_rows: int = 0
    seconds: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)  # seconds per step: read, fold, write, publish, commit


@dataclass
class Fold:
    """What a batch changes: per (query, binding) the summed sign and the highest n (``delta_agg``: columns
    ``query_id, bidx, delta, delta_n``), the queries whose registration restarts (``reset``), each query's
    ``answers`` partition, and the report so far."""

    report: FoldReport
    delta_agg: pa.Table
    reset: list[str]
    partitions: dict[str, int]
    bindings: Bindings


def fold(batch: DeltaTable, folded_n: Mapping[str, int], versions: Mapping[str, int] | None = None,
         lower_bound: Iterable[str] = ()) -> Fold:
    """Fold ``batch`` given the manifest's ``folded_n`` and ``versions``: which deltas are new, the report's
    counts and gaps, and the per-binding sums, all by vectorised group-bys.  ``lower_bound``: queries whose
    ``folded_n`` may be below the n they really reached (a seeded snapshot): their first new delta counts as
    the next one, not as a gap after ``folded_n``.

    Registration versions: each query's stream is that of its latest version (the manifest's, or a newer one
    in the batch); deltas of older versions are dropped (``stale``).  A newer version than the manifest's
    starts over: the query's snapshot rows are dropped (touched, so they are tombstoned) and n counts from 0.
    Version 0 (written before versions) belongs to the query's version.

    Multiplicity is the sum of signs, so a fold is associative: folding a log in pieces equals folding it
    at once, which is what makes snapshot + later deltas replay exactly like the whole log."""
    versions = dict(versions or {})
    t = batch.table
    report = FoldReport(deltas_in=t.num_rows)
    bad = pc.is_valid(t.column("error")).to_numpy(zero_copy_only=False) if t.num_rows else np.zeros(0, bool)
    report.undecodable = int(bad.sum())
    if report.undecodable:
        report.errors = [e for e in pc.filter(t.column("error"), pa.array(bad)).to_pylist()[:5]]
        t = t.filter(pa.array(~bad))
    qcodes = pc.dictionary_encode(t.column("query_id").combine_chunks()) if t.num_rows else None
    queries: list[str] = qcodes.dictionary.to_pylist() if qcodes is not None else []
    qi = qcodes.indices.to_numpy(zero_copy_only=False).astype(np.int64) if qcodes is not None else np.zeros(0, np.int64)
    nq = len(queries)
    version = t.column("version").to_numpy().astype(np.int64) if t.num_rows else np.zeros(0, np.int64)
    n = t.column("n").to_numpy().astype(np.int64) if t.num_rows else np.zeros(0, np.int64)
    diff = t.column("sign").to_numpy().astype(np.int64) if t.num_rows else np.zeros(0, np.int64)
    bidx = t.column("bidx").to_numpy().astype(np.int64) if t.num_rows else np.zeros(0, np.int64)
    hi = np.full(nq, np.iinfo(np.int64).min)
    np.maximum.at(hi, qi, version)
    lo = np.full(nq, np.iinfo(np.int64).max)
    nonzero = version != 0
    np.minimum.at(lo, qi[nonzero], version[nonzero])
    manifest_version = np.array([versions.get(q, 0) for q in queries], np.int64)
    target = np.maximum(hi, manifest_version)
    # Queries whose stream restarts here: a version newer than a versioned fold, or two versions in this batch
    # (0 -> v alone adopts: answers written before versions carry on in the first versioned stream).
    restart = (target > manifest_version) & ((manifest_version != 0) | ((lo != np.iinfo(np.int64).max) & (lo < target)))
    reset = sorted(q for q, r in zip(queries, restart) if r)
    base_n = np.array([0 if r else folded_n.get(q, 0) for q, r in zip(queries, restart)], np.int64)
    report.folded_n = {q: int(v) for q, v in folded_n.items() if q not in set(reset)}
    report.versions = {**versions, **{q: int(v) for q, v in zip(queries, target)}}
    stale = nonzero & (version < target[qi])
    is_new = ~stale & (n > base_n[qi])
    report.stale = int(stale.sum())
    new_count = int(is_new.sum())
    report.already_folded = t.num_rows - new_count - report.stale
    # Unique (query, n) among the new deltas, sorted by query then n.
    qn, nn, sn, bn = qi[is_new], n[is_new], diff[is_new], bidx[is_new]
    order = np.lexsort((nn, qn))
    qn, nn, sn, bn = qn[order], nn[order], sn[order], bn[order]
    first = np.ones(len(qn), bool)
    first[1:] = (qn[1:] != qn[:-1]) | (nn[1:] != nn[:-1])
    qn, nn, sn, bn = qn[first], nn[first], sn[first], bn[first]
    report.duplicates = new_count - len(qn)
    loose = set(lower_bound) - set(reset)
    report.lower_bound = sorted(loose - {queries[q] for q in np.unique(qn)})
    if len(qn):
        starts = np.flatnonzero(np.r_[True, qn[1:] != qn[:-1]])
        # where each query's numbers go on from: its folded n, or just below its first new one when that is a
        # lower bound
        first_base = np.array([nn[s] - 1 if queries[qn[s]] in loose else base_n[qn[s]] for s in starts], np.int64)
        max_n = np.maximum.reduceat(nn, starts)
        unique = np.diff(np.r_[starts, len(qn)])
        for k, s in enumerate(starts):
            q = queries[qn[s]]
            report.folded_n[q] = int(max_n[k])
            missing = int(max_n[k]) - int(first_base[k]) - int(unique[k])
            if missing:
                report.missing[q] = missing
        if report.missing:  # gaps: consecutive unique n of a query more than 1 apart (the first from base_n)
            prev = np.empty_like(nn)
            prev[1:] = nn[:-1]
            prev[starts] = first_base
            gap = nn - prev > 1
            for i in np.flatnonzero(gap):
                ranges = report.gaps.setdefault(queries[qn[i]], [])
                if len(ranges) < MAX_GAP_RANGES:
                    ranges.append([int(prev[i]) + 1, int(nn[i]) - 1])
    # Per (query, binding): the summed sign and the highest n.
    key = qn * (len(batch.bindings.canonical) + 1) + bn
    keys, inverse = np.unique(key, return_inverse=True)
    delta = np.zeros(len(keys), np.int64)
    np.add.at(delta, inverse, sn)
    delta_n = np.zeros(len(keys), np.int64)
    np.maximum.at(delta_n, inverse, nn)
    kq = keys // (len(batch.bindings.canonical) + 1)
    kb = keys % (len(batch.bindings.canonical) + 1)
    report.changed = len(keys)
    partitions: dict[str, int] = {}
    if t.num_rows and t.column("partition").null_count < t.num_rows:
        highest = np.full(nq, -1, np.int64)
        np.maximum.at(highest, qi, pc.fill_null(t.column("partition"), -1).to_numpy().astype(np.int64))
        partitions = {q: int(p) for q, p in zip(queries, highest) if p >= 0}
    delta_agg = pa.table({
        "query_id": pa.array(queries, pa.string()).take(pa.array(kq)) if nq else pa.array([], pa.string()),
        "bidx": pa.array(kb.astype(np.int32)), "delta": pa.array(delta), "delta_n": pa.array(delta_n)})
    return Fold(report, delta_agg, reset, partitions, batch.bindings)


# ---------------------------------------------------------------- answers.current records


Publisher = Callable[[pa.Table, Bindings], None]


def kafka_publisher(kafka_options: Mapping[str, str], topic: str) -> Publisher:
    """A publisher producing ``changed`` rows (``query_id, binding, bidx, multiplicity, last_n, version,
    partition``) to ``topic`` from the driver, waiting for every acknowledgement (raises otherwise)."""
    from spark.kafka_io import KafkaSourceError, client_config, reused_producer

    # One producer kept across batches (reused_producer: a new one costs 0.5-1 s before its first ack).  lz4 as the
    # fleet's producers; delivery reports for failures only (flush() waits for every message either way).
    config = client_config(kafka_options, **{
        "enable.idempotence": True, "acks": "all", "linger.ms": 20, "compression.type": "lz4",
        "queue.buffering.max.messages": 1_000_000, "delivery.report.only.error": True})

    def publish(changed: pa.Table, bindings: Bindings) -> None:
        keys, values = current_answer_columns(changed, bindings.avro)
        parts = changed.column("partition").to_pylist() if "partition" in changed.column_names else [None] * len(keys)
        errors: list[str] = []

        def on_delivery(err: Any, _msg: Any) -> None:
            errors.append(str(err))

        with reused_producer(config) as p:
            sent = 0
            produce = p.produce
            for key, value, partition in zip(keys.to_pylist(), values.to_pylist(), parts):
                while True:
                    try:
                        if partition is None:
                            produce(topic, value, key, on_delivery=on_delivery)
                        else:
                            produce(topic, value, key, partition=partition, on_delivery=on_delivery)
                        break
                    except BufferError:
                        p.poll(0.1)
                sent += 1
            remaining = p.flush(float(kafka_options.get("flushTimeoutS", "60")))
            if errors or remaining:
                raise KafkaSourceError(f"Kafka write failed: {sent - remaining - len(errors)}/{sent} acknowledged, "
                                       f"{remaining} undelivered, errors: {errors[:3]}")

    return publish


def compact_batch(spark: SparkSession | None, deltas: DataFrame | pa.Table, store: SnapshotStore,
                  publish: Publisher | None) -> FoldReport:
    """Fold ``deltas`` into ``store`` and publish the changed answers, crash-safe at every step.

    ``deltas``: raw Kafka rows (Avro ``Answer`` values) or decoded rows (``DELTA_SCHEMA``), a DataFrame or an
    Arrow table.  The order is the design (a crash between any two steps leaves a state the rerun repairs):

    1. fold against the *current* manifest -- deltas it already covers are dropped, so a rerun of a
       batch whose manifest was committed folds nothing twice;
    2. write the new snapshot as a new version directory -- invisible until step 4;
    3. publish the touched answers to answers.current and wait for every ack -- a crash after this
       republishes the same key/value pairs on rerun, which compaction of the topic makes harmless;
    4. swap the manifest -- the fold is now durable; only then may the caller commit input offsets.
    """
    started = mark = time.monotonic()
    stages: dict[str, float] = {}

    def lap(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        stages[name] = round(now - mark, 3)
        mark = now

    batch = delta_table(deltas)
    lap("read")
    result = fold(batch, store.folded_n(), store.versions(), store.lower_bound())  # 1.
    report = result.report
    report.stages = stages
    lap("fold")
    if report.changed == 0:  # nothing new (empty batch, stale or undecodable only): keep the current version
        return _logged(report, started)
    version, changed, counts = store.write_fold(result)  # 2.
    report.changed = changed.num_rows
    report.snapshot_rows = sum(c[0] for c in counts.values())
    report.negative = sum(c[1] for c in counts.values())
    lap("write")
    if publish is not None:  # 3.
        queries = changed.column("query_id")
        names = sorted(set(queries.to_pylist()))
        lookup = pa.array(names, pa.string())
        where = pc.index_in(queries, value_set=lookup)
        versions = pa.array([report.versions.get(q, 0) for q in names], pa.int32())
        partitions = pa.array([result.partitions.get(q) for q in names], pa.int32())
        changed = changed.append_column("version", versions.take(where)).append_column(
            "partition", partitions.take(where))
        publish(changed, result.bindings)
        lap("publish")
    store.commit(version, report, counts)  # 4.
    lap("commit")
    return _logged(report, started)


def _logged(report: FoldReport, started: float) -> FoldReport:
    report.seconds = round(time.monotonic() - started, 3)
    if report.missing or report.undecodable or report.negative:
        anomalies = {k: v for k, v in asdict(report).items() if k in ("missing", "undecodable", "errors", "negative")}
        anomalies["gaps"] = dict(list(report.gaps.items())[:MAX_GAP_RANGES])  # a sample; counts are in missing
        log.warning("compaction anomalies: %s", json.dumps(anomalies))
    log.info("compaction: %s", json.dumps({k: v for k, v in asdict(report).items()
                                           if k not in ("folded_n", "versions", "gaps", "missing", "errors")}))
    return report
