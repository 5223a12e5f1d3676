"""A topic read to its end again and again by one Spark Python worker process (plans, the term dictionary).

Spark reuses its Python worker processes between micro-batches, so each process keeps one reader per
(brokers, topic) and reads only what was appended since its last look.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping, TypeVar

__all__ = ["TopicTail", "per_process"]

T = TypeVar("T")
_INSTANCES: dict[tuple[type, str, str], Any] = {}
_LOCK = threading.Lock()


class TopicTail:
    """Every partition of ``topic``, read from offset 0 up to the end seen at each :meth:`read_to_end`."""

    def __init__(self, client_config: Mapping[str, Any], topic: str, group_id: str) -> None:
        from confluent_kafka import Consumer

        self.topic = topic
        self._consumer = Consumer({**client_config, "group.id": group_id, "enable.auto.commit": False,
                                   "isolation.level": "read_committed", "enable.partition.eof": False})
        metadata = self._consumer.list_topics(topic, timeout=30).topics[topic]
        self.partitions = sorted(metadata.partitions)
        self._positions = {p: 0 for p in self.partitions}

    def read_to_end(self, apply: Callable[[Any], None], deadline: float, batch: int = 1000) -> None:
        """Pass every record up to the current end (or until ``deadline``, a ``time.monotonic()``) to ``apply``.

        The consumer is assigned only while it reads: an assigned consumer at the end of a noida-db log fetches
        without pause (``services.kafka.fetch``), and every Python worker of the job holds one of these."""
        from confluent_kafka import TopicPartition

        ends = {p: self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                for p in self.partitions}
        behind = [p for p in self.partitions if self._positions[p] < ends[p]]
        if not behind:
            return
        self._consumer.assign([TopicPartition(self.topic, p, self._positions[p]) for p in behind])
        try:
            self._read(apply, ends, deadline, batch)
        finally:
            self._consumer.unassign()

    def _read(self, apply: Callable[[Any], None], ends: dict[int, int], deadline: float, batch: int) -> None:
        from confluent_kafka import TopicPartition

        while any(self._positions[p] < ends[p] for p in self.partitions) and time.monotonic() < deadline:
            # (a short wait: consume() waits out its timeout unless a whole batch comes, and a refresh usually
            # finds a record or two; the positions below tell when the end is reached)
            for msg in self._consumer.consume(batch, timeout=0.01):
                if msg.error():
                    continue
                self._positions[msg.partition()] = msg.offset() + 1
                apply(msg)
            for p in self.partitions:  # transaction markers and compaction leave offset gaps
                if self._positions[p] >= ends[p]:
                    continue  # (not assigned: its position is unknown to the consumer)
                position = self._consumer.position([TopicPartition(self.topic, p)])[0].offset
                if position >= 0:
                    self._positions[p] = max(self._positions[p], position)

    def close(self) -> None:
        self._consumer.close()


def close_instances() -> None:
    """Close and forget this process's instances (their consumers), as before its brokers go away."""
    with _LOCK:
        instances = list(_INSTANCES.values())
        _INSTANCES.clear()
    for instance in instances:
        close = getattr(instance, "close", None)
        if close is not None:
            close()


def per_process(cls: Callable[[Mapping[str, Any], str], T], client_config: Mapping[str, Any], topic: str) -> T:
    """This process's one ``cls(client_config, topic)`` for (brokers, topic)."""
    key = (cls, str(client_config.get("bootstrap.servers")), topic)
    with _LOCK:
        instance = _INSTANCES.get(key)
        if instance is None:
            instance = _INSTANCES[key] = cls(client_config, topic)
        return instance
