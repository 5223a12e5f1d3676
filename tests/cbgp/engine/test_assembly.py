"""cbgp.engine.assembly: the product of a query's parts, assembled from per-part deltas.

The set-up mirrors the planned deployment: an Engine holds each part of a query
as its own sub-query ("name#i"), its per-part deltas go through an Assembler,
and the assembled stream must (a) replay to pyoxigraph's answers of the WHOLE
query after every update and (b) equal, per update and as a multiset, the
deltas of the same Engine with the whole query registered directly.
"""

from __future__ import annotations

import json
import pickle
from collections import Counter
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.cbgp.engine.test_engine_differential as differential
from cbgp.engine.assembly import (Assembler, AssemblyError, GraphAssembler, PartQuery, assembler_for, needs_assembly,
                           split_parts)
from cbgp.engine.engine import Engine
from cbgp.query.sparql import parse_query
from tests.oracle import OracleGraph, ReplayedAnswers

EX = differential.EX
P, Q, R = (f"<{EX}{n}>" for n in ("p", "q", "r"))
A, B, C, D = (f"<{EX}{n}>" for n in ("a", "b", "c", "d"))
G1 = f"<{EX}g1>"

# Multi-part queries of every shape the product handles (all have needs_assembly True).
FIXED_QUERIES = {
    "ground_star": f"SELECT * WHERE {{ {A} {P} {B} . ?x {Q} {A} }}",
    "loose": differential.FIXED_QUERIES["loose"],
    "two_stars": f"SELECT * WHERE {{ ?x {P} {A} . {B} {Q} ?y }}",
    "three_stars_projected": f'SELECT ?z ?x WHERE {{ ?x {P} {A} . {B} {Q} ?y . ?z {R} "x" . ?z {P} ?z }}',
    "star_times_path": f"SELECT * WHERE {{ ?x {P} ?y . ?y {Q} ?z . ?w {R} {D} }}",
    "star_times_cycle": f"SELECT ?w ?x WHERE {{ ?x {P} ?y . ?y {P} ?x . ?w {Q} {B} . ?w {P} {A} }}",
    "mixed": differential.FIXED_QUERIES["mixed"],
    "distinct_product": differential.FIXED_QUERIES["distinct_product"],
    "distinct_dropping_all_of_a_part": f"SELECT DISTINCT ?x WHERE {{ ?x {P} ?y . ?z {Q} {B} . {A} {R} {B} }}",
    "distinct_star": f"SELECT DISTINCT * WHERE {{ ?x {P} {A} . ?y {Q} ?y }}",
    "bnode_component_times_star": f"SELECT * WHERE {{ ?x {P} _:m . _:m {Q} ?z . ?w {R} {A} }}",
    "bnode_star_multiplicity": f"SELECT ?x WHERE {{ ?x {P} {A} . _:b {Q} {B} }}",
    "bnode_only_and_ground": f"SELECT * WHERE {{ _:b {P} {A} . [] {Q} ?x . {A} {P} {B} }}",
    "projection_drops_parts": f"SELECT ?y WHERE {{ ?x {P} {A} . ?x {Q} ?x . {B} {Q} ?y }}",
    "named_graph_parts": f"SELECT * WHERE {{ GRAPH {G1} {{ ?x {P} {A} . {A} {P} {B} }} . ?y {Q} {B} }}",
    "named_graph_mixed": (
        f"SELECT ?x ?z WHERE {{ GRAPH {G1} {{ ?x {P} ?y }} . ?y {Q} ?z . GRAPH {G1} {{ ?w {Q} {A} }} }}"
    ),
}


# Denser streams than the engine differential test's (a smaller alphabet, longer lists): a product only
# changes when several parts hold at once, which that test's streams rarely reach.
dense_updates = st.tuples(
    st.sampled_from([1, 1, -1]),
    st.sampled_from([A, B, C] * 2 + [D]),
    differential.predicates,
    st.sampled_from([A, B, C] * 3 + [D, G1] + differential.LITERALS),
    st.sampled_from([None] * 3 + [G1]),
)
dense_streams = st.lists(dense_updates, min_size=4, max_size=40)

parsed = lru_cache(maxsize=None)(parse_query)  # rdflib parsing dominates otherwise (~10 ms a query)


