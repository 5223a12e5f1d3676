"""Property paths: how they are rewritten and where their closure lives (explain), what an anchored closure keeps,
and the bound on a closure's pairs (a query over it stops, alone, with one line; at registration it is refused)."""

from __future__ import annotations

import logging
import pickle

import pytest

from cbgp.algebra import ContinuousEngine, OperatorQuery, analyse
from cbgp.algebra.paths import Closure
from cbgp.engine.engine import EngineError
from cbgp.terms import TermDictionary

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


def alone(text: str) -> tuple[OperatorQuery, TermDictionary]:
    """A query with its own steps, as a worker or the answers service runs one (no engine shares them)."""
    dictionary = TermDictionary()
    return OperatorQuery(analyse(P + text), dictionary), dictionary


def feed_chain(query: OperatorQuery, dictionary: TermDictionary, n: int, diff: int = 1) -> list:
    encode = dictionary.encode
    return [delta for i in range(n)
            for delta in query.apply(diff, encode(f"<{EX}n{i}>"), encode(f"<{EX}next>"), encode(f"<{EX}n{i + 1}>"))]


def closure_of(engine: ContinuousEngine, name: str) -> Closure:
    return [op for op in engine.operator_queries[name].root.walk() if op.name == "Closure"][0]


def test_anchored_closures_in_one_engine_share_its_steps_and_hold_only_what_their_anchor_reaches():
    engine = ContinuousEngine()
    engine.register("from_n5", P + "SELECT * WHERE { :n5 :next+ ?y }")
    engine.register("to_n3", P + "SELECT * WHERE { ?x :next+ :n3 }")
    chain(engine, 10)  # n0 -> n1 -> ... -> n10
    closures = {name: closure_of(engine, name) for name in ("from_n5", "to_n3")}
    assert closures["from_n5"].pairs == 5 and closures["to_n3"].pairs == 3
    # the steps are the engine's, kept once: a query's state is what its anchor reaches
    steps = engine.steps[engine.dictionary.encode(f"<{EX}next>")]
    assert closures["from_n5"].shared is closures["to_n3"].shared is steps and steps.size == 10
    assert (engine.state_entries("from_n5"), engine.state_entries("to_n3")) == (5, 3)
    assert engine.state_entries() == 5 + 3 + 2 * 10
    assert "n5> <http://ex.org/next>+ ?y, anchored at the subject: 5 pair(s) over the engine's 10 shared step(s)" \
        in engine.explain("from_n5")
    deltas = engine.apply_terms(-1, f"<{EX}n6>", f"<{EX}next>", f"<{EX}n7>")  # cuts the path after n6
    assert sorted(engine.decode_row(n, row)["y"] for n, sign, row in deltas if sign < 0) == \
        [f"<{EX}n{i}>" for i in (10, 7, 8, 9)]
    assert (closures["from_n5"].pairs, steps.size) == (1, 9)
    engine.apply_terms(1, f"<{EX}n8>", f"<{EX}next>", f"<{EX}n3>")  # n8, and n7 before it, now reach n3
    assert engine.state_entries("to_n3") == 3 + 2
    engine.unregister("from_n5")
    assert engine.steps  # (still read by to_n3)
    engine.unregister("to_n3")
    assert engine.steps == {}  # (dropped with its last query)


def test_a_closure_with_its_own_steps_holds_what_its_anchor_reaches_over_every_step():
    query, dictionary = alone("SELECT * WHERE { :n5 :next+ ?y }")
    feed_chain(query, dictionary, 10)
    closure = [op for op in query.root.walk() if op.name == "Closure"][0]
    # every step of the relation is kept (a step out of a node not reached yet may be walked once a new step
    # reaches it), and its state counts them
    assert (closure.pairs, closure.steps, closure.entries()) == (5, 10, 15)
    assert "5 pair(s) over 10 step(s)" in query.explain()


def test_a_closure_pickled_before_it_counted_its_steps_counts_them_when_restored():
    query, dictionary = alone("SELECT * WHERE { :n0 :next+ ?y }")
    feed_chain(query, dictionary, 6)
    closure = [op for op in query.root.walk() if op.name == "Closure"][0]
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


