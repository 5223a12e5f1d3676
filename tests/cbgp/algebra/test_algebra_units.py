"""cbgp.algebra beside the differential tests: push-down, late registration, the fast path, rejections."""

from __future__ import annotations

import random

import pytest

from cbgp.algebra import ContinuousEngine, OperatorQuerySpec, analyse
from cbgp.query.sparql import ParsedQuery, QueryError

EX = "http://ex.org/"
P = f"PREFIX : <{EX}> "


def _stream(seed: int, n: int = 300) -> list[tuple]:
    rng = random.Random(seed)
    nodes = [f"<{EX}n{i}>" for i in range(12)]
    values = [f'"{v}"' for v in ("Opera", "Chrome", "Firefox")] + [f"<{EX}n{i}>" for i in range(3)]
    out = []
    for _ in range(n):
        p = rng.choice([f"<{EX}browser>", f"<{EX}ip>", f"<{EX}knows>"])
        o = rng.choice(values if p != f"<{EX}knows>" else nodes)
        out.append((rng.choice([1, 1, -1]), rng.choice(nodes), p, o))
    return out


def _replay(engine: ContinuousEngine, name: str, stream: list[tuple]) -> list[tuple]:
    out = []
    for op, s, p, o in stream:
        out.extend((sign, tuple(sorted(engine.decode_row(n, row).items())))
                   for n, sign, row in engine.apply_terms(op, s, p, o) if n == name)
    return out


def test_filter_push_down_gives_the_same_answers_with_less_state():
    query = P + 'SELECT * WHERE { ?x :browser ?b ; :ip ?ip . FILTER(?b = "Opera" && isLiteral(?ip)) }'
    on, off = ContinuousEngine(pushdown=True), ContinuousEngine(pushdown=False)
    on.register("q", query)
    off.register("q", query)
    stream = _stream(1)
    assert _replay(on, "q", stream) == _replay(off, "q", stream)
    assert on.operator_queries["q"].gated > 0
    assert on.state_entries("q") < off.state_entries("q")


def test_late_registration_replays_the_kept_graph():
    stream = _stream(2)
    query = P + "SELECT ?x (COUNT(?y) AS ?n) WHERE { ?x :knows ?y OPTIONAL { ?y :browser ?b } } GROUP BY ?x"
    early = ContinuousEngine()
    early.register("q", query)
    late = ContinuousEngine(keep_graph=True)
    half = len(stream) // 2
    for op, s, p, o in stream[:half]:
        late.apply_terms(op, s, p, o)
    state: dict = {}

    def fold(deltas, engine):  # noqa: ANN001, ANN202
        for name, sign, row in deltas:
            key = tuple(sorted(engine.decode_row(name, row).items()))
            state[key] = state.get(key, 0) + sign

    fold(late.register("q", query), late)
    reference: dict = {}
    for op, s, p, o in stream[:half]:
        for name, sign, row in early.apply_terms(op, s, p, o):
            key = tuple(sorted(early.decode_row(name, row).items()))
            reference[key] = reference.get(key, 0) + sign
    assert {k: v for k, v in state.items() if v} == {k: v for k, v in reference.items() if v}


def test_plain_bgp_queries_stay_on_the_engine_fast_path():
    assert isinstance(analyse(P + "SELECT DISTINCT ?x WHERE { ?x :p ?y }"), ParsedQuery)
    engine = ContinuousEngine()
    engine.register("plain", P + "SELECT * WHERE { ?x :p ?y }")
    assert "plain" in engine.engine.queries and not engine.operator_queries
    assert isinstance(analyse(P + "SELECT * WHERE { ?x :p ?y FILTER(?y > 1) }"), OperatorQuerySpec)