def run_stream(queries: dict[str, str], stream: list[tuple], restore_at: int | None = None,
               check: bool = True, before: list[tuple] = ()) -> list[dict]:
    """Feed the stream through engine parts + assemblers; check both oracles after every update (if `check`).

    `before`: updates applied before the queries are registered (a query registered late: its parts'
    initial answers, fed as one `apply`, must give the whole query's).  `restore_at`: before that update,
    every assembler is replaced by `from_state` of its JSON-round-tripped `to_state()`.
    Returns, per update, each query's assembled deltas (for comparing runs).
    """
    engine = Engine(keep_graph=True)
    oracle = OracleGraph()
    for op, s, p, o, g in before:
        engine.apply_terms(op, s, p, o, g)
        oracle.apply(op, s, p, o, g)
    assemblers: dict[str, Assembler] = {}
    replayed: dict[str, ReplayedAnswers] = {}

    def replay(name: str, out: list, where: str) -> None:
        assembler = assemblers[name]
        assert not ({row for sign, row in out if sign > 0} & {row for sign, row in out if sign < 0}), where
        for sign, row in out:
            binding = dict(zip(assembler.columns, map(engine.dictionary.decode, row)))
            replayed[name].apply(sign, binding, assembler.distinct)
        assert replayed[name].rows == oracle.answers(queries[name]), where

    for name, text in queries.items():
        assemblers[name] = assembler = Assembler(parsed(text))
        replayed[name] = ReplayedAnswers()
        whole = Counter((sign, row) for _, sign, row in engine.register(name, parsed(text)))
        assert engine.columns(name) == assembler.columns
        initial = []
        for part in assembler.parts:
            part_name = f"{name}#{part.index}"
            initial += [(part.index, sign, row) for _, sign, row in engine.register(part_name, parsed(part.sparql))]
            assert engine.columns(part_name) == part.columns
        out = assembler.apply(initial)
        assert Counter(out) == whole and all(sign > 0 for sign, _ in out), f"initial answers of {name}"
        if check:
            replay(name, out, f"initial answers of {name}")
    history: list[dict] = []
    for step, (op, s, p, o, g) in enumerate(stream, 1):
        if restore_at is not None and step == restore_at:
            for name, text in queries.items():
                saved = json.loads(json.dumps(assemblers[name].to_state()))
                assemblers[name] = Assembler.from_state(parsed(text), saved)
        if check:
            oracle.apply(op, s, p, o, g)
        part_deltas: dict[str, list] = {name: [] for name in queries}
        whole_deltas: dict[str, Counter] = {name: Counter() for name in queries}
        for query, sign, row in engine.apply_terms(op, s, p, o, g):
            name, _, index = query.partition("#")
            if index:
                part_deltas[name].append((int(index), sign, row))
            else:
                whole_deltas[name][(sign, row)] += 1
        outputs = {}
        for name in queries:
            out = assemblers[name].apply(part_deltas[name])
            outputs[name] = out
            where = f"query {name} after update {step} {(op, s, p, o, g)}"
            assert Counter(out) == whole_deltas[name], where
            if check:
                replay(name, out, where)
        history.append(outputs)
    return history


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(stream=dense_streams)
def test_fixed_multi_part_queries_match_pyoxigraph_and_the_whole_query(stream):
    run_stream(FIXED_QUERIES, stream)


# Random BGPs: the differential test's terms plus a blank node, and patterns sometimes in GRAPH <g1>.
_subject_terms = st.sampled_from(differential.variables + differential.NODES[:2] + ["_:b"])
_object_terms = st.sampled_from(differential.variables + differential.NODES[:2] + differential.LITERALS[:1] + ["_:b"])


@st.composite
def random_queries(draw):
    patterns = draw(st.lists(
        st.tuples(_subject_terms, st.sampled_from(differential.PREDICATES), _object_terms, st.booleans()),
        min_size=1, max_size=4,
    ))
    # Named-graph patterns go in one GRAPH block after the default-graph ones, where the blank node stays:
    # a blank node label may not be shared by two basic graph patterns.
    default = [f"{s} {p} {o}" for s, p, o, named in patterns if not named or "_:b" in (s, o)]
    named = [f"{s} {p} {o}" for s, p, o, named in patterns if named and "_:b" not in (s, o)]
    body = default + ([f"GRAPH {G1} {{ {' . '.join(named)} }}"] if named else [])
    used = sorted({t for s, _, o, _ in patterns for t in (s, o) if t.startswith("?")})
    return f"{differential.select_clause(draw, used)} WHERE {{ {' . '.join(body)} }}"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(queries=st.lists(random_queries(), min_size=1, max_size=3), stream=dense_streams)
def test_random_bgps_assembled_from_parts_match_pyoxigraph(queries, stream):
    run_stream({f"q{i}": q for i, q in enumerate(queries)}, stream)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(stream=dense_streams, cut=st.integers(min_value=1, max_value=40))
def test_to_state_from_state_mid_stream_continues_identically(stream, cut):
    # Both runs are unchecked: the test above checks the same runs against the oracles.
    plain = run_stream(FIXED_QUERIES, stream, check=False)
    restored = run_stream(FIXED_QUERIES, stream, restore_at=min(cut, len(stream)), check=False)
    assert plain == restored


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(before=dense_streams, after=dense_streams)
def test_query_registered_after_data_arrived(before, after):
    run_stream(FIXED_QUERIES, after, before=before)


