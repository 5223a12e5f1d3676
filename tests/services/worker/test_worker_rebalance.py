"""What a worker does with its shards when the group takes partitions away and gives them back.

Real broker and the real service object; the group's decisions are played by calling the rebalance
callbacks with a member of the worker's group (the same calls librdkafka makes).  The failure this guards
against: a worker whose partitions were revoked kept processing and committing them while its next
assignment was pending (noida-db can leave a JoinGroup unanswered for a minute), at the same time as the
worker that owned them now.
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from services.ingest.core import IngestProcessor, RawRecord
from services.ingest.core import replay_outputs
from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets, make_consumer, make_producer
from services.runtime.life import produce_all
from services.wire.records import query_partition
from services.worker.service import WorkerService
from tests.fleet_support import EX, QUERIES, generate_patch, publish_plan

pytestmark = [pytest.mark.slow]  # a real broker


def publish_encoded(settings: KafkaSettings, lines: list[str]) -> None:
    """Dictionary, encoded and routed records as ingest makes them (without running ingest)."""
    processor = IngestProcessor(settings, settings.partitions, len(end_offsets(settings, settings.topic("dictionary"))))
    raw = RawRecord(("\n".join(lines) + "\n").encode(), {}, settings.topic("updates.raw"), 0, 0, 1)
    producer = make_producer(settings)
    produce_all(producer, replay_outputs(processor, [raw]))
    assert producer.flush(30) == 0


def test_revoked_partitions_stop_at_once_and_come_back_only_unchanged(kafka_settings: KafkaSettings) -> None:
    settings = kafka_settings
    publish_plan(settings, "star", QUERIES["star"])  # routed: a shard per partition
    # A path per named graph whose graph is also its subject has one owner: one whole shard, on its partition
    publish_plan(settings, "grounded", f"SELECT * WHERE {{ GRAPH ?g {{ ?g <{EX}knows> ?b . ?b <{EX}knows> ?c . "
                                       f"?c <{EX}likes> <{EX}Tea> }} }}")
    owner = query_partition("grounded", settings.partitions)
    other = (owner + 1) % settings.partitions
    args = argparse.Namespace(group=None, instance_id="rebalance-test", batch=100, assembly="worker")
    service = WorkerService(settings, args)
    member = make_consumer(settings, service.group)  # answers committed() for the group, like the real member
    play_member(service, member)
    routed = settings.topic("updates.routed")
    every = [TopicPartition(routed, p) for p in range(settings.partitions)]

    def assign() -> None:  # as GroupInput does it: the partitions with their committed offsets
        service.on_assign(member, member.committed(every, timeout=30))
    try:
        service.load_plans()
        assign()
        assert {p for kind, p in service.core.shards if kind == "routed"} == set(range(settings.partitions))
        assert ("whole", owner) in service.core.shards and owner in service.encoded

        # Revoked: nothing of the partition is processed or committed from now on, however long the next
        # assignment takes.
        service.on_revoke(member, [TopicPartition(routed, owner)])
        assert ("routed", owner) not in service.core.shards
        assert ("whole", owner) not in service.core.shards and owner not in service.encoded
        committed = {tp.partition for parts, _meta in service._offsets() for tp in parts if tp.topic == routed}
        assert committed == set(range(settings.partitions)) - {owner}

        # Given back unchanged (nobody committed it meanwhile): the parked shard resumes as it was.
        parked = service.parked[owner][0]
        assign()
        assert service.core.shards[("routed", owner)] is parked
        assert ("whole", owner) in service.core.shards

        # Revoked, then processed by another worker (its committed offset moved): restored from the log.
        service.on_revoke(member, every)
        publish_encoded(settings, generate_patch(200, seed=3))
        moved = end_offsets(settings, routed)[other][1]
        assert moved > 0
        member.commit(offsets=[TopicPartition(routed, other, moved)], asynchronous=False)
        kept = service.parked[owner][0]
        assign()
        assert service.core.shards[("routed", owner)] is kept
        restored = service.core.shards[("routed", other)]
        assert restored.position == moved and restored.engine.state_entries() > 0
        assert not service.parked
    finally:
        service.close()
        member.close()


def test_snapshots_of_a_revoked_partition_are_left_to_its_next_owner(kafka_settings: KafkaSettings) -> None:
    """A plan applied at the start of an iteration queues the snapshot of every held partition; if the group
    revokes a partition before the transaction, its snapshot must not be produced (the next owner owes it by
    the committed metadata: both made it, and the two differently numbered copies doubled the answers in a
    kill -9 fault run) and the shard must not be parked without it."""
    settings = kafka_settings
    service, member = worker_over(settings, generate_patch(300, seed=4), "revoke-snapshot-test")
    routed = settings.topic("updates.routed")
    try:
        publish_plan(settings, "path", QUERIES["path"])  # by centre: a snapshot from every partition
        service.load_plans()  # applies the new plan: snapshots queued, as at the start of an iteration
        queued = {row[3] for rows in service.core.outputs.batched.values() for row in rows}
        assert len(queued) >= 2, f"the partitions with answers queued their snapshots: {queued}"
        gone = min(queued)
        service.on_revoke(member, [TopicPartition(routed, gone)])
        sources = {row[3] for rows in service.core.outputs.batched.values() for row in rows}
        assert sources == queued - {gone}
        assert gone not in service.parked, "a shard whose snapshot was dropped must be restored, not resumed"
    finally:
        service.close()
        member.close()


def test_a_revoked_partition_whose_snapshot_had_no_rows_is_restored_and_marks_the_registration_ready(
        kafka_settings: KafkaSettings) -> None:
    """A registration by centre that has no answers in a partition still owes the answers service that partition's
    ProbeReady mark (its gate opens once every partition sent one).  Revoked before the transaction, the mark is
    dropped with the snapshot: the shard must be restored, not resumed, if it comes back, so that it owes the mark
    again.  (Resumed, the registration looked applied and the gate stayed shut: its answers never came.)"""
    settings = kafka_settings
    service, member = worker_over(settings, generate_patch(100, seed=5), "revoke-mark-test")
    routed = settings.topic("updates.routed")
    try:
        publish_plan(settings, "none", f"SELECT ?x WHERE {{ ?x <{EX}absent> ?y }}")  # by centre, no answers
        service.load_plans()
        marks = lambda: {due[2] for due in service.core.outputs.ready_due if due[0] == "none"}  # noqa: E731
        assert marks() == set(range(settings.partitions)) and not service.core.outputs.batched
        service.on_revoke(member, [TopicPartition(routed, 0)])
        assert marks() == set(range(1, settings.partitions))
        assert 0 not in service.parked, "a shard whose ProbeReady mark was dropped must be restored, not resumed"
        service.on_assign(member, member.committed([TopicPartition(routed, 0)], timeout=30))
        service._process([m for m in read_partition(settings, routed, 0)], [])  # (nothing committed: from 0)
        assert marks() == set(range(settings.partitions)), "the restored shard owes the mark again"
    finally:
        service.close()
        member.close()


def play_member(service: WorkerService, member: Any) -> None:
    """``member`` as the worker's group input: its committed offsets and its group metadata (as GroupInput gives
    them); the test closes it."""
    service.consumer = member
    service.routed_in = SimpleNamespace(consumer_group_metadata=member.consumer_group_metadata, close=lambda: None)


def worker_over(settings: KafkaSettings, lines: list[str], instance_id: str) -> tuple[WorkerService, Any]:
    """A worker service (and a member of its group, to play the group's calls) holding every partition, with
    ``lines`` published and applied as its loop would."""
    publish_encoded(settings, lines)
    args = argparse.Namespace(group=None, instance_id=instance_id, batch=100, assembly="worker")
    service = WorkerService(settings, args)
    member = make_consumer(settings, service.group)
    play_member(service, member)
    routed = settings.topic("updates.routed")
    service.load_plans()
    service.on_assign(member, member.committed([TopicPartition(routed, p) for p in range(settings.partitions)],
                                               timeout=30))
    for partition in range(settings.partitions):
        service._process([m for m in read_partition(settings, routed, partition)], [])
    return service, member


def read_partition(settings: KafkaSettings, topic: str, partition: int) -> list:
    from services.kafka.replay import read_range

    high = end_offsets(settings, topic)[partition][1]
    return list(read_range(settings, topic, partition, 0, high))
