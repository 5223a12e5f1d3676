"""The bookkeeping of ``cbgp.windows.windowed``: a time window's quad records, a per-event window's events, and the queue
of instants at which either may change."""

from __future__ import annotations

import heapq
from collections import Counter

__all__ = ["Event", "Record", "WakeQueue"]


class Record:
    """One quad of a time window: its pruned history and whether the engine holds it."""

    __slots__ = ("history", "present", "wake", "range_ms")

    def __init__(self, range_ms: int) -> None:
        self.history: list[tuple[int, int, int]] = []  # (event time, arrival seq, op), sorted
        self.present = False
        self.wake: int | None = None  # the instant the wake queue should look at it again
        self.range_ms = range_ms  # the window's range; BACKGROUND_RANGE for a quad of a background graph


class WakeQueue:
    """Wake-ups by grid instant: one list of keys per instant and a heap of the instants alone (wakes fall on
    the grid, so there are few instants and many keys: a push is an append, not a heap operation)."""

    __slots__ = ("_instants", "_keys", "_size")

    def __init__(self) -> None:
        self._instants: list[int] = []  # a heap
        self._keys: dict[int, list] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, instant: int, key: object) -> None:
        keys = self._keys.get(instant)
        if keys is None:
            self._keys[instant] = [key]
            heapq.heappush(self._instants, instant)
        else:
            keys.append(key)
        self._size += 1

    def first(self) -> int | None:
        return self._instants[0] if self._instants else None

    def pop(self, instant: int) -> list:
        """The keys of the first instant, ``instant``, removed."""
        heapq.heappop(self._instants)
        keys = self._keys.pop(instant)
        self._size -= len(keys)
        return keys


class Event:
    """One event of a per-event window: its triples (while they may be needed) and its current answer rows."""

    __slots__ = ("triples", "entered", "dirty", "rows", "held", "wake")

    def __init__(self) -> None:
        self.triples: set[tuple[int, int, int, int]] | None = set()
        self.entered = False
        self.dirty = False  # a late triple joined it after it was evaluated
        self.rows: Counter[tuple[int, ...]] = Counter()
        self.held: list[int] = []  # the computed values its rows name, held for them (``TermDictionary.hold``)
        self.wake: int | None = None
