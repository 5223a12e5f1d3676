"""The papers' worked examples, message by message.

Each case is a query, then messages `ins(s,p,o)` / `del(s,p,o)` with the exact
multiset of deltas expected after each one, as the analysis gives them (checked
there against a brute-force oracle).  Names like `a` stand for `<http://ex/a>`.
"""

from __future__ import annotations

from collections import Counter

import pytest

from cbgp.engine.engine import Engine

EX = "http://ex/"


def _iri(name: str) -> str:
    return f'"{name[1:-1]}"' if name.startswith('"') else f"<{EX}{name}>"


def _query(head: str, patterns: list[str]) -> str:
    body = " . ".join(" ".join(t if t.startswith("?") else _iri(t) for t in p.split()) for p in patterns)
    return f"SELECT {head} WHERE {{ {body} }}"


def run_case(head: str, patterns: list[str], steps: list[tuple[str, str, list[str]]]) -> None:
    engine = Engine()
    engine.register("q", _query(head, patterns))
    columns = engine.columns("q")
    for number, (op, triple, expected) in enumerate(steps, 1):
        s, p, o = (_iri(t) for t in triple.split())
        deltas = engine.apply_terms(1 if op == "ins" else -1, s, p, o)
        got = Counter()
        for _name, sign, row in deltas:
            values = engine.decode_row("q", row)
            names = ",".join(values[c][len(EX) + 1 : -1] for c in columns)
            got[("+" if sign > 0 else "-") + f"({names})"] += 1
        assert got == Counter(expected), f"message {number}: {op}({triple})"


