"""The answers service's dictionary follows the topic while deltas flow, so a delta with new terms after a quiet
spell does not wait for every term published meanwhile; it reads at most every DICTIONARY_FOLLOW_SECONDS."""

from __future__ import annotations

import time
import types

import pytest

from services import codec
from services.answers import side_inputs
from services.answers.side_inputs import Dictionary
from services.kafka.client import make_producer
from services.kafka.config import KafkaSettings


def publish(settings: KafkaSettings, ids: range, packed: bool = False) -> None:
    """Terms ``<urn:tN>`` for ``ids``, one DictionaryEntry each, or ``packed``: one DictionaryColumns per partition."""
    producer = make_producer(settings)
    topic, n = settings.topic("dictionary"), settings.partitions
    if packed:
        for partition in range(n):
            mine = [term_id for term_id in ids if term_id % n == partition]
            if mine:
                producer.produce(topic, codec.encode_dictionary_columns(mine, [f"<urn:t{i}>" for i in mine]),
                                 f"batch-{mine[0]}".encode(), partition=partition)
    else:
        for term_id in ids:
            producer.produce(topic, codec.encode_dictionary_entry(term_id, f"<urn:t{term_id}>"),
                             str(term_id).encode(), partition=term_id % n)
    producer.flush(30)


@pytest.mark.slow
def test_the_dictionary_reads_ahead_at_most_every_interval_and_waits_for_the_rest(kafka_settings, monkeypatch):
    clock = [1000.0]  # (the module's clock only: the fetcher's waits keep the real one)
    monkeypatch.setattr(side_inputs, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    publish(kafka_settings, range(1, 41))
    dictionary = Dictionary(kafka_settings)
    try:
        dictionary.follow()  # (no id asked for: read ahead)
        assert dictionary.terms == {i: f"<urn:t{i}>" for i in range(1, 41)}
        publish(kafka_settings, range(41, 61), packed=True)
        dictionary.follow()  # (within the interval: no fetch)
        assert 41 not in dictionary.terms
        clock[0] += side_inputs.DICTIONARY_FOLLOW_SECONDS
        dictionary.follow()
        assert set(dictionary.terms) == set(range(1, 61))
        assert dictionary.fetcher.parked  # (an idle assigned consumer would fetch in a tight loop)
        publish(kafka_settings, range(61, 71), packed=True)
        monkeypatch.setattr(side_inputs, "time", time)  # (wait_for's deadline runs on the real clock)
        dictionary.wait_for({70})  # (a delta's terms do not wait for the interval)
        assert dictionary.terms[70] == "<urn:t70>"
    finally:
        dictionary.close()
