"""Queries sharing var-var tables (cbgp.engine.edge_tables): exact whatever registers, replays and leaves when.

Random streams over a tiny vocabulary (duplicate inserts, deletes of absent triples, self-loops, one
triple matching several patterns of one query) interleaved with registrations and unregistrations of
queries drawn from a pool where many share a pattern shape (``?x p ?y`` with different constants around
it, the same relation twice in one query, in two parts of a product, in GRAPH ?g instances).  A query
registered late is brought up to date either from the engine's own graph copy (`register`) or by
replaying the history into it alone (`register(initial=[])` then `apply_to`, deletions included, as
the fleet's workers do).  After every step every registered query's answers equal
pyoxigraph's re-evaluation, and once every query has gone the engine holds no state.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgp.engine.engine import Engine
from cbgp.query.sparql import parse_query
from cbgp.terms import DEFAULT_GRAPH_ID
from tests.oracle import OracleGraph, ReplayedAnswers

EX = "http://ex.org/"
NODES = [f"<{EX}{n}>" for n in ("a", "b", "c")]
P, Q = f"<{EX}p>", f"<{EX}q>"
G1 = f"<{EX}g1>"

POOL = [
    *(f"SELECT * WHERE {{ ?y {Q} {c} . ?x {P} ?y }}" for c in NODES),  # the bench's shape, one per constant
    *(f"SELECT * WHERE {{ ?x {P} ?y . ?x {Q} {c} }}" for c in NODES[:2]),  # gated on the subject end
    f"SELECT * WHERE {{ ?x {P} ?y . ?y {P} ?z }}",  # one relation twice, two roles
    f"SELECT * WHERE {{ ?x {P} ?y . ?y {P} ?x }}",
    f"SELECT * WHERE {{ ?x {P} {NODES[0]} . ?x {P} ?y }}",  # a single pattern opening its own var-var gate
    f"SELECT * WHERE {{ ?x {P} ?y . ?y {P} ?z . ?z {P} ?x }}",
    f"SELECT * WHERE {{ ?x {P} ?y }}",
    f"SELECT DISTINCT ?x WHERE {{ ?x {P} ?y . ?y {Q} ?z }}",
    f"SELECT * WHERE {{ ?x {P} ?y . ?z {P} ?w }}",  # a product: two parts over one shared table
    f"SELECT * WHERE {{ ?x {P} ?x . ?x {P} ?y }}",
    f"SELECT * WHERE {{ GRAPH ?g {{ ?x {P} ?y . ?y {Q} {NODES[1]} }} }}",
    f"SELECT * WHERE {{ GRAPH {G1} {{ ?x {P} ?y }} . ?y {Q} ?z }}",
]

terms = st.sampled_from(NODES * 2 + [f"<{EX}d>"])
updates = st.tuples(st.just("u"), st.sampled_from([1, 1, -1]), terms, st.sampled_from([P, P, Q]), terms,
                    st.sampled_from([None, None, None, G1]))
registrations = st.tuples(st.just("r"), st.integers(0, len(POOL) - 1), st.booleans())
unregistrations = st.tuples(st.just("x"), st.integers(0, 20))
events = st.lists(st.one_of(updates, updates, updates, registrations, unregistrations), min_size=1, max_size=45)


def _ids(engine: Engine, s: str, p: str, o: str, g: str | None) -> tuple[int, int, int, int]:
    encode = engine.dictionary.encode
    return encode(s), encode(p), encode(o), DEFAULT_GRAPH_ID if g is None else encode(g)


def run_events(initial: list[int], stream: list[tuple]) -> None:
    engine = Engine(keep_graph=True)
    oracle = OracleGraph()
    history: list[tuple[int, int, int, int, int]] = []
    live: dict[str, tuple[str, ReplayedAnswers, bool]] = {}
    number = 0

    def register(index: int, replay: bool) -> None:
        nonlocal number
        number += 1
        name, text = f"q{number}", POOL[index]
        answers = ReplayedAnswers()
        distinct = parse_query(text).distinct
        if replay:  # the worker's way: nothing at registration, then the history fed to this query alone
            assert engine.register(name, text, initial=[]) == []
            for sign, s, p, o, g in history:
                for q, d_sign, row in engine.apply_to(name, sign, s, p, o, g):
                    answers.apply(d_sign, engine.decode_row(q, row), distinct)
        else:
            for q, d_sign, row in engine.register(name, text):
                answers.apply(d_sign, engine.decode_row(q, row), distinct)
        live[name] = (text, answers, distinct)

    for index in initial:
        register(index, False)
    for step, event in enumerate(stream, 1):
        if event[0] == "u":
            _kind, op, s, p, o, g = event
            oracle.apply(op, s, p, o, g)
            history.append((op, *_ids(engine, s, p, o, g)))
            for name, sign, row in engine.apply_terms(op, s, p, o, g):
                text, answers, distinct = live[name]
                answers.apply(sign, engine.decode_row(name, row), distinct)
        elif event[0] == "r":
            register(event[1], event[2])
        elif live:
            name = sorted(live)[event[1] % len(live)]
            engine.unregister(name)
            del live[name]
        for name, (text, answers, _distinct) in live.items():
            assert answers.rows == oracle.answers(text), f"{name} = {text} after event {step} {event}"
    for name in list(live):
        engine.unregister(name)
    assert engine.state_entries() == 0 and not engine._shared and not any(engine._index.values())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, len(POOL) - 1), min_size=1, max_size=6), events)
def test_queries_sharing_tables_match_the_oracle_whenever_they_come_and_go(initial, stream) -> None:
    run_events(initial, stream)


def test_same_shape_queries_share_one_table_and_cost_only_what_is_new() -> None:
    """50 queries of the bench's shape hold the `like`-style relation once: the engine's state is the
    single query's plus each query's own (small) masks, not 50 copies; the last unregister frees it."""
    like, tag = f"<{EX}like>", f"<{EX}tag>"
    tags = [f'"t{i}"' for i in range(50)]

    def fill(engine: Engine) -> None:
        for i in range(400):
            engine.apply_terms(1, f"<{EX}fan{i % 37}>", like, f"<{EX}post{i}>")
            engine.apply_terms(1, f"<{EX}post{i}>", tag, tags[i % 50])

    one, many = Engine(), Engine()
    one.register("q0", f"SELECT * WHERE {{ ?post {tag} {tags[0]} . ?fan {like} ?post }}")
    for i, t in enumerate(tags):
        many.register(f"q{i}", f"SELECT * WHERE {{ ?post {tag} {t} . ?fan {like} ?post }}")
    empty_one, empty_many = one.state_bytes(), many.state_bytes()  # containers every query has
    fill(one)
    fill(many)
    assert len(many._shared) == 1
    single = one.state_entries()
    assert many.state_entries("q0") == single  # a query is charged the shared table in full
    assert many.state_entries() < single + 50 * 10  # the table once, plus 8 masked posts per query
    assert many.state_bytes() - empty_many < 2 * (one.state_bytes() - empty_one)
    for i in range(50):
        many.unregister(f"q{i}")
    assert many.state_entries() == 0 and not many._shared


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, 40)), max_size=300))
def test_neighbour_containers_behave_as_sets(ops) -> None:
    """cbgp.engine.part_state's neighbour containers (int, tuple up to 16, set beyond, back to a tuple at 8) against
    dict-of-sets: what add/remove report, membership, iteration and length."""
    from cbgp.engine.part_state import nb_add, nb_has, nb_iter, nb_len, nb_remove, nb_same

    table: dict = {}
    model: dict[int, set[int]] = {}
    for add, key, value in ops:
        present = value in model.get(key, ())
        if add:
            assert nb_add(table, key, value) is not present
            model.setdefault(key, set()).add(value)
        else:
            assert nb_remove(table, key, value) is present
            model.get(key, set()).discard(value)
            if key in model and not model[key]:
                del model[key]
        assert set(table) == set(model)
        for k, values in model.items():
            assert sorted(nb_iter(table[k])) == sorted(values) and nb_len(table[k]) == len(values)
            assert nb_same(table[k], tuple(reversed(sorted(values)))) and nb_has(table, k, value) == (
                value in values)
