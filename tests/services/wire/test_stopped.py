"""services.wire.stopped: the closures of one process over their total budget stop largest first, each told once
on queries.status."""

from __future__ import annotations

from cbgp.algebra import ContinuousEngine
from cbgp.algebra.paths import closure_pairs
from services import codec
from services.wire.stopped import StoppedQueries, pairs_by_query, stop_the_largest

EX = "http://ex.org/"
P = f"PREFIX : <{EX}> "


def test_over_the_total_the_largest_stop_until_the_rest_fit_and_each_is_told_once(monkeypatch) -> None:
    engine = ContinuousEngine()
    queries = {"everyone": "SELECT * WHERE { ?x :next+ ?y }", "from_n0": "SELECT * WHERE { :n0 :next+ ?y }",
               "from_n5": "SELECT * WHERE { :n5 :next+ ?y }", "to_n9": "SELECT * WHERE { ?x :next+ :n9 }"}
    for name, text in queries.items():
        engine.register(name, P + text)
    for i in range(10):
        engine.apply_terms(1, f"<{EX}n{i}>", f"<{EX}next>", f"<{EX}n{i + 1}>")
    trees = [(name, query, closure_pairs(query.root)) for name, query in engine.operator_queries.items()]
    assert pairs_by_query(trees) == {"everyone": 55, "from_n0": 10, "from_n5": 5, "to_n9": 9}

    stop_the_largest([(tree, pairs) for _name, tree, pairs in trees], budget=100)  # 79: nothing to do
    assert all(tree.failed is None for _name, tree, _pairs in trees)
    monkeypatch.setenv("CBGP_MAX_PATH_PAIRS_TOTAL", "15")
    stop_the_largest([(tree, pairs) for _name, tree, pairs in trees])  # 79 > 15: 55 then 10 go, 14 are left
    stopped = {name: tree.failed for name, tree, _pairs in trees if tree.failed is not None}
    assert set(stopped) == {"everyone", "from_n0"}
    assert stopped["everyone"] == ("the property paths of this process's queries would hold 79 pairs together, more "
                                   "than 15 (CBGP_MAX_PATH_PAIRS_TOTAL); this query held the most (55)")
    assert "would hold 24 pairs together" in stopped["from_n0"]
    assert pairs_by_query(trees) == {"from_n5": 5, "to_n9": 9}
    assert engine.state_entries("everyone") == 0 and engine.explain("everyone").startswith("SELECT query stopped")
    more = [d for d in engine.apply_terms(1, f"<{EX}n10>", f"<{EX}next>", f"<{EX}n11>")]
    assert {name for name, _sign, _row in more} == {"from_n5"}  # the others stopped; n11 does not reach n9

    told = StoppedQueries("queries.status")
    reasons = [(name, 1, why) for name, why in stopped.items()]
    first = told.statuses(reasons)
    assert sorted(codec.decode("QueryStatus", out.value)["query_id"] for out in first) == ["everyone", "from_n0"]
    assert told.statuses(reasons) == []
