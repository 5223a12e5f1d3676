"""Ingest survives retention below its checkpoint, on the embedded broker.

Ingest processes a first part of a stream and checkpoints; it is killed -9; a second life restores from that
checkpoint, processes a second part without checkpointing and is killed -9 too (so the checkpoint is stale);
every record of updates.encoded below the checkpoint is deleted (``AdminClient.delete_records``, as retention
would); a third life restores from the stale checkpoint plus the tail after it, and processes the rest.  The
whole encoded output (seqs, signs, quads, refreshes) equals what one uninterrupted processor makes of the
same raw records: no insert of a present triple numbered again, deletes of absent triples still dropped.
A restore from offset 0 would have refused the truncated log (``tests/services/kafka/test_truncation.py``).
"""

from __future__ import annotations

import logging
import re
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from services import codec
from services.ingest.core import IngestProcessor, RawRecord
from services.ingest.service import restore, save_checkpoint
from services.kafka.config import KafkaSettings
from services.kafka.client import delete_topics, end_offsets, make_producer, read_all
from services.kafka.topics import ensure_topics
from services.state.store import Store
from tests.fixtures.broker import fresh_settings
from tests.fleet_support import Fleet, generate_patch, publish_patch

PER_MESSAGE = 50


def _processed(settings: KafkaSettings, raw_records: int, timeout: float = 90.0) -> None:
    """Until ingest's group has committed every raw record (each commit is its transaction's)."""
    consumer = Consumer(settings.consumer_config(f"{settings.topic_prefix}ingest"))
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            committed = consumer.committed([TopicPartition(settings.topic("updates.raw"), 0)], timeout=10)[0].offset
            if committed >= raw_records:
                return
            time.sleep(0.2)
        raise TimeoutError(f"ingest committed {committed} of {raw_records} raw records in {timeout}s")
    finally:
        consumer.close()


def _wait_log(fleet: Fleet, name: str, pattern: str, timeout: float = 60.0) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, fleet.log_text(name))
        if found:
            return found
        time.sleep(0.2)
    raise TimeoutError(f"{name} did not log {pattern!r}:\n{fleet.log_text(name)[-3000:]}")


def _kill9(fleet: Fleet, name: str) -> None:
    proc = fleet.procs.pop(name)
    proc.kill()
    proc.wait(10)


def _rows(messages: list) -> list[tuple]:
    return [(seq, sign, s, p, o, g, refresh) for msg in messages
            for seq, sign, s, p, o, g, _t, _role, refresh in codec.encoded_changes(msg.value())]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("on_disk", [False, True], ids=["in-memory", "state-on-disk"])