def test_a_stopped_closure_frees_the_shared_steps_it_alone_read(monkeypatch):
    monkeypatch.setenv("CBGP_MAX_PATH_PAIRS", "20")
    engine = ContinuousEngine()
    engine.register("all", P + "SELECT * WHERE { ?x :next+ ?y }")
    engine.register("other", P + "SELECT * WHERE { :n0 :prev+ ?y }")
    chain(engine, 8)  # 36 pairs: "all" stops
    assert engine.explain("all").startswith("SELECT query stopped")
    assert list(engine.steps) == [engine.dictionary.encode(f"<{EX}prev>")] and engine.state_entries() == 0
    assert chain(engine, 2, start=8) == []


def test_a_stopped_query_lets_go_of_its_closure_s_memory(monkeypatch):
    """In one engine (a worker's single-owner query): once stopped, nothing the query keeps leads to its closure,
    whose trees are then freed, not only no longer fed."""
    import gc
    import weakref

    monkeypatch.setenv("CBGP_MAX_PATH_PAIRS", "20")
    engine = ContinuousEngine(keep_graph=True)
    engine.register("all", P + "SELECT * WHERE { ?x :next+ ?y . ?y :label ?l }")
    closure = weakref.ref(next(op for op in engine.operator_queries["all"].root.walk() if isinstance(op, Closure)))
    chain(engine, 8)
    gc.collect()
    assert engine.explain("all").startswith("SELECT query stopped") and closure() is None


def test_a_stopped_query_at_the_answers_service_lets_go_of_its_closure_and_leaves():
    """By centre (the answers service's OperatorAssembler, fed part deltas): stopped from outside, as a process's
    budget stops its largest query, its closure and the leaves it was fed through are freed at the next delta."""
    import gc
    import weakref

    from cbgp.algebra.by_centre import OperatorAssembler

    dictionary = TermDictionary()
    assembler = OperatorAssembler(analyse(P + "SELECT * WHERE { ?x :next+ ?y }"), dictionary)
    columns = assembler._target(assembler.parts[0])
    ids = [dictionary.encode(f"<{EX}n{i}>") for i in range(6)]
    answers = [a for i in range(5) for a in assembler.apply([(0, 1, (ids[i], ids[i + 1]), columns)])]
    assert len(answers) == 15  # 5 + 4 + 3 + 2 + 1 pairs
    closure = weakref.ref(next(op for op in assembler.tree.root.walk() if isinstance(op, Closure)))
    assembler.tree.stop("over the budget")
    assert assembler.apply([(0, 1, (ids[0], ids[5]), columns)]) == []
    gc.collect()
    assert closure() is None and assembler.leaves == [] and assembler.state_entries() == 0


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
    query, dictionary = alone("SELECT * WHERE { :n0 :next+ ?y }")
    assert not query.engine.queries and list(query.direct.values()) == [[("leaf0", True)]]
    first = feed_chain(query, dictionary, 2)
    assert feed_chain(query, dictionary, 2) == []  # inserted again: nothing changes
    encode = dictionary.encode
    assert query.apply(-1, encode(f"<{EX}n5>"), encode(f"<{EX}next>"), encode(f"<{EX}n6>")) == []  # absent
    assert sorted(sign for sign, _row in first) == [1, 1]
    gone = query.apply(-1, encode(f"<{EX}n0>"), encode(f"<{EX}next>"), encode(f"<{EX}n1>"))
    assert sorted(sign for sign, _row in gone) == [-1, -1]
    assert query.apply(1, encode(f"<{EX}n0>"), encode(f"<{EX}next>"), encode(f"<{EX}n1>")) != []  # back
    assert query.state_entries() == 2 + 2 + 2  # the pairs present, the closure's pairs and its steps


def test_shared_steps_have_set_semantics_and_a_late_query_starts_from_them():
    engine = ContinuousEngine()
    engine.register("reach", P + "SELECT * WHERE { :n0 :next+ ?y }")
    first = chain(engine, 3)
    assert chain(engine, 3) == []  # inserted again: nothing changes
    assert engine.apply_terms(-1, f"<{EX}n7>", f"<{EX}next>", f"<{EX}n8>") == []  # absent: nothing changes
    assert len(first) == 3
    # a query registered later reads the steps the engine keeps (the graph is not kept here)
    late = engine.register("late", P + "SELECT * WHERE { :n1 :next+ ?y }")
    assert sorted(engine.decode_row("late", row)["y"] for _n, _sign, row in late) == [f"<{EX}n2>", f"<{EX}n3>"]
    gone = engine.apply_terms(-1, f"<{EX}n2>", f"<{EX}next>", f"<{EX}n3>")
    assert sorted((name, sign) for name, sign, _row in gone) == [("late", -1), ("reach", -1)]
