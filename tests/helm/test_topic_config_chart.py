"""The Helm chart passes the topic configs (``kafka.topicConfig``) to every service and to the topics Job as
``CBGP_TOPIC_CONFIG``; the values it ships keep what restores need, and a value that would let a checkpoint or
compacted topic lose records is refused by the services (and the Job) in one line."""

from __future__ import annotations

from typing import Any

import pytest

from services.kafka.config import KafkaSettings
from services.kafka.topics import TOPICS, TopicError, catalogue, ensure_topics
from tests.helm.test_helm_chart import render


def _config(docs: list[dict[str, Any]]) -> dict[str, str]:
    maps = [d for d in docs if d["kind"] == "ConfigMap" and "CBGP_BOOTSTRAP_SERVERS" in d.get("data", {})]
    assert len(maps) == 1
    return maps[0]["data"]


def _job_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    jobs = [d for d in docs if d["kind"] == "Job" and d["spec"]["template"]["spec"]["containers"][0]["args"]
            == ["topics", "create"]]
    assert len(jobs) == 1
    return {e["name"]: e.get("value") for e in jobs[0]["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_the_chart_sets_the_bounded_topics_retention_explicitly_and_the_services_and_job_get_it() -> None:
    docs = render()
    raw = _config(docs)["CBGP_TOPIC_CONFIG"]
    assert _job_env(docs)["CBGP_TOPIC_CONFIG"] == raw
    settings = KafkaSettings.from_env({"CBGP_TOPIC_CONFIG": raw})
    assert settings.topic_configs == {name: {"retention.ms": "604800000"}
                                      for name in ("updates.raw", "admin", "queries.status", "deadletter", "answers")}
    entries = {e["name"]: e for e in catalogue(settings)}  # no refusal: the shipped values are safe
    for t in TOPICS:
        assert entries[f"cbgp.{t.name}"]["configs"] == t.topic_configs()


def test_a_chart_value_that_lets_a_compacted_topic_lose_records_is_refused_by_the_services_in_one_line() -> None:
    docs = render("--set", "kafka.topicConfig.updates\\.raw.retention\\.ms=86400000",
                  "--set", "kafka.topicConfig.dictionary.cleanup\\.policy=delete")
    raw = _config(docs)["CBGP_TOPIC_CONFIG"]
    assert "updates.raw:retention.ms=86400000" in raw and "dictionary:cleanup.policy=delete" in raw  # not 8.64e+07
    settings = KafkaSettings.from_env({"CBGP_TOPIC_CONFIG": raw, "CBGP_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    with pytest.raises(TopicError) as caught:
        ensure_topics(settings)  # refused before any broker round trip
    assert "\n" not in str(caught.value)
    assert "dictionary: cleanup.policy=delete, needs compact" in str(caught.value)
