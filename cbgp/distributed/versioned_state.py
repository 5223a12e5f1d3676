"""The state of :mod:`cbgp.distributed.evaluator` at one partition: versioned pattern stores (with the counts the
route choices read) and the live-probe counts of the updates that started there."""

from __future__ import annotations

import bisect
import heapq
from operator import itemgetter
from typing import Iterable

SKETCH_SIZE, MIN_KEYS = 64, 16  # distinct keys by the k smallest key hashes; fewer keys: the default fan-out
_GOLDEN, _HASH_MASK, _HASH_RANGE = 0x9E3779B97F4A7C15, (1 << 64) - 1, float(1 << 64)  # Fibonacci hashing


def present_at(history: list[int], as_of: int) -> bool:
    """Whether a triple was present at seq ``as_of``.  ``history`` lists the seqs at which its presence
    flipped, oldest first, with a leading -1 when it was present before the first recorded flip (changes
    alternate: ingest drops duplicate inserts and deletes of absent triples)."""
    return bisect.bisect_right(history, as_of) % 2 == 1


def _foldable_from(history: list[int]) -> int:
    """The least watermark at which :meth:`PatternStore.collapse` folds something of ``history`` (two flips or
    more): its first flip, or the second after a leading -1 (present before the history)."""
    return history[1] if history[0] == -1 else history[0]


Quad = tuple[int, int, int, int]


def fold(graph: dict[Quad, tuple], changes: Iterable[tuple], upto: int,
         predicates: frozenset[int] | None = None) -> dict[Quad, tuple]:
    """Move ``graph`` (each present quad -> the change that inserted it) along ``changes``
    (``cbgp.change.Change`` tuples) whose seq is at most ``upto``; ``predicates``: those of the others only."""
    for change in changes:
        seq, diff, s, p, o, g = change[:6]
        if seq > upto or (predicates is not None and p not in predicates):
            continue
        if diff > 0:
            graph[(s, p, o, g)] = change
        else:
            graph.pop((s, p, o, g), None)
    return graph


def insert_history(graph: dict[Quad, tuple]) -> list[tuple]:
    """A graph (as :func:`fold` keeps it) as an insert-only history: each quad inserted at the seq of its last
    insert, in seq order.  For the graph as of seq S this is a function of the global history and S alone,
    whatever base or log it was folded from: the history a multi-centre registration replays
    (``PartitionEvaluator.replay_history``)."""
    return sorted(graph.values(), key=itemgetter(0))


