"""A shard's graph at an offset of its log, from a base rather than from offset 0 (steps 4 and 5 of
``docs/design/bounded-input-logs.md``).  No Kafka here.

How it works: docs/design/internals.md, services.worker.snapshots.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, NamedTuple

from cbgp.change import ROLE_BOTH, Change, change_of, routes
from cbgp.distributed.versioned_state import fold
from services import codec
from services.wire.loglines import kv
from services.wire.settings import whole_setting
from services.worker.points import log_tail
from services.worker.probes import Before, RecordReader, record_changes

log = logging.getLogger("cbgp.worker")

Quad = tuple[int, int, int, int]
FOREVER = 1 << 62  # (a seq past every change)
# A registration with at most this many changes before it (all partitions counted: its seq) reads them from its
# routed log while that log is whole, instead of loading ingest's snapshot (see Bases.serves).
LOG_READ_CHANGES = whole_setting("CBGP_BASE_MIN_CHANGES", 10_000, unit="changes")


class IngestSnapshot(NamedTuple):
    """Ingest's latest snapshot as a base: its presence set (quad -> insert seq, -1 unknown), the routed end
    offsets it matches ({}: not recorded, an older ingest), the updates.encoded offset it matches (None: not
    known) and the last seq it reflects."""

    present: Mapping[Quad, int]
    routed_ends: Mapping[int, int]
    encoded_offset: int | None = None
    seq: int = -1


# () -> ingest's latest snapshot (an IngestSnapshot, or a (presence, routed ends) pair), or None when none serves
# the logs as they are.
BaseSource = Callable[[], "IngestSnapshot | tuple | None"]


@dataclass
class RoutedBase:
    """One routed partition's graph at ``offset`` of its log (every change below it, none at or above it):
    quad -> the insert that made it present, as a Change with the quad's role at this partition."""

    partition: int
    offset: int
    graph: dict[Quad, Change]
    seqs_known: bool = True  # False: from an older snapshot (insert seqs unknown, -1): no history from it

    @classmethod
    def of(cls, present: Mapping[Quad, int], routed_ends: Mapping[int, int], partition: int,
           partitions: int) -> RoutedBase:
        """Partition ``partition``'s part of ingest's snapshot (``present``: quad -> insert seq, -1 unknown;
        ``routed_ends``: the routed offsets it matches)."""
        graph: dict[Quad, Change] = {}
        known = True
        for quad, seq in present.items():
            s, p, o, g = quad
            for routed, role in routes(s, o, partitions):
                if routed == partition:
                    graph[quad] = change_of((seq, 1, s, p, o, g, None, role, False))
                    known = known and seq >= 0
        return cls(partition, routed_ends[partition], graph, known)

    def before(self, records: RecordReader, point: int, predicates: frozenset[int] | None = None
               ) -> tuple[dict[Quad, Change], bool]:
        """The partition's graph just before offset ``point`` of its log (every change of the records below it),
        each quad -> the change that inserted it, ``predicates``: those quads only; and whether every insert seq
        in it is known (an older snapshot's are not, nor a quad restored by undoing a delete from before ingest
        kept them): a registration's history needs them, an engine's snapshot does not."""
        graph = {quad: change for quad, change in self.graph.items()
                 if predicates is None or quad[1] in predicates}
        known = self.seqs_known
        if self.offset <= point:
            for _offset, value in records(self.partition, self.offset, point):
                fold(graph, record_changes(value), FOREVER, predicates)
            return graph, known
        for _offset, value in reversed(list(records(self.partition, point, self.offset))):
            changes = record_changes(value)
            inserted = codec.inserted_at(value) if changes else []
            for i in range(len(changes) - 1, -1, -1):
                _seq, diff, s, p, o, g, _time, role, _refresh = changes[i]
                if predicates is not None and p not in predicates:
                    continue
                if diff > 0:
                    graph.pop((s, p, o, g), None)
                    continue
                insert = inserted[i] if inserted else -1
                known = known and insert >= 0
                graph[(s, p, o, g)] = change_of((insert, 1, s, p, o, g, None, role, False))
        return graph, known


