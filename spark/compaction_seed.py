"""Seeding compaction's snapshot from ``answers.current`` when the answers log no longer starts at offset 0.

How it works: docs/design/internals.md, spark.compaction_seed.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping

import pyarrow as pa

from services.kafka.client import end_offsets
from services.kafka.config import KafkaSettings
from services.client.reading import current_at_cut
from spark.answer_columns import canonical_binding
from spark.compaction import delta_table, fold
from spark.kafka_io import read_ranges
from spark.snapshot_store import SnapshotStore

log = logging.getLogger("cbgp.spark.compaction")

__all__ = ["needs_seed", "seed_from_current"]


def needs_seed(store: SnapshotStore, checkpoint_dir: str | Path) -> bool:
    """Whether the compaction starts with nothing of its own: no snapshot yet and no streaming checkpoint
    (whose offsets the stream would resume from)."""
    offsets = Path(checkpoint_dir) / "offsets"
    return int(store.manifest()["version"]) == 0 and not (offsets.is_dir() and any(offsets.iterdir()))


def seed_from_current(settings: KafkaSettings, options: Mapping[str, str],
                      store: SnapshotStore) -> dict[int, int] | None:
    """Seed an empty ``store`` from answers.current when some answers partition starts past offset 0 (see the
    module doc); returns the cut, the offsets the stream starts at, or None when the whole log is there (the
    fold starts from offset 0, as ever)."""
    topic = settings.topic("answers")
    if not any(low for low, _high in end_offsets(settings, topic).values()):
        return None  # (the usual first start: nothing deleted, answers.current not even read)
    records, marks = current_at_cut(settings, who="spark compaction", on_error=lambda exc: log.warning(
        "compaction seed: undecodable answers.current record left out: %s", exc))
    lows = {p: low for p, (low, _high) in marks.items()}
    if not any(lows.values()):
        return None
    cut = {p: high for p, (_low, high) in marks.items()}
    ranges = [{"partition": p, "start": lows[p], "end": cut[p]} for p in sorted(cut) if cut[p] > lows[p]]
    below = fold(delta_table(read_ranges(options, topic, ranges)), {}, {}).report if ranges else None
    left_n = below.folded_n if below is not None else {}
    left_versions = below.versions if below is not None else {}
    # Each query's registration version: the newest its current answers or its deltas left below the cut show.
    versions: dict[str, int] = dict(left_versions)
    for record in records:
        versions[record["query_id"]] = max(versions.get(record["query_id"], 0), record["version"])
    rows: dict[str, list] = {"query_id": [], "binding": [], "multiplicity": [], "last_n": []}
    current_n: dict[str, int] = {}  # each query's highest last_n among its current answers
    for record in records:
        q = record["query_id"]
        if record["multiplicity"] and record["version"] in (0, versions[q]):
            rows["query_id"].append(q)
            rows["binding"].append(canonical_binding(record["binding"]))
            rows["multiplicity"].append(record["multiplicity"])
            rows["last_n"].append(record["last_n"])
            current_n[q] = max(current_n.get(q, 0), record["last_n"])
    folded_n: dict[str, int] = {}
    lower_bound = []
    for q, version in versions.items():
        if q in left_n and left_versions.get(q, 0) == version:
            folded_n[q] = left_n[q]
        else:
            folded_n[q] = current_n.get(q, 0)
            lower_bound.append(q)
    table = pa.table({"query_id": pa.array(rows["query_id"], pa.string()),
                      "binding": pa.array(rows["binding"], pa.string()),
                      "multiplicity": pa.array(rows["multiplicity"], pa.int64()),
                      "last_n": pa.array(rows["last_n"], pa.int64())})
    store.seed(table, folded_n, versions, lower_bound, {"cut": {str(p): o for p, o in cut.items()},
                                                        "log_start": {str(p): o for p, o in lows.items()}})
    log.info("compaction: the answers log starts past offset 0 (%s) and the snapshot is empty: seeded it from "
             "answers.current at offsets %s (%d answers of %d queries); folding from there",
             ", ".join(f"partition {p} at {o}" for p, o in sorted(lows.items()) if o), cut, table.num_rows,
             len(versions))
    return cut
