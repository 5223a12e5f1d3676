"""Hostile raw records cannot stop ingest or lose the good input around them: each bad line is one bounded dead
letter, a record of many bad lines makes a bounded number of them, an input no check foresaw is dead-lettered
as an internal error, and only a stream where every input fails stops the service, with one reason."""

from __future__ import annotations

import pytest

from services import codec
from services.ingest.core import IngestProcessor, RawRecord
from services.kafka.config import KafkaSettings
from services.wire.failures import TooManyFailures
from tests.services.ingest.test_ingest import encoded_of, outputs_by_topic

SETTINGS = KafkaSettings(topic_prefix="u.")  # (outputs_by_topic strips it)
GOOD = '{"op": "+", "s": "<http://ex.org/a>", "p": "<http://ex.org/p>", "o": "\\"ok\\""}\n'


def dead_letters(out) -> list[dict]:  # noqa: ANN001
    return [codec.decode("DeadLetter", o.value) for o in out.get("deadletter", [])]


def jsonl(data: str, offset: int = 0) -> RawRecord:
    return RawRecord(data.encode(), {"cbgp-format": b"jsonl"}, offset=offset)


def test_a_lone_surrogate_is_a_dead_letter_and_the_next_line_is_ingested() -> None:
    ingest = IngestProcessor(SETTINGS, 4, 4)
    bad = '{"op": "+", "s": "<http://ex.org/a>", "p": "<http://ex.org/p>", "o": "\\"x\\ud800y\\""}\n'
    out = outputs_by_topic(ingest.process(jsonl(bad + GOOD)))
    [dead] = dead_letters(out)
    assert dead["reason"] == "malformed-rdf" and dead["line"] == 1 and "U+D800" in dead["message"]
    assert len(encoded_of(out["updates.encoded"])) == 1


def test_one_bad_line_in_a_1mb_record_makes_a_small_dead_letter() -> None:
    ingest = IngestProcessor(SETTINGS, 4, 4)
    lines = [GOOD.replace("ok", f"ok{i}") for i in range(13_000)]
    lines[5_000] = "not json at all\n"
    record = "".join(lines)
    assert len(record) > 1_000_000
    out = outputs_by_topic(ingest.process(jsonl(record)))
    [dead] = dead_letters(out)
    assert dead["line"] == 5_001 and dead["original"] == b"not json at all"
    assert len(out["deadletter"][0].value) < 2_000  # before: the whole 1 MB record, over the broker's limit
    assert len(encoded_of(out["updates.encoded"])) == 12_999


def test_a_record_of_10000_bad_lines_makes_101_dead_letters() -> None:
    ingest = IngestProcessor(SETTINGS, 4, 4)
    out = outputs_by_topic(ingest.process(jsonl("oops\n" * 10_000 + GOOD)))
    dead = dead_letters(out)
    assert len(dead) == 101 and dead[-1]["reason"] == "too-many-errors" and "9,900 more" in dead[-1]["message"]
    assert sum(len(o.value) for o in out["deadletter"]) < 100_000
    assert len(encoded_of(out["updates.encoded"])) == 1  # the good line after them


def test_a_long_line_is_cut_to_an_excerpt_that_says_so() -> None:
    ingest = IngestProcessor(SETTINGS, 4, 4)
    out = outputs_by_topic(ingest.process(jsonl("x" * 50_000 + "\n")))
    [dead] = dead_letters(out)
    assert len(dead["original"]) == 1024 and "the first 1,024 of 50,000 bytes" in dead["message"]


def test_an_error_no_check_foresaw_is_dead_lettered_and_the_rest_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    ingest = IngestProcessor(SETTINGS, 4, 4)
    real = ingest._encode

    def encode(term):  # noqa: ANN001, ANN202 - a bug that strikes one term
        if "boom" in term:
            raise KeyError("a bug")
        return real(term)

    monkeypatch.setattr(ingest, "_encode", encode)
    data = GOOD + GOOD.replace("ok", "boom") + GOOD.replace("ok", "fine")
    out = outputs_by_topic(ingest.process(jsonl(data, offset=7)))
    [dead] = dead_letters(out)
    assert dead["reason"] == "internal-error" and dead["line"] == 2 and "KeyError" in dead["message"]
    assert len(encoded_of(out["updates.encoded"])) == 2
    # the failed line left no trace: once the bug is gone, the same triple is an insert, not a duplicate
    monkeypatch.setattr(ingest, "_encode", real)
    again = outputs_by_topic(ingest.process(jsonl(GOOD.replace("ok", "boom"))))
    assert len(encoded_of(again["updates.encoded"])) == 1


def test_only_a_stream_where_every_record_fails_stops_ingest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CBGP_MAX_CONSECUTIVE_FAILURES", "5")
    ingest = IngestProcessor(SETTINGS, 4, 4)
    monkeypatch.setattr(ingest, "_accept", lambda out, raw: 1 / 0)
    for offset in range(4):
        out = outputs_by_topic(ingest.accept(jsonl(GOOD, offset)))
        assert dead_letters(out)[0]["reason"] == "internal-error"
    with pytest.raises(TooManyFailures, match="the last 5 inputs in a row failed .*ZeroDivisionError"):
        ingest.accept(jsonl(GOOD, 4))
