"""``services.background.service.StreamKeys`` on the embedded broker: the background service reads updates.encoded from
the windows' horizon (``offsets_for_times``), hands every change to the core, follows what comes next, and
stops reading when no windowed query needs it."""

from __future__ import annotations

import time

import pytest

from cbgp.change import Change
from services import codec
from services.background.service import StreamKeys
from services.kafka.config import KafkaSettings
from services.kafka.topics import ensure_topics
from services.kafka.client import make_producer
from tests.fleet_support import wait_for

pytestmark = pytest.mark.slow


class Core:
    def __init__(self, horizon_ms: float | None) -> None:
        self.horizon_ms = horizon_ms
        self.seen: list[int] = []

    def stream_horizon_ms(self) -> float | None:
        return self.horizon_ms

    def on_changes(self, changes) -> None:  # noqa: ANN001
        self.seen.extend(change[0] for change in changes)


def _publish(settings: KafkaSettings, seqs: list[int], timestamp_ms: int) -> None:
    producer = make_producer(settings)
    rows = [Change(seq, 1, 11, 12, 13, 0, timestamp_ms) for seq in seqs]
    producer.produce(settings.topic("updates.encoded"), codec.encode_encoded_batch(rows, [(0, s) for s in seqs],
                                                                                   "t.updates.raw"),
                     partition=0, timestamp=timestamp_ms)
    assert producer.flush(10) == 0


def test_stream_keys_reads_from_the_horizon_then_follows_and_closes(kafka_settings: KafkaSettings) -> None:
    ensure_topics(kafka_settings)
    now = int(time.time() * 1000)
    _publish(kafka_settings, [1, 2], now - 60_000)  # before the horizon: never read
    _publish(kafka_settings, [3], now - 5_000)
    stream = StreamKeys(kafka_settings)
    core = Core(horizon_ms=10_000)
    try:
        # (each follow() listens for a moment, as the service calls it every WINDOW_POLL_SECONDS: on a loaded
        # broker what was published may come at a later call)
        wait_for(lambda: stream.follow(core) or core.seen, what="the record inside the horizon")
        assert core.seen == [3]
        _publish(kafka_settings, [4, 5], now)
        wait_for(lambda: stream.follow(core) or len(core.seen) >= 3, what="the records published while following")
        assert core.seen == [3, 4, 5]
        core.horizon_ms = None  # the last windowed WSJ query is gone
        stream.follow(core)
        assert stream.consumer is None
    finally:
        stream.close()
