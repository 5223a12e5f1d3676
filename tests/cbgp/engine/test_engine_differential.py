"""Random update streams: after every update, our replayed deltas equal pyoxigraph's answers.

Streams come from a tiny vocabulary so that they are full of the cases the
papers' pseudocode gets wrong: duplicate inserts, deletes of absent triples,
re-inserts, self-loops, cycles, one triple matching several patterns,
literals (as objects only, as RDF requires).  Several queries run at once over
one stream, so the shared predicate index and per-query states are exercised
together.  Together the two tests below run 600 random streams per CI run.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgp.engine.engine import Engine
from cbgp.query.sparql import parse_query
from tests.oracle import OracleGraph, ReplayedAnswers

EX = "http://ex.org/"
NODES = [f"<{EX}{n}>" for n in ("a", "b", "c", "d")]
LITERALS = ['"x"', '"1"^^<http://www.w3.org/2001/XMLSchema#integer>', '"x"@en']
PREDICATES = [f"<{EX}{n}>" for n in ("p", "q", "r")]
GRAPHS = [None, f"<{EX}g1>", f"<{EX}g2>"]

# Fixed queries of every class the papers define, plus projection/DISTINCT/blank-node variants.
FIXED_QUERIES = {
    "star": f"SELECT * WHERE {{ ?x <{EX}p> <{EX}a> . ?x <{EX}q> <{EX}b> }}",
    "star_two_way": f"SELECT * WHERE {{ ?x <{EX}p> <{EX}b> . <{EX}a> <{EX}p> ?x }}",
    "star_literal": f'SELECT ?x WHERE {{ ?x <{EX}r> "x" . ?x <{EX}p> ?x }}',
    "ground": f"SELECT * WHERE {{ <{EX}a> <{EX}p> <{EX}b> . <{EX}b> <{EX}q> <{EX}c> }}",
    "loose": f"SELECT * WHERE {{ ?x <{EX}p> <{EX}a> . <{EX}b> <{EX}q> ?y . <{EX}a> <{EX}r> <{EX}b> }}",
    "path": f"SELECT * WHERE {{ ?x <{EX}p> ?y . ?y <{EX}p> ?z }}",
    "path_mixed": f"SELECT * WHERE {{ ?x <{EX}p> ?y . ?y <{EX}q> ?z . ?z <{EX}r> \"x\" }}",
    "triangle": f"SELECT * WHERE {{ ?x <{EX}p> ?y . ?y <{EX}p> ?z . ?z <{EX}p> ?x }}",
    "two_edges": f"SELECT * WHERE {{ ?x <{EX}p> ?y . ?x <{EX}q> ?y }}",
    "back_edge": f"SELECT * WHERE {{ ?x <{EX}p> ?y . ?y <{EX}q> ?x }}",
    "snowflake": (
        f"SELECT * WHERE {{ ?x <{EX}p> ?y . ?x <{EX}q> ?z . ?y <{EX}r> <{EX}a> . ?z <{EX}r> ?w . ?x <{EX}r> <{EX}b> }}"
    ),
    "mixed": (
        f"SELECT * WHERE {{ ?x <{EX}p> ?y . ?y <{EX}q> <{EX}c> . ?w <{EX}r> <{EX}d> . <{EX}a> <{EX}q> <{EX}b> }}"
    ),
    "projected": f"SELECT ?x WHERE {{ ?x <{EX}p> ?y . ?y <{EX}q> ?z }}",
    "distinct": f"SELECT DISTINCT ?x WHERE {{ ?x <{EX}p> ?y . ?y <{EX}q> ?z }}",
    "distinct_product": f"SELECT DISTINCT ?y WHERE {{ ?x <{EX}p> <{EX}a> . <{EX}b> <{EX}q> ?y }}",
    "bnode": f"SELECT * WHERE {{ ?x <{EX}p> _:m . _:m <{EX}q> ?z }}",
    "self_loop_component": f"SELECT * WHERE {{ ?x <{EX}p> ?x . ?x <{EX}q> ?y }}",
    "named_graph": f"SELECT * WHERE {{ GRAPH <{EX}g1> {{ ?x <{EX}p> ?y }} . ?y <{EX}q> ?z }}",
    "boolean": f"SELECT * WHERE {{ <{EX}a> <{EX}p> <{EX}a> }}",
    "graph_var_path": f"SELECT * WHERE {{ GRAPH ?g {{ ?x <{EX}p> ?y . ?y <{EX}q> ?z }} }}",
    "graph_var_star": f"SELECT DISTINCT ?g WHERE {{ GRAPH ?g {{ ?x <{EX}p> <{EX}a> . ?x <{EX}q> ?g }} }}",
    "graph_var_ground": f"SELECT ?g WHERE {{ GRAPH ?g {{ <{EX}a> <{EX}p> <{EX}b> }} }}",
    # DISTINCT over every graph's solutions (?g not projected): a row found in two graphs is one answer
    "graph_var_distinct": f"SELECT DISTINCT ?x WHERE {{ GRAPH ?g {{ ?x <{EX}p> ?y . ?y <{EX}q> ?z }} }}",
}

# A small alphabet makes joins, self-loops, cycles and repeated triples frequent; the rarer terms still
# appear so that literals, the third predicate and the named graph are covered.
subjects = st.sampled_from(NODES[:3] * 3 + NODES[3:])
objects = st.sampled_from(NODES[:3] * 4 + NODES[3:] + LITERALS + GRAPHS[1:])
predicates = st.sampled_from(PREDICATES[:2] * 3 + PREDICATES[2:])
graphs = st.sampled_from([None] * 4 + GRAPHS[1:])
updates = st.tuples(st.sampled_from([1, 1, -1]), subjects, predicates, objects, graphs)
streams = st.lists(updates, min_size=1, max_size=40)


def check_stream(queries: dict[str, str], stream: list[tuple]) -> None:
    engine = Engine()
    oracle = OracleGraph()
    replayed = {}
    for name, text in queries.items():
        engine.register(name, text)
        replayed[name] = ReplayedAnswers()
    distinct = {name: parse_query(text).distinct for name, text in queries.items()}
    for step, (op, s, p, o, g) in enumerate(stream, 1):
        oracle.apply(op, s, p, o, g)
        for name, sign, row in engine.apply_terms(op, s, p, o, g):
            replayed[name].apply(sign, engine.decode_row(name, row), distinct[name])
        for name, text in queries.items():
            expected = oracle.answers(text)
            assert replayed[name].rows == expected, f"query {name} after update {step} {(op, s, p, o, g)}"


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(stream=streams)
def test_fixed_queries_of_every_class_match_pyoxigraph_after_every_update(stream):
    check_stream(FIXED_QUERIES, stream)


variables = ["?x", "?y", "?z"]
subject_terms = st.sampled_from(variables + NODES[:2])
object_terms = st.sampled_from(variables + NODES[:2] + LITERALS[:1])


@st.composite
def random_queries(draw):
    patterns = draw(
        st.lists(st.tuples(subject_terms, st.sampled_from(PREDICATES), object_terms), min_size=1, max_size=4)
    )
    body = " . ".join(f"{s} {p} {o}" for s, p, o in patterns)
    used = sorted({t for s, _, o in patterns for t in (s, o) if t.startswith("?")})
    return f"{select_clause(draw, used)} WHERE {{ {body} }}"


def select_clause(draw, used: list[str]) -> str:  # noqa: ANN001 - hypothesis' draw
    """``SELECT [DISTINCT] *`` or a random non-empty projection of the ``used`` variables."""
    distinct = draw(st.booleans())
    if used and draw(st.booleans()):
        head = " ".join(draw(st.lists(st.sampled_from(used), min_size=1, max_size=len(used), unique=True)))
    else:
        head = "*"
    return f"SELECT {'DISTINCT ' if distinct else ''}{head}"


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(queries=st.lists(random_queries(), min_size=1, max_size=3), stream=streams)
def test_random_bgps_match_pyoxigraph_after_every_update(queries, stream):
    check_stream({f"q{i}": q for i, q in enumerate(queries)}, stream)
