"""Property paths against pyoxigraph: after every update of a random stream (deletions, duplicate inserts,
deletes of absent triples, self-loops, cycles over four nodes, literals, a named graph), the answers rebuilt from
our deltas equal pyoxigraph's re-evaluated from scratch, for every path form alone, nested, and joined to
patterns and under operators; and closures sharing one engine's steps, registered and dropped mid-stream."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgp.algebra import ContinuousEngine, OperatorQuerySpec, analyse
from tests.cbgp.algebra.test_algebra_differential import PREFIX, check_stream, expected_answers, streams
from tests.oracle import OracleGraph, ReplayedAnswers

GROUPS = {
    "rewritten": {
        "sequence": "SELECT * WHERE { ?x :p/:q ?y }",
        "sequence_inverse": "SELECT * WHERE { ?x ^:p/:q ?y }",
        "inverse_anchored": "SELECT * WHERE { :a ^:p ?y }",
        "alternative": "SELECT * WHERE { ?x :p|:q ?y }",
        "alternative_of_sequence": "SELECT * WHERE { ?x (:p/:q)|:r ?y }",
        "sequence_of_alternative": "SELECT * WHERE { ?x :p/(:q|:r) ?y }",
        "alternative_inverse": "SELECT * WHERE { ?x :p|^:q ?y }",
        "negated": "SELECT * WHERE { ?x !(:p|:q) ?y }",
        "negated_one": "SELECT * WHERE { :a !:p ?y }",
        "negated_inverse": "SELECT * WHERE { ?x ^!:p ?y }",
        "negated_graph": "SELECT * WHERE { GRAPH ?g { ?x !:r ?y } }",
        "optional_step": "SELECT * WHERE { ?x :p? ?y }",
        "optional_step_anchored": "SELECT * WHERE { :a (:p|:q)? ?y }",
        "sequence_optional_step": "SELECT * WHERE { ?x :p/:q? ?y }",
        "blank_node": "SELECT ?x WHERE { ?x :p/:q _:b . _:b :r ?z }",
    },
    "closures": {
        "plus": "SELECT * WHERE { ?x :p+ ?y }",
        "star": "SELECT * WHERE { ?x :p* ?y }",
        "plus_anchored": "SELECT * WHERE { :a :p+ ?y }",
        "star_anchored": "SELECT * WHERE { :a :p* ?y }",
        "plus_object_anchored": "SELECT * WHERE { ?x :p+ :a }",
        "star_object_anchored": "SELECT * WHERE { ?x (:p|:q)* :b }",
        "both_anchored": "ASK { :a :p* :c }",
        "cycle": "SELECT * WHERE { ?x :p+ ?x }",
        "star_same": "SELECT * WHERE { ?x (:p|:q)* ?x }",
        "closure_of_sequence": "SELECT * WHERE { :a (:p/:q)+ ?y }",
        "closure_of_alternative": "SELECT * WHERE { ?x (:p|^:q)+ ?y }",
        "inverse_closure": "SELECT * WHERE { :a ^:p+ ?y }",
        "nested_closure": "SELECT * WHERE { :a (:p*/:q)+ ?y }",
        "negated_closure": "SELECT * WHERE { :a (!:q)+ ?y }",
        "literal_end": 'SELECT * WHERE { ?x :r* "x" }',
    },
    "combined": {
        "graph_closure": "SELECT * WHERE { GRAPH ?g { ?x :p* ?y } }",
        "graph_anchored": "SELECT * WHERE { GRAPH <http://ex.org/g1> { :a :p+ ?y } }",
        "joined": "SELECT * WHERE { ?x :p+ ?y . ?y :r ?z }",
        "two_paths": "SELECT * WHERE { ?x :p+ ?y . ?y (:q|:r) ?z }",
        "optional": "SELECT * WHERE { ?x :q ?y OPTIONAL { ?y :p+ ?z } }",
        "filter": "SELECT * WHERE { ?x :p* ?y FILTER(?x != ?y && isIRI(?y)) }",
        "count": "SELECT ?x (COUNT(?y) AS ?n) WHERE { ?x :p+ ?y } GROUP BY ?x",
        "union": "SELECT * WHERE { { ?x :p+ ?y } UNION { ?x :q ?y } }",
        "minus": "SELECT * WHERE { ?x :q ?y MINUS { ?x :p+ ?y } }",
        "exists": "SELECT * WHERE { ?x :q ?y FILTER EXISTS { ?y :p* :a } }",
        "distinct": "SELECT DISTINCT ?x WHERE { ?x :p/:p ?y }",
        "construct": "CONSTRUCT { ?x :reaches ?y } WHERE { ?x (:p|:q)+ ?y }",
    },
}
# Spanning trees cut and re-attached: longer streams over six nodes, a third of them deletions.
GROUPS["trees"] = {name: GROUPS["closures"][name] for name in ("plus", "plus_anchored", "plus_object_anchored",
                                                              "cycle", "closure_of_alternative")}
STREAMS = {"rewritten": 300, "closures": 400, "combined": 300, "trees": 150}
SIX = [f"<http://ex.org/{n}>" for n in "abcdef"]
cyclic = st.lists(st.tuples(st.sampled_from([1, 1, 1, -1]), st.sampled_from(["<http://ex.org/a>",
                                                                              "<http://ex.org/b>",
                                                                              "<http://ex.org/c>"]),
                            st.sampled_from(["<http://ex.org/p>", "<http://ex.org/q>"]),
                            st.sampled_from(["<http://ex.org/a>", "<http://ex.org/b>", "<http://ex.org/c>"]),
                            st.just(None)), min_size=1, max_size=30)
longer = st.lists(st.tuples(st.sampled_from([1, 1, -1]), st.sampled_from(SIX),
                            st.sampled_from(["<http://ex.org/p>", "<http://ex.org/p>", "<http://ex.org/q>"]),
                            st.sampled_from(SIX), st.just(None)), min_size=20, max_size=80)


def _group_test(group: str, stream_strategy):  # noqa: ANN001, ANN202
    @settings(max_examples=STREAMS[group], deadline=None, suppress_health_check=list(HealthCheck),
              database=None)
    @given(stream=stream_strategy)
    def test(stream):  # noqa: ANN001, ANN202
        check_stream(GROUPS[group], stream)

    return test


test_rewritten_paths_match_pyoxigraph_after_every_update = _group_test("rewritten", streams)
test_closures_match_pyoxigraph_after_every_update = _group_test("closures", streams)
test_closures_on_dense_cycles_match_pyoxigraph = _group_test("closures", cyclic)
test_trees_cut_and_reattached_match_pyoxigraph = _group_test("trees", longer)
test_paths_under_operators_match_pyoxigraph_after_every_update = _group_test("combined", streams)


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_path_query_is_accepted(group):
    for name, text in GROUPS[group].items():
        assert isinstance(analyse(PREFIX + text), OperatorQuerySpec), name


# Closures over :p and :q sharing the engine's steps: some from the start, some registered mid-stream (seeded from
# the steps the others kept, or from the graph for a predicate no query read yet), one dropped and registered again.
SHARING = {
    "early_plus": "SELECT * WHERE { :a :p+ ?y }",
    "early_all": "SELECT * WHERE { ?x :p+ ?y }",
    "late_star": "SELECT * WHERE { ?x :p* :b }",
    "late_inverse": "SELECT * WHERE { :c ^:p+ ?y }",
    "late_other": "SELECT * WHERE { ?x :q+ ?y . ?y :p ?z }",
    "dropped": "SELECT * WHERE { :b :q+ ?y }",
}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(stream=longer, late=st.integers(0, 80), dropped=st.integers(0, 80))
def test_closures_sharing_steps_registered_and_dropped_mid_stream_match_pyoxigraph(stream, late, dropped):
    engine = ContinuousEngine(keep_graph=True)
    oracle = OracleGraph()
    texts = {name: PREFIX + text for name, text in SHARING.items()}
    replayed: dict[str, ReplayedAnswers] = {}

    def register(name: str) -> None:
        replayed[name] = ReplayedAnswers()
        for _, sign, row in engine.register(name, texts[name]):
            replayed[name].apply(sign, engine.decode_row(name, row))

    for name in ("early_plus", "early_all", "dropped"):
        register(name)
    for step, (op, s, p, o, g) in enumerate(stream):
        if step == late:
            for name in ("late_star", "late_inverse", "late_other"):
                register(name)
        if step == dropped:
            engine.unregister("dropped")
            del replayed["dropped"]
        if step == dropped + 5:
            register("dropped")
        oracle.apply(op, s, p, o, g)
        for name, sign, row in engine.apply_terms(op, s, p, o, g):
            replayed[name].apply(sign, engine.decode_row(name, row))
        for name in replayed:
            expected = expected_answers(oracle, texts[name])
            assert replayed[name].rows == expected, f"query {name} after update {step} {(op, s, p, o, g)}"
    assert set(engine.steps) <= {engine.dictionary.encode(f"<http://ex.org/{n}>") for n in "pq"}
