"""The fleet's term dictionary as the Spark job's Python workers see it (windowed operator queries, issue 18).

A windowed BGP needs no terms: its rows are term ids.  A windowed query with operators does: a FILTER compares
literals, an aggregate sums them, and it makes terms of its own (a COUNT, a BIND value, ASK's booleans).  Each
Python worker process keeps one :class:`FleetTerms` per (brokers, dictionary topic), read on demand like
``spark.plans``: ingest commits a term before any update that uses it, so reading the topic to its end finds
every id of an update already read.  The terms a batch's answers use that the topic does not hold (an
operator made them) are published on it by the job's writer with those answers, in every batch that uses them
until this process has read them back: a batch that Spark runs again publishes them again, and a term
published twice is the same record (ids are stable hashes).
"""

from __future__ import annotations

import threading
import time
from typing import Any, Iterable, Mapping

from cbgp.terms import TermDictionary
from services import codec

__all__ = ["FleetTerms", "fleet_terms"]

_TERMS: dict[tuple[str, str], "FleetTerms"] = {}
_LOCK = threading.Lock()


class FleetTerms(TermDictionary):
    """Stable term ids: decodes an id from the dictionary topic when it is not known here, and knows which ids
    it has read there (:meth:`published`)."""

    __slots__ = ("topic", "partitions", "_consumer", "_positions", "_fleet")

    def __init__(self, client_config: Mapping[str, Any], topic: str) -> None:
        from confluent_kafka import Consumer, TopicPartition

        super().__init__(stable=True)
        self.topic = topic
        self._fleet: set[int] = set()  # ids read from the topic
        self._consumer = Consumer({**client_config, "group.id": "cbgp-spark-terms", "enable.auto.commit": False,
                                   "isolation.level": "read_committed", "enable.partition.eof": False})
        metadata = self._consumer.list_topics(topic, timeout=30).topics[topic]
        self.partitions = sorted(metadata.partitions)
        self._positions = {p: 0 for p in self.partitions}
        self._consumer.assign([TopicPartition(topic, p, 0) for p in self.partitions])

    def __reduce__(self):  # noqa: ANN204 - never pickled with its consumer: a copy is a plain dictionary
        plain = TermDictionary(stable=True)
        for term, term_id in self.items():
            plain.add(term_id, term)
        return (_plain, (plain,))

    def published(self, term_id: int) -> bool:
        """Whether the id was read from the dictionary topic (else an operator made it here)."""
        return term_id in self._fleet

    def decode(self, term_id: int) -> str:
        try:
            return super().decode(term_id)
        except KeyError:
            self.wait_for([term_id])
            return super().decode(term_id)  # KeyError still: not in the fleet's dictionary

    def wait_for(self, ids: Iterable[int], timeout_s: float = 30.0) -> None:
        """Read the topic until every id in ``ids`` is known (or up to its end, when ``timeout_s`` is reached)."""
        missing = {i for i in ids if self.lookup_id(i) is None}
        deadline = time.monotonic() + timeout_s
        while missing and time.monotonic() < deadline:
            self._read_to_end(deadline)
            missing = {i for i in missing if self.lookup_id(i) is None}
            if missing:
                time.sleep(0.05)  # ingest commits a term before the update that uses it: it is coming

    def lookup_id(self, term_id: int) -> str | None:
        return self._terms.get(term_id)

    def _read_to_end(self, deadline: float) -> None:
        from confluent_kafka import TopicPartition

        ends = {p: self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                for p in self.partitions}
        while any(self._positions[p] < ends[p] for p in self.partitions) and time.monotonic() < deadline:
            for msg in self._consumer.consume(5000, timeout=0.2):
                if msg.error() or msg.value() is None:
                    continue
                self._positions[msg.partition()] = msg.offset() + 1
                try:
                    entry = codec.decode("DictionaryEntry", msg.value())
                except codec.CodecError:
                    continue
                self.add(entry["id"], entry["term"])
                self._fleet.add(entry["id"])
            for p in self.partitions:  # transaction markers leave offset gaps
                position = self._consumer.position([TopicPartition(self.topic, p)])[0].offset
                if position >= 0:
                    self._positions[p] = max(self._positions[p], position)


def _plain(dictionary: TermDictionary) -> TermDictionary:
    return dictionary


def fleet_terms(client_config: Mapping[str, Any], topic: str) -> FleetTerms:
    """This process's dictionary for (brokers, topic)."""
    key = (str(client_config.get("bootstrap.servers")), topic)
    with _LOCK:
        terms = _TERMS.get(key)
        if terms is None:
            terms = _TERMS[key] = FleetTerms(client_config, topic)
        return terms
