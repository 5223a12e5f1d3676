"""``run_doctor``: all checks pass on the embedded broker and leave nothing behind; unreachable or
under-sized brokers give a short report with remedies, never a traceback."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from services.kafka.broker import free_port
from services.kafka.config import KafkaSettings
from services.kafka.doctor import Check, format_report, run_doctor

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
    assert report.endswith("9/9 checks passed: the broker is ready for cbgp")


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
