"""A worker's shard checkpoints, and the answers service's partition checkpoints in the same form (issue 16): each shard's engine as of a committed log position, so that a restore
replays only the log after it instead of the whole log.  No Kafka here.

A shard's engine state is a function of the records of its log below its position and of the queries registered
in it (a query registered late replays the history, so its state ends as if it had been there from the start).
So a checkpoint taken once a transaction committed -- the engine, the position, the seq of the last change it
applied and the (query, version) pairs it holds -- can serve any later restore of that shard with the same queries
at a committed offset at or past its position, on whichever worker, as long as its log is the same log: the seq
of the change before the position is checked (``WorkerCore.open_shard``).

A routed shard holding multi-centre queries saves their evaluator too (versioned stores, probes waiting, live
counts, the probe segments taken per sender), and the probe floors read so far.  What is not checkpointed (the
shard is then restored from offset 0, as before): a shard feeding a derived stream, a shard that still owes a
snapshot or waits for a registration's point, and an engine pickle cannot serialise.  The store is the worker's
own disk (``--state-dir``), so pickle is safe here: nothing else writes it.
"""

from __future__ import annotations

import logging
import pickle
from typing import Any, Iterable

from services.records import kv
from services.state.store import Store, StoreError

__all__ = ["FORMAT", "ShardCheckpoints", "dump_shard", "load_shard"]

log = logging.getLogger("cbgp.state")

# of the pickled dict (2: with the multi-centre evaluator); a checkpoint of another format is ignored (restored
# from the log)
FORMAT = 2
_PREFIX = b"shard/"


def _key(kind: str, partition: int) -> bytes:
    return _PREFIX + f"{kind}/{partition}".encode()


def dump_shard(state: dict[str, Any]) -> bytes:
    """``state`` (position, last_seq, queries, versions, outputs, engine) as bytes; raises what pickle raises for
    an engine holding something it cannot serialise."""
    return pickle.dumps({"format": FORMAT, **state}, protocol=pickle.HIGHEST_PROTOCOL)


def load_shard(blob: bytes) -> dict[str, Any] | None:
    """The state :func:`dump_shard` wrote, or None for one of another format or that does not load."""
    try:
        state = pickle.loads(blob)
    except Exception as exc:  # noqa: BLE001 - a checkpoint of older code: restore from the log instead
        log.warning(kv(event="shard-checkpoint-unreadable", reason=f"{type(exc).__name__}: {exc}"))
        return None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return None
    return state


class ShardCheckpoints:
    """The shard checkpoints in one worker's :class:`Store` (``shard/<kind>/<partition>`` -> pickled state)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def get(self, kind: str, partition: int) -> dict[str, Any] | None:
        for key, value in self.store.scan(_key(kind, partition)):
            if key == _key(kind, partition):
                return load_shard(value)
        return None

    def put(self, shards: Iterable[tuple[str, int, bytes]]) -> int:
        """Write the ``(kind, partition, blob)`` checkpoints in one atomic batch; returns how many."""
        puts = [(_key(kind, partition), blob) for kind, partition, blob in shards]
        if puts:
            self.store.commit(puts, [], {"shards": [key.decode() for key, _blob in puts]})
        return len(puts)

    def save(self, shards: Iterable[tuple[str, int, bytes]]) -> int | None:
        """:meth:`put`, or None when the store cannot be written (a full or broken disk: one log line, the store
        closed; the service keeps serving, and its restores read the logs from 0)."""
        try:
            return self.put(shards)
        except StoreError as exc:
            log.warning(kv(event="checkpoints-off", reason=str(exc)))
            self.close()
            return None

    def close(self) -> None:
        self.store.close()
