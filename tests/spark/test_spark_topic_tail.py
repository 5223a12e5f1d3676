"""The plans and term-dictionary readers every Spark Python worker keeps (``spark.topic_tail``): each read finds
what was published since the last one, and between reads the consumer holds no partition -- an assigned
consumer at the end of a noida-db log fetches without pause, which made the broker the busiest process of a
windows run (0.64-0.76 core, against 0.10 once unassigned: ``bench/spark_stream_bench.py --only latency``)."""

from __future__ import annotations

import pytest

from services.kafka.config import KafkaSettings
from services.kafka.topics import ensure_topics
from spark.plan_topic import PlanCache
from tests.fleet_support import publish_plan, unpublish_plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

QUERY = "SELECT ?x WHERE { ?x <http://ex.org/p> ?y }"


def test_the_plans_reader_finds_new_plans_and_holds_no_partition_between_reads(kafka_settings: KafkaSettings) -> None:
    ensure_topics(kafka_settings)
    cache = PlanCache(kafka_settings.client_config(), kafka_settings.topic("queries.plans"))
    consumer = cache._tail._consumer
    assert cache.refresh() == {} and consumer.assignment() == []
    publish_plan(kafka_settings, "a", QUERY)
    publish_plan(kafka_settings, "b", QUERY)
    assert sorted(cache.refresh()) == ["a", "b"]
    assert consumer.assignment() == []
    unpublish_plan(kafka_settings, "a")
    publish_plan(kafka_settings, "b", QUERY.replace("?y", "?z"), version=2)
    plans = cache.refresh()
    assert sorted(plans) == ["b"] and plans["b"].version == 2
    assert consumer.assignment() == []
