"""The gateway's ``GET /fleet`` sampler samples only while someone asks, on the embedded broker.

Nobody asking, it takes no sample (an idle gateway costs nothing); asked, it answers with a fresh sample and
keeps sampling for ``keep`` seconds; asked again after a quiet spell, it answers with a new sample, not the
stale one.
"""

from __future__ import annotations

import time

import pytest

from services.gateway.kafka_io import FleetSampler
from services.kafka.client import make_producer
from services.kafka.config import KafkaSettings

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_the_fleet_sampler_samples_only_while_someone_asks(kafka_settings: KafkaSettings) -> None:
    sampler = FleetSampler(kafka_settings, every=0.2, keep=1.0)
    sampler.start()
    try:
        time.sleep(1.0)
        assert sampler.samples == 0 and sampler.state["state"] == "unknown", "nobody asked: nothing sampled"
        producer = make_producer(kafka_settings)
        for i in range(5):
            producer.produce(kafka_settings.topic("updates.raw"), value=b"<a> <b> <c%d> ." % i, partition=0)
        assert producer.flush(10) == 0
        state = sampler.current(wait=20)
        assert state["at_ms"] > 0 and state["ends"]["updates.raw"] == 5, "the first request waits for a sample"
        assert state["lag"] == {"ingest": None}, "ingest never committed: no lag to tell"
        time.sleep(0.8)
        assert sampler.samples >= 3, "sampling goes on while asked"
        assert sampler.current()["rates"] == {"updates.raw": 0.0, "updates.encoded": 0.0, "answers": 0.0}
        time.sleep(1.5)  # (past keep: quiet)
        quiet = sampler.samples
        time.sleep(1.0)
        assert sampler.samples == quiet, "nobody asks any more: no sample"
        stale = sampler.state["at_ms"]
        assert sampler.current(wait=20)["at_ms"] > stale, "asked after a quiet spell: a fresh sample"
    finally:
        sampler.stop()
        sampler.join(10)
    assert not sampler.is_alive()
