"""Derived streams at registration: ``stream=<iri>`` is for CONSTRUCT queries only, and a
derived stream must not read its own graph, use ``GRAPH ?g``, or close a cycle with other derived streams; each
rejection is one line naming the problem and, where there is one, its place.  No broker."""

from __future__ import annotations

import json

import pytest

from services.wire.registrations import REGISTER_OPTIONS, check_option_keys
from services.registry.core import Registry
from services.worker.core import WorkerCore
from services import codec

EX = "http://example.org/"


def decide(registry: Registry, query_id: str, sparql: str, **options: str) -> dict:
    decision = registry.decide({"command": "REGISTER", "query_id": query_id, "sparql": sparql, "options": options},
                               lambda: 7)
    if decision.entry is not None:
        registry.commit(decision)
    return decision.status


def feeds(graph: str, reads: str | None = None, prefix: bool = False) -> str:
    where = f"GRAPH <{EX}{reads}> {{ ?s <{EX}q> ?o }}" if reads else f"?s <{EX}q> ?o"
    return f"CONSTRUCT {{ ?s <{EX}{graph}> ?o }}\nWHERE {{ {where} }}"


def test_a_construct_with_stream_is_accepted_and_its_plan_keeps_the_option() -> None:
    registry = Registry()
    status = decide(registry, "a", feeds("p"), stream=f"<{EX}a>")
    assert status["status"] == "ACCEPTED" and "derived stream" in status["message"] and f"<{EX}a>" in status["message"]
    decision = Registry().decide({"command": "REGISTER", "query_id": "a", "sparql": feeds("p"),
                                  "options": {"stream": f"{EX}a"}}, lambda: 7)
    record = decision.plan[1]
    assert record["options"] == {"stream": f"{EX}a"} and json.loads(record["plan_json"])["form"] == "CONSTRUCT"
    # the worker reads the option back from the plan record, as N-Triples
    core = WorkerCore({"deltas.parts": "d", "deadletter": "x"}, 4, 4, 4, lambda *a: [])
    core.on_plan(0, 0, b"a", codec.encode("QueryPlan", record), [])
    assert core.plans["a"].stream == f"<{EX}a>"
    assert "stream" in REGISTER_OPTIONS
    check_option_keys({"stream": "x"})  # cbgp register accepts it before sending


@pytest.mark.parametrize("sparql, message, place", [
    (f"SELECT ?s WHERE {{ ?s <{EX}q> ?o }}", "option stream= is only for CONSTRUCT queries (a derived stream of "
     "triples), not SELECT", (1, 1)),
    (f"PREFIX ex: <{EX}>\nASK {{ ?s ex:q ?o FILTER(?o > 1) }}", "not ASK", (2, 1)),
    (f"PREFIX ex: <{EX}>\nCONSTRUCT {{ ?s ex:p ?o }}\nWHERE {{ GRAPH ex:a {{ ?s ex:q ?o }} }}",
     f"a derived stream cannot read its own graph: GRAPH <{EX}a> is what stream=<{EX}a> feeds", (3, 9)),
    (f"CONSTRUCT {{ ?s <{EX}p> ?o }} WHERE {{ ?s <{EX}q> ?o . GRAPH ?g {{ ?s <{EX}r> ?o }} }}",
     f"a derived stream (stream=<{EX}a>) cannot read GRAPH ?g", (1, 83)),
])
def test_rejected_with_the_problem_and_its_place(sparql: str, message: str, place: tuple[int, int]) -> None:
    status = decide(Registry(), "q", sparql, stream=f"<{EX}a>")
    assert status["status"] == "REJECTED" and message in status["message"], status
    assert (status["line"], status["column"]) == place
    assert "\n" not in status["message"]


def test_a_cycle_across_derived_streams_and_a_second_feeder_are_rejected() -> None:
    registry = Registry()
    assert decide(registry, "A", feeds("p", reads="b"), stream=f"<{EX}a>")["status"] == "ACCEPTED"
    assert decide(registry, "C", feeds("p", reads="c2"), stream=f"<{EX}c>")["status"] == "ACCEPTED"
    status = decide(registry, "B", feeds("q", reads="a"), stream=f"<{EX}b>")
    assert status["status"] == "REJECTED", status
    assert status["message"] == (f"a cycle across derived streams: 'B' feeds <{EX}b>, read by 'A', which feeds "
                                 f"<{EX}a>, and reads it back with GRAPH <{EX}a>")
    assert (status["line"], status["column"]) == (2, 9)
    # a longer cycle: D feeds <d> reading <c>; then C2 would feed <c2> reading <d>: c2 -> C -> c -> D -> d -> C2
    assert decide(registry, "D", feeds("p", reads="c"), stream=f"<{EX}d>")["status"] == "ACCEPTED"
    status = decide(registry, "C2", feeds("p", reads="d"), stream=f"<{EX}c2>")
    assert status["status"] == "REJECTED" and "'C', which feeds" in status["message"] and "'D'" in status["message"]
    # a chain is fine, and so is a plain query reading any derived graph (it feeds nothing)
    assert decide(registry, "E", feeds("p", reads="d"), stream=f"<{EX}e>")["status"] == "ACCEPTED"
    assert decide(registry, "R", "SELECT * WHERE { GRAPH ?g { ?s ?p ?o } }")["status"] == "ACCEPTED"
    status = decide(registry, "F", feeds("p"), stream=f"<{EX}a>")
    assert status["status"] == "REJECTED" and status["message"].startswith(f"graph <{EX}a> is already fed by")
    # replacing A by itself with another input is not a cycle with its own old registration
    assert decide(registry, "A", feeds("p", reads="e"), stream=f"<{EX}a>", replace="true")["status"] == "ACCEPTED"
    # unregistered, its graph is free again
    registry.commit(registry.decide({"command": "UNREGISTER", "query_id": "A"}, lambda: 7))
    assert decide(registry, "F", feeds("p"), stream=f"<{EX}a>")["status"] == "ACCEPTED"


def test_a_bad_stream_iri_is_rejected() -> None:
    status = decide(Registry(), "q", feeds("p"), stream="not an iri")
    assert status["status"] == "REJECTED" and "expected an absolute IRI" in status["message"]