# -- the API on the paper-style examples ---------------------------------------------------------

def test_needs_assembly_on_paper_style_examples():
    assert not needs_assembly(f"SELECT * WHERE {{ ?x {P} {A} . ?x {Q} {B} }}")  # one simple star
    assert not needs_assembly(f"SELECT * WHERE {{ ?x {P} ?y . ?y {Q} ?z }}")  # one component
    assert not needs_assembly(f"SELECT * WHERE {{ {A} {P} {B} }}")  # ground only
    assert needs_assembly(f"SELECT * WHERE {{ {A} {P} {B} . ?x {Q} {A} }}")  # ground + star
    assert needs_assembly(parse_query(f"SELECT ?x WHERE {{ ?x {P} {A} . {B} {Q} ?y }}"))  # two stars
    assert not needs_assembly(f"SELECT * WHERE {{ GRAPH ?g {{ ?x {P} {A} . {B} {Q} ?y }} }}")
    for name, text in FIXED_QUERIES.items():
        assert needs_assembly(text), name


def test_split_parts_of_ground_plus_star_plus_component():
    text = f'SELECT ?z WHERE {{ {A} {P} {B} . ?x {Q} "x"@en . ?y {P} _:n . _:n {R} ?z }}'
    parts = split_parts(text)
    assert parts == [
        PartQuery(0, f"SELECT * WHERE {{ {A} {P} {B} . }}", ()),
        PartQuery(1, f'SELECT ?x WHERE {{ ?x {Q} "x"@en . }}', ("x",)),
        PartQuery(2, f"SELECT ?y ?z WHERE {{ ?y {P} _:n . _:n {R} ?z . }}", ("y", "z")),
    ]
    assert Assembler(text).columns == ("z",)


def test_split_parts_keeps_graph_blocks_and_columns_match_the_engine():
    engine = Engine()
    for name, text in FIXED_QUERIES.items():
        original = parse_query(text)  # `[]` gets a fresh label at every parse: split this very parse
        for part in split_parts(original):
            reparsed = parse_query(part.sparql)
            assert not reparsed.distinct
            assert set(reparsed.patterns) <= set(original.patterns)
            engine.register(f"{name}#{part.index}", part.sparql)
            assert engine.columns(f"{name}#{part.index}") == part.columns
    assert split_parts(FIXED_QUERIES["named_graph_parts"])[0].sparql == (
        f"SELECT * WHERE {{ GRAPH {G1} {{ {A} {P} {B} . }} }}"
    )
    # A GRAPH ?g query's parts carry ?g first (the product joins them on it): GraphAssembler, not Assembler.
    graph_query = f"SELECT ?y WHERE {{ GRAPH ?g {{ ?x {P} {A} . {B} {Q} ?y }} }}"
    parts = split_parts(graph_query)
    assert [(p.sparql, p.columns) for p in parts] == [
        (f"SELECT ?g ?x WHERE {{ GRAPH ?g {{ ?x {P} {A} . }} }}", ("g", "x")),
        (f"SELECT ?g ?y WHERE {{ GRAPH ?g {{ {B} {Q} ?y . }} }}", ("g", "y"))]
    for part in parts:
        engine.register(f"graph#{part.index}", part.sparql)
        assert engine.columns(f"graph#{part.index}") == part.columns
    with pytest.raises(AssemblyError):
        Assembler(graph_query)
    assert isinstance(assembler_for(graph_query), GraphAssembler)


def test_graph_products_join_on_the_graph_by_hand():
    """Per named graph the product of the parts' rows of that graph; without ?g projected the graphs'
    answers add up, and under DISTINCT a row found in two graphs is one answer until it is in neither."""
    text = f"SELECT ?g ?x ?y WHERE {{ GRAPH ?g {{ ?x {P} {A} . {B} {Q} ?y }} }}"
    assembler = assembler_for(text)
    assert assembler.columns == ("g", "x", "y")
    assert assembler.apply([(0, 1, (100, 7))]) == []  # graph 100 has no part-1 row yet
    assert assembler.apply([(1, 1, (200, 8))]) == []  # graph 200 has no part-0 row: no cross-graph product
    assert assembler.apply([(1, 1, (100, 9))]) == [(1, (100, 7, 9))]
    assert assembler.apply([(0, -1, (100, 7))]) == [(-1, (100, 7, 9))]
    distinct = assembler_for(f"SELECT DISTINCT ?y WHERE {{ GRAPH ?g {{ ?x {P} {A} . {B} {Q} ?y }} }}")
    assert distinct.columns == ("y",)
    assert distinct.apply([(0, 1, (100, 7)), (1, 1, (100, 9))]) == [(1, (9,))]
    assert distinct.apply([(0, 1, (200, 5)), (1, 1, (200, 9))]) == []  # in a second graph: still one answer
    assert distinct.apply([(0, -1, (100, 7))]) == []  # still an answer in graph 200
    assert distinct.apply([(1, -1, (200, 9))]) == [(-1, (9,))]
    # A restore folds released deltas in any order, then counts the graphs' answers again before the next
    # update: the row is an answer in graph 300 alone, so removing it there retracts it.
    restored = assembler_for(f"SELECT DISTINCT ?y WHERE {{ GRAPH ?g {{ ?x {P} {A} . {B} {Q} ?y }} }}")
    for part, sign, row in [(1, 1, (300, 9)), (0, -1, (100, 7)), (0, 1, (300, 4)), (0, 1, (100, 7))]:
        restored.absorb(part, sign, row)
    assert restored.apply([(1, -1, (300, 9))]) == [(-1, (9,))]
    assert restored.state_entries() == 1  # graph 300's part-0 row; graph 100 was emptied and dropped


