"""Keyed state whose per-batch cost follows the batch, for ``transformWithStateInPandas`` processors.

How it works: docs/design/internals.md, spark.state_log.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Generic, Iterable, Mapping, TypeVar

from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from services.wire.sealed import seal, unseal

T = TypeVar("T")

BLOB_SCHEMA = "blob binary"
_TAGGED = "cbgp-tail-v1"  # a tail row's pickled value: (_TAGGED, version the batch produced, its record)
KEPT_ROWS = 4  # tail rows kept past a base rewrite, for workers that missed the last batches


class QueryStateProcessor(StatefulProcessor):
    """Base of the per-query processors: ``meta`` (the subclass's ``META_SCHEMA``), ``base`` and ``tail`` state,
    the Kafka client config and plans topic to look plans up in, and the partition count of the deltas topic."""

    META_SCHEMA: str

    def __init__(self, kafka_config: Mapping[str, Any], plans_topic: str, deltas_partitions: int) -> None:
        self.kafka_config = dict(kafka_config)
        self.plans_topic = plans_topic
        self.deltas_partitions = deltas_partitions

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.meta = handle.getValueState("meta", self.META_SCHEMA)
        self.base = handle.getValueState("base", BLOB_SCHEMA)
        self.tail = handle.getListState("tail", BLOB_SCHEMA)

    def close(self) -> None:
        pass


class LiveCache(Generic[T]):
    """Per Python worker: key -> (version, token, evaluator); token tells evaluators of different plans apart."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[int, Any, T]] = {}

    def get(self, key: str, version: int, token: Any) -> T | None:
        entry = self._entries.get(key)
        if entry is not None and entry[0] == version and entry[1] == token:
            return entry[2]
        return None

    def evaluator(self, key: str, version: int, token: Any, base_state: Any, tail: Any,
                  build: Callable[[Any], T], replay: Callable[[T, Any], T]) -> T:
        """The key's evaluator at the stored ``version``: this worker's live one; else its live one of an older
        version caught up by replaying the tail rows of the batches another worker ran since (Spark gives a
        partition's next task to any idle worker, so two workers take turns); else rebuilt from the base and
        the whole tail (:func:`restore`)."""
        live = self.get(key, version, token)
        if live is not None:
            return live
        entry = self._entries.get(key)
        if entry is not None and entry[1] == token and entry[0] < version and tail.exists():
            missed = [row for row in map(_tail_row, tail.get()) if row[0] is not None and row[0] > entry[0]]
            if [row[0] for row in missed] == list(range(entry[0] + 1, version + 1)):
                evaluator = entry[2]
                for _version, record in missed:
                    evaluator = replay(evaluator, record)
                return evaluator
        return restore(base_state, tail, build, replay)

    def put(self, key: str, version: int, token: Any, evaluator: T) -> None:
        self._entries[key] = (version, token, evaluator)

    def drop(self, key: str) -> None:
        self._entries.pop(key, None)


class StateRefused(RuntimeError):
    """A state row whose seal does not verify: it is not unpickled."""


def dumps(value: Any) -> bytes:
    """A state row, sealed with the fleet's checkpoint key (``services.wire.sealed``): a pickle is code."""
    return seal(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def restore(base_state: Any, tail: Any, build: Callable[[Any], T], replay: Callable[[T, Any], T]) -> T:
    """``build(base or None)``, then ``evaluator = replay(evaluator, inputs)`` for every tail row after the
    base, in order."""
    base_version, saved = _tail_row(base_state.get()) if base_state.exists() else (None, None)
    evaluator = build(saved)
    if tail.exists():
        for version, record in map(_tail_row, tail.get()):
            if base_version is None or version is None or version > base_version:
                evaluator = replay(evaluator, record)
    return evaluator


def _tail_row(row: tuple[bytes]) -> tuple[int | None, Any]:
    """(the version the batch produced, its record), or (the base's version, its snapshot); None for a row or
    base written before they carried it."""
    data = unseal(row[0])
    if data is None:
        raise StateRefused("a Spark state row is not sealed with this fleet's checkpoint key (CBGP_CHECKPOINT_SECRET "
                           "differs, or the state was altered): remove the job's --state-dir to start it clean")
    value = pickle.loads(data)
    if isinstance(value, tuple) and len(value) == 3 and value[0] == _TAGGED:
        return value[1], value[2]
    return None, value


def save(base_state: Any, tail: Any, tail_inputs: int, batch_inputs: int, batch_record: Any, version: int,
         entries: Callable[[], int], snapshot: Callable[[], Any], min_tail: int, tail_factor: int = 1) -> int:
    """Persist one batch, which brings the key to ``version``: append ``batch_record`` (None: nothing to
    replay) to the tail, or rewrite the base when the tail would hold more than ``tail_factor`` times the
    state's entries in inputs.  A rewrite keeps the last ``KEPT_ROWS`` rows (the base holds them; a worker a
    few batches behind catches up with them).  Returns the tail's input count after the base."""
    total = tail_inputs + batch_inputs
    row = (dumps((_TAGGED, version, batch_record)),) if batch_record is not None else None
    if total >= min_tail and total >= tail_factor * entries():
        base_state.update((dumps((_TAGGED, version, snapshot())),))
        kept = [r for r in list(tail.get())[-KEPT_ROWS + 1:] if _tail_row(r)[0] is not None] if tail.exists() else []
        tail.clear()
        if row is not None or kept:
            tail.put(kept + ([row] if row is not None else []))
        return 0
    if row is not None:
        tail.appendList([row])
    return total


def clear_all(states: Iterable[Any]) -> None:
    for state in states:
        state.clear()
