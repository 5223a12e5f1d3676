"""Checkpoints kept in Kafka: a shard's saved state as records of a checkpoint topic, so that
any instance restores it -- not only the one whose disk holds it -- and ``cbgp topics floor`` can tell how much
of an input log the fleet no longer needs.

How it works: docs/design/internals.md, services.kafka.checkpoint_log.
"""

from __future__ import annotations

import hmac
import logging
import time
import uuid
import json
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient

from services.kafka.client import end_offsets
from services.kafka.replay import records_between
from services.kafka.config import KafkaSettings
from services.wire.records import Output
from services.wire.loglines import kv
from services.wire.sealed import CheckpointKeyMissing, mac

__all__ = ["CHUNK_BYTES", "CheckpointLog", "Saved", "checkpoint_records", "latest", "latest_positions"]

log = logging.getLogger("cbgp.state")

CHUNK_BYTES = 512 * 1024  # well under librdkafka's and Kafka's default 1 MB message size
H_ID, H_CHUNK, H_POSITION, H_MAC = "cbgp-checkpoint", "cbgp-chunk", "cbgp-position", "cbgp-hmac"
H_NEEDS = "cbgp-needs"


def _mac(checkpoint_id: str, position: int, needs: bytes | None, blob: bytes) -> bytes:
    """The HMAC of a checkpoint: of its blob and of the headers readers act on (its id, the position it reflects,
    what its restore needs of other logs, which ``cbgp topics trim`` deletes below), so none can be altered."""
    head = json.dumps([checkpoint_id, position, (needs or b"").decode("utf-8", "replace")]).encode()
    try:
        return mac(head + b"\0" + blob).hex().encode()
    except CheckpointKeyMissing:
        return b""


@dataclass(frozen=True)
class Saved:
    """The last whole checkpoint of a partition: its blob, the input position it reflects and the offset of
    its first chunk (everything below it may be deleted)."""

    blob: bytes
    position: int
    first_offset: int
    needs: Mapping[str, int] = field(default_factory=dict)  # what its restore reads of other logs (H_NEEDS)


def checkpoint_records(topic: str, partition: int, key: bytes, blob: bytes, position: int,
                       checkpoint_id: str, needs: Mapping[str, int] | None = None) -> list[Output]:
    """``blob`` as the chunk records of one checkpoint in ``topic[partition]`` (to produce in one transaction);
    ``needs``: what its restore reads of other logs (catalogue topic -> lowest offset), carried by the last chunk."""
    chunks = [blob[i:i + CHUNK_BYTES] for i in range(0, len(blob), CHUNK_BYTES)] or [b""]
    needs_header = json.dumps(dict(needs), sort_keys=True).encode() if needs else None
    last = [(H_MAC, _mac(checkpoint_id, position, needs_header, blob))] + \
        ([(H_NEEDS, needs_header)] if needs_header else [])
    return [Output(topic, chunk, key, partition,
                   [(H_ID, checkpoint_id.encode()), (H_CHUNK, f"{i}/{len(chunks)}".encode()),
                    (H_POSITION, str(position).encode())] + (last if i == len(chunks) - 1 else []))
            for i, chunk in enumerate(chunks)]


def _records(consumer: Consumer, topic: str, partition: int, low: int, high: int,
             timeout: float = 120.0) -> Iterator[Message]:
    """The committed records of ``topic[partition]`` from ``low`` (or the log start, if trimmed meanwhile) up to
    ``high``, through ``consumer`` (assigned here, unassigned after): one consumer serves every read of a restore,
    instead of a connection per shard.  Transaction markers take offsets, so the end is the consumer's position."""
    if high <= low:
        return
    try:
        yield from records_between(consumer, topic, partition, low, high, 500, timeout,
                                   f"reading the checkpoints of {topic}[{partition}] {low}..{high}")
    finally:
        consumer.unassign()


def _reader(settings: KafkaSettings) -> Consumer:
    return Consumer(settings.consumer_config(f"{settings.topic_prefix}checkpoints", enable_partition_eof=True,
                                             fetch_wait_max_ms=20))


def _needs(header: bytes | None) -> dict[str, int]:
    try:
        needs = json.loads(header) if header else {}
        return {str(topic): int(offset) for topic, offset in needs.items()}
    except (ValueError, TypeError, AttributeError):
        return {}  # (written by a newer fleet, say): it needs nothing this reader knows of


