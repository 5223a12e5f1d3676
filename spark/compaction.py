"""Periodic compaction: fold the ``answers`` delta log into current answers.

Every query's answers topic is a log of numbered deltas ``(query_id, n, sign, binding)``; replaying it from
n=1 gives the current answer set.  Compaction keeps that replay short:

- a **snapshot** (Parquet, partitioned by ``query_id``, one directory per version) of rows
  ``(query_id, binding, multiplicity, last_n)``, where ``binding`` is canonical JSON
  ``{"var": "<canonical N-Triples term>", ...}`` with sorted keys, so equal bindings are equal strings;
- a **manifest** (``manifest.json``) naming the current version and, per query, the highest ``n`` folded;
  snapshot + the deltas with ``n`` above that replay to the same answers as the whole log;
- the compacted **answers.current** topic: key = canonical JSON ``["<query_id>", {binding}]``, value = an Avro
  ``CurrentAnswer``, or a tombstone (null value) when the multiplicity drops to 0.

Deltas arrive at least once, so duplicates by ``(query_id, n)`` are dropped, and so are deltas at or below
the manifest's ``n`` (already folded).  Missing numbers are reported as gaps, never waited for.

The fold itself (:func:`fold`) is plain DataFrame code with no Kafka in it; :func:`compact_batch` adds
the durable steps in the order that keeps a crash at any point harmless (see its docstring).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pandas as pd
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from services import codec

log = logging.getLogger(__name__)

DELTA_SCHEMA = "query_id string, n long, sign int, binding string, error string, version int"
SNAPSHOT_SCHEMA = "query_id string, binding string, multiplicity long, last_n long"
MANIFEST_NAME = "manifest.json"
MAX_GAP_RANGES = 10
_KEEP_VERSIONS = 2  # the current one and its predecessor, which a slow reader may still be scanning


class CompactionError(RuntimeError):
    """The snapshot directory is unusable (corrupt manifest, missing version); the message says which."""


# ---------------------------------------------------------------- bindings and records


def canonical_binding(binding: Mapping[str, Mapping[str, Any] | None]) -> str:
    """Canonical JSON of an Avro binding ``{var: SparqlTerm{type, value, datatype, lang}}``.

    Terms become their canonical N-Triples strings (``cbgp.terms``), which is RDF term identity: two
    bindings are the same solution mapping exactly when their canonical JSON strings are equal.
    Unbound variables (null terms) are left out, as in SPARQL results.
    """
    return codec.canonical_binding({var: codec.term_from_avro(term) for var, term in binding.items()
                                    if term is not None})


def binding_terms(binding_json: str) -> dict[str, dict[str, Any]]:
    """Inverse of :func:`canonical_binding`: canonical JSON -> Avro ``{var: SparqlTerm}``."""
    return {var: codec.term_to_avro(term) for var, term in json.loads(binding_json).items()}


current_key = codec.current_key  # the answers service writes the same keys


def decode_answers(kafka_df: DataFrame) -> DataFrame:
    """Kafka rows (``value`` = Avro ``Answer``) -> delta rows ``DELTA_SCHEMA``.

    Undecodable records are kept with ``error`` set, so the fold can report them instead of dropping
    them silently; null values (tombstones) are skipped, they carry no delta.
    """

    def decode(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from services.codec import decode as avro_decode

        for pdf in batches:
            rows = []
            for value, partition, offset in zip(pdf["value"], pdf["partition"], pdf["offset"]):
                if value is None:
                    continue
                try:
                    rec = avro_decode("Answer", bytes(value))
                    sign = {"+": 1, "-": -1}[rec["sign"]]
                    rows.append((rec["query_id"], int(rec["n"]), sign, canonical_binding(rec["binding"]), None,
                                 int(rec["version"])))
                except Exception as exc:  # noqa: BLE001 - reported per record, never stops the job
                    rows.append((None, None, None, None, f"partition {partition} offset {offset}: {exc!r}"[:500],
                                 None))
            yield pd.DataFrame(rows, columns=["query_id", "n", "sign", "binding", "error", "version"])

    return kafka_df.select("value", "partition", "offset").mapInPandas(decode, DELTA_SCHEMA)


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
    negative: int = 0  # bindings whose multiplicity went below 0: a "-" for an absent answer
    folded_n: dict[str, int] = field(default_factory=dict)  # query -> highest n after this fold
    # query -> the registration version folded (n counts within it); a newer version replaces the query's rows
    versions: dict[str, int] = field(default_factory=dict)
    stale: int = 0  # deltas of an older version than the query's folded one (ended streams)
    changed: int = 0  # bindings touched = answers.current records published (tombstones included)
    snapshot_rows: int = 0
    seconds: float = 0.0


@dataclass
class FoldResult:
    snapshot: DataFrame  # SNAPSHOT_SCHEMA, multiplicity != 0
    touched: DataFrame  # (query_id, binding, delta_n): bindings this fold changed, for answers.current
    report: FoldReport


def fold(spark: SparkSession, deltas: DataFrame, snapshot: DataFrame | None, folded_n: Mapping[str, int],
         versions: Mapping[str, int] | None = None) -> FoldResult:
    """Fold ``deltas`` (``DELTA_SCHEMA``) onto ``snapshot`` given the manifest's ``folded_n`` and ``versions``.

    Registration versions: each query's stream is that of its latest version (the manifest's, or a newer one
    in ``deltas``); deltas of older versions are dropped (``stale``).  A newer version than the manifest's
    starts over: the query's snapshot rows are dropped (touched, so they are tombstoned) and n counts from 0.
    Version 0 (written before versions) belongs to the query's version.

    Multiplicity is the sum of signs, so a fold is associative: folding a log in pieces equals folding it
    at once, which is what makes snapshot + later deltas replay exactly like the whole log.

    Runs one Spark job for the report (two when there are gaps, three with undecodable records); the
    returned DataFrames are lazy.  ``deltas`` should be materialised by the caller: it is scanned again.
    """
    versions = dict(versions or {})
    if "version" not in deltas.columns:
        deltas = deltas.withColumn("version", F.lit(0))
    manifest_df = spark.createDataFrame([(q, int(n), int(versions.get(q, 0))) for q, n in folded_n.items()],
                                        "query_id string, folded_n long, folded_version int")
    seen = deltas.where("error is null").groupBy("query_id").agg(
        F.max("version").alias("hi"), F.min(F.when(F.col("version") != 0, F.col("version"))).alias("lo")).collect()
    targets = {r["query_id"]: max(int(r["hi"]), versions.get(r["query_id"], 0)) for r in seen}
    # Queries whose stream restarts here: a version newer than a versioned fold, or two versions in this batch
    # (0 -> v alone adopts: answers written before versions carry on in the first versioned stream).
    reset = sorted(r["query_id"] for r in seen if targets[r["query_id"]] > versions.get(r["query_id"], 0) and (
        versions.get(r["query_id"], 0) or r["lo"] is not None and int(r["lo"]) < targets[r["query_id"]]))
    targets_df = spark.createDataFrame(list(targets.items()) or [], "query_id string, target int")
    fresh = (
        deltas.join(F.broadcast(manifest_df), "query_id", "left")
        .join(F.broadcast(targets_df), "query_id", "left")
        .withColumn("folded_n", F.when(F.col("query_id").isin(reset), F.lit(0))
                    .otherwise(F.coalesce("folded_n", F.lit(0))))
        .withColumn("stale", F.col("error").isNull() & (F.col("version") != 0)
                    & (F.col("version") < F.col("target")))
        .withColumn("is_new", F.col("error").isNull() & ~F.col("stale") & (F.col("n") > F.col("folded_n")))
    )
    new_n = F.when(F.col("is_new"), F.col("n"))
    # One pass for every count the report needs; undecodable records form the query_id-null group.
    stats = fresh.groupBy("query_id").agg(
        F.count("*").alias("total"),
        F.count("error").alias("bad"),
        F.count(new_n).alias("new"),
        F.count_distinct(new_n).alias("unique"),
        F.max(new_n).alias("max_n"),
        F.min("folded_n").alias("folded_n"),
        F.count_distinct(F.when(F.col("is_new"), F.col("binding"))).alias("touched"),
        F.count(F.when(F.col("stale"), 1)).alias("stale"),
    ).collect()
    report = FoldReport(folded_n={q: int(n) for q, n in folded_n.items() if q not in reset},
                        versions={**versions, **targets})
    for r in stats:
        total, bad, new, unique = int(r["total"]), int(r["bad"]), int(r["new"]), int(r["unique"])
        stale = int(r["stale"])
        report.deltas_in += total
        report.undecodable += bad
        report.stale += stale
        report.already_folded += total - bad - new - stale
        report.duplicates += new - unique
        report.changed += int(r["touched"])
        if r["max_n"] is not None:
            report.folded_n[r["query_id"]] = int(r["max_n"])
            missing = int(r["max_n"]) - int(r["folded_n"]) - unique
            if missing:
                report.missing[r["query_id"]] = missing
    unique_new = fresh.where("is_new").drop("error").dropDuplicates(["query_id", "n"])
    if report.missing:  # only then is the per-query ordering pass worth running
        w = Window.partitionBy("query_id").orderBy("n")
        gap_rows = (
            unique_new.select("query_id", "n", "folded_n")
            .withColumn("prev", F.coalesce(F.lag("n").over(w), F.col("folded_n")))
            .where(F.col("n") - F.col("prev") > 1)
            .select("query_id", (F.col("prev") + 1).alias("first"), (F.col("n") - 1).alias("last"))
            .withColumn("rank", F.row_number().over(Window.partitionBy("query_id").orderBy("first")))
            .where(F.col("rank") <= MAX_GAP_RANGES)
        )
        for r in gap_rows.orderBy("query_id", "first").collect():
            report.gaps.setdefault(r["query_id"], []).append([int(r["first"]), int(r["last"])])
    if report.undecodable:
        report.errors = [r["error"] for r in deltas.where("error is not null").limit(5).collect()]

    delta_agg = unique_new.groupBy("query_id", "binding").agg(
        F.sum("sign").cast("long").alias("delta"), F.max("n").alias("delta_n")
    )
    old = snapshot if snapshot is not None else spark.createDataFrame([], SNAPSHOT_SCHEMA)
    ended = old.where(F.col("query_id").isin(reset))  # rows of a replaced registration: tombstoned
    old = old.where(~F.col("query_id").isin(reset))
    merged = old.join(delta_agg, ["query_id", "binding"], "full_outer").select(
        "query_id",
        "binding",
        (F.coalesce("multiplicity", F.lit(0)) + F.coalesce("delta", F.lit(0))).alias("multiplicity"),
        F.greatest(F.coalesce("last_n", F.lit(0)), F.coalesce("delta_n", F.lit(0))).alias("last_n"),
    )
    touched = delta_agg.select("query_id", "binding", "delta_n").unionByName(
        ended.select("query_id", "binding", F.col("last_n").alias("delta_n"))).dropDuplicates(["query_id", "binding"])
    report.changed += ended.count() if reset else 0
    return FoldResult(merged.where("multiplicity != 0"), touched, report)


# ---------------------------------------------------------------- snapshot store


class SnapshotStore:
    """Versioned snapshot directories plus an atomically replaced manifest.

    Layout: ``<root>/v000001/query_id=<q>/part-*.parquet`` and ``<root>/manifest.json``.  A version
    directory is complete before the manifest names it, so readers never see a half-written snapshot.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def manifest(self) -> dict[str, Any]:
        path = self.root / MANIFEST_NAME
        if not path.exists():
            return {"version": 0, "queries": {}, "gaps": {}, "missing": {}}
        try:
            return json.loads(path.read_text())
        except ValueError as exc:
            raise CompactionError(f"{path} is not valid JSON ({exc}); restore it or delete the snapshot dir") from exc

    def folded_n(self) -> dict[str, int]:
        return {q: int(n) for q, n in self.manifest()["queries"].items()}

    def versions(self) -> dict[str, int]:
        """Query -> the registration version its folded n belongs to (absent: 0, before versions)."""
        return {q: int(v) for q, v in self.manifest().get("versions", {}).items()}

    def version_dir(self, version: int) -> Path:
        return self.root / f"v{version:06d}"

    def read(self, spark: SparkSession) -> DataFrame | None:
        version = int(self.manifest()["version"])
        if version == 0:
            return None
        path = self.version_dir(version)
        if not path.exists():
            raise CompactionError(f"manifest names {path}, which is missing; the snapshot dir was damaged")
        # An explicit schema keeps query_id a string (partition inference would turn "1" into an int).
        return spark.read.schema(SNAPSHOT_SCHEMA).parquet(str(path))

    def write_version(self, snapshot: DataFrame) -> int:
        """Write ``snapshot`` as the next version directory (not yet current); return its number."""
        version = int(self.manifest()["version"]) + 1
        snapshot.write.mode("overwrite").partitionBy("query_id").parquet(str(self.version_dir(version)))
        return version

    def commit(self, version: int, report: FoldReport) -> None:
        """Make ``version`` current (atomic rename), then delete versions no reader needs any more."""
        old = self.manifest()
        gaps = {q: list(g) for q, g in old.get("gaps", {}).items()}
        for q, g in report.gaps.items():
            gaps[q] = (gaps.get(q, []) + g)[-MAX_GAP_RANGES:]  # the most recent ones: what an operator chases
        missing = dict(old.get("missing", {}))
        for q, count in report.missing.items():
            missing[q] = missing.get(q, 0) + count
        manifest = {"version": version, "queries": report.folded_n, "gaps": gaps, "missing": missing,
                    "versions": {**old.get("versions", {}), **report.versions},
                    "updated_at_ms": int(time.time() * 1000)}
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".manifest-")
        with os.fdopen(fd, "w") as fh:
            json.dump(manifest, fh, sort_keys=True, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.root / MANIFEST_NAME)
        for path in self.root.glob("v[0-9]*"):
            if int(path.name[1:]) <= version - _KEEP_VERSIONS:
                shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- answers.current records


