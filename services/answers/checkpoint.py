"""The answers service's partition checkpoints, with no Kafka: a deltas.parts partition's state as
of a committed offset, so that a restore reads the answers and deltas.parts after it instead of from offset 0.

How it works: docs/design/internals.md, services.answers.checkpoint."""

from __future__ import annotations

import logging
from typing import Any, Callable

from services.wire.loglines import kv
from services.answers.release import SeqRelease
from services.state.shards import dump_shard

AnswersCore = Any  # services.answers.service.AnswersCore (the service module imports this one)

log = logging.getLogger("cbgp.answers")

KIND = "deltas"  # the ShardCheckpoints kind of a deltas.parts partition
# How far before a checkpoint's answers end a restore looks for its last Answer (transaction markers follow it), in
# steps.
LAST_ANSWER_LOOKBACK = (4, 64, 1024)


def answers_needed(answers_end: int) -> int:
    """The lowest answers offset a restore from a checkpoint ending at ``answers_end`` reads (the checkpoint declares
    it for ``cbgp topics floor``): the last few records, where its last Answer usually is.  Anything below may go: a
    restore that finds that Answer deleted trusts the checkpoint (a topic deleted and written again starts at
    offset 0, where the comparison still runs)."""
    return max(0, answers_end - LAST_ANSWER_LOOKBACK[0])


def partition_blob(core: AnswersCore, release: SeqRelease, partition: int, position: int, metadata: str,
                   answers_end: int, last_answer: bytes | None, warn: bool = True) -> bytes | None:
    """The checkpoint of ``partition`` committed at ``position`` with ``metadata``, or None when it cannot be
    pickled (an operator query's operators hold closures; one log line if ``warn``: the partition is then
    restored from offset 0)."""
    try:
        return dump_shard({"position": position, "answers_end": answers_end, "last_answer": last_answer,
                           "queries": {name: core.queries[name] for name, p in core.partition_of.items()
                                       if p == partition},
                           "release": release.checkpoint(partition, metadata)})
    except Exception as exc:  # noqa: BLE001 - pickle raises PicklingError, TypeError, AttributeError...
        if warn:
            log.warning(kv(event="answers-checkpoint-skipped", partition=partition,
                           reason=f"{type(exc).__name__}: {exc}"))
        return None


def partition_blobs(core: AnswersCore, release: SeqRelease, due: list[tuple[int, int, str, int, bytes | None, bool]]
                    ) -> list[tuple[int, int, int, bytes | None]]:
    """``(partition, position, answers_end, blob)`` of each ``(partition, position, metadata, answers_end,
    last_answer, warn)`` in ``due`` (:func:`partition_blob`; what a child process forked to checkpoint returns)."""
    return [(partition, position, answers_end, partition_blob(core, release, partition, position, metadata,
                                                              answers_end, last_answer, warn=warn))
            for partition, position, metadata, answers_end, last_answer, warn in due]


def last_answer_before(read: Callable[[int, int], list[bytes | None]], end: int, low: int,
                       saved_last: bytes | None) -> bytes | None:
    """What a restore compares with a checkpoint's last Answer (``unusable``): the last record before ``end``, read
    with ``read(start, end)`` looking back ``LAST_ANSWER_LOOKBACK`` but not below the log's start ``low``.  When
    retention deleted it (``low`` past 0) there is nothing to compare: the checkpoint's own is taken."""
    for back in LAST_ANSWER_LOOKBACK:
        start = end - back
        values = read(max(start, low), end)
        if values or start <= low:
            return values[-1] if values else saved_last if low > 0 else None
    return None  # no Answer in the last LAST_ANSWER_LOOKBACK[-1] records: unusable


def unusable(saved: dict[str, Any] | None, committed: int, answers_high: int,
             last_answer: bytes | None) -> str | None:
    """Why ``saved`` cannot restore a partition committed at ``committed`` whose answers partition ends at
    ``answers_high`` and holds ``last_answer`` as its last Answer before the checkpoint's end offset; None
    when it can."""
    if saved is None:
        return "no checkpoint"
    if saved["position"] > committed:
        return f"position {saved['position']} is past the committed offset {committed}"
    if saved["answers_end"] > answers_high:
        return f"answers end {saved['answers_end']} is past the log's end {answers_high}"
    if last_answer != saved["last_answer"]:
        return "the last answer before its end offset is another (the topics were written again)"
    return None


def adopt(core: AnswersCore, partition: int, saved: dict[str, Any]) -> None:
    """Give the core the checkpoint's answer streams of ``partition`` (the answers after ``answers_end`` are
    then restored into it as usual)."""
    core.drop_partition(partition)
    for name, state in saved["queries"].items():
        core.queries[name] = state
        core.partition_of[name] = partition
    core.unsettled = True
