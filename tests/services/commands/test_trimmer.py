"""``make run``'s trimmer: every interval, what the fleet no longer needs of its internal logs is deleted (the
embedded broker's cost grows with what it stores), the topics users read back are left alone, and nothing is done
while nothing was written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from services.commands.trimmer import INTERNAL_LOGS, QUICK_LOGS, Trimmer
from services.kafka.client import end_offsets, make_consumer, make_producer
from services.kafka.config import KafkaSettings


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_the_trimmer_deletes_below_the_floor_of_the_internal_logs_only(kafka_settings: KafkaSettings,
                                                                       tmp_path: Path) -> None:
    s = kafka_settings
    producer = make_producer(s)
    for topic, count in (("updates.raw", 5), ("deadletter", 2)):
        for i in range(count):
            producer.produce(s.topic(topic), value=f"{topic}{i}".encode())
    assert producer.flush(10) == 0
    ingest = make_consumer(s, f"{s.topic_prefix}ingest")
    try:  # ingest has read the first 3 raw records: below them, nothing is needed
        ingest.commit(offsets=[TopicPartition(s.topic("updates.raw"), 0, 3)], asynchronous=False)
    finally:
        ingest.close()
    log = tmp_path / "trimmer.log"
    trimmer = Trimmer(s, 0.2, log).start()
    try:
        deadline = time.monotonic() + 30
        while "event=trimmed" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "the trimmer wrote no line"
            time.sleep(0.1)
        time.sleep(1.0)  # five more intervals with nothing written: no trim (an idle fleet costs nothing)
        assert len(log.read_text().splitlines()) == 1
    finally:
        trimmer.close()
    assert not trimmer.thread.is_alive()
    assert end_offsets(s, s.topic("updates.raw"))[0] == (3, 5)
    # the dead letters are needed by nobody (their floor is their end), but users read them: left alone
    assert end_offsets(s, s.topic("deadletter"))[0][0] == 0 and "deadletter" not in INTERNAL_LOGS
    assert "updates.raw[0]@3" in log.read_text().splitlines()[0]


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_the_raw_log_is_trimmed_every_quick_interval_before_any_full_pass(kafka_settings: KafkaSettings,
                                                                          tmp_path: Path) -> None:
    s = kafka_settings
    assert QUICK_LOGS == {"updates.raw": "ingest"}  # (its floor is ingest's committed offset alone)
    producer = make_producer(s)
    for topic in ("updates.raw", "updates.encoded"):
        for i in range(5):
            producer.produce(s.topic(topic), value=f"{topic}{i}".encode())
    assert producer.flush(10) == 0
    log = tmp_path / "trimmer.log"
    trimmer = Trimmer(s, 600, log, quick_interval=0.2).start()  # (no full pass within the test)
    ingest = make_consumer(s, f"{s.topic_prefix}ingest")
    try:
        time.sleep(1.0)  # nothing committed yet: nothing below ingest's position
        assert end_offsets(s, s.topic("updates.raw"))[0] == (0, 5)
        ingest.commit(offsets=[TopicPartition(s.topic("updates.raw"), 0, 4)], asynchronous=False)
        deadline = time.monotonic() + 30
        while end_offsets(s, s.topic("updates.raw"))[0] != (4, 5):
            assert time.monotonic() < deadline, "the raw log was not trimmed to ingest's committed offset"
            time.sleep(0.1)
    finally:
        ingest.close()
        trimmer.close()
    assert trimmer.quick_trims == 1 and trimmer.trims == 0
    # the logs whose floors read checkpoints wait for the full pass, and no line is written before it
    assert end_offsets(s, s.topic("updates.encoded"))[0] == (0, 5)
    assert not log.exists() or log.read_text() == ""