@dataclass
class WholeBase:
    """updates.encoded's graph at ``offset`` (every change below it, none at or above it): quad -> the insert
    that made it present, role ``ROLE_BOTH``, as a whole shard's engines see it; ``seq``: the snapshot's last."""

    offset: int
    graph: dict[Quad, Change]
    seq: int

    @classmethod
    def of(cls, snapshot: IngestSnapshot) -> WholeBase:
        graph = {quad: change_of((seq, 1, *quad, None, ROLE_BOTH, False)) for quad, seq in snapshot.present.items()}
        return cls(int(snapshot.encoded_offset or 0), graph, snapshot.seq)

    def at(self, changes_in: Callable[[int, int], Iterable[Change]], point: int
           ) -> tuple[list[Change], int, Change | None]:
        """The graph just before offset ``point`` of updates.encoded, as the inserts of its quads: the base moved
        forwards over the changes of the records in ``[offset, point)``, or backwards over those of ``[point,
        offset)`` undone newest first (``changes_in(start, end)``; refreshes left out).  Only those records are
        read.  Also the seq of the last change below ``point`` and that change (None when it was not read: a
        change's seq follows the one before, so the seq is known all the same), as a replay from 0 leaves them."""
        graph = dict(self.graph)
        if self.offset <= point:
            last = None
            for change in changes_in(self.offset, point):
                last = change
                fold(graph, (change,), FOREVER)
            return list(graph.values()), last.seq if last is not None else self.seq, last
        undone = list(changes_in(point, self.offset))
        for change in reversed(undone):
            quad = (change.s, change.p, change.o, change.g)
            if change.diff > 0:
                graph.pop(quad, None)
            else:  # (the seq of the insert it undid is not needed: an engine's snapshot, no history)
                graph[quad] = change._replace(diff=1, event_time_ms=None, role=ROLE_BOTH, refresh=False)
        return list(graph.values()), undone[0].seq - 1 if undone else self.seq, None


class Bases:
    """A worker's bases: ingest's snapshot, loaded on the first registration or restore that needs it and kept
    until :meth:`forget` (the end of the poll: a burst of registrations or restores reads it once)."""

    def __init__(self, source: BaseSource | None, records: RecordReader | None, log_start: Callable[[int], int],
                 partitions: int, log_read_changes: int = LOG_READ_CHANGES) -> None:
        self.source = source
        self.log_read_changes = log_read_changes
        self.records = records  # (None: routed bases are not used, as without routed record reads)
        self.log_start = log_start
        self.partitions = partitions
        self.loaded: dict[int, RoutedBase | None] | None = None
        self.snapshot: IngestSnapshot | None = None
        self.whole_base: WholeBase | None = None

    def _load(self) -> IngestSnapshot | None:
        if self.loaded is None:
            loaded = self.source() if self.source is not None else None
            self.loaded, self.snapshot = {}, None if loaded is None else IngestSnapshot(*loaded)
        return self.snapshot

    def whole(self) -> WholeBase | None:
        """updates.encoded's base for whole shards (None: no snapshot serves, or it does not say its offset)."""
        snapshot = self._load()
        if snapshot is None or snapshot.encoded_offset is None:
            return None
        if self.whole_base is None:
            self.whole_base = WholeBase.of(snapshot)
            log.info(kv(event="base-loaded", log="updates.encoded", offset=self.whole_base.offset,
                        quads=len(self.whole_base.graph)))
        return self.whole_base

    def whole_below(self, changes_in: Callable[[int, int], Iterable[Change]], point: int) -> Iterable[Change]:
        """updates.encoded's changes below ``point`` for a whole shard's queries: the graph there as inserts, moved
        from ingest's snapshot (step 5 of ``docs/design/bounded-input-logs.md``), else the log from offset 0
        (``changes_in(start, end)``)."""
        base = self.whole() if point > 0 else None
        return changes_in(0, point) if base is None else base.at(changes_in, point)[0]

    def serves(self, partition: int, seq: int) -> bool:
        """Whether a registration as of change ``seq`` in routed partition ``partition`` starts from the base
        rather than from the log below its point: only when that log is trimmed, or more than
        ``log_read_changes`` changes precede it.  The snapshot holds the whole graph however early the point: a
        query registered before the data it waits for (as the quickstart's) would load the graph of the whole
        burst that follows, only to move it back to the log's first records."""
        return self.source is not None and (seq > self.log_read_changes or self.log_start(partition) > 0)

    def get(self, partition: int) -> RoutedBase | None:
        """Routed partition ``partition``'s base (None: no snapshot serves)."""
        if self.source is None or self.records is None:
            return None
        self._load()
        assert self.loaded is not None
        if partition not in self.loaded:
            snapshot = self.snapshot
            base = None if snapshot is None or partition not in snapshot.routed_ends else \
                RoutedBase.of(snapshot.present, snapshot.routed_ends, partition, self.partitions)
            if base is not None:
                log.info(kv(event="base-loaded", partition=partition, offset=base.offset, quads=len(base.graph),
                            insert_seqs="known" if base.seqs_known else "unknown"))
            self.loaded[partition] = base
        return self.loaded[partition]

    def forget(self) -> None:
        self.loaded = self.snapshot = self.whole_base = None

    def history(self, base: RoutedBase | None, moved: tuple[dict, bool] | None, point: int) -> Before | None:
        """What a multi-centre registration at ``point`` needs of the log before it, from ``base`` moved there
        (``moved``, :meth:`RoutedBase.before`): the graph with its insert seqs and the seq the partition had
        applied (None: no base, or insert seqs unknown: the registration reads the log from 0)."""
        if base is None or moved is None or not moved[1]:
            return None
        graph = moved[0]
        tail = log_tail(self.records, base.partition, point, start=self.log_start(base.partition))
        return Before(graph, tail.applied)


__all__ = ["FOREVER", "BaseSource", "Bases", "IngestSnapshot", "RoutedBase", "WholeBase"]