@pytest.mark.parametrize("text, message, at", [
    ("SELECT * WHERE {\n ?x :p ?y .\n BIND(RAND() AS ?r) }", "RAND() is not supported", "RAND"),
    ("SELECT * WHERE { ?x !(:p|^:q) ?y }", "inverse IRI inside a negated property set", "^:q"),
    ("SELECT * WHERE { SERVICE <http://s/> { ?x :p ?y } }", "SERVICE is not supported", "SERVICE"),
    ("DESCRIBE ?x WHERE { ?x :p ?y }", "DESCRIBE queries are not supported", "DESCRIBE"),
    ("SELECT * FROM <http://g/> WHERE { ?x :p ?y }", "FROM / FROM NAMED", "FROM"),
    ("SELECT * WHERE { ?x :p ?y FILTER EXISTS { ?y :q ?z FILTER NOT EXISTS { ?z :r ?x } } }",
     "inside EXISTS that reads a variable of the outer pattern", "EXISTS"),
    ("SELECT * WHERE { ?x :p ?y FILTER(?y = 1 || EXISTS { ?y :q ?z }) }", "EXISTS inside an expression", "EXISTS"),
])
def test_out_of_scope_constructs_are_rejected_naming_construct_line_and_column(text, message, at):
    full = P + text
    offset = full.index(at)
    line = full.count("\n", 0, offset) + 1
    column = offset - (full.rfind("\n", 0, offset) + 1) + 1
    with pytest.raises(QueryError) as caught:
        analyse(full)
    assert message in caught.value.message
    assert (caught.value.line, caught.value.column) == (line, column)


def test_syntax_errors_keep_their_message():
    with pytest.raises(QueryError) as caught:
        analyse(P + "SELECT * WHERE { ?x :p ?y FILTER(?y > ) }")
    assert "syntax error" in caught.value.message


@pytest.mark.timeout(60)
def test_select_star_columns_follow_first_use_whatever_comments_strings_and_iris_hold():
    """``SELECT *`` is found outside comments, strings and IRIs (its columns then follow the variables' first
    use); a comment line full of "#" is read in one pass (it used to make the search backtrack exponentially:
    40 of them would not finish)."""
    comment = "# " + "#tag " * 40 + "\n"
    spec = analyse(comment + P + "SELECT * WHERE { ?y :p ?x FILTER(?x > 1) }")
    assert spec.columns == ("y", "x")
    spec = analyse(comment + P.replace("PREFIX", "PREFIX h: <http://h#>\nPREFIX", 1)
                   + 'SELECT ?x WHERE { ?x :p "SELECT *" FILTER(?x < <http://h#a>) }')
    assert spec.columns == ("x",)
    spec = analyse("PREFIX : <http://ex/#> SELECT * WHERE { ?b :p ?a OPTIONAL { ?a :q ?c } }")  # one line
    assert spec.columns == ("b", "a", "c")


def test_a_change_visits_only_the_operator_queries_of_its_predicate_and_answers_stay_exact():
    from collections import Counter

    from tests.oracle import OracleGraph

    queries = {
        "browser": P + 'SELECT * WHERE { ?x :browser ?b FILTER(?b != "Chrome") }',
        "ip": P + "SELECT * WHERE { ?x :ip ?i OPTIONAL { ?x :knows ?y } }",
        "any": P + "SELECT * WHERE { ?x ?p ?o FILTER(isIRI(?o)) }",  # a variable predicate: every change
        "gone": P + 'SELECT * WHERE { ?x :browser ?b FILTER(?b = "Opera") }',
    }
    engine = ContinuousEngine()
    for name, text in queries.items():
        engine.register(name, text)
    visits: Counter[str] = Counter()
    for name, op in engine.operator_queries.items():
        def counted(*args, _name=name, _apply=op.apply):  # noqa: ANN002, ANN202
            visits[_name] += 1
            return _apply(*args)
        op.apply = counted
    engine.unregister("gone")
    oracle = OracleGraph()
    answers: dict[str, Counter] = {name: Counter() for name in queries}
    stream = _stream(11)
    for op, s, p, o in stream:
        oracle.apply(op, s, p, o)
        for name, sign, row in engine.apply_terms(op, s, p, o):
            answers[name][tuple(sorted(engine.decode_row(name, row).items()))] += sign
    for name in ("browser", "ip", "any"):
        assert +answers[name] == oracle.answers(queries[name]), name
    by_predicate = Counter(p for _, _, p, _ in stream)
    assert visits["browser"] == by_predicate[f"<{EX}browser>"]
    assert visits["ip"] == by_predicate[f"<{EX}ip>"] + by_predicate[f"<{EX}knows>"]
    assert visits["any"] == len(stream) and visits["gone"] == 0
