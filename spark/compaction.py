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

**Cost follows the batch.** A micro-batch arrives in the ``foreachBatch`` of the streaming query as one
Arrow table (``DataFrame.toArrow``); its Avro records are decoded column-wise (``spark.answer_columns``) and
folded with Arrow/numpy group-bys: no Python object per record.  A new snapshot version rewrites only the
queries the batch touched (their previous rows are read, merged and written again, one Parquet file per
query); every other query's files are hard-linked from the previous version, so a version costs what the
batch touched, not the snapshot's size.  The touched answers are encoded column-wise and produced to
answers.current from the driver, each to the partition of ``answers`` its query's deltas came from (the
partition the answers service writes them to, so a key never lives in two partitions).

:func:`compact_batch` runs the durable steps in the order that keeps a crash at any point harmless (see its
docstring).  The fold runs on the driver: a batch (bounded by ``--max-offsets-per-trigger``) and the rows of
the queries it touches must fit in the driver's memory.
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
from typing import Any, Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from services import codec
from spark.answer_columns import Bindings, canonical_binding, current_answer_columns, decode_answer_values

log = logging.getLogger(__name__)

DELTA_SCHEMA = "query_id string, n long, sign int, binding string, error string, version int"
SNAPSHOT_SCHEMA = "query_id string, binding string, multiplicity long, last_n long"
MANIFEST_NAME = "manifest.json"
MAX_GAP_RANGES = 10
_KEEP_VERSIONS = 2  # the current one and its predecessor, which a slow reader may still be scanning
_FILE_SCHEMA = pa.schema([("binding", pa.string()), ("multiplicity", pa.int64()), ("last_n", pa.int64())])

__all__ = ["DELTA_SCHEMA", "SNAPSHOT_SCHEMA", "CompactionError", "FoldReport", "SnapshotStore", "canonical_binding",
           "binding_terms", "current_key", "decode_answers", "compact_batch", "kafka_publisher", "delta_table"]


class CompactionError(RuntimeError):
    """The snapshot directory is unusable (corrupt manifest, missing version); the message says which."""


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


