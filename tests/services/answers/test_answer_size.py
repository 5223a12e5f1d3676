"""An answer must fit in one Kafka record: the registry refuses a query whose answers could not (terms are at most
CBGP_MAX_TERM_BYTES), and the answers service dead-letters one that still would rather than wedge its partition."""

from __future__ import annotations

import pytest

from services import codec
from services.answers.core import AnswersCore
from services.registry.core import Registry


def register(sparql: str) -> dict:
    return Registry().decide({"command": "REGISTER", "query_id": "q", "sparql": sparql, "options": {}},
                             lambda: 0).status


def test_a_query_whose_answers_could_exceed_a_record_is_refused_at_registration() -> None:
    def query(n: int) -> str:
        return "SELECT * WHERE { ?s <http://ex.org/p> ?o0 . " + " ".join(
            f"?o{i - 1} <http://ex.org/p> ?o{i} ." for i in range(1, n - 1)) + " }"
    assert register(query(15))["status"] == "ACCEPTED"
    refused = register(query(16))
    assert refused["status"] == "REJECTED"
    assert "an answer of 16 variables may take" in refused["message"]
    assert "(CBGP_MAX_RECORD_BYTES, CBGP_MAX_TERM_BYTES)" in refused["message"]


def test_an_answer_larger_than_a_record_is_dead_lettered_and_the_stream_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CBGP_MAX_RECORD_BYTES", "4000")
    core = AnswersCore("a", "c", "d", "parts")
    terms = {1: '"' + "x" * 5000 + '"', 2: "<http://ex.org/small>"}
    value = codec.encode_part_delta_batch("q", -1, ["x"], [(1, 1, (1,), 0, 1, 0, False, None),
                                                          (2, 1, (2,), 0, 2, 0, False, None)], version=1)
    core.on_plan("q", 1)
    out = core.on_record(0, 9, value, None, terms.get)
    dead = [codec.decode("DeadLetter", o.value) for o in out if o.topic == "d"]
    answers = [codec.decode("Answer", o.value) for o in out if o.topic == "a"]
    assert [d["reason"] for d in dead] == ["answer-too-large"] and "5,00" in dead[0]["message"]
    assert [(a["n"], a["binding"]["x"]["value"]) for a in answers] == [(1, "http://ex.org/small")]
    assert all(len(o.value) <= 4000 for o in out if o.value is not None)


def test_a_corrupt_packed_delta_record_is_dead_lettered_in_one_line_and_the_next_record_is_answered() -> None:
    """A cut deltas.parts record (a damaged PartDeltaColumns): one dead letter naming the record, in one line, and
    the good record after it is answered as if the bad one had not come."""
    core = AnswersCore("a", "c", "d", "parts")
    core.on_plan("q", 1)
    good = codec.encode_part_delta_batch("q", -1, ["x"], [(1, 1, (2,), 0, 1, 0, False, None)], version=1)
    bad = good[:-20]
    out = core.on_record(0, 7, bad, None, {2: "<http://ex.org/small>"}.get)
    dead = [codec.decode("DeadLetter", o.value) for o in out if o.topic == "d"]
    assert [d["reason"] for d in dead] == ["schema-mismatch"] and len(out) == 1
    assert "PartDeltaColumns" in dead[0]["message"] and "\n" not in dead[0]["message"]
    out = core.on_record(0, 8, good, None, {2: "<http://ex.org/small>"}.get)
    assert [codec.decode("Answer", o.value)["n"] for o in out if o.topic == "a"] == [1]
