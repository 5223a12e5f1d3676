"""SERVICE views as named graphs of the stream (in the fleet): the rewritten query over the view graph
answers what the original query answers with SERVICE evaluated against the endpoint's data (pyoxigraph on both
sides), and refreshes keep the graph equal to a fresh fill, whatever triples the keys share."""

from __future__ import annotations

from collections import Counter

import pyoxigraph as ox
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cbgp.background.service_clause import ServiceError
from cbgp.background.view_graphs import ViewGraph, has_service, rewrite_services

EX = "http://ex.org/"
REMOTE = "urn:test:remote"
QUERY = f"""PREFIX ex: <{EX}>
SELECT ?u ?n ?c WHERE {{
  ?u ex:posted ?m .
  SERVICE <http://endpoint.example/sparql> {{ ?u ex:follows ?x . ?x ex:count ?c . ?u ex:name ?n }}
}}"""


def rows_by_key(store: ox.Store, view) -> dict[str, frozenset]:
    """What SparqlRemote.fill returns for ``view`` over ``store``'s remote graph: rows per key, key left out."""
    out: dict[str, set] = {}
    text = f"{view.prologue} SELECT * WHERE {{ GRAPH <{REMOTE}> {{ {view.pattern} }} }}"
    result = store.query(text)
    names = [v.value for v in result.variables]
    for solution in result:
        key = str(solution[view.key])
        row = tuple(sorted((name, str(solution[name])) for name in names
                           if name != view.key and solution[name] is not None))
        out.setdefault(key, set()).add(row)
    return {k: frozenset(v) for k, v in out.items()}


def answers(store: ox.Store, text: str) -> Counter:
    result = store.query(text)
    names = [v.value for v in result.variables]
    return Counter(tuple(str(s[n]) for n in names) for s in result)


triples = st.lists(st.tuples(st.sampled_from(["follows", "count", "name", "posted"]),
                             st.integers(0, 5), st.integers(0, 5)), max_size=40)


def quad(p: str, s: int, o: int, graph: str | None) -> ox.Quad:
    obj = ox.Literal(str(o)) if p in ("count", "name") else ox.NamedNode(f"{EX}n{o}")
    return ox.Quad(ox.NamedNode(f"{EX}n{s}"), ox.NamedNode(EX + p), obj,
                   ox.NamedNode(graph) if graph else ox.DefaultGraph())


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(local=triples, remote=triples, later=triples)
def test_the_view_graph_answers_what_service_over_the_endpoint_answers(local, remote, later) -> None:
    rewritten, (view,) = rewrite_services(QUERY)
    assert "SERVICE" not in rewritten and f"GRAPH <{view.graph}>" in rewritten and view.key == "u"
    store = ox.Store()
    store.extend(quad(p, s, o, None) for p, s, o in local)
    store.extend(quad(p, s, o, REMOTE) for p, s, o in remote)
    graph = ViewGraph(view)
    store.update(graph.replace_all(rows_by_key(store, view)))
    truth = QUERY.replace("SERVICE <http://endpoint.example/sparql>", f"GRAPH <{REMOTE}>")
    assert answers(store, rewritten) == answers(store, truth)
    # The endpoint's data changes; refreshing every key, one request each, reaches what a fresh fill gives.
    store.update(f"DROP SILENT GRAPH <{REMOTE}>")
    store.extend(quad(p, s, o, REMOTE) for p, s, o in later)
    fresh = rows_by_key(store, view)
    for key in sorted(set(graph.rows) | set(fresh)):
        text = graph.update_text(*graph.set_key(key, fresh.get(key, ())))
        if text:
            store.update(text)
    assert answers(store, rewritten) == answers(store, truth)
    assert set(store.quads_for_pattern(None, None, None, ox.NamedNode(view.graph))) == {
        ox.Quad(*(_term(t) for t in triple), ox.NamedNode(view.graph)) for triple in ViewGraph_fill(view, fresh)}


def ViewGraph_fill(view, fresh) -> set:  # noqa: N802 - the graph a fresh fill builds
    graph = ViewGraph(view)
    for key, rows in fresh.items():
        graph.set_key(key, rows)
    return set(graph.count)


def _term(text: str):  # noqa: ANN202
    return ox.NamedNode(text[1:-1]) if text.startswith("<") else ox.Literal(text[1:-1])


def test_queries_without_service_are_unchanged_and_bad_clauses_say_why() -> None:
    plain = f"PREFIX ex: <{EX}> SELECT * WHERE {{ ?s ex:p ?o }}"
    assert rewrite_services(plain) == (plain, ()) and not has_service(plain) and has_service(QUERY)
    with pytest.raises(ServiceError, match="shares no variable"):
        rewrite_services(f"PREFIX ex: <{EX}> SELECT * WHERE {{ ?s ex:p ?o . SERVICE <http://e/> {{ ?a ex:q ?b }} }}")
    with pytest.raises(ServiceError, match="basic graph pattern"):
        rewrite_services(f"PREFIX ex: <{EX}> SELECT * WHERE {{ ?s ex:p ?o . "
                         f"SERVICE <http://e/> {{ ?s ex:q ?b OPTIONAL {{ ?b ex:r ?c }} }} }}")
    with pytest.raises(ServiceError, match="constant endpoint"):
        rewrite_services(f"PREFIX ex: <{EX}> SELECT * WHERE {{ ?s ex:p ?e . SERVICE ?e {{ ?s ex:q ?b }} }}")
    # Two queries with the same clause share one view graph.
    other = QUERY.replace("?u ?n ?c", "?u ?c")
    assert rewrite_services(other)[1][0].graph == rewrite_services(QUERY)[1][0].graph


def test_a_refresh_that_changes_a_shared_triple_keeps_it_for_the_other_key() -> None:
    _text, (view,) = rewrite_services(QUERY)
    graph = ViewGraph(view)
    a, b = f"<{EX}a>", f"<{EX}b>"
    row = (("c", '"5"'), ("n", '"A"'), ("x", f"<{EX}x>"))
    graph.replace_all({a: [row], b: [row[:1] + (("n", '"B"'),) + row[2:]]})
    removed, added = graph.set_key(a, [])  # a unfollows x: x's count stays, b still needs it
    assert (f"<{EX}x>", f"<{EX}count>", '"5"') not in removed
    assert (a, f"<{EX}follows>", f"<{EX}x>") in removed and added == []
    assert graph.update_text([], []) is None


def test_the_same_clause_under_other_prefixes_comments_and_layout_shares_one_view() -> None:
    (view,) = rewrite_services(QUERY)[1]
    other = f"""# Authors and their counts, written another way
PREFIX x: <{EX}>
PREFIX unused: <urn:unused:>
SELECT * WHERE {{ ?u x:posted ?m .
  SERVICE <http://endpoint.example/sparql> {{ ?u <{EX}follows> ?x .
     ?x x:count ?c .   ?u x:name ?n }} }}"""
    (same,) = rewrite_services(other)[1]
    assert same.graph == view.graph
    changed = other.replace("?u x:name ?n", "?u x:name ?m2")  # another variable: another view
    assert rewrite_services(changed)[1][0].graph != view.graph
    elsewhere = other.replace("endpoint.example", "other.example")
    assert rewrite_services(elsewhere)[1][0].graph != view.graph