class PatternStore:
    """The triples matching one pattern, stored at one end: end value (with a GRAPH ?g, (end value, graph))
    -> other value -> flip history.  A history of one flip ``[k]`` (present since k) is never rewritten; those
    of more flips wait in ``dirty``, a heap by the seq from which :meth:`collapse` can fold them, so a collapse
    costs the entries it folds, not the whole state nor the recent flips it must keep (the workers collapse
    after every probe record, and the watermark trails the newest flips by a few transactions)."""

    __slots__ = ("table", "dirty", "size", "pairs", "sketch", "in_sketch", "sketch_max")

    def __init__(self) -> None:
        self.table: dict[int, dict[int, list[int]]] = {}
        self.dirty: list[tuple[int, int, int]] = []  # heap of (foldable from seq, key, other)
        self.size = 0  # (key, other) entries, kept as they change: the state metrics read it every second
        # For route choices: the pairs present, and the SKETCH_SIZE smallest hashes of the keys ever inserted
        # (a k-minimum-values sketch of the distinct keys).  Both follow the changes alone, never a collapse,
        # so every worker that applied the same log counts the same.
        self.pairs = 0
        self.sketch: list[int] = []
        self.in_sketch: set[int] = set()
        self.sketch_max = _HASH_RANGE

    def flip(self, key: int, other: int, seq: int, diff: int = 0) -> None:
        if diff:
            self.pairs += diff
            if diff > 0:
                # (a GRAPH ?g store's key is (value, graph): its hash is as deterministic as an int's)
                hashed = (key if key.__class__ is int else hash(key)) * _GOLDEN & _HASH_MASK
                if hashed < self.sketch_max and hashed not in self.in_sketch:
                    self._note(hashed)
        bucket = self.table.get(key)
        if bucket is None:
            self.table[key] = {other: [seq]}
            self.size += 1
            return
        history = bucket.get(other)
        if history is None:
            bucket[other] = [seq]
            self.size += 1
        else:
            history.append(seq)
            heapq.heappush(self.dirty, (_foldable_from(history), key, other))

    def _note(self, hashed: int) -> None:
        sketch = self.sketch
        bisect.insort(sketch, hashed)
        self.in_sketch.add(hashed)
        if len(sketch) > SKETCH_SIZE:
            self.in_sketch.discard(sketch.pop())
        if len(sketch) == SKETCH_SIZE:
            self.sketch_max = sketch[-1]

    def fan(self, default: float) -> float:
        """Values per key (pairs present / distinct keys seen), or ``default`` while too few keys were seen."""
        sketch = self.sketch
        if len(sketch) < SKETCH_SIZE:
            return default if len(sketch) < MIN_KEYS else max(self.pairs, 0) / len(sketch)
        keys = (SKETCH_SIZE - 1) * _HASH_RANGE / sketch[-1]
        return max(self.pairs, 0) / keys

    def present(self, key: int, other: int, as_of: int) -> bool:
        bucket = self.table.get(key)
        history = bucket.get(other) if bucket else None
        return history is not None and present_at(history, as_of)

    def values(self, key: int, as_of: int) -> list[int]:
        bucket = self.table.get(key)
        if not bucket:
            return []
        # (no flip after as_of, the usual case: present iff the flips are odd in number)
        return [other for other, history in bucket.items()
                if (len(history) & 1 if history[-1] <= as_of else bisect.bisect_right(history, as_of) & 1)]

    def collapse(self, watermark: int) -> None:
        """Drop flips no read can need (reads are as of seqs >= watermark): keep the state at the watermark."""
        table, due = self.table, self.dirty
        while due and due[0][0] <= watermark:
            _from, key, other = heapq.heappop(due)
            bucket = table.get(key)
            history = bucket.get(other) if bucket else None
            if history is None or len(history) < 2:
                continue  # (folded already: an entry is pushed again at each flip)
            cut = bisect.bisect_right(history, watermark)
            if cut == 0 or (cut == 1 and history[0] == -1):
                continue  # nothing at or below the watermark to fold (its current entry is still in the heap)
            history = [-1] + history[cut:] if cut % 2 == 1 else history[cut:]
            if history:
                bucket[other] = history
                if len(history) > 1:
                    heapq.heappush(due, (_foldable_from(history), key, other))
            else:
                del bucket[other]
                self.size -= 1
                if not bucket:
                    del table[key]

    def __setstate__(self, state: tuple) -> None:
        """Unpickle; a checkpoint written before ``dirty`` was a heap holds a set of ``(key, other)``."""
        for name, value in state[1].items():
            setattr(self, name, value)
        if isinstance(self.dirty, set):
            pending = []
            for key, other in self.dirty:
                history = self.table.get(key, {}).get(other)
                if history is not None and len(history) > 1:
                    pending.append((_foldable_from(history), key, other))
            heapq.heapify(pending)
            self.dirty = pending

    def entries(self) -> int:
        return self.size


class LiveCounts:
    """(query, seq, snapshot) -> probes still alive elsewhere, for the updates (and registrations) whose probes
    started here, with the oldest live seq in O(log n): :meth:`PartitionEvaluator.completed` asks for it after
    every record, and scanning every key each time cost more than the probes themselves."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, int, bool], int] = {}
        # keys per seq (all / without registrations'), and their seqs as lazily cleaned min-heaps
        self._per_seq: tuple[dict[int, int], dict[int, int]] = ({}, {})
        self._heaps: tuple[list[int], list[int]] = ([], [])

    def __bool__(self) -> bool:
        return bool(self.counts)

    def __iter__(self):  # noqa: ANN204
        return iter(self.counts)

    def add(self, key: tuple[str, int, bool], delta: int) -> None:
        before = self.counts.get(key, 0)
        after = before + delta
        if after:
            self.counts[key] = after
        else:
            self.counts.pop(key, None)
        if (before == 0) != (after == 0):
            self._count_key(key, 1 if before == 0 else -1)

    def drop_query(self, name: str) -> None:
        for key in [k for k in self.counts if k[0] == name]:
            del self.counts[key]
            self._count_key(key, -1)

    def oldest(self, registrations: bool) -> int | None:
        """The lowest seq with a live key (``registrations``: the registrations' keys count too)."""
        which = 0 if registrations else 1
        per_seq, heap = self._per_seq[which], self._heaps[which]
        while heap and not per_seq.get(heap[0]):
            per_seq.pop(heapq.heappop(heap), None)
        return heap[0] if heap else None

    def _count_key(self, key: tuple[str, int, bool], delta: int) -> None:
        _query, seq, snapshot = key
        for which in ((0,) if snapshot else (0, 1)):
            per_seq = self._per_seq[which]
            n = per_seq.get(seq, 0)
            if n == 0 and delta > 0:
                heapq.heappush(self._heaps[which], seq)
            per_seq[seq] = n + delta


__all__ = ["MIN_KEYS", "SKETCH_SIZE", "LiveCounts", "PatternStore", "Quad", "fold", "insert_history", "present_at"]
