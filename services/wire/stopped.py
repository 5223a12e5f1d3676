"""Queries that stopped because their state would pass a bound (a property path's closure over
CBGP_MAX_PATH_PAIRS: ``cbgp.algebra.continuous.OperatorTree.failed``), told on queries.status once each.

The services that keep operator trees (the answers service for by-centre ones, a worker for single-owner ones)
scan them at most every SCAN_SECONDS and produce one ``ERROR`` QueryStatus per newly stopped registration in
their next transaction; ``cbgp_queries_stopped`` counts those a process has seen stop."""

from __future__ import annotations

import time
from typing import Iterable

from prometheus_client import Gauge

from services.wire.records import Output, query_error

SCAN_SECONDS = 1.0
QUERIES_STOPPED = Gauge("cbgp_queries_stopped", "Queries this process stopped: their state would pass a bound "
                        "(CBGP_MAX_PATH_PAIRS); each told once on queries.status.")


class StoppedQueries:
    """The registrations already told, and when to scan next."""

    def __init__(self, status_topic: str) -> None:
        self.topic = status_topic
        self.told: set[tuple[str, int]] = set()
        self.next_scan = 0.0

    def due(self) -> bool:
        now = time.monotonic()
        if now < self.next_scan:
            return False
        self.next_scan = now + SCAN_SECONDS
        return True

    def statuses(self, stopped: Iterable[tuple[str, int, str]]) -> list[Output]:
        """One ERROR status for each ``(query id, version, reason)`` not told yet."""
        out = []
        for query_id, version, reason in stopped:
            if (query_id, version) in self.told:
                continue
            self.told.add((query_id, version))
            out.append(Output(self.topic, query_error(query_id, f"query stopped: {reason}"), query_id.encode(), 0))
        QUERIES_STOPPED.set(len(self.told))
        return out
