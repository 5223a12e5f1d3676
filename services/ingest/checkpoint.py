"""Ingest's checkpoints, written off the data path.

A checkpoint is taken on the service's thread right after a committed transaction (:class:`Capture`: the
positions, what changed since the last one, a copy of the presence set and of the published ids: 10-17 ms at
100,000-130,000 triples), and written by one background thread: the changes to the instance's store, and the
whole state as one snapshot blob for ``checkpoints.ingest``, which the service queues for its next transaction
once :meth:`CheckpointWriter.done` hands it back.  The writer keeps the terms it packed
(:class:`services.state.presence.TermChunks`): terms are only ever added, so a snapshot decodes and pickles only
those published since the last one.  Written on the service's thread, a checkpoint of the first 100,000 LSBench
updates stopped ingest for 0.25 s every 10 s, and every answer behind it waited (the fleet's
p99).  No Kafka here.

The thread gives the interpreter's lock back every few hundred quads (:func:`_give_way`): holding it, it made the
service's thread, back from each Kafka call, wait up to the interpreter's 5 ms switch interval for it, and ingest
ran at a tenth of its pace for the whole write (bench/snapshot_lock_bench.py).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from services.state import presence
from services.state.checkpointing import Checkpoint
from services.state.store import Store, StoreError

__all__ = ["Capture", "CheckpointWriter", "Written"]


@dataclass(slots=True)
class Capture:
    """One checkpoint's state, copied when it was taken: the record (positions, facts), the quads whose presence
    changed and the terms published since the last checkpoint (for the store), and the whole presence set and
    published ids (for the snapshot; None: no snapshot)."""

    checkpoint: Checkpoint
    position: int  # its updates.encoded position (the snapshot's record position in checkpoints.ingest)
    changed: dict | None = None
    new_terms: list = field(default_factory=list)
    present: dict | None = None
    published: set[int] | None = None
    taken_at: float = field(default_factory=time.monotonic)
    capture_seconds: float = 0.0


@dataclass(slots=True)
class Written:
    """What the background write made of a :class:`Capture`."""

    capture: Capture
    blob: bytes | None  # the snapshot for checkpoints.ingest (None: none was asked for)
    store_error: StoreError | None  # the store failed: the caller turns its checkpoints off
    seconds: float  # the background work


class CheckpointWriter:
    """Writes one :class:`Capture` at a time in a background thread."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[Written] | None = None
        self._terms = presence.TermChunks()  # the terms of the last snapshot, packed (used by the thread alone)

    def busy(self) -> bool:
        return self._pending is not None

    def start(self, capture: Capture, store: Store | None, decode: Callable[[int], str]) -> None:
        """Write ``capture``: its changes to ``store``, its snapshot with the terms ``decode`` gives for its ids
        (the service's dictionary: it only grows, so reading it meanwhile needs no lock)."""
        assert self._pending is None, "one checkpoint at a time"
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="ingest-checkpoint")
        self._pending = self._executor.submit(self._write, capture, store, decode)

    def done(self, wait: bool = False) -> Written | None:
        """The finished write, once (None: none, or still running and not ``wait``); raises what the write
        raised other than a store error (a bug)."""
        pending = self._pending
        if pending is None or not (wait or pending.done()):
            return None
        self._pending = None
        return pending.result()

    def close(self) -> None:
        """Wait for a write in progress (its store must be closed after it), then stop the thread."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _write(self, capture: Capture, store: Store | None, decode: Callable[[int], str]) -> Written:
        started = time.monotonic()
        store_error = None
        if store is not None and capture.changed is not None:
            try:
                puts, deletes = presence.changes(capture.changed, capture.new_terms)
                store.commit(puts, deletes, capture.checkpoint.to_json())
            except StoreError as exc:
                store_error = exc
        blob = None
        if capture.present is not None and capture.published is not None:
            self._terms.update(capture.published, decode, pause=_give_way)
            blob = presence.snapshot(capture.present, self._terms, capture.checkpoint.to_json(), pause=_give_way)
        return Written(capture, blob, store_error, time.monotonic() - started)


def _give_way() -> None:
    time.sleep(0)  # (releases the lock: a thread waiting for it takes it now, not at the next switch interval)