CASES = {
    # 5.2 ground query (Algorithm 1)
    "G1": ("*", ["a p b", "b q c"], [
        ("ins", "a p b", []), ("ins", "b q c", ["+()"]), ("ins", "x y z", []), ("del", "a p b", ["-()"]),
        ("del", "b q c", []), ("ins", "b q c", []), ("ins", "a p b", ["+()"])]),
    # 5.3 simple var-centric stars (Algorithm 2)
    "S1": ("?X", ["?X type Person", "?X livesIn Corfu"], [
        ("ins", "alice type Person", []), ("ins", "alice livesIn Corfu", ["+(alice)"]),
        ("ins", "bob livesIn Corfu", []), ("ins", "bob type Person", ["+(bob)"]),
        ("del", "alice type Person", ["-(alice)"]), ("ins", "alice type Person", ["+(alice)"]),
        ("del", "bob livesIn Corfu", ["-(bob)"])]),
    "S2": ("?X", ["?X p a", "?X q b"], [
        ("ins", "x p a", []), ("ins", "x q b", ["+(x)"]), ("del", "x p a", ["-(x)"]), ("del", "x q b", []),
        ("ins", "x q b", [])]),
    "S3": ("?X", ["?X p b", "a p ?X"], [
        ("ins", "a p b", []), ("ins", "a p a", ["+(a)"]), ("ins", "b p b", ["+(b)"]),
        ("del", "a p b", ["-(a)", "-(b)"])]),
    "S4": ("?X", ["?X p a", "a p ?X"], [("ins", "a p a", ["+(a)"]), ("del", "a p a", ["-(a)"])]),
    "S6": ("?X", ["?X p a"], [
        ("ins", "x p a", ["+(x)"]), ("ins", "x p a", []), ("del", "x p a", ["-(x)"]), ("del", "x p a", []),
        ("del", "y p a", [])]),
    "S7": ("?X", ["?X p ?X", "?X q a"], [
        ("ins", "a p b", []), ("ins", "b p b", []), ("ins", "b q a", ["+(b)"]), ("del", "b p b", ["-(b)"])]),
    # 5.4 loosely-connected (Algorithm 3)
    "L1": ("?X ?Y", ["?X p a", "b q ?Y", "a r b"], [
        ("ins", "x1 p a", []), ("ins", "b q y1", []), ("ins", "a r b", ["+(x1,y1)"]),
        ("ins", "x2 p a", ["+(x2,y1)"]), ("ins", "b q y2", ["+(x1,y2)", "+(x2,y2)"]),
        ("del", "a r b", ["-(x1,y1)", "-(x1,y2)", "-(x2,y1)", "-(x2,y2)"]),
        ("ins", "a r b", ["+(x1,y1)", "+(x1,y2)", "+(x2,y1)", "+(x2,y2)"]),
        ("del", "x1 p a", ["-(x1,y1)", "-(x1,y2)"]), ("del", "b q y1", ["-(x2,y1)"]),
        ("del", "b q y2", ["-(x2,y2)"])]),
    "L2": ("?X", ["a p b", "?X p b"], [
        ("ins", "a p b", ["+(a)"]), ("ins", "c p b", ["+(c)"]), ("del", "a p b", ["-(a)", "-(c)"]),
        ("ins", "a p b", ["+(a)", "+(c)"])]),
    "L3": ("?X ?Y", ["?X p b", "a p ?Y"], [
        ("ins", "a p b", ["+(a,b)"]), ("ins", "c p b", ["+(c,b)"]), ("ins", "a p d", ["+(a,d)", "+(c,d)"]),
        ("del", "a p b", ["-(a,b)", "-(a,d)", "-(c,b)"])]),
    # 5.5 var-connected (Algorithms 5-7): Example 3 of the paper, then the analysis' extensions
    "V1+V2": ("?Y ?X ?Z", ["?Y p3 ?X", "?Y p4 a", "?Y p5 b", "a p2 ?X", "?X p1 ?Z", "d p10 ?Z"], [
        ("ins", "c1 p3 c2", []), ("ins", "c1 p3 c3", []), ("ins", "c1 p4 a", []), ("ins", "c1 p5 b", []),
        ("ins", "a p2 c2", []), ("ins", "c2 p1 c4", []), ("ins", "d p10 c4", ["+(c1,c2,c4)"]),
        ("del", "c1 p5 b", ["-(c1,c2,c4)"]), ("ins", "c1 p5 b", ["+(c1,c2,c4)"]), ("ins", "a p2 c3", []),
        ("ins", "c3 p1 c4", ["+(c1,c3,c4)"]), ("del", "c1 p3 c2", ["-(c1,c2,c4)"]), ("ins", "c2 p1 c5", []),
        ("ins", "d p10 c5", []), ("ins", "c1 p3 c2", ["+(c1,c2,c4)", "+(c1,c2,c5)"]),
        ("del", "d p10 c4", ["-(c1,c2,c4)", "-(c1,c3,c4)"])]),
    "V3": ("?Y ?X ?Z", ["?Y p3 ?X", "?Y p4 a", "?Y p5 b", "a p2 ?X", "?X p1 ?Z", "d p10 ?Z"], [
        ("ins", "c1 p3 c2", []), ("ins", "c1 p3 c3", []), ("ins", "c1 p4 a", []), ("ins", "c1 p5 b", []),
        ("ins", "a p2 c2", []), ("ins", "c2 p1 c4", []), ("ins", "d p10 c4", ["+(c1,c2,c4)"]),
        ("del", "c1 p3 c3", []), ("del", "c1 p5 b", ["-(c1,c2,c4)"])]),
    "V4": ("?Y ?X ?Z", ["?Y p3 ?X", "?Y p4 a", "?Y p5 b", "a p2 ?X", "?X p1 ?Z", "d p10 ?Z"], [
        ("ins", "c1 p3 c2", []), ("ins", "c1 p3 c3", []), ("ins", "c1 p4 a", []), ("ins", "c1 p5 b", []),
        ("ins", "a p2 c2", []), ("ins", "c2 p1 c4", []), ("ins", "d p10 c4", ["+(c1,c2,c4)"]),
        ("del", "c1 p5 b", ["-(c1,c2,c4)"]), ("ins", "c1 p5 b", ["+(c1,c2,c4)"])]),
    "V5": ("?X ?Y ?Z", ["?X p ?Y", "?Y p ?Z"], [
        ("ins", "a p a", ["+(a,a,a)"]), ("ins", "a p b", ["+(a,a,b)"]),
        ("ins", "b p a", ["+(a,b,a)", "+(b,a,a)", "+(b,a,b)"]),
        ("del", "a p a", ["-(a,a,a)", "-(a,a,b)", "-(b,a,a)"]), ("del", "a p b", ["-(a,b,a)", "-(b,a,b)"])]),
    "V6": ("?X ?Y", ["?X p ?Y", "?X q ?Y"], [
        ("ins", "b p b", []), ("ins", "a p c", []), ("ins", "a q b", []), ("ins", "a p b", ["+(a,b)"]),
        ("del", "a p c", []), ("del", "a q b", ["-(a,b)"])]),
    "V7": ("?X ?Y ?Z", ["?X p ?Y", "?X q ?Z"], [
        ("ins", "x p y1", []), ("ins", "x q z1", ["+(x,y1,z1)"]), ("ins", "x p y2", ["+(x,y2,z1)"]),
        ("ins", "x q z2", ["+(x,y1,z2)", "+(x,y2,z2)"]), ("ins", "x p y3", ["+(x,y3,z1)", "+(x,y3,z2)"]),
        ("del", "x p y1", ["-(x,y1,z1)", "-(x,y1,z2)"]), ("del", "x q z1", ["-(x,y2,z1)", "-(x,y3,z1)"])]),
    # 5.6 mixed query: var-connected component x simple star x ground part
    "M1": ("?X ?Y ?Z ?W", ["?Y p3 ?X", "?Y p4 a", "?Y p5 b", "a p2 ?X", "?X p1 ?Z", "d p10 ?Z", "?W p6 e",
                            "f p7 g"], [
        ("ins", "c1 p3 c2", []), ("ins", "c1 p4 a", []), ("ins", "c1 p5 b", []), ("ins", "a p2 c2", []),
        ("ins", "c2 p1 c4", []), ("ins", "d p10 c4", []), ("ins", "w1 p6 e", []),
        ("ins", "f p7 g", ["+(c2,c1,c4,w1)"]), ("ins", "w2 p6 e", ["+(c2,c1,c4,w2)"]),
        ("del", "f p7 g", ["-(c2,c1,c4,w1)", "-(c2,c1,c4,w2)"]),
        ("ins", "f p7 g", ["+(c2,c1,c4,w1)", "+(c2,c1,c4,w2)"]),
        ("del", "c1 p4 a", ["-(c2,c1,c4,w1)", "-(c2,c1,c4,w2)"])]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_worked_example_emits_exactly_the_expected_deltas(name):
    head, patterns, steps = CASES[name]
    run_case(head, patterns, steps)


def test_literal_object_is_a_different_term_from_an_iri_with_the_same_text():
    # S5: Q = {(?X, name, "Corfu"), (?X, type, City)}
    engine = Engine()
    engine.register("q", f'SELECT ?X WHERE {{ ?X <{EX}name> "Corfu" . ?X <{EX}type> <{EX}City> }}')
    assert engine.apply_terms(1, f"<{EX}c1>", f"<{EX}name>", f"<{EX}Corfu>") == []
    assert engine.apply_terms(1, f"<{EX}c1>", f"<{EX}type>", f"<{EX}City>") == []
    deltas = engine.apply_terms(1, f"<{EX}c1>", f"<{EX}name>", '"Corfu"')
    assert [engine.decode_row("q", row) for _q, _s, row in deltas] == [{"X": f"<{EX}c1>"}]


def test_query_registered_after_data_first_gets_its_current_answers():
    engine = Engine(keep_graph=True)
    for s, o in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]:
        engine.apply_terms(1, f"<{EX}{s}>", f"<{EX}p>", f"<{EX}{o}>")
    engine.apply_terms(-1, f"<{EX}c>", f"<{EX}p>", f"<{EX}d>")
    initial = engine.register("path", f"SELECT ?x ?z WHERE {{ ?x <{EX}p> ?y . ?y <{EX}p> ?z }}")
    got = sorted(tuple(v[len(EX) + 1 : -1] for v in engine.decode_row("path", row).values())
                 for _q, sign, row in initial if sign > 0)
    assert got == [("a", "c"), ("b", "a"), ("c", "b")]
    live = engine.apply_terms(-1, f"<{EX}a>", f"<{EX}p>", f"<{EX}b>")
    assert sorted(sign for _q, sign, _row in live) == [-1, -1]


def test_unregister_stops_output_and_frees_state():
    engine = Engine()
    engine.register("star", f"SELECT * WHERE {{ ?x <{EX}p> <{EX}a> . ?x <{EX}q> <{EX}b> }}")
    engine.register("other", f"SELECT * WHERE {{ ?x <{EX}p> ?y }}")
    for i in range(10):
        engine.apply_terms(1, f"<{EX}n{i}>", f"<{EX}p>", f"<{EX}a>")
    assert engine.state_entries("star") == 10
    engine.unregister("star")
    assert "star" not in engine.queries
    deltas = engine.apply_terms(1, f"<{EX}n1>", f"<{EX}q>", f"<{EX}b>")
    assert all(name != "star" for name, _s, _r in deltas)
    assert engine.state_entries() == engine.state_entries("other")


def test_projection_without_distinct_reports_each_solution_and_distinct_counts():
    engine = Engine()
    engine.register("all", f"SELECT ?x WHERE {{ ?x <{EX}p> ?y }}")
    engine.register("dist", f"SELECT DISTINCT ?x WHERE {{ ?x <{EX}p> ?y }}")
    a, p = f"<{EX}a>", f"<{EX}p>"
    first = engine.apply_terms(1, a, p, f"<{EX}b>")
    second = engine.apply_terms(1, a, p, f"<{EX}c>")
    assert sorted(name for name, _s, _r in first) == ["all", "dist"]
    assert [name for name, _s, _r in second] == ["all"]  # DISTINCT row already present: count 1 -> 2
    third = engine.apply_terms(-1, a, p, f"<{EX}b>")
    assert [name for name, _s, _r in third] == ["all"]  # count 2 -> 1: still present
    fourth = engine.apply_terms(-1, a, p, f"<{EX}c>")
    assert sorted((name, sign) for name, sign, _r in fourth) == [("all", -1), ("dist", -1)]


def test_state_holds_only_relevant_triples():
    engine = Engine()
    engine.register("star", f"SELECT * WHERE {{ ?x <{EX}p> <{EX}a> . ?x <{EX}q> <{EX}b> }}")
    for i in range(1000):  # irrelevant: other predicates or other constants
        engine.apply_terms(1, f"<{EX}n{i}>", f"<{EX}r>", f"<{EX}a>")
        engine.apply_terms(1, f"<{EX}n{i}>", f"<{EX}p>", f"<{EX}z>")
    assert engine.state_entries() == 0
    engine.apply_terms(1, f"<{EX}n1>", f"<{EX}p>", f"<{EX}a>")
    assert engine.state_entries() == 1


def test_state_bytes_grow_with_relevant_triples_and_return_to_empty():
    engine = Engine()
    engine.register("path", f"SELECT * WHERE {{ ?x <{EX}p> ?y . ?y <{EX}p> ?z }}")
    empty = engine.state_bytes()
    triples = [(f"<{EX}n{i}>", f"<{EX}p>", f"<{EX}n{(i * 7) % 50}>") for i in range(200)]
    for s, p, o in triples:
        engine.apply_terms(1, s, p, o)
    grown = engine.state_bytes()
    assert grown > empty + 200 * 20  # at least a dict slot per relevant triple
    for s, p, o in triples:
        engine.apply_terms(-1, s, p, o)
    assert engine.state_entries() == 0


def test_graph_variable_instances_need_only_the_graph_id_not_its_term():
    # A state worker's dictionary holds query constants only: data terms arrive as stable ids.
    from cbgp.terms import TermDictionary, stable_term_id

    engine = Engine(TermDictionary(stable=True))
    engine.register("q", f"SELECT ?g ?x WHERE {{ GRAPH ?g {{ ?x <{EX}p> ?g }} }}")
    ids = {t: stable_term_id(t) for t in (f"<{EX}a>", f"<{EX}p>", f"<{EX}g1>")}
    deltas = engine.apply(1, ids[f"<{EX}a>"], ids[f"<{EX}p>"], ids[f"<{EX}g1>"], ids[f"<{EX}g1>"])
    assert deltas == [("q", 1, (ids[f"<{EX}g1>"], ids[f"<{EX}a>"]))]
