"""``make run``'s trimmer: every interval, what the fleet no longer needs of its internal logs is deleted (the
embedded broker's cost grows with what it stores), the topics users read back are left alone, and nothing is done
while nothing was written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from services.commands.trimmer import INTERNAL_LOGS, Trimmer
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
