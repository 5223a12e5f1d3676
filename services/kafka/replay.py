"""Replaying a log between two offsets: how a service restores state.

:func:`read_range` reads one partition's committed records in ``[start, end)`` and, like :func:`require_from`,
refuses a log whose needed records were deleted (:class:`LogTruncated`), which ``services.runtime.life.run_service``
turns into one error line and exit code 3 instead of a state rebuilt from what is left.

Split from ``services.runtime.life`` (one job per module); ``services.runtime.life`` re-exports every name.
"""

from __future__ import annotations

import logging
import time
from typing import Iterator

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from services.kafka.config import KafkaSettings
from services.kafka.truncation import require_log_start

__all__ = ["RangeReader", "read_range", "records_between", "require_from"]

log = logging.getLogger("cbgp.runtime")


def read_range(settings: KafkaSettings, topic: str, partition: int, start: int, end: int,
               batch: int = 2000, timeout: float = 120.0) -> Iterator[Message]:
    """Every committed record of ``topic[partition]`` with ``start <= offset < end``, in offset order.

    Raises :class:`LogTruncated` if the partition's log starts above ``start``: records the caller needs were
    deleted (a restore replaying "from offset 0" must read from 0, not from the low watermark).
    Transaction markers and aborted records take offsets too, so progress is tracked by the consumer's
    position, not by the last record.  Raises :class:`TimeoutError` if the range cannot be read in time.
    """
    if end <= start:
        return
    consumer = _replay_consumer(settings)
    try:
        # Every record in [start, end) is needed: refuse a log that no longer starts at or below ``start``.
        require_log_start(consumer, topic, {partition: start}, end={partition: end})
        yield from records_between(consumer, topic, partition, start if start > 0 else OFFSET_BEGINNING, end,
                                   batch, timeout, f"replay of {topic}[{partition}] {start}..{end}")
    finally:
        consumer.close()


class RangeReader:
    """:func:`read_range` for many small reads through one consumer, kept until :meth:`close`: a bisection over a
    log reads a few records at many places, and a consumer per read (a connection, its threads, its metadata)
    cost more than the reads.  Each read is returned whole, so no read is left half-done on the consumer."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._consumer: Consumer | None = None

    def records(self, topic: str, partition: int, start: int, end: int) -> list[tuple[int, bytes | None]]:
        """``(offset, value)`` of every committed record of ``topic[partition]`` in ``[start, end)``; raises as
        :func:`read_range`."""
        if end <= start:
            return []
        if self._consumer is None:
            self._consumer = _replay_consumer(self.settings)
        try:
            require_log_start(self._consumer, topic, {partition: start}, end={partition: end})
            return [(m.offset(), m.value()) for m in records_between(
                self._consumer, topic, partition, start if start > 0 else OFFSET_BEGINNING, end,
                what=f"read of {topic}[{partition}] {start}..{end}")]
        finally:
            self._consumer.unassign()

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _replay_consumer(settings: KafkaSettings) -> Consumer:
    # auto.offset.reset=error: a position deleted while it reads is an error, never a silent skip to the log start.
    return Consumer(settings.consumer_config(f"{settings.topic_prefix}replay", enable_partition_eof=True,
                                             fetch_wait_max_ms=20, auto_offset_reset="error"))


def records_between(consumer: Consumer, topic: str, partition: int, start: int, end: int, batch: int = 2000,
                    timeout: float = 120.0, what: str = "") -> Iterator[Message]:
    """The committed records of ``topic[partition]`` from ``start`` up to ``end`` through ``consumer`` (assigned
    here).  Transaction markers take offsets, so the end is the consumer's position, not the last record's
    offset.  Raises :class:`TimeoutError` (naming ``what``) if the range cannot be read in time."""
    consumer.assign([TopicPartition(topic, partition, start)])
    deadline = time.monotonic() + timeout
    tp = TopicPartition(topic, partition)
    wanted = end - max(start, 0)
    while True:
        # (consume waits its whole timeout unless it gets as many records as it asks for: ask for no more than
        # the range holds, and wait briefly, or each short read costs the timeout)
        for msg in consumer.consume(max(1, min(batch, wanted)), 0.01):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(err)
            if msg.offset() >= end:
                return
            yield msg
        position = consumer.position([tp])[0].offset
        if position >= end:
            return
        wanted = end - max(position, start, 0)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what or topic} stuck at {position}")


def require_from(settings: KafkaSettings, topic: str, needed: dict[int, int], timeout: float = 30.0) -> None:
    """Raise :class:`LogTruncated` when a partition of ``topic`` no longer holds its ``needed`` offset (partition
    -> first offset a reader needs; negative = 0): for readers that assign their own consumer at an offset."""
    consumer = Consumer(settings.consumer_config(f"{settings.topic_prefix}watermarks"))
    try:
        require_log_start(consumer, topic, needed, timeout)
    finally:
        consumer.close()
