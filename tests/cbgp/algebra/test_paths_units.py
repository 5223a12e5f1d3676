"""Property paths: how they are rewritten and where their closure lives (explain), what an anchored closure keeps,
and the bound on a closure's pairs (a query over it stops, alone, with one line; at registration it is refused)."""

from __future__ import annotations

import logging
import pickle

import pytest

from cbgp.algebra import ContinuousEngine
from cbgp.algebra.paths import Closure
from cbgp.engine.engine import EngineError

EX = "http://ex.org/"
P = f"PREFIX : <{EX}> "


def chain(engine: ContinuousEngine, n: int, start: int = 0) -> list:
    out = []
    for i in range(start, start + n):
        out += engine.apply_terms(1, f"<{EX}n{i}>", f"<{EX}next>", f"<{EX}n{i + 1}>")
    return out


def test_explain_shows_the_rewriting_and_the_closure():
    engine = ContinuousEngine()
    engine.register("q", P + "SELECT * WHERE { :n0 (:next/^:prev)+ ?y . ?y :p|:q ?z }")
    text = engine.explain("q")
    assert "Closure <http://ex.org/n0> (<http://ex.org/next>/^<http://ex.org/prev>)+ ?y, anchored at the subject" \
        in text
    assert "BGP ?_path1 <http://ex.org/next> ?_path3 . ?_path2 <http://ex.org/prev> ?_path3" in text
    assert "Distinct" in text and "Union" in text


def test_an_anchored_closure_holds_the_pairs_its_anchor_reaches_over_every_step():
    engine = ContinuousEngine()
    engine.register("from_n5", P + "SELECT * WHERE { :n5 :next+ ?y }")
    engine.register("to_n3", P + "SELECT * WHERE { ?x :next+ :n3 }")
    chain(engine, 10)  # n0 -> n1 -> ... -> n10
    closures = {name: [op for op in engine.operator_queries[name].root.walk() if op.name == "Closure"][0]
                for name in ("from_n5", "to_n3")}
    assert closures["from_n5"].pairs == 5 and closures["to_n3"].pairs == 3
    # ... over every step of the relation, which it keeps (a step out of a node not reached yet may be walked
    # once a new step reaches it), and which its state counts
    assert closures["from_n5"].steps == closures["to_n3"].steps == 10
    assert closures["from_n5"].entries() == 15
    deltas = engine.apply_terms(-1, f"<{EX}n6>", f"<{EX}next>", f"<{EX}n7>")  # cuts the path after n6
    assert sorted(engine.decode_row(n, row)["y"] for n, sign, row in deltas if sign < 0) == \
        [f"<{EX}n{i}>" for i in (10, 7, 8, 9)]
    assert (closures["from_n5"].pairs, closures["from_n5"].steps) == (1, 9)


def test_a_closure_pickled_before_it_counted_its_steps_counts_them_when_restored():
    engine = ContinuousEngine()
    engine.register("from_n0", P + "SELECT * WHERE { :n0 :next+ ?y }")
    chain(engine, 6)
    closure = [op for op in engine.operator_queries["from_n0"].root.walk() if op.name == "Closure"][0]
    state = dict(vars(closure))
    del state["steps"]  # (as a checkpoint written before it was kept)
    restored = Closure.__new__(Closure)
    restored.__setstate__(state)
    assert restored.steps == closure.steps == 6
    assert pickle.loads(pickle.dumps(closure)).entries() == closure.entries() == 12


def test_a_closure_over_its_bound_stops_its_query_alone(monkeypatch, caplog):
    monkeypatch.setenv("CBGP_MAX_PATH_PAIRS", "20")
    engine = ContinuousEngine(keep_graph=True)
    engine.register("all", P + "SELECT * WHERE { ?x :next+ ?y }")
    engine.register("anchored", P + "SELECT * WHERE { :n0 :next+ ?y }")
    with caplog.at_level(logging.ERROR):
        deltas = chain(engine, 8)  # 8 * 9 / 2 = 36 pairs for the unanchored closure
    assert "the path ?x <http://ex.org/next>+ ?y would hold more than 20 pairs (CBGP_MAX_PATH_PAIRS)" in caplog.text
    assert engine.explain("all").startswith("SELECT query stopped: the path")
    assert engine.state_entries("all") == 0
    assert sum(1 for name, _sign, _row in deltas if name == "anchored") == 8
    assert not [d for d in chain(engine, 2, start=8) if d[0] == "all"]  # it answers nothing more
    with pytest.raises(EngineError, match="would hold more than 20 pairs"):  # over the bound at registration
        engine.register("late", P + "SELECT * WHERE { ?x :next* ?y }")
    assert "late" not in engine.operator_queries


def test_closure_pairs_counts_what_a_query_s_closures_hold_and_none_without_one():
    from cbgp.algebra.paths import closure_pairs

    engine = ContinuousEngine()
    engine.register("from_n5", P + "SELECT * WHERE { :n5 :next+ ?y }")
    engine.register("both", P + "SELECT * WHERE { :n5 :next+ ?y . ?x :next* :n2 }")
    engine.register("plain", P + "SELECT * WHERE { ?x :next ?y }")
    chain(engine, 10)
    pairs = {name: closure_pairs(engine.operator_queries[name].root) for name in ("from_n5", "both")}
    assert pairs == {"from_n5": 5, "both": 5 + 2}  # (n6..n10 from n5; n0, n1 to n2)
    assert "plain" not in engine.operator_queries or closure_pairs(engine.operator_queries["plain"].root) is None


def test_a_closure_s_single_step_is_fed_without_the_engine_with_set_semantics():
    engine = ContinuousEngine()
    engine.register("reach", P + "SELECT * WHERE { :n0 :next+ ?y }")
    op = engine.operator_queries["reach"]
    assert not op.engine.queries and list(op.direct.values()) == [[("leaf0", True)]]
    first = chain(engine, 2)
    assert chain(engine, 2) == []  # inserted again: nothing changes
    assert engine.apply_terms(-1, f"<{EX}n5>", f"<{EX}next>", f"<{EX}n6>") == []  # absent: nothing changes
    assert sorted(sign for _n, sign, _row in first) == [1, 1]
    gone = engine.apply_terms(-1, f"<{EX}n0>", f"<{EX}next>", f"<{EX}n1>")
    assert sorted(sign for _n, sign, _row in gone) == [-1, -1]
    assert engine.apply_terms(1, f"<{EX}n0>", f"<{EX}next>", f"<{EX}n1>") != []  # back after its delete
    assert op.state_entries() == 2 + 2 + 2  # the pairs present, the closure's pairs and its steps
