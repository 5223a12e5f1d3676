"""Broker conformance (reference notes §9 item 5): the broker behaviours the fleet relies on.

A noida-db upgrade or a broker swap (``CBGP_TEST_BOOTSTRAP=...``) that breaks one of these shows up here
before it shows up as wrong answers: exact high watermarks after batched produce (Tansu gets this wrong),
range rebalance of 4 partitions over 2 consumers, commit/resume, and read_committed transaction isolation
(Tansu and librdkafka's mock cluster both leak aborted records).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from services.kafka.broker import BrokerError, EmbeddedBroker
from services.kafka.client import (consume_until, end_offsets, make_consumer, make_producer, produce_sync,
                                   read_all, wait_assignment)
from services.kafka.config import KafkaSettings
from services.kafka.topics import TopicError, ensure_topics
from tests.fixtures.broker import fresh_settings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def test_topics_are_created_with_explicit_partitions_once(kafka_settings: KafkaSettings) -> None:
    assert ensure_topics(kafka_settings) == []  # the fixture already created them: idempotent
    assert len(end_offsets(kafka_settings, kafka_settings.topic("updates.routed"))) == 4
    assert len(end_offsets(kafka_settings, kafka_settings.topic("updates.encoded"))) == 1


def test_partition_count_mismatch_is_a_clear_error(kafka_settings: KafkaSettings) -> None:
    with pytest.raises(TopicError, match=r"updates\.routed has 4 partitions, expected 2"):
        ensure_topics(KafkaSettings(bootstrap_servers=kafka_settings.bootstrap_servers,
                                    topic_prefix=kafka_settings.topic_prefix, partitions=2))


def test_high_watermarks_are_exact_after_batched_produce(kafka_settings: KafkaSettings) -> None:
    topic = kafka_settings.topic("answers")
    producer = make_producer(kafka_settings, linger_ms=50)  # long linger: many records per batch
    for batch in range(3):
        for i in range(10):
            producer.produce(topic, value=b"x", partition=0)
        producer.flush(10)
        assert end_offsets(kafka_settings, topic)[0] == (0, 10 * (batch + 1))
    assert len(read_all(kafka_settings, topic)) == 30


def test_same_key_lands_on_the_same_partition(kafka_settings: KafkaSettings) -> None:
    topic = kafka_settings.topic("deltas.parts")
    producer = make_producer(kafka_settings)
    for i in range(200):
        producer.produce(topic, key=f"q{i % 20}".encode(), value=str(i).encode())
    producer.flush(10)
    partitions_of: dict[bytes, set[int]] = {}
    for msg in read_all(kafka_settings, topic):
        partitions_of.setdefault(msg.key(), set()).add(msg.partition())
    assert len(partitions_of) == 20 and all(len(ps) == 1 for ps in partitions_of.values())
    assert len({p for ps in partitions_of.values() for p in ps}) > 1  # and keys do spread


def _owned(consumer, timeout: float = 30.0) -> set[int]:  # type: ignore[no-untyped-def]
    return {tp.partition for tp in wait_assignment(consumer, timeout)}


def test_group_rebalances_four_partitions_over_two_consumers(kafka_settings: KafkaSettings) -> None:
    topic = kafka_settings.topic("updates.routed")
    a = make_consumer(kafka_settings, "rebalance", [topic])
    assert _owned(a) == {0, 1, 2, 3}
    b = make_consumer(kafka_settings, "rebalance", [topic])
    try:
        # Both must poll for the rebalance to complete; poll them alternately until each owns two.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            a.poll(0.1)
            b.poll(0.1)
            got_a = {tp.partition for tp in a.assignment()}
            got_b = {tp.partition for tp in b.assignment()}
            if len(got_a) == 2 and len(got_b) == 2:
                break
        assert got_a | got_b == {0, 1, 2, 3} and not got_a & got_b
    finally:
        b.close()
    deadline = time.monotonic() + 30
    while {tp.partition for tp in a.assignment()} != {0, 1, 2, 3} and time.monotonic() < deadline:
        a.poll(0.1)
    assert {tp.partition for tp in a.assignment()} == {0, 1, 2, 3}  # B left: A takes everything back
    a.close()


def test_committed_offsets_resume_a_restarted_consumer(kafka_settings: KafkaSettings) -> None:
    topic = kafka_settings.topic("answers")
    producer = make_producer(kafka_settings)
    for i in range(100):
        producer.produce(topic, key=str(i).encode(), value=f"first-{i}".encode())
    producer.flush(10)
    first = make_consumer(kafka_settings, "resume", [topic])
    assert len(consume_until(first, 100, commit=True)) == 100
    first.close()
    for i in range(40):
        producer.produce(topic, key=str(i).encode(), value=f"second-{i}".encode())
    producer.flush(10)
    second = make_consumer(kafka_settings, "resume", [topic])
    again = consume_until(second, 40)
    second.poll(1.0)  # nothing else should arrive
    assert sorted(m.value() for m in again) == sorted(f"second-{i}".encode() for i in range(40))
    second.close()


def test_read_committed_hides_aborted_transactions(kafka_settings: KafkaSettings) -> None:
    topic = kafka_settings.topic("deltas.parts")
    producer = make_producer(kafka_settings, transactional_id=f"{kafka_settings.topic_prefix}tx")
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, key=b"q", value=f"committed-{i}".encode())
    producer.commit_transaction(10)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, key=b"q", value=f"aborted-{i}".encode())
    producer.flush(10)  # really on the broker before the abort (abort would otherwise just purge them)
    producer.abort_transaction(10)
    producer.begin_transaction()
    producer.produce(topic, key=b"q", value=b"after")
    producer.commit_transaction(10)

    committed = [m.value() for m in read_all(kafka_settings, topic)]
    everything = [m.value() for m in read_all(kafka_settings, topic, isolation="read_uncommitted")]
    assert committed == [f"committed-{i}".encode() for i in range(5)] + [b"after"]
    assert len(everything) == 16 and b"aborted-3" in everything


def test_consume_transform_produce_commits_offsets_in_the_transaction(kafka_settings: KafkaSettings) -> None:
    source, sink = kafka_settings.topic("updates.raw"), kafka_settings.topic("updates.encoded")
    plain = make_producer(kafka_settings)
    for i in range(10):
        produce_sync(plain, source, f"in-{i}".encode())
    consumer = make_consumer(kafka_settings, "ctp", [source])
    txp = make_producer(kafka_settings, transactional_id=f"{kafka_settings.topic_prefix}ctp")
    records = consume_until(consumer, 10)
    txp.begin_transaction()
    for msg in records:
        txp.produce(sink, value=msg.value().upper())
    txp.send_offsets_to_transaction(consumer.position(consumer.assignment()), consumer.consumer_group_metadata())
    txp.commit_transaction(10)
    consumer.close()
    assert [m.value() for m in read_all(kafka_settings, sink)] == [f"IN-{i}".encode() for i in range(10)]
    checker = make_consumer(kafka_settings, "ctp")
    committed = checker.committed([TopicPartition(source, 0)], timeout=10)
    checker.close()
    assert committed[0].offset == 10


def test_embedded_broker_keeps_data_across_a_graceful_restart(embedded_broker: EmbeddedBroker) -> None:
    settings = fresh_settings(embedded_broker)
    ensure_topics(settings)
    producer = make_producer(settings)
    produce_sync(producer, settings.topic("admin"), b"survives")
    producer.flush(5)
    del producer  # closes its connections: otherwise librdkafka logs every refused reconnect during the restart
    old_pid = embedded_broker.pid
    embedded_broker.restart()
    assert embedded_broker.pid != old_pid and embedded_broker.running()
    assert [m.value() for m in read_all(settings, settings.topic("admin"))] == [b"survives"]
    embedded_broker.kill()
    assert not embedded_broker.running()
    embedded_broker.start()  # same data dir and port after a crash
    assert ensure_topics(settings) == []  # topics saved by the graceful stop survive the crash


def test_embedded_broker_runs_in_its_own_process_group(embedded_broker: EmbeddedBroker) -> None:
    # So a Ctrl-C in the terminal reaches the parent, which then stops the broker in order.
    assert os.getpgid(embedded_broker.pid) == embedded_broker.pid != os.getpgid(0)
    assert embedded_broker.log_path.read_text().count("kafka") >= 1


def test_a_taken_port_is_a_one_line_error_naming_the_cause(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        broker = EmbeddedBroker(tmp_path, port=busy.getsockname()[1], start_timeout=10)
        with pytest.raises(BrokerError, match="already in use") as info:
            broker.start()
    assert "\n" not in str(info.value) and not broker.running()


def test_an_auto_chosen_port_that_was_taken_moves_to_another(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        broker = EmbeddedBroker(tmp_path)
        broker.port = busy.getsockname()[1]  # as if another process grabbed our free port first
        with broker:
            assert broker.port != busy.getsockname()[1] and broker.running()
    assert not broker.running()
