"""Keyed state whose per-batch cost follows the batch, for ``transformWithStateInPandas`` processors.

A query's evaluator (``cbgp.windows.WindowedQuery``, ``cbgp.assembly.Assembler``) is a Python object whose
state can be large (a window's content, a part's answers).  ``applyInPandasWithState`` stored it as one
pickled value rewritten every batch, so each batch cost as much as the whole state.  Here a key's state is

- ``meta`` (ValueState): small fields, among them ``version`` (one more per batch that touched the key);
- ``base`` (ValueState): the evaluator's ``to_state()`` at some version, pickled -- rewritten rarely;
- ``tail`` (ListState): one row per batch since that base: the inputs that batch fed the evaluator, pickled
  (appended: ``appendList`` of one row, so a batch writes only what it read).

Each Python worker keeps the live evaluator per key with the version it reached (``LiveCache``); a batch
whose stored ``version`` matches uses it as is, otherwise (another worker ran the last batch, a restart, a
retried batch) the evaluator is rebuilt from ``base`` plus a replay of ``tail``.  When the tail holds more
inputs than the evaluator holds entries (and at least ``min_tail``), the base is rewritten and the tail
cleared, so the replay stays bounded by the state and the rewrite cost is amortised over as many inputs.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Generic, Iterable, Mapping, TypeVar

from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

T = TypeVar("T")

BLOB_SCHEMA = "blob binary"


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

    def put(self, key: str, version: int, token: Any, evaluator: T) -> None:
        self._entries[key] = (version, token, evaluator)

    def drop(self, key: str) -> None:
        self._entries.pop(key, None)


def dumps(value: Any) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def restore(base_state: Any, tail: Any, build: Callable[[Any], T], replay: Callable[[T, Any], T]) -> T:
    """``build(base or None)``, then ``evaluator = replay(evaluator, inputs)`` for every tail row in order."""
    blob = base_state.get()[0] if base_state.exists() else None
    evaluator = build(pickle.loads(blob) if blob is not None else None)
    if tail.exists():
        for (row_blob,) in tail.get():
            evaluator = replay(evaluator, pickle.loads(row_blob))
    return evaluator


def save(base_state: Any, tail: Any, tail_inputs: int, batch_inputs: int, batch_record: Any,
         entries: Callable[[], int], snapshot: Callable[[], Any], min_tail: int) -> int:
    """Persist one batch: append ``batch_record`` (None: nothing to replay) to the tail, or rewrite the base
    and clear the tail when the tail would outgrow the state.  Returns the tail's input count afterwards."""
    total = tail_inputs + batch_inputs
    if total >= min_tail and total >= entries():
        base_state.update((dumps(snapshot()),))
        tail.clear()
        return 0
    if batch_record is not None:
        tail.appendList([(dumps(batch_record),)])
    return total


def clear_all(states: Iterable[Any]) -> None:
    for state in states:
        state.clear()
