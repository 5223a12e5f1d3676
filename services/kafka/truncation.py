"""Restores that never go silently wrong: is every record a restore needs still in the log?

How it works: docs/design/internals.md, services.kafka.truncation.
"""

from __future__ import annotations

from typing import Mapping

from confluent_kafka import Consumer, TopicPartition

from services.metrics.instruments import RESTORE_MISSING_OFFSETS

__all__ = ["LogTruncated", "EXIT_TRUNCATED", "truncation", "require_log_start"]

EXIT_TRUNCATED = 3  # the process exit code of a service that refused to restore from a truncated log


class LogTruncated(RuntimeError):
    """Records a restore needs are no longer in the log: the state cannot be rebuilt exactly."""

    def __init__(self, topic: str, partition: int, needed: int, log_start: int) -> None:
        self.topic, self.partition, self.needed, self.log_start = topic, partition, needed, log_start
        super().__init__(
            f"{topic}[{partition}] was truncated: the restore needs offset {needed} but the log starts at "
            f"{log_start} (offsets {needed}..{log_start - 1} were deleted by retention or delete_records); "
            "refusing to rebuild state from what is left: restore the deleted records or start a new fleet "
            "(--topic-prefix); `cbgp doctor` checks that the topics keep what restores need")


def truncation(topic: str, partition: int, needed: int, log_start: int, end: int | None = None) -> LogTruncated | None:
    """The error to raise when a reader that needs ``topic[partition]`` from offset ``needed`` (negative:
    ``OFFSET_BEGINNING`` or no committed offset, i.e. 0) finds the log starting at ``log_start``; None when every
    needed record is there.  ``end``: the reader needs only offsets below it (None: up to the end of the log).
    An unknown log start (negative) is not an error."""
    needed = max(needed, 0)
    if log_start < 0 or (end is not None and end <= needed):
        return None
    return LogTruncated(topic, partition, needed, log_start) if log_start > needed else None


def require_log_start(consumer: Consumer, topic: str, needed: Mapping[int, int], timeout: float = 30.0,
                      end: Mapping[int, int] | None = None) -> None:
    """Raise :class:`LogTruncated` (and set ``cbgp_restore_missing_offsets``) when a partition of ``topic`` no
    longer holds the offsets ``needed`` (partition -> first offset needed, negative = 0) up to ``end``
    (partition -> end offset, default: the end of the log).  One ListOffsets round trip per partition, through
    any ``consumer`` (it need not be assigned)."""
    for partition, offset in needed.items():
        low, _high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)
        error = truncation(topic, partition, offset, low, None if end is None else end.get(partition))
        if error is not None:
            RESTORE_MISSING_OFFSETS.labels(topic, str(partition)).set(error.log_start - error.needed)
            raise error
