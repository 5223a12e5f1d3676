"""The registered queries as the Spark job's Python workers see them: the compacted ``queries.plans`` topic.

Each Spark Python worker process keeps one :class:`PlanCache` per (brokers, topic), which reads only what was
appended since its last look (``spark.topic_tail``).  A plan is immutable per (query id, version); an
unregistration is a tombstone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping

from cbgp.query.sparql import QueryError
from cbgp.windows.spec import WindowError, WindowSpec
from services import codec
from services.wire.registrations import read_registration, recorded_placement, spark_multiplies
from spark.topic_tail import TopicTail, per_process

__all__ = ["PlanCache", "RegisteredPlan", "plan_cache"]

@dataclass(frozen=True)
class RegisteredPlan:
    query_id: str
    version: int
    sparql: str  # the plain SPARQL (RSP-QL window clauses removed)
    window: WindowSpec | None
    registered_at_seq: int
    placement: str | None = None  # where the registry placed it (plan_json's "placement"; None: not recorded)

    def assembled_by_spark(self, fleet_single_owner: bool) -> bool:
        """Whether the workers send this query's part deltas to the Spark job to multiply, as they decide it
        (``services.wire.registrations.spark_multiplies``): the fleet's placement, else the registry's
        record, else the query's own decomposition's."""
        try:
            return spark_multiplies(self.sparql, self.window, self.placement, fleet_single_owner)
        except QueryError:
            return False  # (the workers dead-letter it)


class PlanCache:
    """``query id -> RegisteredPlan`` for every currently registered query, refreshed on demand."""

    def __init__(self, client_config: Mapping[str, Any], topic: str) -> None:
        self.plans: dict[str, RegisteredPlan] = {}
        self.invalid: dict[str, str] = {}  # query id -> why its plan cannot be used (the worker dead-letters it)
        self._tail = TopicTail(client_config, topic, "cbgp-spark-plans")

    def refresh(self, timeout_s: float = 10.0) -> dict[str, RegisteredPlan]:
        """Read the topic up to its current end; return the registered plans."""
        self._tail.read_to_end(self._apply, time.monotonic() + timeout_s, batch=500)
        return self.plans

    def _apply(self, msg: Any) -> None:
        key, value = msg.key(), msg.value()
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
            placement = recorded_placement(record["plan_json"])
        except (codec.CodecError, WindowError, ValueError) as exc:
            self.plans.pop(query_id, None)
            self.invalid[query_id] = str(exc)
            return
        self.plans[query_id] = RegisteredPlan(query_id, record["version"], text, window, record["registered_at_seq"],
                                              placement)

    def close(self) -> None:
        self._tail.close()

    def get(self, query_id: str) -> RegisteredPlan | None:
        """The plan of ``query_id``, refreshing once if it is not known yet."""
        plan = self.plans.get(query_id)
        if plan is None:
            plan = self.refresh().get(query_id)
        return plan


def plan_cache(client_config: Mapping[str, Any], topic: str) -> PlanCache:
    """This process's cache for (brokers, topic)."""
    return per_process(PlanCache, client_config, topic)
