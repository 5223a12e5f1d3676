"""Operators over event-time windows (FILTER, OPTIONAL, UNION, aggregates, ASK... in a windowed
query): at every grid instant, the answers rebuilt from the reports equal pyoxigraph's answers over the window
content of that instant, computed from the definition (`tests.cbgp.windows.test_windows`); per-event windows: the sum
over the events in the window of pyoxigraph's answers over each event alone.  Random streams with deletions,
duplicate inserts, deletes of absent triples, literals, self-loops, late data and both lateness policies."""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgp.windows.windowed import WindowedQuery
from cbgp.windows.spec import WindowError, WindowSpec
from tests.cbgp.algebra.test_algebra_differential import expected_answers
from tests.cbgp.engine.test_engine_differential import EX
from tests.cbgp.windows.test_windows import (Harness, Reference, assert_restore_mid_stream_reports_the_same, rows, run,
                                     scenarios)
from tests.oracle import OracleGraph

PREFIX = f"PREFIX : <{EX}> PREFIX xsd: <http://www.w3.org/2001/XMLSchema#> "
QUERIES = {name: PREFIX + text for name, text in {
    "filter": "SELECT * WHERE { ?x :p ?y FILTER(isIRI(?y) && ?y != :a) }",
    "filter_literal": 'SELECT * WHERE { ?x :r ?y FILTER(isLiteral(?y) && LANG(?y) = "") }',
    "optional": "SELECT * WHERE { ?x :p ?y OPTIONAL { ?y :q ?z } }",
    "union_count": "SELECT ?x (COUNT(*) AS ?n) WHERE { { ?x :p ?y } UNION { ?x :q ?y } } GROUP BY ?x",
    "count_all": "SELECT (COUNT(*) AS ?n) (COUNT(DISTINCT ?x) AS ?d) WHERE { ?x :p ?y }",
    "having": "SELECT ?y (COUNT(?x) AS ?c) WHERE { ?x :p ?y } GROUP BY ?y HAVING (COUNT(?x) > 1)",
    "minus": "SELECT * WHERE { ?x :p ?y MINUS { ?y :q ?x } }",
    "not_exists": "SELECT * WHERE { ?x :p ?y FILTER NOT EXISTS { ?y :p ?x } }",
    "ask": "ASK { ?x :p ?y . ?y :q ?x }",
    "pred_var": "SELECT ?p (COUNT(*) AS ?c) WHERE { ?s ?p ?o } GROUP BY ?p",
    "values": "SELECT * WHERE { VALUES ?y { :a :b } ?x :p ?y }",
    "distinct_union": "SELECT DISTINCT ?x WHERE { { ?x :p ?y } UNION { ?y :q ?x } }",
}.items()}
# (a query with answers over no triples cannot run per event: rejected below)
EVENT_QUERIES = {k: v for k, v in QUERIES.items() if k != "count_all"}


def operator_answers(quads, query: str):
    oracle = OracleGraph()
    for s, p, o, g in quads:
        oracle.apply(1, s, p, o, g)
    return expected_answers(oracle, query)


class OperatorReference(Reference):
    evaluate = staticmethod(operator_answers)


class OperatorHarness(Harness):
    reference_class = OperatorReference


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@SETTINGS
@given(scenario=scenarios(["sliding", "tumbling"]))
def test_operators_over_time_windows_match_pyoxigraph_at_every_instant(scenario):
    spec, actions = scenario
    harness = run(spec, QUERIES, actions, OperatorHarness)
    for name, w in harness.windows.items():
        assert w.state_entries() == 0, f"{name}: expired history is pruned"
        assert harness.replayed[name].rows == harness.reference.answers(name, harness.last), name


@SETTINGS
@given(scenario=scenarios(["event"]))
def test_operators_over_event_windows_sum_the_per_event_answers(scenario):
    spec, actions = scenario
    harness = run(spec, EVENT_QUERIES, actions, OperatorHarness)
    for name in harness.windows:
        assert not harness.replayed[name].rows, name


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(scenario=scenarios(["sliding", "tumbling", "event"]), data=st.data())
def test_an_operator_window_restored_mid_stream_reports_the_same(scenario, data):
    spec, actions = scenario
    cut = data.draw(st.integers(0, len(actions)))
    text = EVENT_QUERIES[data.draw(st.sampled_from(sorted(EVENT_QUERIES)))]

    assert_restore_mid_stream_reports_the_same(text, spec, actions, cut)


SEC = 1000


def test_a_count_over_a_window_starts_at_zero_and_follows_expiry():
    """The seed paper's kind of query (an aggregate with a HAVING over a sliding window), by hand."""
    w = WindowedQuery(PREFIX + "SELECT ?y (COUNT(?x) AS ?n) WHERE { ?x :likes ?y } GROUP BY ?y "
                      "HAVING (COUNT(?x) >= 2)", WindowSpec("sliding", 10 * SEC, 5 * SEC))
    total = WindowedQuery(PREFIX + "SELECT (COUNT(*) AS ?n) WHERE { ?x :likes ?y }",
                          WindowSpec("sliding", 10 * SEC, 5 * SEC))
    assert rows(total, total.advance(0)) == [(0, [(1, {"n": '"0"^^<http://www.w3.org/2001/XMLSchema#integer>'})])]
    for t, x in ((1 * SEC, "a"), (2 * SEC, "b"), (7 * SEC, "c")):
        for query in (w, total):
            query.add_terms(1, f"<{EX}{x}>", f"<{EX}likes>", f"<{EX}post>", None, t)
    integer = "^^<http://www.w3.org/2001/XMLSchema#integer>"
    assert rows(w, w.advance(5 * SEC)) == [(5 * SEC, [(1, {"y": f"<{EX}post>", "n": f'"2"{integer}'})])]
    assert rows(w, w.advance(10 * SEC)) == [(10 * SEC, [(-1, {"y": f"<{EX}post>", "n": f'"2"{integer}'}),
                                                       (1, {"y": f"<{EX}post>", "n": f'"3"{integer}'})])]
    # a (1 s) and b (2 s) leave at 15 s: one like is left, under the HAVING's 2
    assert rows(w, w.advance(15 * SEC)) == [(15 * SEC, [(-1, {"y": f"<{EX}post>", "n": f'"3"{integer}'})])]
    assert [r.instant_ms for r in total.advance(20 * SEC)] == [5 * SEC, 10 * SEC, 15 * SEC, 20 * SEC]


def test_a_query_with_answers_over_no_triples_is_rejected_in_a_per_event_window():
    with pytest.raises(WindowError, match="answers over no triples .* per-event window: use a time window"):
        WindowedQuery(QUERIES["count_all"], WindowSpec("event", 10, 10))


def test_graph_in_an_operator_query_is_rejected_in_a_per_event_window():
    with pytest.raises(WindowError, match="GRAPH is not supported in a per-event window"):
        WindowedQuery(PREFIX + "SELECT * WHERE { ?x :p ?y OPTIONAL { GRAPH ?g { ?y :q ?z } } }",
                      WindowSpec("event", 10, 10))
