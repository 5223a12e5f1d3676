"""Checkpoints kept in Kafka (``services.kafka.checkpoint_log``): chunked blobs a reader takes
whole or not at all, trimmed by their writer, refused when their HMAC does not match, and the positions
``cbgp topics floor`` reads."""

from __future__ import annotations

import os

import pytest

from services.kafka.checkpoint_log import CHUNK_BYTES, CheckpointLog, checkpoint_records, latest
from services.kafka.client import end_offsets, make_producer
from services.kafka.config import KafkaSettings
from services.commands.floor import floor
from services.runtime.life import produce_all

pytestmark = pytest.mark.slow


def _ends(settings: KafkaSettings, topic: str, partition: int) -> tuple[int, int]:
    return end_offsets(settings, topic)[partition]


def _write(settings: KafkaSettings, log: CheckpointLog, producer, shards) -> None:  # type: ignore[no-untyped-def]
    """One checkpoint round as a service does it: queue, then the records in the next transaction, then trim."""
    log.queue(shards)
    producer.begin_transaction()  # (services.runtime.life.commit_transaction's steps, without its life bookkeeping)
    produce_all(producer, log.take())
    producer.commit_transaction(30)
    log.committed()


@pytest.mark.timeout(120)
def test_the_last_whole_checkpoint_is_read_and_the_older_ones_are_deleted(kafka_settings: KafkaSettings) -> None:
    s = kafka_settings
    topic = s.topic("checkpoints.deltas")
    log = CheckpointLog(s, {"deltas": "unused", "d": topic}, "i1")
    producer = make_producer(s, transactional_id=f"{s.topic_prefix}ckpt-test")
    big = os.urandom(int(CHUNK_BYTES * 2.5))  # three chunks
    try:
        assert log.get("d", 1) is None
        _write(s, log, producer, [("d", 1, big, 40), ("d", 2, b"two", 7)])
        first = log.get("d", 1)
        assert first is not None and first.blob == big and first.position == 40 and first.first_offset == 0
        assert log.get("d", 2).blob == b"two"  # type: ignore[union-attr]

        newer = os.urandom(CHUNK_BYTES + 10)
        low_before = _ends(s, topic, 1)[0]
        _write(s, log, producer, [("d", 1, newer, 90)])
        second = log.get("d", 1)
        assert second is not None and (second.blob, second.position) == (newer, 90)
        low, high = _ends(s, topic, 1)
        assert low_before == 0 and low == second.first_offset > 0, "the older checkpoint was deleted, not the newer"
        assert latest(s, topic, 1, low, high) == second

        # a checkpoint whose transaction aborted is never read
        producer.begin_transaction()
        for out in checkpoint_records(topic, 1, b"d/1", b"aborted", 120, "x"):
            producer.produce(out.topic, out.value, out.key, partition=out.partition, headers=out.headers)
        producer.abort_transaction()
        assert log.get("d", 1) == second

        # what `cbgp topics floor` says: deltas.parts up to each partition's last checkpoint position is not needed
        _write(s, log, producer, [("d", 0, b"zero", 3)])
        got = floor(s)
        assert got[s.topic("deltas.parts")] == {"0": 3, "1": 90, "2": 7, "3": 0}
        assert got[topic]["1"] == second.first_offset and got[topic]["3"] == 0
    finally:
        log.close()


@pytest.mark.timeout(60)
def test_a_checkpoint_whose_hmac_does_not_match_is_refused(kafka_settings: KafkaSettings,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    s = kafka_settings
    monkeypatch.setenv("CBGP_CHECKPOINT_SECRET", "fleet-secret-0123456789")
    log = CheckpointLog(s, {"w": s.topic("checkpoints.whole")}, "i1")
    producer = make_producer(s, transactional_id=f"{s.topic_prefix}ckpt-hmac")
    try:
        _write(s, log, producer, [("w", 0, b"state", 5)])
        assert log.get("w", 0).blob == b"state"  # type: ignore[union-attr]
        monkeypatch.setenv("CBGP_CHECKPOINT_SECRET", "someone-else-0123456789")
        with caplog.at_level("WARNING"):
            assert log.get("w", 0) is None
        assert any("checkpoint-refused" in r.getMessage() and "HMAC" in r.getMessage() for r in caplog.records)
    finally:
        log.close()


@pytest.mark.timeout(120)
def test_doctor_accepts_deltas_deleted_below_the_last_checkpoint_and_names_those_deleted_above(
        kafka_settings: KafkaSettings) -> None:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from services.commands.doctor import run_doctor

    s = kafka_settings
    deltas = s.topic("deltas.parts")
    producer = make_producer(s)
    for i in range(5):
        producer.produce(deltas, value=b"d", partition=0)
    assert producer.flush(10) == 0
    log = CheckpointLog(s, {"deltas": s.topic("checkpoints.deltas")}, "i1")
    try:
        _write(s, log, make_producer(s, transactional_id=f"{s.topic_prefix}ckpt-doctor"), [("deltas", 0, b"s", 3)])
    finally:
        log.close()
    admin = AdminClient(s.admin_config())

    def delete_below(offset: int) -> list[tuple[bool, str]]:
        for future in admin.delete_records([TopicPartition(deltas, 0, offset)], request_timeout=10).values():
            future.result(10)
        return [(c.ok, c.detail) for c in run_doctor(s) if c.name == "records restores need still present"]

    assert delete_below(3) == [(True, "7 topic(s) restores read still hold every record they need (from offset 0, "
                                      "or from the last checkpoint)")]
    found = delete_below(4)
    assert len(found) == 1 and not found[0][0]
    assert found[0][1].startswith(f"{deltas}[0] was truncated: the restore needs offset 3 but the log starts at 4")
