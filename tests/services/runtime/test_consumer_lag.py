"""``cbgp_consumer_lag`` of a caught-up reader is 0, also on topics written in transactions (an idle
fleet read 1, the commit marker after the last record counted as lag)."""

from __future__ import annotations

import time

import pytest

from services.kafka.config import KafkaSettings
from services.kafka.client import make_producer
from services.metrics.instruments import CONSUMER_LAG
from services.metrics.exposition import record_consumer_lag
from services.kafka.fetch import Fetcher


def _lag(topic: str, partition: int) -> float:
    return CONSUMER_LAG.labels(topic, str(partition))._value.get()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_caught_up_reader_of_a_transactional_topic_reports_no_lag(kafka_settings: KafkaSettings) -> None:
    topic = kafka_settings.topic("updates.encoded")  # one partition, written by ingest in transactions
    producer = make_producer(kafka_settings, transactional_id=kafka_settings.topic("lag-test"))
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, value=b"v%d" % i)
    producer.commit_transaction(10)  # offsets 0-2 are the records, 3 is the commit marker

    fetcher = Fetcher(kafka_settings, "lag-test", 100)
    try:
        fetcher.set_positions({(topic, 0): 0})
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 3 and time.monotonic() < deadline:
            got += fetcher.poll()
        assert [m.offset() for m in got] == [0, 1, 2]
        record_consumer_lag(fetcher.consumer, fetcher.positions)  # as the services do after each batch
        for _ in range(5):  # idle: nothing more to read
            assert fetcher.poll() == []
        assert _lag(topic, 0) == 0
        assert fetcher.positions[(topic, 0)] == 4  # past the marker: a re-assignment does not fetch it again
    finally:
        fetcher.close()
