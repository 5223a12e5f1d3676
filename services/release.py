"""Seq-ordered, consolidated release of by-centre queries' deltas (the answers service's first step; no Kafka).

A query placed by centre value (``Plan.placement == "by-centre"``) is evaluated on every updates.routed
partition, each for its own centre values and in its own seq order; their deltas reach deltas.parts
interleaved arbitrarily.  Released as they come, a consumer could see the deltas of change 9 before those of
change 7, and, once the centre is projected away, a row's ``-`` from one partition before the ``+`` it
retracts from another.  So, per deltas.parts partition:

1. **Hold** every delta from a routed source (``source_partition >= 0``) until every routed partition's
   *frontier* has reached its seq.  A worker writes a ``Frontier`` record after the deltas of its shards'
   changes up to that seq (ingest writes frontier marks to every routed partition, so idle ones move too);
   deltas from one ordered source (whole queries: -1; the Spark job: below -1) pass straight through.
2. **Release** the held deltas whose seq is at or below the lowest frontier, sorted by
   ``(seq, source partition, source offset, index)``: the answer stream follows the graph's order.
3. **Consolidate DISTINCT**: a by-centre DISTINCT query's partitions report every solution's row
   (``PartDeltaBatch.distinct``); released in seq order, a row goes out as ``+`` when its count goes
   0 -> 1 and as ``-`` when it goes 1 -> 0.

Restart: the offset committed for a deltas.parts partition is never past a record that still holds an
unreleased delta, and its commit metadata carries the frontiers as they were before that record
(:meth:`SeqRelease.commit_position`), so a restarted service re-reads the held records and decides exactly as
before; what it had already released is dropped downstream by idempotence key.  DISTINCT counts are rebuilt
from the deltas.parts records before the committed offset (:meth:`SeqRelease.restore_counts`), which were
all released.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field
from itertools import count

from services.codec import PartDeltaColumns
from services.idempotence import ORDERED_SOURCE_BELOW  # sources below it are one ordered stream each


@dataclass
class _Partition:
    frontiers: dict[int, int] = field(default_factory=dict)  # routed partition -> highest completed seq
    heap: list = field(default_factory=list)  # (seq, source partition, source offset, index, tie, record, i)
    # deltas.parts offset -> [deltas still held, frontiers before that record, origin ms]
    records: dict[int, list] = field(default_factory=dict)


Released = tuple[int, "int | None", PartDeltaColumns]  # (deltas.parts offset, origin ms, deltas)


class SeqRelease:
    """Holding, ordering and DISTINCT consolidation of the deltas of every held deltas.parts partition."""

    def __init__(self, routed_partitions: int) -> None:
        self.n_routed = routed_partitions
        self.partitions: dict[int, _Partition] = {}
        self.counts: dict[tuple[str, int], dict[tuple[int, ...], int]] = {}  # (query, version) -> row -> count
        self._tie = count()

    # -- partitions

    def restore(self, partition: int, metadata: str | None) -> None:
        """Start (or restart) a partition at its committed offset, with the frontiers committed beside it."""
        state = self.partitions[partition] = _Partition()
        try:
            stored = json.loads(metadata or "{}").get("frontiers", {})
            state.frontiers = {int(p): int(s) for p, s in stored.items()}
        except (ValueError, AttributeError, TypeError):
            state.frontiers = {}

    def drop(self, partition: int) -> None:
        self.partitions.pop(partition, None)

    def restore_counts(self, deltas: PartDeltaColumns) -> None:
        """Count a DISTINCT batch that was released before the committed offset (restore, no output)."""
        if deltas.distinct:
            self._consolidate(deltas, emit=False)

    def commit_position(self, partition: int, next_offset: int) -> tuple[int, str]:
        """The offset to commit for ``partition`` (processed up to ``next_offset``) and its metadata."""
        state = self.partitions[partition]
        if state.records:
            first = min(state.records)
            return first, json.dumps({"frontiers": state.records[first][1]}, separators=(",", ":"))
        return next_offset, json.dumps({"frontiers": state.frontiers}, separators=(",", ":"))

    def held(self) -> int:
        return sum(len(state.heap) for state in self.partitions.values())

    def watermark(self, partition: int) -> int:
        """The highest seq every routed partition has completed, as seen on this deltas.parts partition."""
        frontiers = self.partitions[partition].frontiers
        return min((frontiers.get(p, -1) for p in range(self.n_routed)), default=-1)

    # -- records

    def on_frontier(self, partition: int, frontiers: dict[int, int]) -> list[Released]:
        """A Frontier record: raise the frontiers it names and release what they allow."""
        state = self.partitions[partition]
        for routed, seq in frontiers.items():
            if seq > state.frontiers.get(routed, -1):
                state.frontiers[routed] = seq
        return self._release(partition)

    def on_deltas(self, partition: int, offset: int, origin: int | None, deltas: PartDeltaColumns) -> list[Released]:
        """A batch of deltas: an ordered source's pass straight through; a by-centre query's are held."""
        if not deltas.source_partition or max(deltas.source_partition) < ORDERED_SOURCE_BELOW:
            return [(offset, origin, deltas)]
        state = self.partitions[partition]
        state.records[offset] = [len(deltas), dict(state.frontiers), origin]
        for i in range(len(deltas)):
            heapq.heappush(state.heap, (deltas.seq[i], deltas.source_partition[i], deltas.source_offset[i],
                                        deltas.index[i], next(self._tie), offset, deltas, i))
        return self._release(partition)

    def _release(self, partition: int) -> list[Released]:
        state = self.partitions[partition]
        limit = self.watermark(partition)
        heap = state.heap
        groups: list[tuple[int, int | None, PartDeltaColumns, list[int]]] = []
        while heap and heap[0][0] <= limit:
            *_key, offset, deltas, i = heapq.heappop(heap)
            record = state.records[offset]
            record[0] -= 1
            if record[0] == 0:
                del state.records[offset]
            last = groups[-1] if groups else None
            if last is not None and _same_stream(last[2], deltas):
                last[3].append(i) if last[2] is deltas else last[3].append((deltas, i))
            else:
                groups.append((offset, record[2], deltas, [i]))
        out: list[Released] = []
        for offset, origin, deltas, items in groups:
            picked = _pick(deltas, items)
            if picked.distinct:
                picked = self._consolidate(picked, emit=True)
                if not len(picked):
                    continue
            out.append((offset, origin, picked))
        return out

    def _consolidate(self, deltas: PartDeltaColumns, emit: bool) -> PartDeltaColumns:
        """DISTINCT over multiset rows: keep a row's delta only when its count crosses 0 <-> 1."""
        key = (deltas.query_id, deltas.version)
        counts = self.counts.get(key)
        if counts is None:
            for stale in [k for k in self.counts if k[0] == deltas.query_id and k[1] < deltas.version]:
                del self.counts[stale]  # a re-registration starts from nothing
            counts = self.counts[key] = {}
        k = len(deltas.variables)
        kept: list[int] = []
        for i in range(len(deltas)):
            row = tuple(deltas.values[i * k:(i + 1) * k])
            before = counts.get(row, 0)
            after = before + (1 if deltas.sign[i] == "PLUS" else -1)
            if after:
                counts[row] = after
            else:
                counts.pop(row, None)
            if (before == 0 and after == 1) or (before == 1 and after == 0):
                kept.append(i)
        if not emit:
            return deltas
        picked = _pick(deltas, kept)
        return PartDeltaColumns(picked.query_id, picked.part, picked.variables, picked.seq, picked.sign,
                                picked.values, picked.source_partition, picked.source_offset, picked.index,
                                picked.snapshot, picked.event_time_ms, picked.version, False)


def _same_stream(a: PartDeltaColumns, b: PartDeltaColumns) -> bool:
    return (a is b or (a.query_id == b.query_id and a.variables == b.variables and a.version == b.version
                       and a.distinct == b.distinct and a.part == b.part))


def _pick(deltas: PartDeltaColumns, items: list) -> PartDeltaColumns:
    """The deltas ``items`` (indices into ``deltas``, or (other batch of the same stream, index) pairs)."""
    k = len(deltas.variables)
    cols: list[list] = [[] for _ in range(8)]
    values: list[int] = []
    for item in items:
        source, i = (deltas, item) if isinstance(item, int) else item
        for column, array in zip(cols, (source.seq, source.sign, source.source_partition, source.source_offset,
                                        source.index, source.snapshot, source.event_time_ms)):
            column.append(array[i])
        values.extend(source.values[i * k:(i + 1) * k])
    seq, sign, src, offset, index, snapshot, event_time, _unused = cols
    return PartDeltaColumns(deltas.query_id, deltas.part, deltas.variables, seq, sign, values, src, offset, index,
                            snapshot, event_time, deltas.version, deltas.distinct)