def latest(settings: KafkaSettings, topic: str, partition: int, low: int, high: int,
           consumer: Consumer | None = None) -> Saved | None:
    """The last whole checkpoint in ``topic[partition]`` between the watermarks ``low`` and ``high`` (read
    through ``consumer``, or one made for this read)."""
    if consumer is None:
        consumer = _reader(settings)
        try:
            return latest(settings, topic, partition, low, high, consumer)
        finally:
            consumer.close()
    found: Saved | None = None
    current, chunks, first = None, [], 0
    for msg in _records(consumer, topic, partition, low, high):
        headers = dict(msg.headers() or ())
        try:
            checkpoint_id = headers[H_ID].decode()
            index, count = (int(x) for x in headers[H_CHUNK].decode().split("/"))
            position = int(headers[H_POSITION])
        except (KeyError, ValueError, AttributeError):
            log.warning(kv(event="checkpoint-record-unreadable", topic=topic, partition=partition,
                           offset=msg.offset()))
            current, chunks = None, []
            continue
        if index == 0:
            current, chunks, first = checkpoint_id, [], msg.offset()
        if checkpoint_id != current or index != len(chunks):
            current, chunks = None, []  # a chunk out of its place: that checkpoint is not whole
            continue
        chunks.append(msg.value() or b"")
        if len(chunks) == count:
            blob = b"".join(chunks)
            expected = _mac(checkpoint_id, position, headers.get(H_NEEDS), blob)
            if expected and hmac.compare_digest(headers.get(H_MAC) or b"", expected):
                found = Saved(blob, position, first, _needs(headers.get(H_NEEDS)))
            else:
                log.warning(kv(event="checkpoint-refused", topic=topic, partition=partition, offset=first,
                               reason="its HMAC does not match (CBGP_CHECKPOINT_SECRET differs, or it was altered)"))
            current, chunks = None, []
    return found


def latest_positions(settings: KafkaSettings, topic: str) -> dict[int, Saved | None]:
    """Per partition of ``topic``, where its last whole checkpoint is and the position it reflects (None: none;
    the blobs are not kept: one partition's at a time is read)."""
    found = {}
    consumer = _reader(settings)
    try:
        for p, (low, high) in sorted(end_offsets(settings, topic).items()):
            saved = latest(settings, topic, p, low, high, consumer)
            found[p] = None if saved is None else Saved(b"", saved.position, saved.first_offset, saved.needs)
    finally:
        consumer.close()
    return found


class CheckpointLog:
    """A service's checkpoints in Kafka: ``topics`` maps a shard kind to its checkpoint topic.

    :meth:`queue` takes a checkpoint, :meth:`take` hands its records to the service's next transaction and
    :meth:`committed` trims the older checkpoints once that transaction committed; :meth:`get` reads the last
    whole checkpoint of a shard (None when there is none or it cannot be read: one log line)."""

    def __init__(self, settings: KafkaSettings, topics: Mapping[str, str], instance_id: str) -> None:
        self.settings = settings
        self.topics = dict(topics)
        self._topic_names = set(self.topics.values())
        self.instance_id = instance_id
        self._queued: list[Output] = []
        self._queued_trims: dict[tuple[str, int], int] = {}
        self._taken_trims: dict[tuple[str, int], int] = {}
        self._consumer: Consumer | None = None  # made on first use: a fleet that never checkpoints has none
        self._admin: AdminClient | None = None

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = _reader(self.settings)
        return self._consumer

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        return self._client().get_watermark_offsets(TopicPartition(topic, partition), timeout=30)

    def owns(self, output: Output) -> bool:
        """Whether ``output`` is a checkpoint record of this log."""
        return output.topic in self._topic_names

    def get(self, kind: str, partition: int) -> Saved | None:
        topic = self.topics[kind]
        try:
            low, high = self._watermarks(topic, partition)
            return latest(self.settings, topic, partition, low, high, self._client())
        except (KafkaException, TimeoutError) as exc:
            log.warning(kv(event="kafka-checkpoint-unreadable", topic=topic, partition=partition, reason=str(exc)))
            return None

    def queue(self, shards: Iterable[tuple]) -> int:
        """Queue the ``(kind, partition, blob, position[, needs])`` checkpoints for the next transaction."""
        count = 0
        stamp = f"{self.instance_id}/{int(time.time() * 1000)}/{uuid.uuid4().hex[:8]}"
        for kind, partition, blob, position, *needs in shards:
            topic = self.topics[kind]
            try:
                _low, high = self._watermarks(topic, partition)
            except KafkaException as exc:  # (a topic with too few partitions, say): the disk's checkpoint only
                log.warning(kv(event="kafka-checkpoint-skipped", topic=topic, partition=partition,
                               reason=exc.args[0].str() if hasattr(exc.args[0], "str") else str(exc)))
                continue
            # drop a checkpoint of the same shard queued earlier and not taken yet: this one is newer
            self._queued = [o for o in self._queued if (o.topic, o.partition) != (topic, partition)]
            self._queued.extend(checkpoint_records(topic, partition, f"{kind}/{partition}".encode(), blob, position,
                                                   stamp, needs[0] if needs else None))
            self._queued_trims.setdefault((topic, partition), high)
            count += 1
        return count

    def take(self) -> list[Output]:
        """The queued checkpoint records, for the transaction about to begin."""
        outputs, self._queued = self._queued, []
        for key, below in self._queued_trims.items():
            self._taken_trims.setdefault(key, below)
        self._queued_trims = {}
        return outputs

    def committed(self) -> None:
        """The transaction that held the taken records committed: delete the checkpoints below them."""
        if not self._taken_trims:
            return
        wanted = [TopicPartition(topic, partition, below) for (topic, partition), below in self._taken_trims.items()
                  if below > 0]
        self._taken_trims = {}
        if not wanted:
            return
        if self._admin is None:
            self._admin = AdminClient(self.settings.admin_config())
        try:
            for future in self._admin.delete_records(wanted, request_timeout=30).values():
                future.result()
        except KafkaException as exc:  # the next checkpoint trims again: older ones only cost space meanwhile
            log.warning(kv(event="checkpoint-trim-failed", reason=str(exc)))

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
