"""Queries that stopped because their state would pass a bound, told on queries.status once each: a property
path's closure over CBGP_MAX_PATH_PAIRS (``cbgp.algebra.continuous.OperatorTree.failed``), or the closures of one
process together over CBGP_MAX_PATH_PAIRS_TOTAL (:func:`stop_the_largest`).

The services that keep operator trees (the answers service for by-centre ones, a worker for single-owner ones)
scan them at most every SCAN_SECONDS, stop the largest while their closures together pass the total, and produce
one ``ERROR`` QueryStatus per newly stopped registration in their next transaction; ``cbgp_queries_stopped`` counts
those a process has seen stop."""

from __future__ import annotations

import time
from typing import Any, Iterable

from prometheus_client import Gauge

from cbgp.query.limits import limit
from services.wire.records import Output, query_error

SCAN_SECONDS = 1.0
# One query may hold CBGP_MAX_PATH_PAIRS pairs (about 250 bytes each), and an owner may register a thousand: the
# queries of one process together hold at most this many (about 250 MB: the chart gives the answers service 512
# MiB), or the largest stop.
TOTAL_SETTING, DEFAULT_MAX_TOTAL_PAIRS = "CBGP_MAX_PATH_PAIRS_TOTAL", 1_000_000
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


def stop_the_largest(trees: Iterable[tuple[Any, int]], budget: int | None = None) -> None:
    """``trees``: the live operator trees of this process with the pairs their closures hold.  While they hold
    more than ``budget`` (CBGP_MAX_PATH_PAIRS_TOTAL) together, the one that holds the most stops (its state
    dropped, as over its own bound): the queries that cost the memory go, not the one that came last."""
    budget = limit(TOTAL_SETTING, DEFAULT_MAX_TOTAL_PAIRS) if budget is None else budget
    ranked = sorted(((pairs, i, tree) for i, (tree, pairs) in enumerate(trees)), key=lambda t: t[:2], reverse=True)
    total = sum(pairs for pairs, _i, _tree in ranked)
    for pairs, _i, tree in ranked:
        if total <= budget:
            return
        tree.stop(f"the property paths of this process's queries would hold {total:,} pairs together, more than "
                  f"{budget:,} ({TOTAL_SETTING}); this query held the most ({pairs:,})")
        total -= pairs


def pairs_by_query(trees: Iterable[tuple[str, Any, int]]) -> dict[str, int]:
    """The pairs of each query's closures (``cbgp_path_pairs``) from ``(query id, tree, pairs)``, stopped trees left
    out."""
    totals: dict[str, int] = {}
    for query_id, tree, pairs in trees:
        if tree.failed is None:
            totals[query_id] = totals.get(query_id, 0) + pairs
    return totals