def test_ingest_restores_from_a_stale_checkpoint_after_the_log_below_it_was_deleted(
        kafka_broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
        on_disk: bool) -> None:
    """(``state-on-disk``: the presence set and the terms stay in the store; no snapshot goes to
    Kafka, each life opens the store.)"""
    s = fresh_settings(kafka_broker, partitions=4)
    ensure_topics(s)
    # A SIGKILLed member is never expired by noida-db: a static member id lets the next life replace it at once.
    monkeypatch.setenv("CBGP_KAFKA_GROUP_INSTANCE_ID", f"{s.topic_prefix}ingest")
    lines = generate_patch(1800, seed=5)
    parts = [lines[:600], lines[600:1200], lines[1200:]]
    encoded = s.topic("updates.encoded")
    state = ["--instance-id", "ckpt", "--state-dir", str(tmp_path / "state")] + (["--state-on-disk"] if on_disk else [])

    # What one processor that never stops makes of the same raw records (event times aside).
    reference = IngestProcessor(s, 4, 4)
    expected: list[tuple] = []
    for offset, start in enumerate(range(0, len(lines), PER_MESSAGE)):
        text = ("\n".join(lines[start:start + PER_MESSAGE]) + "\n").encode()
        for out in reference.process(RawRecord(text, {}, s.topic("updates.raw"), 0, offset, 1)):
            if out.topic == encoded:
                expected.extend((seq, sign, q0, q1, q2, q3, refresh) for seq, sign, q0, q1, q2, q3, _t, _role, refresh
                                in codec.encoded_changes(out.value))
    assert any(r[-1] for r in expected) and reference.seq < len(lines)  # refreshes and dropped no-ops happen

    raw_sent = 0
    with Fleet(s, tmp_path / "logs") as fleet:
        # Life 1: checkpoints after every transaction; killed once the first part is in a checkpoint.
        fleet.start("ingest", "ingest", *state, "--checkpoint-interval", "0")
        publish_patch(s, parts[0], PER_MESSAGE)
        raw_sent += -(-len(parts[0]) // PER_MESSAGE)
        _processed(s, raw_sent)
        high = end_offsets(s, encoded)[0][1]
        _wait_log(fleet, "ingest", rf"event=checkpoint .*{re.escape(encoded)}\[0\]@{high}\b")
        _kill9(fleet, "ingest")
        checkpoint_position = high

        # Life 2: restores from it, processes the second part, never checkpoints (killed before its interval).
        fleet.start("ingest", "ingest", *state, "--checkpoint-interval", "3600")
        publish_patch(s, parts[1], PER_MESSAGE)
        raw_sent += -(-len(parts[1]) // PER_MESSAGE)
        _processed(s, raw_sent)
        _kill9(fleet, "ingest")
        second_life = fleet.log_text("ingest").split("event=started")[-1]
        assert "from_checkpoint=True" in second_life and "event=checkpoint " not in second_life

        before = read_all(s, encoded, timeout=30)
        admin = AdminClient(s.admin_config())
        for future in admin.delete_records([TopicPartition(encoded, 0, checkpoint_position)],
                                           request_timeout=10).values():
            future.result(10)
        assert end_offsets(s, encoded)[0][0] == checkpoint_position

        # Life 3: the stale checkpoint plus the tail above it, then the rest of the stream.
        fleet.start("ingest", "ingest", *state, "--checkpoint-interval", "0")
        publish_patch(s, parts[2], PER_MESSAGE)
        raw_sent += -(-len(parts[2]) // PER_MESSAGE)
        _processed(s, raw_sent)
        third_life = fleet.log_text("ingest").split("event=started")[-1]
        restored = re.search(r"event=restored seq=(\d+) .*from_checkpoint=True tail_records=(\d+)", third_life)
        assert restored and int(restored.group(2)) > 0, third_life[-3000:]
        assert "checkpoint-discarded" not in fleet.log_text("ingest") and "Traceback" not in fleet.log_text("ingest")
        if on_disk:
            assert "source=store" in third_life
            assert end_offsets(s, s.topic("checkpoints.ingest"))[0][1] == 0  # no snapshot of it in Kafka
        after = read_all(s, encoded, timeout=30)

    last_before = max(m.offset() for m in before)
    rows = _rows(before) + _rows([m for m in after if m.offset() > last_before])
    assert rows == expected


def _publish(settings: KafkaSettings, processor: IngestProcessor, lines: list[str]) -> None:
    """Run ``lines`` through ``processor`` and write its encoded and dictionary records (as ingest would)."""
    producer = make_producer(settings)
    for i in range(0, len(lines), PER_MESSAGE):
        text = ("\n".join(lines[i:i + PER_MESSAGE]) + "\n").encode()
        for out in processor.process(RawRecord(text, {}, settings.topic("updates.raw"), 0, i, 1)):
            if out.topic in (settings.topic("updates.encoded"), settings.topic("dictionary")):
                producer.produce(out.topic, out.value, out.key, partition=out.partition)
    assert producer.flush(10) == 0


def _ends(settings: KafkaSettings) -> dict[str, dict[int, int]]:
    return {t: {p: hi for p, (_lo, hi) in end_offsets(settings, t).items()}
            for t in (settings.topic("updates.encoded"), settings.topic("dictionary"))}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_checkpoint_that_cannot_belong_to_the_logs_is_discarded_and_the_restore_reads_them_from_0(
        kafka_broker, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    s = fresh_settings(kafka_broker, partitions=4)
    ensure_topics(s)
    lines = generate_patch(400, seed=9)
    first = IngestProcessor(s, 4, 4)
    first.track_changes = True
    _publish(s, first, lines[:200])
    position = _ends(s)[s.topic("updates.encoded")][0]
    with Store(tmp_path / "store") as store:
        save_checkpoint(first, store, _ends(s))

    def restored() -> IngestProcessor:
        processor = IngestProcessor(s, 4, 4)
        with caplog.at_level(logging.INFO, logger="cbgp"), Store(tmp_path / "store") as store:
            restore(processor, s, store)
        return processor

    # The topics deleted and re-created with less in them: the checkpoint is beyond their ends.
    delete_topics(s, [s.topic(t) for t in ("updates.encoded", "dictionary")])
    ensure_topics(s)
    other = IngestProcessor(s, 4, 4)
    _publish(s, other, lines[200:260])
    caplog.clear()
    got = restored()
    assert got.present == other.present and got.seq == other.seq and got.published == other.published
    discarded = [r.getMessage() for r in caplog.records if "checkpoint-discarded" in r.getMessage()]
    assert len(discarded) == 1 and "beyond the log's end" in discarded[0]

    # Re-created again with more than the checkpoint's positions (so they are not beyond the ends): the first
    # change after the position does not follow the checkpoint's seq, and the restore starts over from 0.
    with Store(tmp_path / "store") as store:
        save_checkpoint(first, store, _ends(s))
    delete_topics(s, [s.topic(t) for t in ("updates.encoded", "dictionary")])
    ensure_topics(s)
    foreign = IngestProcessor(s, 4, 4)
    _publish(s, foreign, lines[100:400])
    assert _ends(s)[s.topic("updates.encoded")][0] > position
    caplog.clear()
    got = restored()
    assert got.present == foreign.present and got.seq == foreign.seq and got.published == foreign.published
    discarded = [r.getMessage() for r in caplog.records if "checkpoint-discarded" in r.getMessage()]
    assert len(discarded) == 1 and "the first record after the checkpoint" in discarded[0], discarded