def fold(batch: DeltaTable, folded_n: Mapping[str, int], versions: Mapping[str, int] | None = None) -> Fold:
    """Fold ``batch`` given the manifest's ``folded_n`` and ``versions``: which deltas are new, the report's
    counts and gaps, and the per-binding sums, all by vectorised group-bys.

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
    sign = t.column("sign").to_numpy().astype(np.int64) if t.num_rows else np.zeros(0, np.int64)
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
    qn, nn, sn, bn = qi[is_new], n[is_new], sign[is_new], bidx[is_new]
    order = np.lexsort((nn, qn))
    qn, nn, sn, bn = qn[order], nn[order], sn[order], bn[order]
    first = np.ones(len(qn), bool)
    first[1:] = (qn[1:] != qn[:-1]) | (nn[1:] != nn[:-1])
    qn, nn, sn, bn = qn[first], nn[first], sn[first], bn[first]
    report.duplicates = new_count - len(qn)
    if len(qn):
        starts = np.flatnonzero(np.r_[True, qn[1:] != qn[:-1]])
        max_n = np.maximum.reduceat(nn, starts)
        unique = np.diff(np.r_[starts, len(qn)])
        for k, s in enumerate(starts):
            q = queries[qn[s]]
            report.folded_n[q] = int(max_n[k])
            missing = int(max_n[k]) - int(base_n[qn[s]]) - int(unique[k])
            if missing:
                report.missing[q] = missing
        if report.missing:  # gaps: consecutive unique n of a query more than 1 apart (the first from base_n)
            prev = np.empty_like(nn)
            prev[1:] = nn[:-1]
            prev[starts] = base_n[qn[starts]]
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


# ---------------------------------------------------------------- snapshot store

# Spark's escaping of partition values in directory names (ExternalCatalogUtils.escapePathName), so that
# Spark reads the files written here with the right query_id, and files Spark wrote are found here.
_ESCAPED = set(map(chr, range(1, 0x20))) | set('"#%\'*/:=?\\\x7f{[]^')
_NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def partition_dir_name(query_id: str) -> str:
    if not query_id:
        return "query_id=" + _NULL_PARTITION
    return "query_id=" + "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in query_id)


def query_of_dir(name: str) -> str | None:
    """The query id of a partition directory name (None: not one)."""
    if not name.startswith("query_id="):
        return None
    value = name[len("query_id="):]
    if value == _NULL_PARTITION:
        return ""
    out, i = [], 0
    while i < len(value):
        code = value[i + 1: i + 3]
        if value[i] == "%" and len(code) == 2 and all(c in "0123456789abcdefABCDEF" for c in code):
            out.append(chr(int(code, 16)))
            i += 3
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def _data_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith(("_", ".")))


class SnapshotStore:
    """Versioned snapshot directories plus an atomically replaced manifest.

    Layout: ``<root>/v000001/query_id=<q>/part-*.parquet`` and ``<root>/manifest.json``.  A version
    directory is complete before the manifest names it, so readers never see a half-written snapshot.
    Files of queries a version did not change are hard links to the previous version's.
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

    def read_table(self) -> pa.Table:
        """The current snapshot as one Arrow table (``SNAPSHOT_SCHEMA``), without Spark."""
        version = int(self.manifest()["version"])
        parts = []
        if version:
            for d in sorted(self.version_dir(version).iterdir()):
                q = query_of_dir(d.name) if d.is_dir() else None
                if q is not None:
                    parts.append(_with_query(_read_query(d), q))
        return pa.concat_tables(parts) if parts else _empty_snapshot()

    def write_fold(self, result: Fold) -> tuple[int, pa.Table, dict[str, list[int]]]:
        """Write the snapshot after ``result`` as the next version directory (not yet current).

        Returns the version, the changed answers (``query_id, binding, bidx, multiplicity, last_n``: the
        touched bindings' new multiplicity, 0 for a binding no longer an answer) and per query ``[rows,
        negative rows]`` of the new version."""
        manifest = self.manifest()
        old = int(manifest["version"])
        version = old + 1
        target = self.version_dir(version)
        shutil.rmtree(target, ignore_errors=True)  # a half-written one from a crash
        target.mkdir(parents=True)
        counts: dict[str, list[int]] = {q: list(c) for q, c in manifest.get("rows", {}).items()}
        touched = set(result.delta_agg.column("query_id").to_pylist()) | set(result.reset)
        old_dirs: dict[str, Path] = {}
        if old:
            source = self.version_dir(old)
            if not source.exists():
                raise CompactionError(f"manifest names {source}, which is missing; the snapshot dir was damaged")
            for d in source.iterdir():
                q = query_of_dir(d.name) if d.is_dir() else None
                if q is not None:
                    old_dirs[q] = d
        for q, d in old_dirs.items():
            if q in touched:
                continue
            (target / d.name).mkdir()
            for f in _data_files(d):
                _link(f, target / d.name / f.name)
            if q not in counts:  # a manifest from before row counts: count once
                mult = _read_query(d).column("multiplicity").to_numpy()
                counts[q] = [len(mult), int((mult < 0).sum())]
        for q in list(counts):
            if q not in old_dirs or q in touched:
                del counts[q]
        reset = set(result.reset)
        olds = [_with_query(_read_query(old_dirs[q]), q) for q in sorted(touched) if q in old_dirs]
        old_rows = pa.concat_tables(olds) if olds else _empty_snapshot()
        ended = old_rows.filter(pc.is_in(old_rows.column("query_id"), pa.array(sorted(reset), pa.string()))) \
            if reset else old_rows.slice(0, 0)
        kept = old_rows.filter(pc.invert(pc.is_in(old_rows.column("query_id"), pa.array(sorted(reset), pa.string())))) \
            if reset else old_rows
        canonical = pa.array(result.bindings.canonical, pa.string())
        agg = result.delta_agg
        fresh = pa.table({
            "query_id": agg.column("query_id"),
            "binding": canonical.take(agg.column("bidx")) if len(canonical) else pa.array([], pa.string()),
            "multiplicity": agg.column("delta"), "last_n": agg.column("delta_n"),
            "bidx": agg.column("bidx"), "touched": pa.array(np.ones(agg.num_rows, np.int8))})
        kept = kept.append_column("bidx", pa.nulls(kept.num_rows, pa.int32())).append_column(
            "touched", pa.array(np.zeros(kept.num_rows, np.int8)))
        merged = pa.concat_tables([kept, fresh]).group_by(["query_id", "binding"], use_threads=False).aggregate(
            [("multiplicity", "sum"), ("last_n", "max"), ("bidx", "max"), ("touched", "max")])
        merged = merged.rename_columns(["query_id", "binding", "multiplicity", "last_n", "bidx", "touched"])
        rows = merged.filter(pc.not_equal(merged.column("multiplicity"), 0))
        rows = rows.sort_by([("query_id", "ascending"), ("binding", "ascending")])
        qcol = rows.column("query_id").to_numpy(zero_copy_only=False)
        mult = rows.column("multiplicity").to_numpy()
        bounds = np.flatnonzero(np.r_[True, qcol[1:] != qcol[:-1], True]) if len(qcol) else np.array([0])
        for a, b in zip(bounds[:-1], bounds[1:]):
            q = qcol[a]
            d = target / partition_dir_name(q)
            d.mkdir()
            pq.write_table(rows.slice(a, b - a).select(["binding", "multiplicity", "last_n"]).cast(_FILE_SCHEMA),
                           d / "part-00000.parquet")
            counts[q] = [int(b - a), int((mult[a:b] < 0).sum())]
        (target / "_SUCCESS").touch()
        changed = merged.filter(pc.equal(merged.column("touched"), 1)).select(
            ["query_id", "binding", "bidx", "multiplicity", "last_n"])
        if ended.num_rows:  # rows of a replaced registration that the new one does not have: tombstones
            gone = ended.join(changed.select(["query_id", "binding"]), ["query_id", "binding"], join_type="left anti")
            changed = pa.concat_tables([changed, pa.table({
                "query_id": gone.column("query_id"), "binding": gone.column("binding"),
                "bidx": pa.nulls(gone.num_rows, pa.int32()),
                "multiplicity": pa.array(np.zeros(gone.num_rows, np.int64)), "last_n": gone.column("last_n")})])
        return version, changed, counts

    def commit(self, version: int, report: FoldReport, counts: Mapping[str, list[int]] | None = None) -> None:
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
        if counts is not None:
            manifest["rows"] = dict(counts)  # query -> [rows, negative rows] of this version
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


def _empty_snapshot() -> pa.Table:
    return pa.table({"query_id": pa.array([], pa.string()), "binding": pa.array([], pa.string()),
                     "multiplicity": pa.array([], pa.int64()), "last_n": pa.array([], pa.int64())})


def _read_query(directory: Path) -> pa.Table:
    files = _data_files(directory)
    tables = [pq.read_table(f, columns=["binding", "multiplicity", "last_n"]).cast(_FILE_SCHEMA) for f in files]
    return pa.concat_tables(tables) if tables else _FILE_SCHEMA.empty_table()


def _with_query(table: pa.Table, query_id: str) -> pa.Table:
    return table.add_column(0, "query_id", pa.array([query_id] * table.num_rows, pa.string()))


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # a file system without hard links
        shutil.copyfile(source, target)


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
    result = fold(batch, store.folded_n(), store.versions())  # 1.
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
