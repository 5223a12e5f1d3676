"""Ingest never saves a checkpoint whose positions were read from a broker that restarted since its life began.

noida-db can acknowledge a commit and then forget it across a graceful restart (it is not in its snapshot), and
the fleet's services notice the outage only afterwards.  Ingest's checkpoint takes its positions from the log
ends: read after such a restart, they are the ends of a log without the forgotten transaction, while the state
includes it (its terms marked published, its changes present), and a restore from it never wrote those terms
again (``LookupError: term ids ... are not on the dictionary topic`` in a worker, answers lost).  On the embedded
broker: ingest commits a batch and checkpoints, commits another, the broker restarts, and the next checkpoint is
refused (``TransactionFailed``: a new life restores from what the broker kept) with the store untouched.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, TopicPartition

from services.ingest.service import IngestService, register
from services.kafka.client import broker_outages, make_producer
from services.kafka.topics import ensure_topics
from services.runtime.life import TransactionFailed, commit_transaction, set_life
from tests.fixtures.broker import fresh_settings


def _ingest_args(state_dir: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["ingest", "--instance-id", "i1", "--state-dir", str(state_dir),
                              "--checkpoint-interval", "0"])


def _publish(settings, lines: list[str]) -> None:  # type: ignore[no-untyped-def]
    producer = make_producer(settings, idempotent=True)
    producer.produce(settings.topic("updates.raw"), ("\n".join(lines) + "\n").encode(), partition=0)
    assert producer.flush(10) == 0


def _one_batch(service: IngestService) -> None:
    """Poll until a batch comes, then process and commit it, as the runner does."""
    deadline = time.monotonic() + 60
    while True:
        step = service.process(service.poll())
        if step is not None and step.offsets:
            break
        assert time.monotonic() < deadline, "ingest read nothing"
    commit_transaction(service.producer, step.outputs, step.offsets)
    service.committed(step)
    service.wait_for_checkpoint()


def _wait_for_watermarks(service: IngestService) -> None:
    assert service.watermarks is not None
    deadline = time.monotonic() + 30
    while True:
        try:
            service.watermarks.get_watermark_offsets(TopicPartition(service.processor.t_encoded, 0), timeout=5)
            return
        except KafkaException:
            assert time.monotonic() < deadline, "the restarted broker did not answer"
            time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_checkpoint_after_a_broker_restart_is_refused_and_the_store_keeps_the_last_good_one(
        embedded_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = fresh_settings(embedded_broker)
    ensure_topics(settings)
    service = IngestService(settings, _ingest_args(tmp_path / "state"))
    set_life(broker_outages())
    service.open()
    try:
        _publish(settings, ["A <http://e/a> <http://e/p> <http://e/b> ."])
        _one_batch(service)  # committed, and checkpointed (interval 0)
        assert service.store is not None
        good = service.store.checkpoint()
        assert good is not None and good["facts"]["seq"] == 1
        _publish(settings, ["A <http://e/c> <http://e/p> <http://e/d> ."])
        _one_batch(service)
        second = service.store.checkpoint()
        assert second is not None and second["facts"]["seq"] == 2
        embedded_broker.restart()
        _wait_for_watermarks(service)  # (as a checkpoint a moment later would read them: from the restarted broker)
        with pytest.raises(TransactionFailed, match="ingest's checkpoint not saved"):
            service.checkpoint()
        assert service.store.checkpoint() == second
    finally:
        service.close(clean=False)
