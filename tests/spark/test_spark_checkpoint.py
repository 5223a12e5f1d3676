"""A Spark state dir belongs to the broker it was made against: a second ``make run`` starts
a fresh broker but finds the last run's checkpoints in ``.run/spark``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.kafka.broker import EmbeddedBroker
from services.kafka.topics import ensure_topics
from services.kafka.client import make_producer
from spark.job import claim_state, offsets_mismatch

pytestmark = [pytest.mark.slow]  # embedded brokers of its own

V1_META = '{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}'


def _checkpoint(path: Path, offsets: dict[str, int]) -> Path:
    (path / "offsets").mkdir(parents=True)
    (path / "offsets" / "0").write_text(f"v1\n{V1_META}\n{json.dumps(offsets)}")
    return path


def _fill(settings, topic: str, count: int) -> None:  # noqa: ANN001
    producer = make_producer(settings)
    for i in range(count):
        producer.produce(settings.topic(topic), value=b"x%d" % i, partition=0)
    assert producer.flush(10) == 0


def test_a_state_dir_made_against_another_broker_is_started_clean(tmp_path: Path) -> None:
    state = tmp_path / "state"
    checkpoints = {"windows": state / "checkpoint-windows", "compaction": state / "checkpoint"}
    with EmbeddedBroker(tmp_path / "first") as first:
        settings = first.settings()
        ensure_topics(settings)
        _fill(settings, "updates.encoded", 5)
        assert claim_state(settings, state, checkpoints, state / "snapshot") is None  # nothing there yet
        _checkpoint(checkpoints["windows"], {"0": 5})
        (state / "snapshot").mkdir()
        # the same broker again (a restarted job): the state is its own and is kept
        assert claim_state(settings, state, checkpoints, state / "snapshot") is None
        assert checkpoints["windows"].exists()
    with EmbeddedBroker(tmp_path / "second") as second:
        settings = second.settings()
        ensure_topics(settings)
        _fill(settings, "updates.encoded", 8)  # more records than the checkpoint read: offsets alone look fine
        assert offsets_mismatch(settings, "windows", checkpoints["windows"]) is None
        reason = claim_state(settings, state, checkpoints, state / "snapshot")
        assert reason is not None and "another cluster" in reason
        assert not checkpoints["windows"].exists() and not (state / "snapshot").exists()
        # from now on the state dir is this broker's
        _checkpoint(checkpoints["windows"], {"0": 8})
        assert claim_state(settings, state, checkpoints, state / "snapshot") is None
        assert checkpoints["windows"].exists()


def test_a_checkpoint_whose_offsets_are_past_the_topic_end_is_started_clean(tmp_path: Path) -> None:
    # a state dir from before the cluster marker existed: no identity to compare, but its offsets cannot be
    # this broker's
    state = tmp_path / "state"
    checkpoints = {"windows": _checkpoint(state / "checkpoint-windows", {"0": 151})}
    with EmbeddedBroker(tmp_path / "broker") as broker:
        settings = broker.settings()
        ensure_topics(settings)
        _fill(settings, "updates.encoded", 3)
        assert "151 > 3" in (offsets_mismatch(settings, "windows", checkpoints["windows"]) or "")
        reason = claim_state(settings, state, checkpoints, None)
        assert reason is not None and "past the end of" in reason
        assert not checkpoints["windows"].exists()
