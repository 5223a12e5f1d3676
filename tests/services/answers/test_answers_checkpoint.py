"""What a restore compares with an answers checkpoint's last Answer (``answers_checkpoint.last_answer_before``),
with the answers partition as a list: the proof that the checkpoint belongs to this log, and what it needs of it."""

from __future__ import annotations

from services.answers.checkpoint import LAST_ANSWER_LOOKBACK, answers_needed, last_answer_before, unusable


def reader(log: list[bytes | None], low: int = 0):  # noqa: ANN201
    """``read(start, end)`` over ``log`` (None: a transaction marker, which no reader sees), deleted below ``low``."""
    def read(start: int, end: int) -> list[bytes]:
        assert start >= low, f"read from {start}, below the log's start {low}"
        return [v for v in log[start:end] if v is not None]
    return read


def saved(end: int, last: bytes | None) -> dict:
    return {"position": 0, "answers_end": end, "last_answer": last}


def test_the_last_answer_is_found_behind_the_transaction_markers_that_follow_it() -> None:
    log = [b"a1", None, b"a2", b"a3"] + [None] * 40  # 40 empty transactions' markers after a3
    end = len(log)
    assert last_answer_before(reader(log), end, 0, b"a3") == b"a3"
    assert unusable(saved(end, b"a3"), 0, end, b"a3") is None


def test_a_log_written_again_from_offset_0_is_told_apart() -> None:
    log = [b"b1", None, b"b2", None]  # another topic of the same name: the checkpoint's a2 is not there
    assert last_answer_before(reader(log), 4, 0, b"a2") == b"b2"
    assert unusable(saved(4, b"a2"), 0, 4, b"b2") is not None


def test_when_retention_deleted_the_last_answer_the_checkpoint_is_trusted_without_reading_below_the_start() -> None:
    log = [b"a%d" % i for i in range(10)] + [None] * 3
    end = len(log)
    assert last_answer_before(reader(log, low=end), end, end, b"a9") == b"a9"  # all of it deleted
    assert last_answer_before(reader(log, low=end - 2), end, end - 2, b"a9") == b"a9"  # only markers left
    assert last_answer_before(reader(log, low=5), end, 5, b"a9") == b"a9"  # it is still there: compared
    assert last_answer_before(reader(log, low=5), end, 5, b"x") == b"a9"


def test_no_answer_in_the_whole_lookback_makes_the_checkpoint_unusable() -> None:
    log = [b"a1"] + [None] * (LAST_ANSWER_LOOKBACK[-1] + 5)
    assert last_answer_before(reader(log), len(log), 0, b"a1") is None


def test_a_checkpoint_needs_only_the_last_records_of_the_answers_partition() -> None:
    assert answers_needed(0) == 0 and answers_needed(3) == 0
    assert answers_needed(1000) == 1000 - LAST_ANSWER_LOOKBACK[0]
