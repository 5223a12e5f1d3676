"""GroupInput asks librdkafka for its group metadata once per assignment (the call waits for librdkafka's main
thread), and a rebalance drops the cached one: transactions commit offsets with the metadata of the member's
current generation, before and after another member joins."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from services.kafka.client import broker_outages, make_producer
from services.kafka.fetch import GroupInput
from services.runtime.life import commit_transaction

pytestmark = [pytest.mark.slow]


def _settle(members: list[GroupInput], partitions: int, timeout: float = 60.0) -> None:
    """Serve the members until their assignments cover the topic's partitions between them, each one's own."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for member in members:
            member.serve()
        held = [member.member.assignment() for member in members]
        if all(held) and sum(len(h) for h in held) == partitions:
            return
        time.sleep(0.05)
    raise AssertionError(f"no settled assignment within {timeout:.0f} s: {held}")


def _commit(producer: Any, member: GroupInput, topic: str, offset: int, life: int) -> None:
    tps = [TopicPartition(topic, tp.partition, offset) for tp in member.member.assignment()]
    commit_transaction(producer, [], [(tps, member.consumer_group_metadata())], timeout=30, life=life)


def test_the_group_metadata_is_kept_until_a_rebalance_and_commits_before_and_after_one(kafka_settings) -> None:
    settings, topic = kafka_settings, kafka_settings.topic("updates.routed")
    group = settings.topic("metadata-test")
    first = GroupInput(settings, group, [topic], 10)
    producer = make_producer(settings, transactional_id=f"{group}.tx")
    life = broker_outages()  # (the outages earlier tests' broker restarts counted are not this producer's)
    second = None
    try:
        _settle([first], settings.partitions)
        before = first.consumer_group_metadata()
        assert first.consumer_group_metadata() is before  # asked once
        _commit(producer, first, topic, 0, life)

        second = GroupInput(settings, group, [topic], 10)
        _settle([first, second], settings.partitions)
        after = first.consumer_group_metadata()
        assert after is not before  # the rebalance dropped it
        _commit(producer, first, topic, 0, life)
        committed = first.member.committed(list(first.member.assignment()), timeout=30)
        assert committed and all(tp.offset == 0 for tp in committed)
    finally:
        for member in (first, second):
            if member is not None:
                member.close()