def test_multiplicities_distinct_and_ground_gating_by_hand():
    # Parts: ground, star ?x, star _:b (columns ()); output ?x.
    assembler = Assembler(f"SELECT ?x WHERE {{ {A} {P} {B} . ?x {P} {A} . _:b {Q} {B} }}")
    assert [p.columns for p in assembler.parts] == [(), ("x",), ()]
    assert assembler.apply([(1, 1, (7,)), (2, 1, ()), (2, 1, ())]) == []  # the ground part gates
    assert sorted(assembler.apply([(0, 1, ())])) == [(1, (7,)), (1, (7,))]
    assert assembler.apply([(2, -1, ())]) == [(-1, (7,))]
    assert sorted(assembler.apply([(1, 1, (8,)), (1, -1, (7,))])) == [(-1, (7,)), (1, (8,))]
    assert assembler.apply([(1, 1, (9,)), (1, -1, (9,))]) == []  # cancels within the update
    assert assembler.apply([(0, -1, ())]) == [(-1, (8,))]
    assert assembler.state_entries() == 2

    distinct = Assembler(f"SELECT DISTINCT ?x WHERE {{ ?x {P} {A} . _:b {Q} {B} }}")
    assert distinct.apply([(0, 1, (7,)), (1, 1, ()), (1, 1, ())]) == [(1, (7,))]
    assert distinct.apply([(1, -1, ())]) == []
    assert distinct.apply([(1, -1, ()), (0, 1, (8,))]) == [(-1, (7,))]  # 8 arrives while the product is empty


def test_cross_part_deltas_in_one_update_are_consolidated():
    assembler = Assembler(f"SELECT * WHERE {{ ?x {P} {A} . {B} {Q} ?y }}")
    assert assembler.apply([(0, 1, (1,)), (1, 1, (2,))]) == [(1, (1, 2))]
    # Any order of the same deltas gives the same net: ΔA×B + A×ΔB + ΔA×ΔB.
    for order in ([(0, 1, (3,)), (1, 1, (4,))], [(1, 1, (4,)), (0, 1, (3,))]):
        fresh = Assembler.from_state(assembler.query, assembler.to_state())
        assert Counter(fresh.apply(order)) == Counter({(1, (3, 2)): 1, (1, (1, 4)): 1, (1, (3, 4)): 1})
    # Opposite part changes whose product terms would cancel produce nothing spurious.
    assert Counter(assembler.apply([(0, -1, (1,)), (0, 1, (5,)), (1, -1, (2,)), (1, 1, (6,))])) == Counter(
        {(-1, (1, 2)): 1, (1, (5, 6)): 1}
    )


def test_state_is_plain_data_and_bad_input_is_rejected():
    text = f"SELECT * WHERE {{ {A} {P} {B} . ?x {Q} {A} . ?y {R} ?z }}"
    assembler = Assembler(text)
    assembler.apply([(0, 1, ()), (1, 1, (3,)), (2, 1, (4, 5)), (2, 1, (4, 5))])
    state = assembler.to_state()
    assert json.loads(json.dumps(state)) == state
    assert pickle.loads(pickle.dumps(state)) == state
    restored = Assembler.from_state(text, state)
    assert restored.to_state() == state and restored.state_entries() == assembler.state_entries() == 3
    with pytest.raises(AssemblyError):
        Assembler.from_state(f"SELECT ?x WHERE {{ {A} {P} {B} . ?x {Q} {A} . ?y {R} ?z }}", state)
    with pytest.raises(AssemblyError):
        assembler.apply([(1, -1, (99,))])  # removes an answer the part never had
    with pytest.raises(AssemblyError):
        assembler.apply([(3, 1, (1,))])
    with pytest.raises(AssemblyError):
        assembler.apply([(1, 1, (1, 2))])
    assert assembler.to_state() == state  # a rejected batch changes nothing
