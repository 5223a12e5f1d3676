"""``/query`` evaluated in a forked child (``services.gateway.query``): a query past ``--query-max-memory`` or
``--query-timeout`` is refused in one line and its child is gone, the gateway's memory and threads untouched; the
answers of the others are pyoxigraph's own.  Real pyoxigraph, real fork, no fleet."""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from types import SimpleNamespace

import pyoxigraph as ox
import pytest

from services.gateway.core import Limits
from services.gateway.query import QueryRefused, evaluate
from services.state.forked import CAN_BOUND, ForkedJob

pytestmark = pytest.mark.skipif(not CAN_BOUND, reason="a child process is forked and bounded on Linux only")
EX = "http://example.org/"
JSON = "application/sparql-results+json"


class Graph:
    """What the gateway's GraphSource offers /query: the store, as of seq 7."""

    def __init__(self, store: ox.Store) -> None:
        self.store = store
        self.children: list[int] = []

    def forked(self, fn) -> ForkedJob:  # noqa: ANN001
        job = ForkedJob(lambda: fn(self.store, 7))
        self.children.append(job.pid)
        return job

    def query(self, text: str):  # noqa: ANN201
        return self.store.query(text), 7


def chain(n: int) -> ox.Store:
    store = ox.Store()
    store.bulk_extend(ox.Quad(ox.NamedNode(f"{EX}n{i}"), ox.NamedNode(f"{EX}k"), ox.NamedNode(f"{EX}n{i + 1}"))
                      for i in range(n))
    return store


def gateway(store: ox.Store, **limits) -> SimpleNamespace:  # noqa: ANN003
    return SimpleNamespace(limits=Limits(**limits), graph=Graph(store))


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_query_past_its_memory_is_refused_in_one_line_and_the_gateway_grows_nothing() -> None:
    """``?a :k+ ?b`` over a chain of 1,500 nodes: 1.1 M pairs, about 250 MB in pyoxigraph."""
    gw = gateway(chain(1500), query_max_memory_mb=64, query_timeout_s=60)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(QueryRefused) as refused:
        evaluate(gw, f"SELECT (COUNT(*) AS ?n) WHERE {{ ?a <{EX}k>+ ?b }}", threading.Event(), JSON)
    assert refused.value.status == 413 and str(refused.value) == (
        "the query needed more than 64 MB (--query-max-memory); make it more selective")
    assert time.monotonic() - started < 30
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 32 * 1024  # (KB: the child's, not ours)
    assert all(gone(pid) for pid in gw.graph.children)


def test_a_query_past_its_deadline_is_killed_there_and_the_next_one_is_answered() -> None:
    class Slow:
        def query(self, *_args, **_kw):  # noqa: ANN002, ANN003, ANN201 - as if pyoxigraph worked on for a minute
            time.sleep(60)

    gw = gateway(Slow(), query_timeout_s=1.0)  # type: ignore[arg-type]
    started = time.monotonic()
    with pytest.raises(QueryRefused) as refused:
        evaluate(gw, "SELECT * WHERE { ?s ?p ?o }", threading.Event(), JSON)
    assert refused.value.status == 503 and "--query-timeout" in str(refused.value)
    assert 0.9 <= time.monotonic() - started < 5
    assert all(gone(pid) for pid in gw.graph.children), "the child was left running"


def test_answers_and_refusals_from_the_child_are_what_pyoxigraph_says_in_the_gateway() -> None:
    store = chain(30)
    text = f"SELECT ?b WHERE {{ <{EX}n25> <{EX}k>+ ?b }} ORDER BY ?b"
    isolated = gateway(store)
    in_thread = gateway(store, query_max_memory_mb=0)
    body, media, seq = evaluate(isolated, text, threading.Event(), JSON)
    assert (media, seq) == (JSON, 7) and body == evaluate(in_thread, text, threading.Event(), JSON)[0]
    rows = json.loads(body)["results"]["bindings"]
    assert [row["b"]["value"] for row in rows] == [x.value for x, in store.query(text)]
    assert len(rows) == 5 and isolated.graph.children and not in_thread.graph.children
    for bad, status, fragment in [("SELECT * WHERE { ?s ?p }", 400, "SPARQL syntax error"),
                                  (f"SELECT * WHERE {{ ?a <{EX}k>* ?b }}", 413, "--query-max-rows")]:
        with pytest.raises(QueryRefused) as refused:
            evaluate(gateway(store, query_max_rows=100), bad, threading.Event(), JSON)
        assert refused.value.status == status and fragment in str(refused.value)
