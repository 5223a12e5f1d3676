"""``run_doctor``: all checks pass on the embedded broker and leave nothing behind; unreachable or
under-sized brokers give a short report with remedies, never a traceback."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from services.kafka.broker import free_port
from services.kafka.config import KafkaSettings
from services.commands.doctor import Check, format_report, run_doctor
from services.kafka.topics import retention_problems
from services.kafka.topics import TOPICS, WEEK_MS, TopicError, ensure_topics, spec

pytestmark = pytest.mark.timeout(120)

EXPECTED = [
    "metadata reachable",
    "brokers vs replication factor",
    "topic creation with explicit partitions",
    "idempotent producer",
    "produce/consume round trip",
    "end offsets equal records written",
    "consumer group join/commit/resume",
    "transactions with read_committed isolation",
    "compaction config accepted",
    "topic retention and cleanup.policy",
]


def topics_on(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


@pytest.mark.slow
def test_every_check_passes_on_the_embedded_broker_and_scratch_topics_are_removed(kafka_broker) -> None:  # type: ignore[no-untyped-def]
    settings = kafka_broker.settings(topic_prefix="doctortest.")
    checks = run_doctor(settings)
    assert [c.name for c in checks] == EXPECTED
    assert all(c.ok for c in checks), format_report(checks)
    assert not {t for t in topics_on(kafka_broker.bootstrap) if t.startswith("doctortest.")}
    report = format_report(checks)
    assert report.count("✓") == len(EXPECTED) and "✗" not in report
    assert report.endswith("10/10 checks passed: the broker is ready for cbgp")


@pytest.mark.slow
def test_a_replication_factor_the_cluster_cannot_meet_fails_with_a_remedy(kafka_broker) -> None:  # type: ignore[no-untyped-def]
    settings = kafka_broker.settings(topic_prefix="doctorrf.", replication_factor=3)
    checks = {c.name: c for c in run_doctor(settings)}
    assert checks["metadata reachable"].ok
    rf = checks["brokers vs replication factor"]
    assert not rf.ok and "1 broker(s) < replication factor 3" in rf.detail and "--replication-factor" in rf.remedy
    assert not checks["topic creation with explicit partitions"].ok
    assert "transactions with read_committed isolation" not in checks  # nothing to test on without topics
    assert not {t for t in topics_on(kafka_broker.bootstrap) if t.startswith("doctorrf.")}


def test_nothing_listening_is_one_clear_failed_check() -> None:
    settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}")
    checks = run_doctor(settings, timeout=2)
    assert len(checks) == 1
    check = checks[0]
    assert check.name == "metadata reachable" and not check.ok
    assert "transport failure" in check.detail.lower() or "timed out" in check.detail.lower()
    assert "--bootstrap-servers" in check.remedy
    report = format_report(checks)
    assert report.splitlines()[0].startswith("✗ metadata reachable: ")
    assert "Traceback" not in report and report.endswith("0/1 checks passed")


def test_report_has_one_line_per_check_with_remedies_only_for_failures() -> None:
    report = format_report([Check("a", True, "fine", "unused remedy"), Check("b", False, "broken", "fix it")])
    assert report.splitlines() == ["✓ a: fine", "✗ b: broken -> fix it", "1/2 checks passed"]


def test_catalogue_configs_have_no_retention_problem_and_broker_defaults_do() -> None:
    for t in TOPICS:
        assert retention_problems(t.name, t, t.topic_configs()) == [], t.name
    kafka_default = {"cleanup.policy": "delete", "retention.ms": str(WEEK_MS), "retention.bytes": "-1"}
    assert retention_problems("updates.encoded", spec("updates.encoded"), kafka_default) == [
        "updates.encoded: retention.ms=604800000, needs -1"]  # (bounded by its floor: a warning, not a refusal)
    assert retention_problems("checkpoints.ingest", spec("checkpoints.ingest"), kafka_default) == [
        "checkpoints.ingest: retention.ms=604800000, needs -1 (it holds the last checkpoints, whose writers delete "
        "the older ones themselves)"]
    assert retention_problems("updates.raw", spec("updates.raw"), kafka_default) == []
    assert retention_problems("deadletter", spec("deadletter"), {**kafka_default, "retention.ms": "3600000"}) == [
        f"deadletter: retention.ms=3600000, needs at least {WEEK_MS}"]
    assert retention_problems("deadletter", spec("deadletter"), {"cleanup.policy": "delete", "retention.ms": "-1"}) == []


def test_compaction_must_match_the_role() -> None:
    dictionary, answers = spec("dictionary"), spec("answers")
    assert retention_problems("d", dictionary, {"cleanup.policy": "delete", "retention.ms": "-1"}) == [
        "d: cleanup.policy=delete, needs compact (the latest value of every key is read from offset 0)"]
    # compact,delete deletes by age too: only safe with infinite retention
    assert retention_problems("d", dictionary, {"cleanup.policy": "compact,delete", "retention.ms": "-1"}) == []
    assert len(retention_problems("d", dictionary, {"cleanup.policy": "compact,delete", "retention.ms": "1000"})) == 1
    assert retention_problems("d", dictionary, {"cleanup.policy": "compact", "retention.ms": "1000"}) == []
    assert retention_problems("a", answers, {"cleanup.policy": "compact", "retention.ms": "-1"}) == [
        "a: cleanup.policy=compact, needs delete (compaction would drop all but the last record of each key)"]
    assert retention_problems("d", dictionary, {"cleanup.policy": "compact,delete", "retention.ms": "-1",
                                                "retention.bytes": "1073741824"}) == [
        "d: retention.bytes=1073741824, needs -1 (a restore reads it from offset 0)"]


@pytest.mark.slow
def test_fleet_topics_with_broker_default_retention_are_reported_one_line_each(kafka_broker) -> None:  # type: ignore[no-untyped-def]
    settings = kafka_broker.settings(topic_prefix="doctorret.")
    admin = AdminClient(settings.admin_config())
    # Created by hand as an older cbgp (or a broker default) would: no retention.ms, the dictionary not compacted.
    wrong = [NewTopic(settings.topic(n), num_partitions=spec(n).partitions_for(settings), replication_factor=1,
                      config={"cleanup.policy": "delete"}) for n in ("updates.encoded", "dictionary")]
    for future in admin.create_topics(wrong, request_timeout=10).values():
        future.result(10)
    try:
        # A service starting now refuses, in one line naming the compacted topic (the log bounded by its floor only
        # warns) ...
        with pytest.raises(TopicError, match="^refusing to start: .*doctorret.dictionary: cleanup.policy=delete, "
                           "needs compact"):
            ensure_topics(settings)
        ensure_topics(settings, check_configs=False)  # ... so create the rest as the catalogue says without it
        checks = [c for c in run_doctor(settings) if c.name == "topic retention and cleanup.policy"]
        assert [c.detail for c in checks] == [
            "doctorret.updates.encoded: retention.ms=604800000, needs -1",
            "doctorret.dictionary: cleanup.policy=delete, needs compact (the latest value of every key is read "
            "from offset 0)",
            "doctorret.dictionary: retention.ms=604800000, needs -1 (a restore reads it from offset 0)",
        ]
        assert all(not c.ok and "kafka-configs.sh --alter" in c.remedy for c in checks)
    finally:
        for future in admin.delete_topics([settings.topic(t.name) for t in TOPICS], request_timeout=10).values():
            future.result(10)
