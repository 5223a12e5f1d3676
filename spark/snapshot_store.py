"""The snapshot store of compaction (``spark.compaction``): versioned Parquet directories of current answers
plus an atomically replaced manifest, and its seeding from ``answers.current`` (``spark.compaction_seed``).

Layout: ``<root>/v000001/query_id=<q>/part-*.parquet`` and ``<root>/manifest.json``.  The manifest names the
current version and, per query, the highest ``n`` folded (``queries``) and the registration version it counts
within (``versions``), the gaps seen, the row counts, and, for a snapshot seeded from ``answers.current``, the
cut it was seeded at (``seeded``) and the queries whose folded ``n`` is only a lower bound (``lower_bound``).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

SNAPSHOT_SCHEMA = "query_id string, binding string, multiplicity long, last_n long"
MANIFEST_NAME = "manifest.json"
MAX_GAP_RANGES = 10
_KEEP_VERSIONS = 2  # the current one and its predecessor, which a slow reader may still be scanning
_FILE_SCHEMA = pa.schema([("binding", pa.string()), ("multiplicity", pa.int64()), ("last_n", pa.int64())])

__all__ = ["SNAPSHOT_SCHEMA", "MANIFEST_NAME", "MAX_GAP_RANGES", "CompactionError", "SnapshotStore",
           "partition_dir_name", "query_of_dir"]


class CompactionError(RuntimeError):
    """The snapshot directory is unusable (corrupt manifest, missing version); the message says which."""


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

    def lower_bound(self) -> list[str]:
        """Queries whose folded n is a lower bound (seeded from answers.current; see :meth:`seed`)."""
        return list(self.manifest().get("lower_bound", []))

    def seed(self, rows: pa.Table, folded_n: Mapping[str, int], versions: Mapping[str, int],
             lower_bound: list[str], seeded: Mapping[str, Any]) -> int:
        """Make ``rows`` (``query_id, binding, multiplicity, last_n``: the current answers at a cut of the answers
        log) the first version of an empty store, with the folded n, registration versions and lower-bound
        queries that go with them, and ``seeded`` (the cut) in the manifest.  Returns the version."""
        if int(self.manifest()["version"]):
            raise CompactionError(f"{self.root} already holds a snapshot: only an empty store is seeded")
        version = 1
        target = self.version_dir(version)
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        counts: dict[str, list[int]] = {}
        _write_queries(target, rows, counts)
        self._write_manifest({"version": version, "queries": dict(folded_n), "gaps": {}, "missing": {},
                              "versions": dict(versions), "rows": counts, "lower_bound": sorted(lower_bound),
                              "seeded": dict(seeded), "updated_at_ms": int(time.time() * 1000)})
        return version

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

    def write_fold(self, result: Any) -> tuple[int, pa.Table, dict[str, list[int]]]:
        """Write the snapshot after ``result`` (a ``spark.compaction.Fold``) as the next version directory (not yet
        current).

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
        _write_queries(target, merged, counts)
        changed = merged.filter(pc.equal(merged.column("touched"), 1)).select(
            ["query_id", "binding", "bidx", "multiplicity", "last_n"])
        if ended.num_rows:  # rows of a replaced registration that the new one does not have: tombstones
            gone = ended.join(changed.select(["query_id", "binding"]), ["query_id", "binding"], join_type="left anti")
            changed = pa.concat_tables([changed, pa.table({
                "query_id": gone.column("query_id"), "binding": gone.column("binding"),
                "bidx": pa.nulls(gone.num_rows, pa.int32()),
                "multiplicity": pa.array(np.zeros(gone.num_rows, np.int64)), "last_n": gone.column("last_n")})])
        return version, changed, counts

    def commit(self, version: int, report: Any, counts: Mapping[str, list[int]] | None = None) -> None:
        """Make ``version`` current (atomic rename), then delete versions no reader needs any more (``report``: the
        fold's ``spark.compaction.FoldReport``)."""
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
        if report.lower_bound:
            manifest["lower_bound"] = list(report.lower_bound)
        if "seeded" in old:
            manifest["seeded"] = old["seeded"]
        self._write_manifest(manifest)
        for path in self.root.glob("v[0-9]*"):
            if int(path.name[1:]) <= version - _KEEP_VERSIONS:
                shutil.rmtree(path, ignore_errors=True)

    def _write_manifest(self, manifest: Mapping[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".manifest-")
        with os.fdopen(fd, "w") as fh:
            json.dump(manifest, fh, sort_keys=True, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.root / MANIFEST_NAME)


def _write_queries(target: Path, rows: pa.Table, counts: dict[str, list[int]]) -> None:
    """Write the rows of ``rows`` (``query_id, binding, multiplicity, last_n``, ...) whose multiplicity is not 0
    into version directory ``target``, one Parquet file per query, set each written query's ``[rows, negative
    rows]`` in ``counts``, and mark the directory complete."""
    rows = rows.filter(pc.not_equal(rows.column("multiplicity"), 0))
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
