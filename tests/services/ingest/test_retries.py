"""Ingest takes each numbered record of a ``cbgp publish`` once (``services.ingest.retries``): a producer retry
that repeats a batch, alone or between the records of another publish, is dropped; records without the numbering
are always taken; what was taken survives a restore through the raw offsets' commit metadata (through the
embedded broker: a new life of the service drops a copy of a record the last one took)."""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import pytest

from services import codec
from services.ingest import retries as retries_module
from services.ingest.retries import KEPT_IDS, MAX_ID_CHARS, Retries
from services.ingest.service import IngestService, register
from services.kafka.client import broker_outages, make_producer, read_all
from services.kafka.topics import ensure_topics
from services.runtime.life import commit_transaction, set_life
from services.wire.records import NUMBER_HEADER, PUBLISH_HEADER
from tests.fixtures.broker import fresh_settings


def _numbered(publish: str, number: int) -> dict[str, bytes]:
    return {PUBLISH_HEADER: publish.encode(), NUMBER_HEADER: str(number).encode()}


def test_a_retried_batch_is_dropped_and_the_records_after_it_are_taken() -> None:
    taken = Retries()
    sent = [1, 2, 3, 2, 3, 4, 5, 4, 5, 6]  # (batches 2-3 and 4-5 each sent twice, as a retry does)
    copies = [taken.is_copy(0, offset, _numbered("a" * 32, n)) for offset, n in enumerate(sent)]
    assert copies == [False, False, False, True, True, False, False, True, True, False]


def test_publishes_written_at_once_are_told_apart_and_each_partition_is_its_own() -> None:
    taken = Retries()
    assert not taken.is_copy(0, 0, _numbered("A", 1))
    assert not taken.is_copy(0, 1, _numbered("B", 1))
    assert not taken.is_copy(0, 2, _numbered("A", 2))
    assert taken.is_copy(0, 3, _numbered("B", 1)), "B's retry after A's next record"
    assert not taken.is_copy(0, 4, _numbered("B", 2))
    assert not taken.is_copy(1, 0, _numbered("A", 1)), "another raw partition keeps its own numbers"


def test_records_without_the_numbering_or_with_a_malformed_one_are_always_taken() -> None:
    taken = Retries()
    for _ in range(2):
        assert not taken.is_copy(0, 0, {})
        assert not taken.is_copy(0, 0, {PUBLISH_HEADER: b"A"})  # (no number)
        assert not taken.is_copy(0, 0, {PUBLISH_HEADER: b"A", NUMBER_HEADER: b"one"})
        assert not taken.is_copy(0, 0, {PUBLISH_HEADER: b"\xff\xfe", NUMBER_HEADER: b"1"})
        assert not taken.is_copy(0, 0, {PUBLISH_HEADER: b"x" * (MAX_ID_CHARS + 1), NUMBER_HEADER: b"1"})
        assert not taken.is_copy(0, 0, {PUBLISH_HEADER: b"A", NUMBER_HEADER: b"9" * 400})
    assert taken.taken == {}, "nothing remembered of them"


def test_the_most_recent_publishes_are_remembered_and_the_metadata_stays_under_a_brokers_limit() -> None:
    taken = Retries()
    for i in range(KEPT_IDS + 1):
        taken.is_copy(0, i, {PUBLISH_HEADER: f"{i:0{MAX_ID_CHARS}d}".encode(), NUMBER_HEADER: str(2**63 - 1).encode()})
    assert len(taken.taken[0]) == KEPT_IDS and f"{0:0{MAX_ID_CHARS}d}" not in taken.taken[0]
    assert len(taken.metadata(0).encode()) < 3 * 1024  # (a Kafka broker keeps 4,096 bytes of commit metadata)


def test_the_metadata_restores_what_was_taken_and_unreadable_metadata_is_ignored_with_a_line(
        caplog: pytest.LogCaptureFixture) -> None:
    taken = Retries()
    for n in (1, 2):
        taken.is_copy(0, n, _numbered("A", n))
    taken.is_copy(0, 3, _numbered("B", 7))
    restored = Retries()
    restored.restore(0, taken.metadata(0))
    assert restored.is_copy(0, 4, _numbered("A", 2)) and restored.is_copy(0, 5, _numbered("B", 7))
    assert not restored.is_copy(0, 6, _numbered("A", 3))
    for hostile in ["{", "[1, 2]", json.dumps({"publish": [["A"]]}), json.dumps({"publish": "AA"}),
                    json.dumps({"publish": [["A", "2"], [3, 4], ["B" * 100, 5]]})]:
        after = Retries()
        with caplog.at_level(logging.WARNING, logger="cbgp.ingest"):
            after.restore(0, hostile)
        assert after.taken[0] == {} and not after.is_copy(0, 0, _numbered("A", 1)), hostile
    assert sum("commit-metadata-ignored" in r.getMessage() for r in caplog.records) >= 3
    other = Retries()
    other.restore(0, None)  # (nothing committed yet)
    assert other.taken[0] == {}


def _ingest_args(state_dir: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["ingest", "--instance-id", "i1", "--state-dir", str(state_dir),
                              "--checkpoint-interval", "-1"])


def _life(settings, state_dir: Path, records: int) -> None:  # type: ignore[no-untyped-def]
    """One life of ingest: poll, process and commit as the runner does until the raw log's first ``records``
    are committed."""
    service = IngestService(settings, _ingest_args(state_dir))
    set_life(broker_outages())
    service.open()
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            step = service.process(service.poll())
            if step is not None and step.offsets:
                commit_transaction(service.producer, step.outputs, step.offsets)
                service.committed(step)
                if step.detail.get(0) == records:
                    return
        raise AssertionError(f"ingest did not reach raw offset {records}")
    finally:
        service.close(clean=True)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ingest_takes_each_numbered_record_once_across_a_restart(embedded_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = fresh_settings(embedded_broker)
    ensure_topics(settings)
    raw_topic = settings.topic("updates.raw")
    producer = make_producer(settings)

    def send(number: int, publish: str = "p1") -> None:
        line = f"A <http://e/{publish}/s{number}> <http://e/p> <http://e/o> .\n"
        producer.produce(raw_topic, line.encode(), partition=0,
                         headers=[("cbgp-format", b"patch"), *(_numbered(publish, number).items())])

    before = retries_module.REPEATED._value.get()
    for n in (1, 2, 1, 2, 3):  # (1 and 2 again: a retried batch)
        send(n)
    send(1, "p2")  # another publish's first record: taken
    assert producer.flush(10) == 0
    _life(settings, tmp_path / "state", 6)
    for n in (3, 4):  # a copy of the last record the first life took, then the next
        send(n)
    assert producer.flush(10) == 0
    _life(settings, tmp_path / "state", 8)  # a new life: what was taken comes from the commit metadata

    subjects = [change.s for m in read_all(settings, settings.topic("updates.encoded"))
                for change in codec.encoded_changes(m.value())]
    assert len(subjects) == len(set(subjects)) == 5, "p1's s1, s2, s3 and s4 and p2's s1, each once"
    assert retries_module.REPEATED._value.get() - before == 3
