"""Restores never go silently wrong (retention): a log whose records a restore needs were deleted
(retention, ``AdminClient.delete_records``) is refused in one line naming topic, partition, needed offset and
log start, and the service stops with exit code 3; topics a restore reads from offset 0 may not be configured,
nor found on the broker, with a retention that would delete them.

The decision functions are tested on plain values and fake clients; the broker tests truncate real logs with
``delete_records`` (noida-db 0.2.3 supports it and moves the low watermark, as Kafka does).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from services.runtime import life as runtime
from services.commands.main import main
from services.commands.doctor import run_doctor
from services.ingest.core import IngestProcessor, RawRecord
from services.ingest.service import restore
from services.metrics.instruments import RESTORE_MISSING_OFFSETS
from services.kafka.client import make_producer, read_all
from services.kafka.config import KafkaConfigError, KafkaSettings, add_kafka_flags, parse_topic_configs
from services.kafka.topics import (FROM_START, TOPICS, TopicError, check_existing_configs, ensure_topics, spec,
                                   wanted_configs)
from services.kafka.truncation import EXIT_TRUNCATED, LogTruncated, require_log_start, truncation
from services.runtime.life import Stopper
from services.kafka.fetch import Fetcher
from services.kafka.replay import read_range
from tests.fixtures.broker import fresh_settings

CBGP = str(Path(__file__).resolve().parents[3] / ".venv" / "bin" / "cbgp")


# ---------------------------------------------------------------------------------------- the decision


def test_a_restore_needing_records_below_the_log_start_is_refused_and_the_error_names_everything() -> None:
    assert truncation("t", 0, 0, 0) is None  # nothing deleted
    assert truncation("t", 0, 5, 3) is None  # deleted below what is needed
    assert truncation("t", 0, 3, 3) is None
    assert truncation("t", 0, 0, -1) is None  # log start unknown: not an error
    assert truncation("t", 0, 0, 4, end=0) is None  # nothing needed
    error = truncation("cbgp.updates.routed", 2, -2, 4)  # OFFSET_BEGINNING: offset 0 is needed
    assert isinstance(error, LogTruncated)
    assert (error.topic, error.partition, error.needed, error.log_start) == ("cbgp.updates.routed", 2, 0, 4)
    assert "cbgp.updates.routed[2]" in str(error) and "needs offset 0" in str(error)
    assert "log starts at 4" in str(error) and "\n" not in str(error)
    committed = truncation("cbgp.updates.raw", 0, 7, 9)  # a committed position whose records were deleted
    assert committed is not None and committed.needed == 7 and "offsets 7..8" in str(committed)
    assert truncation("t", 0, 2, 9, end=5) is not None  # all of [2, 5) gone


class _Watermarks:
    """A consumer that only answers get_watermark_offsets."""

    def __init__(self, lows: dict[int, int]) -> None:
        self.lows = lows

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return self.lows[tp.partition], 100


def test_require_log_start_raises_on_the_first_truncated_partition_and_sets_the_gauge() -> None:
    consumer = _Watermarks({0: 0, 1: 12})
    require_log_start(consumer, "x.topic", {0: 0, 1: 12})  # type: ignore[arg-type]
    with pytest.raises(LogTruncated) as caught:
        require_log_start(consumer, "x.topic", {0: 0, 1: 3})  # type: ignore[arg-type]
    assert (caught.value.partition, caught.value.needed, caught.value.log_start) == (1, 3, 12)
    assert RESTORE_MISSING_OFFSETS.labels("x.topic", "1")._value.get() == 9


def test_run_service_stops_with_one_line_and_exit_code_3_instead_of_restarting(
        caplog: pytest.LogCaptureFixture) -> None:
    lives = []

    def life(stopper: Stopper) -> None:
        lives.append(1)
        raise LogTruncated("cbgp.updates.encoded", 0, 0, 17)

    with caplog.at_level(logging.ERROR, logger="cbgp.runtime"):
        assert runtime.run_lives("ingest", life, Stopper()) == EXIT_TRUNCATED == 3
    assert lives == [1]  # not restarted into the same wrong state
    lines = [r.getMessage() for r in caplog.records if "log-truncated" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    for part in ("service=ingest", "topic=cbgp.updates.encoded", "partition=0", "needed_offset=0", "log_start=17"):
        assert part in lines[0]


# ---------------------------------------------------------------------------------------- topic configs


COMPACTED = {"dictionary", "queries.plans", "answers.current"}


def test_topics_read_from_offset_0_are_never_deleted_by_age_or_size() -> None:
    for t in TOPICS:
        configs = t.topic_configs()
        if t.name in COMPACTED:
            assert t.needed_from == FROM_START
            assert configs["retention.ms"] == "-1" and configs["retention.bytes"] == "-1", t.name
        elif t.name.startswith("checkpoints."):  # the writer deletes its older checkpoints, nothing else may
            assert t.unbounded and configs["retention.ms"] == "-1" and configs["retention.bytes"] == "-1", t.name
        elif t.name == "deltas.parts":  # kept by default; bounded by the answers service's checkpoints
            assert t.needed_from.startswith("checkpoints:") and configs["retention.ms"] == "-1", t.name
        elif t.name in ("updates.routed", "updates.encoded"):  # kept by default; bounded by the checkpoints'
            assert t.needed_from != FROM_START and configs["retention.ms"] == "-1", t.name  # (and ingest's) floor
        else:
            assert t.needed_from != FROM_START and int(configs["retention.ms"]) > 0, t.name


def test_topic_config_overrides_come_from_flags_and_env_and_round_trip() -> None:
    assert parse_topic_configs("x", "updates.raw:retention.ms=86400000; deadletter:retention.ms=3600000;"
                                    "updates.raw:retention.bytes=1073741824") == {
        "updates.raw": {"retention.ms": "86400000", "retention.bytes": "1073741824"},
        "deadletter": {"retention.ms": "3600000"}}
    with pytest.raises(KafkaConfigError, match="TOPIC:KEY=VALUE"):
        parse_topic_configs("CBGP_TOPIC_CONFIG", "updates.raw=1")
    env = {"CBGP_TOPIC_CONFIG": "updates.raw:retention.ms=86400000;admin:retention.ms=1000"}
    parser = add_kafka_flags(argparse.ArgumentParser())
    args = parser.parse_args(["--topic-config", "admin:retention.ms=2000", "--topic-config", "deadletter:retention.ms=5"])
    settings = KafkaSettings.from_args(args, env=env)
    assert settings.topic_configs == {"updates.raw": {"retention.ms": "86400000"}, "admin": {"retention.ms": "2000"},
                                      "deadletter": {"retention.ms": "5"}}  # a flag wins over the env
    assert KafkaSettings.from_env(settings.to_env()).topic_configs == settings.topic_configs


def test_bounded_topics_take_any_retention_but_a_topic_read_from_offset_0_refuses_one() -> None:
    settings = KafkaSettings(topic_configs={"updates.raw": {"retention.ms": "86400000"}})
    assert wanted_configs(spec("updates.raw"), settings)["retention.ms"] == "86400000"
    assert wanted_configs(spec("updates.encoded"), KafkaSettings(
        topic_configs={"updates.encoded": {"retention.ms": "604800000"}}))["retention.ms"] == "604800000"
    for name, change in (("checkpoints.ingest", {"retention.ms": "604800000"}),
                         ("queries.plans", {"cleanup.policy": "compact,delete", "retention.bytes": "10"}),
                         ("queries.plans", {"cleanup.policy": "delete"}),
                         ("dictionary", {"cleanup.policy": "compact,delete", "retention.ms": "1000"})):
        with pytest.raises(TopicError, match=f"would lose records a restore needs: {name}: "):
            wanted_configs(spec(name), KafkaSettings(topic_configs={name: change}))
    with pytest.raises(TopicError, match="unknown topic.*updates.rawx"):
        ensure_topics(KafkaSettings(topic_configs={"updates.rawx": {"retention.ms": "1"}}))


class _Entry:
    def __init__(self, value: str) -> None:
        self.value = value


class _Future:
    def __init__(self, value: object) -> None:
        self.value = value

    def result(self, timeout: float | None = None) -> object:
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


class _Admin:
    """describe_configs over fixed config dicts (or an error, as from a broker without DescribeConfigs)."""

    def __init__(self, configs: dict[str, dict[str, str]] | Exception) -> None:
        self.configs = configs

    def describe_configs(self, resources: list[ConfigResource], request_timeout: float) -> dict:
        if isinstance(self.configs, Exception):
            raise self.configs
        return {r: _Future({k: _Entry(v) for k, v in self.configs[r.name].items()}) for r in resources}


KAFKA_DEFAULT = {"cleanup.policy": "delete", "retention.ms": "604800000", "retention.bytes": "-1"}


def test_existing_topics_with_a_finite_retention_on_a_replayed_log_refuse_the_start_in_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    s = KafkaSettings(topic_prefix="p.")
    specs = {s.topic(t.name): t for t in TOPICS}
    fine = {name: wanted_configs(t, s) for name, t in specs.items()}
    assert check_existing_configs(_Admin(fine), s, specs) == []

    # A topic created by hand (or by auto-creation) with the broker's defaults: 7 days.
    broken = {**fine, "p.queries.plans": {**KAFKA_DEFAULT, "cleanup.policy": "compact,delete",
                                          "retention.bytes": "1073741824"}}
    with pytest.raises(TopicError) as caught:
        check_existing_configs(_Admin(broken), s, specs)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("refusing to start")
    assert "p.queries.plans: retention.ms=604800000, needs -1" in message
    assert "p.queries.plans: retention.bytes=1073741824, needs -1" in message

    # A bounded topic below its retention is a warning, not a refusal.
    short = {**fine, "p.updates.raw": {**KAFKA_DEFAULT, "retention.ms": "3600000"}}
    with caplog.at_level(logging.WARNING, logger="cbgp.topics"):
        assert check_existing_configs(_Admin(short), s, specs) == ["p.updates.raw: retention.ms=3600000, needs at least "
                                                                   "604800000"]
    # ... judged against the configured retention, not the catalogue's.
    day = KafkaSettings(topic_prefix="p.", topic_configs={"updates.raw": {"retention.ms": "3600000"}})
    assert check_existing_configs(_Admin(short), day, specs) == []


def test_a_broker_that_cannot_describe_configs_skips_the_check_with_one_log_line(
        caplog: pytest.LogCaptureFixture) -> None:
    s = KafkaSettings(topic_prefix="p.")
    with caplog.at_level(logging.WARNING, logger="cbgp.topics"):
        assert check_existing_configs(_Admin(NotImplementedError("DescribeConfigs unsupported")), s,
                                      {s.topic("updates.routed"): spec("updates.routed")}) == []
    lines = [r.getMessage() for r in caplog.records if "topic-config-check-skipped" in r.getMessage()]
    assert len(lines) == 1 and "DescribeConfigs unsupported" in lines[0]


# ---------------------------------------------------------------------------------------- on the broker


def _delete_below(settings: KafkaSettings, topic: str, partition: int, offset: int) -> None:
    admin = AdminClient(settings.admin_config())
    for future in admin.delete_records([TopicPartition(topic, partition, offset)], request_timeout=10).values():
        future.result(10)


def _set_config(settings: KafkaSettings, topic: str, key: str, value: str) -> None:
    admin = AdminClient(settings.admin_config())
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(10)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_services_startup_check_refuses_an_existing_replayed_log_with_a_finite_retention(
        kafka_settings: KafkaSettings, capsys: pytest.CaptureFixture[str]) -> None:
    s = kafka_settings
    assert ensure_topics(s) == []  # the catalogue as created passes its own check
    _set_config(s, s.topic("checkpoints.ingest"), "retention.ms", "3600000")
    with pytest.raises(TopicError, match=f"{s.topic('checkpoints.ingest')}: retention.ms=3600000, needs -1"):
        ensure_topics(s)
    flags = ["--bootstrap-servers", s.bootstrap_servers, "--topic-prefix", s.topic_prefix, "--partitions",
             str(s.partitions)]
    assert main(["topics", "create", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refusing to start" in err[0] and "checkpoints.ingest" in err[0]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_reading_a_truncated_log_from_where_a_restore_needs_it_fails_loudly(kafka_settings: KafkaSettings) -> None:
    s = kafka_settings
    topic = s.topic("updates.routed")
    producer = make_producer(s)
    for i in range(10):
        producer.produce(topic, value=f"r{i}".encode(), partition=1)
    assert producer.flush(10) == 0
    assert [m.offset() for m in read_range(s, topic, 1, 0, 10)] == list(range(10))
    _delete_below(s, topic, 1, 4)

    with pytest.raises(LogTruncated) as caught:
        list(read_range(s, topic, 1, 0, 10))
    assert (caught.value.topic, caught.value.partition, caught.value.needed, caught.value.log_start) == (topic, 1, 0, 4)
    with pytest.raises(LogTruncated):
        list(read_range(s, topic, 1, 2, 10))  # a committed position below the log start
    assert [m.offset() for m in read_range(s, topic, 1, 4, 10)] == list(range(4, 10))  # nothing needed is gone
    with pytest.raises(LogTruncated):
        read_all(s, topic, restore=True)
    assert len(read_all(s, topic)) == 6  # what a reader that does not check silently gets

    fetcher = Fetcher(s, "truncation-test", 100)
    try:
        with pytest.raises(LogTruncated):
            fetcher.set_positions({(topic, 1): -2})  # OFFSET_BEGINNING
        with pytest.raises(LogTruncated):
            fetcher.set_positions({(topic, 0): 0, (topic, 1): 3})  # a committed offset whose records are gone
        fetcher.set_positions({(topic, 0): 0, (topic, 1): 4})
    finally:
        fetcher.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ingest_restore_over_a_truncated_encoded_log_refuses_instead_of_forgetting_triples(
        kafka_settings: KafkaSettings) -> None:
    s = kafka_settings
    live = IngestProcessor(s, s.partitions, s.partitions)
    lines = ["A <http://ex.org/a> <http://ex.org/p> <http://ex.org/b> .",
             "A <http://ex.org/c> <http://ex.org/p> <http://ex.org/d> .",
             "A <http://ex.org/e> <http://ex.org/p> <http://ex.org/f> ."]
    producer = make_producer(s)
    for i, line in enumerate(lines):
        for out in live.process(RawRecord(line.encode(), {}, s.topic("updates.raw"), 0, i, 1000 + i)):
            if out.topic in (s.topic("updates.encoded"), s.topic("dictionary")):
                producer.produce(out.topic, value=out.value, key=out.key, partition=out.partition)
    assert producer.flush(10) == 0

    whole = IngestProcessor(s, s.partitions, s.partitions)
    restore(whole, s)
    assert whole.present == live.present and whole.seq == live.seq == 3

    _delete_below(s, s.topic("updates.encoded"), 0, 1)  # the first change is gone
    with pytest.raises(LogTruncated) as caught:
        restore(IngestProcessor(s, s.partitions, s.partitions), s)
    assert (caught.value.topic, caught.value.needed, caught.value.log_start) == (s.topic("updates.encoded"), 0, 1)

    # What the restore did before (read from the low watermark): a state that silently lacks the first triple,
    # so re-inserting it would be numbered and answered as a new change.
    partial = IngestProcessor(s, s.partitions, s.partitions)
    for msg in read_range(s, s.topic("updates.encoded"), 0, 1, 3):
        partial.restore_encoded(msg.value())
    assert len(partial.present) == len(live.present) - 1


def _service_exit(settings: KafkaSettings, service: str, tmp_path: Path, timeout: float = 90.0) -> tuple[int, str]:
    env = {**os.environ, **settings.to_env(), "PYTHONUNBUFFERED": "1"}
    log_path = tmp_path / f"{service}.log"
    args = [CBGP, service, "--metrics-port", "0"]
    if service == "registry":
        args += ["--web-port", "0", "--state-dir", str(tmp_path / "registry-state")]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
            code = -9
    return code, log_path.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("service, topic, partition", [
    ("ingest", "updates.encoded", 0),  # presence set and seq
    ("worker", "updates.routed", 0),  # a shard's star state
    ("answers", "deltas.parts", 2),  # DISTINCT counts and released positions
    ("registry", "queries.plans", 1),  # the registered set
])
def test_a_service_whose_restore_log_was_truncated_stops_with_one_line_and_exit_code_3(
        kafka_broker, tmp_path: Path, service: str, topic: str, partition: int) -> None:  # type: ignore[no-untyped-def]
    s = fresh_settings(kafka_broker, partitions=4)
    ensure_topics(s)
    producer = make_producer(s)
    for i in range(3):
        producer.produce(s.topic(topic), key=b"k", value=f"not-a-record-{i}".encode(), partition=partition)
    assert producer.flush(10) == 0
    if topic == "queries.plans":
        # DeleteRecords is refused on a compact-only topic (POLICY_VIOLATION, on Kafka as on noida-db);
        # compact,delete with retention.ms=-1 passes the startup check and allows it.
        _set_config(s, s.topic(topic), "cleanup.policy", "compact,delete")
    _delete_below(s, s.topic(topic), partition, 2)

    started = time.monotonic()
    code, log = _service_exit(s, service, tmp_path)
    assert code == EXIT_TRUNCATED, log[-3000:]
    truncated = [line for line in log.splitlines() if f"{s.topic(topic)}[{partition}] was truncated" in line]
    assert len(truncated) == 1, log[-3000:]
    assert "needs offset 0 but the log starts at 2" in truncated[0]
    assert "Traceback" not in log, log[-3000:]
    assert time.monotonic() - started < 90


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_doctor_names_every_partition_a_restore_could_not_read_from_offset_0(kafka_settings: KafkaSettings) -> None:
    s = kafka_settings

    def lines() -> list[tuple[bool, str]]:
        return [(c.ok, c.detail) for c in run_doctor(s) if c.name == "records restores need still present"]

    assert lines() == [(True, "7 topic(s) restores read still hold every record they need (from offset 0, or from "
                              "the last checkpoint)")]
    producer = make_producer(s)
    for i in range(3):
        producer.produce(s.topic("answers"), value=b"a", partition=3)
    assert producer.flush(10) == 0
    _delete_below(s, s.topic("answers"), 3, 1)
    found = lines()
    assert len(found) == 1 and not found[0][0]
    assert found[0][1].startswith(f"{s.topic('answers')}[3] was truncated: the restore needs offset 0 but the log "
                                  "starts at 1")
