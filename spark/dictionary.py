"""The fleet's term dictionary as the Spark job's Python workers see it (windowed operator queries, ).

A windowed BGP needs no terms: its rows are term ids.  A windowed query with operators does: a FILTER compares
literals, an aggregate sums them, and it makes terms of its own (a COUNT, a BIND value, ASK's booleans).  Each
Python worker process keeps one :class:`FleetTerms` per (brokers, dictionary topic), read on demand
(``spark.topic_tail``): ingest commits a term before any update that uses it, so reading the topic to its end finds
every id of an update already read.  The terms a batch's answers use that the topic does not hold (an
operator made them) are published on it by the job's writer with those answers, in every batch that uses them
until this process has read them back: a batch that Spark runs again publishes them again, and a term
published twice is the same record (ids are stable hashes).
"""

from __future__ import annotations

import time
from typing import Any, Iterable, Mapping

from cbgp.terms import TermDictionary
from services import codec
from spark.topic_tail import TopicTail, per_process

__all__ = ["FleetTerms", "fleet_terms"]


class FleetTerms(TermDictionary):
    """Stable term ids: decodes an id from the dictionary topic when it is not known here, and knows which ids
    it has read there (:meth:`published`)."""

    __slots__ = ("_tail", "_fleet")

    def __init__(self, client_config: Mapping[str, Any], topic: str) -> None:
        super().__init__(stable=True)
        self._fleet: set[int] = set()  # ids read from the topic
        self._tail = TopicTail(client_config, topic, "cbgp-spark-terms")

    @property
    def topic(self) -> str:
        return self._tail.topic

    @property
    def partitions(self) -> list[int]:
        return self._tail.partitions

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
            self._tail.read_to_end(self._apply, deadline, batch=5000)
            missing = {i for i in missing if self.lookup_id(i) is None}
            if missing:
                time.sleep(0.05)  # ingest commits a term before the update that uses it: it is coming

    def lookup_id(self, term_id: int) -> str | None:
        return self._terms.get(term_id)

    def _apply(self, msg: Any) -> None:
        if msg.value() is None:
            return
        try:
            entries = codec.dictionary_entries(msg.value())
        except codec.CodecError:
            return
        for term_id, term in entries:
            self.add(term_id, term)
            self._fleet.add(term_id)


def fleet_terms(client_config: Mapping[str, Any], topic: str) -> FleetTerms:
    """This process's dictionary for (brokers, topic)."""
    return per_process(FleetTerms, client_config, topic)
