"""``cbgp topics floor``: per topic partition, the lowest offset the fleet still needs (issue 16 item 3).

Apart from :mod:`services.kafka.topics` because it reads offsets through :mod:`services.kafka.client`, which
itself imports the topics module.
"""

from __future__ import annotations

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from services.kafka.client import end_offsets, make_consumer
from services.kafka.config import KafkaSettings
from services.kafka.checkpoint_log import latest_positions
from services.kafka.topics import (CHECKPOINTS, FROM_START, GROUP, LATEST, NOTHING, TOPICS, BrokerUnreachable,
                                  TopicSpec)

__all__ = ["floor"]


def floor(settings: KafkaSettings, specs: tuple[TopicSpec, ...] | list[TopicSpec] = TOPICS,
          timeout: float = 15.0) -> dict[str, dict[str, int]]:
    """``{topic: {partition: offset}}``: per partition of each existing catalogue topic, the lowest offset the
    fleet still needs.  Records below it may be deleted (``delete_records``, or retention) without changing any
    answer.  0 for the logs a restore replays and for compacted topics; for a topic read by a consumer group
    (``updates.raw``: ingest, ``admin``: registry) the group's committed offset (0 before its first commit); the
    high watermark for a topic no service reads back; for a log whose readers restore from checkpoints
    (``deltas.parts``), the position of each partition's last checkpoint (0 without one); for a checkpoint
    topic, the first record of each partition's last checkpoint (its low watermark without one).  Topics not
    created yet are left out.
    """
    admin = AdminClient(settings.admin_config())
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise BrokerUnreachable(f"cannot list topics on {settings.bootstrap_servers}: {exc.args[0]}") from None
    result: dict[str, dict[str, int]] = {}
    for t in specs:
        name = settings.topic(t.name)
        if name not in existing:
            continue
        partitions = sorted(existing[name].partitions)
        if t.needed_from == FROM_START:
            offsets = {p: 0 for p in partitions}
        elif t.needed_from == NOTHING:
            offsets = {p: hi for p, (_, hi) in end_offsets(settings, name, timeout).items()}
        elif t.needed_from.startswith(GROUP):
            group = f"{settings.topic_prefix}{t.needed_from[len(GROUP):]}"
            consumer = make_consumer(settings, group)
            try:
                committed = consumer.committed([TopicPartition(name, p) for p in partitions], timeout=timeout)
            finally:
                consumer.close()
            offsets = {tp.partition: max(tp.offset, 0) for tp in committed}  # no commit yet (-1001): from 0
        elif t.needed_from.startswith(CHECKPOINTS):
            saved = latest_positions(settings, settings.topic(t.needed_from[len(CHECKPOINTS):]))
            offsets = {p: saved[p].position if saved.get(p) is not None else 0 for p in partitions}
        elif t.needed_from == LATEST:
            saved = latest_positions(settings, name)
            lows = {p: low for p, (low, _) in end_offsets(settings, name, timeout).items()}
            offsets = {p: saved[p].first_offset if saved.get(p) is not None else lows[p] for p in partitions}
        else:
            raise ValueError(f"{t.name}: unknown needed_from {t.needed_from!r}")
        result[name] = {str(p): offsets[p] for p in partitions}
    return result