def current_answer_records(changed: DataFrame) -> DataFrame:
    """``changed`` rows -> ``(key binary, value binary)`` for answers.current.

    A binding that is no longer an answer (multiplicity 0, or below 0 after a contract violation that the
    fold reports) gets a tombstone: CurrentAnswer promises multiplicity >= 1.
    """

    def encode(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from services.codec import encode_current_answer

        for pdf in batches:
            keys, values = [], []
            versions = pdf["version"].tolist() if "version" in pdf else [0] * len(pdf)
            for q, b, m, n, v in zip(pdf["query_id"].tolist(), pdf["binding"].tolist(), pdf["multiplicity"].tolist(),
                                     pdf["last_n"].tolist(), versions):
                keys.append(current_key(q, b))
                # the canonical binding JSON maps each variable to its canonical term: what the fast
                # encoder takes (the same bytes as encode("CurrentAnswer", ...) with binding_terms(b))
                values.append(None if m <= 0 else encode_current_answer(
                    q, json.loads(b), int(m), int(n), int(v) if v == v and v is not None else 0))
            yield pd.DataFrame({"key": keys, "value": values})

    return changed.mapInPandas(encode, "key binary, value binary")


Publisher = Callable[[DataFrame], None]


def kafka_publisher(kafka_options: Mapping[str, str], topic: str) -> Publisher:
    """A publisher writing ``changed`` rows to ``topic`` through the cbgpkafka sink."""

    def publish(changed: DataFrame) -> None:
        writer = current_answer_records(changed).write.format("cbgpkafka").mode("append").option("topic", topic)
        writer.options(**dict(kafka_options)).save()

    return publish


def compact_batch(spark: SparkSession, deltas: DataFrame, store: SnapshotStore, publish: Publisher | None) -> FoldReport:
    """Fold ``deltas`` into ``store`` and publish the changed answers, crash-safe at every step.

    The order is the design (a crash between any two steps leaves a state the rerun repairs):

    1. fold against the *current* manifest -- deltas it already covers are dropped, so a rerun of a
       batch whose manifest was committed folds nothing twice;
    2. write the new snapshot as a new version directory -- invisible until step 4;
    3. publish the touched answers to answers.current and wait for every ack -- a crash after this
       republishes the same key/value pairs on rerun, which compaction of the topic makes harmless;
    4. swap the manifest -- the fold is now durable; only then may the caller commit input offsets.
    """
    started = time.monotonic()
    # Materialise the input once: the fold runs several actions, and a Kafka-backed DataFrame would
    # otherwise be read from the broker again for each of them.
    deltas = deltas.localCheckpoint(eager=True)
    folded_n = store.folded_n()  # 1.
    result = fold(spark, deltas, store.read(spark), folded_n, store.versions())
    report = result.report
    if report.changed == 0:  # nothing new (empty batch, stale or undecodable only): keep the current version
        return _logged(report, started)
    version = store.write_version(result.snapshot)  # 2.
    written = spark.read.schema(SNAPSHOT_SCHEMA).parquet(str(store.version_dir(version)))
    sizes = written.agg(F.count("*").alias("rows"), F.count(F.when(F.col("multiplicity") < 0, 1)).alias("neg")).first()
    report.snapshot_rows, report.negative = int(sizes["rows"]), int(sizes["neg"])
    if publish is not None:  # 3.
        # Touched bindings with their new multiplicity; absent from the snapshot = now 0 = tombstone.
        versions_df = spark.createDataFrame(list(report.versions.items()), "query_id string, version int")
        changed = result.touched.join(written, ["query_id", "binding"], "left").join(
            F.broadcast(versions_df), "query_id", "left").select(
            "query_id", "binding", F.coalesce("multiplicity", F.lit(0)).alias("multiplicity"),
            F.coalesce("last_n", "delta_n").alias("last_n"), F.coalesce("version", F.lit(0)).alias("version"),
        )
        publish(changed)
    store.commit(version, report)  # 4.
    return _logged(report, started)


def _logged(report: FoldReport, started: float) -> FoldReport:
    report.seconds = round(time.monotonic() - started, 3)
    if report.missing or report.undecodable or report.negative:
        anomalies = {k: v for k, v in asdict(report).items() if k in ("missing", "undecodable", "errors", "negative")}
        anomalies["gaps"] = dict(list(report.gaps.items())[:MAX_GAP_RANGES])  # a sample; counts are in missing
        log.warning("compaction anomalies: %s", json.dumps(anomalies))
    log.info("compaction: %s", json.dumps({k: v for k, v in asdict(report).items()
                                           if k not in ("folded_n", "gaps", "missing", "errors")}))
    return report
