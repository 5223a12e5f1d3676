"""A worker's shard checkpoints, and the answers service's partition checkpoints in the same form:
each shard's engine as of a committed log position, so that a restore replays only the log after it instead of
the whole log.  No Kafka here.

How it works: docs/design/internals.md, services.state.shards.
"""

from __future__ import annotations

import logging
import pickle
import time
from typing import Any, Iterable, Protocol

from services.metrics.instruments import CHECKPOINT_BYTES, CHECKPOINT_TIME
from services.wire.loglines import kv
from services.state.store import Store, StoreError
from services.wire.sealed import KEY_SETTING, seal, unseal

__all__ = ["FORMAT", "RemoteCheckpoints", "ShardCheckpoints", "dump_shard", "load_shard"]

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
    return seal(pickle.dumps({"format": FORMAT, **state}, protocol=pickle.HIGHEST_PROTOCOL))


def load_shard(blob: bytes) -> dict[str, Any] | None:
    """The state :func:`dump_shard` wrote, or None for one of another format, that does not load, or whose seal
    does not verify under this fleet's key (it is never unpickled then)."""
    data = unseal(blob)
    if data is None:
        log.warning(kv(event="shard-checkpoint-refused", reason=f"not sealed with this fleet's key ({KEY_SETTING})"))
        return None
    try:
        state = pickle.loads(data)
    except Exception as exc:  # noqa: BLE001 - a checkpoint of older code: restore from the log instead
        log.warning(kv(event="shard-checkpoint-unreadable", reason=f"{type(exc).__name__}: {exc}"))
        return None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return None
    return state


def _measure(shards: list[tuple]) -> None:
    """``cbgp_checkpoint_bytes`` and ``cbgp_checkpoint_last_timestamp_seconds`` per kind of the shards saved."""
    sizes: dict[str, int] = {}
    for kind, _partition, blob, *_position in shards:
        sizes[kind] = sizes.get(kind, 0) + len(blob)
    now = time.time()
    for kind, size in sizes.items():
        CHECKPOINT_BYTES.labels(kind).set(size)
        CHECKPOINT_TIME.labels(kind).set(now)


class RemoteCheckpoints(Protocol):
    """Checkpoints kept elsewhere than this instance's disk (``services.kafka.checkpoint_log.CheckpointLog``):
    written with the service's next transaction, readable by any instance."""

    def get(self, kind: str, partition: int) -> Any: ...  # .blob and .position, or None

    def queue(self, shards: Iterable[tuple]) -> int: ...  # (kind, partition, blob, position[, needs])

    def take(self) -> list[Any]: ...  # the records for the next transaction

    def owns(self, output: Any) -> bool: ...  # whether a record is one of its checkpoint records

    def committed(self) -> None: ...

    def close(self) -> None: ...


class ShardCheckpoints:
    """A service's shard checkpoints: in its own :class:`Store` (``shard/<kind>/<partition>`` -> pickled state),
    and in ``remote`` (Kafka: any instance can restore from them).  Either may be None."""

    def __init__(self, store: Store | None, remote: RemoteCheckpoints | None = None) -> None:
        self.store = store
        self.remote = remote

    def get(self, kind: str, partition: int, committed: int | None = None) -> dict[str, Any] | None:
        """The newest checkpoint of a shard (the highest position), its ``"from"`` saying where it was read
        (``store`` or ``kafka``).  The store's is taken without asking Kafka when it is at ``committed``: none
        can be newer."""
        local = self._local(kind, partition)
        if local is not None and (self.remote is None or local.get("position") == committed):
            return local
        saved = self.remote.get(kind, partition) if self.remote is not None else None
        remote = load_shard(saved.blob) if saved is not None else None
        if remote is not None:
            remote["from"] = "kafka"
        found = [state for state in (local, remote) if state is not None]
        return max(found, key=lambda state: state.get("position", -1)) if found else None  # ties: the store's

    def _local(self, kind: str, partition: int) -> dict[str, Any] | None:
        if self.store is None:
            return None
        for key, value in self.store.scan(_key(kind, partition)):
            if key == _key(kind, partition):
                state = load_shard(value)
                if state is not None:
                    state["from"] = "store"
                return state
        return None

    def put(self, shards: Iterable[tuple]) -> int:
        """Write the ``(kind, partition, blob, position[, needs])`` checkpoints: in the store in one atomic batch,
        and queued for the remote's next transaction (``needs``: what the shard's restore reads of other logs,
        catalogue topic -> offset, for ``cbgp topics floor``); returns how many."""
        shards = list(shards)
        if self.store is not None and shards:
            puts = [(_key(kind, partition), blob) for kind, partition, blob, *_position in shards]
            self.store.commit(puts, [], {"shards": [key.decode() for key, _blob in puts]})
        if self.remote is not None:
            self.remote.queue(shards)
        _measure(shards)
        return len(shards)

    def save(self, shards: Iterable[tuple]) -> int | None:
        """:meth:`put`, or None when the store cannot be written (a full or broken disk: one log line, the store
        closed; the service keeps serving, with the remote's checkpoints alone if it has one)."""
        shards = list(shards)
        try:
            return self.put(shards)
        except StoreError as exc:
            log.warning(kv(event="checkpoints-off", store="disk", reason=str(exc)))
            self.store.close()
            self.store = None
            return self.put(shards) if self.remote is not None else None  # (the remote's part alone)

    def outputs(self) -> list[Any]:
        """The remote checkpoint records to produce in the transaction about to begin."""
        return self.remote.take() if self.remote is not None else []

    def only_checkpoints(self, outputs: Iterable[Any]) -> bool:
        """Whether ``outputs`` are checkpoint records alone: a transaction of them changes no state (so it does
        not call for another checkpoint)."""
        return self.remote is not None and all(self.remote.owns(output) for output in outputs)

    def committed(self) -> None:
        """The transaction that carried :meth:`outputs` committed."""
        if self.remote is not None:
            self.remote.committed()

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
        if self.remote is not None:
            self.remote.close()
