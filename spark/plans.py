"""The registered queries as the Spark job's Python workers see them: the compacted ``queries.plans`` topic.

Stateful Spark functions run in Python worker processes that Spark reuses between micro-batches, so each
process keeps one :class:`PlanCache` (per broker and topic) and reads only what was appended since its last
look.  A plan is immutable per (query id, version); an unregistration is a tombstone.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Mapping

from cbgp.windows import WindowError, WindowSpec
from services import codec
from services.queries import read_registration

__all__ = ["PlanCache", "RegisteredPlan", "plan_cache"]

_CACHES: dict[tuple[str, str], "PlanCache"] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class RegisteredPlan:
    query_id: str
    version: int
    sparql: str  # the plain SPARQL (RSP-QL window clauses removed)
    window: WindowSpec | None
    registered_at_seq: int


class PlanCache:
    """``query id -> RegisteredPlan`` for every currently registered query, refreshed on demand."""

    def __init__(self, client_config: Mapping[str, Any], topic: str) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.topic = topic
        self.plans: dict[str, RegisteredPlan] = {}
        self.invalid: dict[str, str] = {}  # query id -> why its plan cannot be used (the worker dead-letters it)
        self._consumer = Consumer({**client_config, "group.id": "cbgp-spark-plans", "enable.auto.commit": False,
                                   "isolation.level": "read_committed", "enable.partition.eof": False})
        metadata = self._consumer.list_topics(topic, timeout=30).topics[topic]
        self._partitions = sorted(metadata.partitions)
        self._positions = {p: 0 for p in self._partitions}
        self._consumer.assign([TopicPartition(topic, p, 0) for p in self._partitions])

    def refresh(self, timeout_s: float = 10.0) -> dict[str, RegisteredPlan]:
        """Read the topic up to its current end; return the registered plans."""
        import time

        ends = {p: self._consumer.get_watermark_offsets(_tp(self.topic, p), timeout=timeout_s)[1]
                for p in self._partitions}
        deadline = time.monotonic() + timeout_s
        while any(self._positions[p] < ends[p] for p in self._partitions) and time.monotonic() < deadline:
            for msg in self._consumer.consume(500, timeout=0.2):
                if msg.error():
                    continue
                self._positions[msg.partition()] = msg.offset() + 1
                self._apply(msg.key(), msg.value())
            for p in self._partitions:  # transaction markers and compaction leave offset gaps
                position = self._consumer.position([_tp(self.topic, p)])[0].offset
                if position >= 0:
                    self._positions[p] = max(self._positions[p], position)
        return self.plans

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        query_id = key.decode("utf-8", "replace") if key else None
        if query_id is None:
            return
        if value is None:
            self.plans.pop(query_id, None)
            self.invalid.pop(query_id, None)
            return
        try:
            record = codec.decode("QueryPlan", value)
            text, window = read_registration(record["sparql"], record["options"])
        except (codec.CodecError, WindowError) as exc:
            self.plans.pop(query_id, None)
            self.invalid[query_id] = str(exc)
            return
        self.plans[query_id] = RegisteredPlan(query_id, record["version"], text, window, record["registered_at_seq"])

    def get(self, query_id: str) -> RegisteredPlan | None:
        """The plan of ``query_id``, refreshing once if it is not known yet."""
        plan = self.plans.get(query_id)
        if plan is None:
            plan = self.refresh().get(query_id)
        return plan


def _tp(topic: str, partition: int) -> Any:
    from confluent_kafka import TopicPartition

    return TopicPartition(topic, partition)


def plan_cache(client_config: Mapping[str, Any], topic: str) -> PlanCache:
    """This process's cache for (brokers, topic)."""
    key = (str(client_config.get("bootstrap.servers")), topic)
    with _LOCK:
        cache = _CACHES.get(key)
        if cache is None:
            cache = _CACHES[key] = PlanCache(client_config, topic)
        return cache
