"""Local views for SERVICE joins (Dehghanzadeh et al.): the Fig. 2 example and the policies, no endpoint."""

from __future__ import annotations

import math
import random

import pytest

from cbgp.background import (
    LocalView,
    Maintainer,
    Policy,
    WindowShape,
    elect,
    estimate_rate,
    estimated_accuracy,
    propose,
    refresh_budget,
    remaining_life,
    renewed_best_before,
    wbm_scores,
)
from cbgp.background.remote import DictRemote

# Fig. 2: t = 8, beta = 1 (the V values imply it); omega = 4 with window entry times a: 5, b: 6, c: 7, d: 7
# gives the printed remaining lives L_a = 1, L_c = L_d = 3.  tau_a = 7, tau_b = 9, tau_c = 6, tau_d = 8 (<= 8,
# not printed); I_a = I_c = 5 and I_d = 1 give the printed renewed best-befores 12, 11, 9.
SHAPE = WindowShape(omega=4, beta=1)
WINDOW = {"a": 5, "b": 6, "c": 7, "d": 7}


def fig2_view() -> LocalView:
    view = LocalView(prior_interval=5)
    for key, tau, interval in (("a", 7, 5), ("b", 9, 5), ("c", 6, 5), ("d", 8, 1), ("e", 3, 5), ("f", 2, 5)):
        view.put(key, f"{key}-old", best_before=tau, refreshed_at=0, interval=interval)
    return view


def test_fig2_candidates_possibly_stale_and_scores():
    view = fig2_view()
    candidates = propose("WSJ", view, WINDOW, 8)
    assert set(candidates) == {"a", "b", "c", "d"}  # e and f do not join with the window
    assert set(view.possibly_stale(candidates, 8)) == {"a", "c", "d"}  # b: 9 > 8
    scores = {s.key: s for s in wbm_scores(view, candidates, 8, SHAPE)}
    assert set(scores) == {"a", "c", "d"}
    assert {k: s.life for k, s in scores.items()} == {"a": 1, "c": 3, "d": 3}
    assert {k: s.best_before_next for k, s in scores.items()} == {"a": 12, "c": 11, "d": 9}
    assert {k: s.validity for k, s in scores.items()} == {"a": 4, "c": 3, "d": 1}
    assert {k: s.score for k, s in scores.items()} == {"a": 1, "c": 3, "d": 1}


def test_fig2_gamma_1_elects_c_and_sets_its_best_before_to_11():
    view = fig2_view()
    remote = DictRemote({k: f"{k}-new" for k in "abcdef"})
    maintainer = Maintainer(view, remote, "WSJ-WBM", SHAPE, gamma=1, seed=1)
    evaluation = maintainer.evaluate(8, WINDOW)
    assert evaluation.elected == ["c"] and evaluation.refreshed == ["c"]
    assert view.entry("c").best_before == 11 and view.value("c") == "c-new"
    assert remote.calls == 1  # one remote query per elected entry, none for the others
    assert [(c.key, c.old, c.new) for c in evaluation.changes] == [("c", "c-old", "c-new")]
    assert evaluation.answers == {"a": "a-old", "b": "b-old", "c": "c-new", "d": "d-old"}
    assert all(view.value(k) == f"{k}-old" for k in "abdef")


def test_fig2_gamma_2_elects_c_and_one_of_a_d_at_random():
    seen = set()
    for seed in range(40):
        view = fig2_view()
        elected = elect("WBM", view, propose("WSJ", view, WINDOW, 8), 8, 2, SHAPE, random.Random(seed))
        keys = [e.key for e in elected]
        assert keys[0] == "c" and keys[1] in ("a", "d") and len(keys) == 2
        seen.add(keys[1])
    assert seen == {"a", "d"}  # ties are broken at random, both happen


def test_formulas():
    assert remaining_life(5, 8, SHAPE) == 1 and remaining_life(None, 8, SHAPE) == 0
    assert remaining_life(0, 8, SHAPE) == 0  # already left the window
    assert renewed_best_before(6, 5, 8) == 11  # the paper's Eq. 4
    assert renewed_best_before(1, 2, 8) == 10  # tau + I = 3 would be in the past: from the refresh (analysis 2.3)
    assert renewed_best_before(1, 2, 8, "paper") == 9  # ... or keeping its phase, tau + k * I
    assert renewed_best_before(6, 5, 8, "now") == 13
    assert renewed_best_before(8, 1, 8) == 9
    assert refresh_budget(rho=0.1, query_time=0.01, refresh_time=0.03) == 3
    assert refresh_budget(rho=0.01, query_time=0.02, refresh_time=0.03) == 0
    assert estimated_accuracy(4, ["a", "c", "d"], ["c"]) == 0.5
    assert estimated_accuracy(0, [], []) == 1.0


def test_tumbling_window_ranks_by_validity():
    shape = WindowShape(omega=1, beta=1)  # L = 1 for everything in the window: min(L, V) would tie all
    view = LocalView(prior_interval=5)
    for key, interval in (("slow", 20), ("mid", 5), ("fast", 1)):
        view.put(key, 0, best_before=8, refreshed_at=0, interval=interval)
    window = {"slow": 7.5, "mid": 7.5, "fast": 7.5}
    elected = elect("WBM", view, window, 8, 2, shape, random.Random(0))
    assert [e.key for e in elected] == ["slow", "mid"]


def test_rnd_lru_gnr_wst():
    view = LocalView(prior_interval=5)
    for i, key in enumerate("abcdef"):
        view.put(key, 0, best_before=0, refreshed_at=i, interval=5)
    window = {"d": 7, "e": 7, "f": 7}
    rng = random.Random(3)
    assert [e.key for e in elect("LRU", view, propose("WSJ", view, window, 8), 8, 2, SHAPE, rng)] == ["d", "e"]
    assert [e.key for e in elect("LRU", view, propose("GNR", view, window, 8), 8, 2, SHAPE, rng)] == ["a", "b"]
    rnd = elect("RND", view, propose("WSJ", view, window, 8), 8, 2, SHAPE, rng)
    assert len(rnd) == 2 and {e.key for e in rnd} <= set(window)
    assert propose("WST", view, window, 8) == {}
    maintainer = Maintainer(view, DictRemote({k: 1 for k in "abcdef"}), "WST", SHAPE, gamma=5)
    assert maintainer.evaluate(8, window).refreshed == []


class ListOracle:
    def __init__(self, changes: dict[str, list[float]]):
        self.changes = changes

    def stale(self, key, since, t):
        return any(since < c <= t for c in self.changes.get(key, ()))

    def next_change(self, key, t):
        return min((c for c in self.changes.get(key, ()) if c > t), default=math.inf)


def test_oracles_bst_and_wbm_star_pick_truly_stale_entries():
    view = LocalView(prior_interval=5)
    for key in "abcd":
        view.put(key, 0, best_before=0, refreshed_at=0, interval=5)
    oracle = ListOracle({"a": [3, 9], "b": [4, 30], "c": [], "d": [20]})
    window = {k: 7 for k in "abcd"}
    shape = WindowShape(omega=10, beta=1)
    assert set(propose("BST", view, window, 8, oracle)) == {"a", "b"}
    elected = elect("WBM*", view, window, 8, 1, shape, random.Random(0), oracle)
    assert [e.key for e in elected] == ["b"] and elected[0].best_before_next == 30  # b stays fresh longer
    maintainer = Maintainer(view, DictRemote({k: 1 for k in "abcd"}), "WSJ-WBM*", shape, gamma=1, oracle=oracle)
    maintainer.evaluate(8, window)
    assert view.entry("b").best_before == 30 and view.entry("b").refreshed_at == 8
    with pytest.raises(ValueError):
        Maintainer(view, DictRemote(), "BST", shape, gamma=1)


def test_rate_estimate_learns_fast_and_slow_changers():
    rng = random.Random(7)
    for true_interval in (2.0, 20.0):
        observations = []
        for _ in range(200):
            d = rng.uniform(1, 10)
            observations.append((d, rng.random() < 1 - math.exp(-d / true_interval)))
        estimate = 1 / estimate_rate(observations, prior_interval=5)
        assert 0.7 * true_interval < estimate < 1.4 * true_interval
    assert 1 / estimate_rate([], prior_interval=5) == pytest.approx(5, rel=1e-3)


def test_refresh_learns_interval_and_reports_change():
    view = LocalView(prior_interval=10)
    view.fill({"k": 1}, 0)
    assert view.entry("k").best_before == 0  # initialised to the first evaluation time (the paper)
    change = view.apply_refresh("k", 2, 4)
    assert change is not None and (change.old, change.new, change.t) == (1, 2, 4)
    assert view.entry("k").interval < 10  # a change seen after 4 units: faster than the prior
    assert view.apply_refresh("k", 2, 6) is None


def test_budget_from_rho_and_deadline_keep_latency_and_alert_below_alpha():
    now = [0.0]

    class SlowRemote(DictRemote):
        def fetch(self, key):
            now[0] += 0.03  # 30 ms per refresh on a fake clock
            return super().fetch(key)

    view = LocalView(prior_interval=5)
    keys = [f"k{i}" for i in range(10)]
    view.fill({k: 0 for k in keys}, 0)
    remote = SlowRemote({k: 1 for k in keys})
    maintainer = Maintainer(view, remote, "WSJ-LRU", WindowShape(10, 1), rho=0.1, alpha=0.75,
                            clock=lambda: now[0], refresh_time_hint=0.03, estimator="ps")
    assert maintainer.allowed_gamma() == 3  # (0.1 - 0) / 0.03
    evaluation = maintainer.evaluate(1, {k: 0.5 for k in keys})
    assert len(evaluation.refreshed) == 3 and evaluation.latency <= 0.1
    assert evaluation.estimate == pytest.approx(0.3)  # 7 of 10 still possibly stale
    assert evaluation.alert is not None and evaluation.alert.estimate == pytest.approx(0.3)
    assert len(evaluation.changes) == 3
    # the rate-based estimate: 3 just refreshed, 7 looked at 1 unit ago with a mean change interval of 5
    assert evaluation.expected == pytest.approx((3 + 7 * math.exp(-1 / 5)) / 10)


def test_policy_names():
    assert [Policy.parse(n).name for n in ("wst", "GNR-RND", "WSJ-WBM*", "BST")] == ["WST", "GNR-RND", "WSJ-WBM*",
                                                                                        "BST"]
    with pytest.raises(ValueError):
        Policy.parse("XYZ-RND")


# --- SERVICE clauses in a registered query, and the join that turns refreshed values into answer deltas -----
PAPER_QUERY = """PREFIX ex: <http://example.org/>
SELECT ?user ?followers WHERE {
  ?post ex:mentions ?user .
  SERVICE <http://127.0.0.1:8890/sparql> { ?user ex:hasFollowers ?followers } .
}"""


def test_split_service_paper_class_leaves_a_plain_bgp():
    from cbgp.background.service_clause import split_service
    from cbgp.query.sparql import parse_query

    plan = split_service(PAPER_QUERY)
    assert plan.maintenance == "budgeted" and "budgeted" in plan.status
    (service,) = plan.services
    assert service.endpoint == "http://127.0.0.1:8890/sparql" and service.join_vars == ("user",)
    assert service.pattern == "?user ex:hasFollowers ?followers"
    assert plan.projected == ("user", "followers") and plan.local_projected == ("user",)
    assert plan.prologue.strip() == "PREFIX ex: <http://example.org/>"
    local = parse_query(plan.local_text)  # the stream part is an ordinary BGP query
    assert local.projected == ("user",) and len(local.patterns) == 1
    assert plan.local_text.count("\n") == PAPER_QUERY.count("\n")  # positions kept for error messages


def test_split_service_other_patterns_get_a_plain_policy_and_bad_forms_are_rejected():
    from cbgp.background.service_clause import ServiceError, split_service

    plan = split_service("SELECT * WHERE { ?p <http://e/m> ?u . ?p <http://e/by> ?a . "
                         "SERVICE SILENT <http://x/sparql> { ?u <http://e/f> ?f . ?a <http://e/f> ?g } }")
    assert plan.maintenance == "plain" and "GNR-LRU" in plan.status
    assert plan.services[0].join_vars == ("u", "a") and plan.services[0].silent
    with pytest.raises(ServiceError, match="constant endpoint"):
        split_service("SELECT * WHERE { ?s ?p ?o SERVICE ?e { ?s ?q ?v } }")
    with pytest.raises(ServiceError, match="no SERVICE"):
        split_service("SELECT * WHERE { ?s ?p ?o }")


def test_background_join_retracts_and_asserts_when_a_refresh_changes_a_value():
    from cbgp.background.service_clause import BackgroundJoin

    view = LocalView(prior_interval=5)
    row = lambda n: frozenset({(("followers", f'"{n}"'),)})  # noqa: E731 - one service row per key
    view.fill({"<u1>": row(10), "<u2>": row(20000)}, 0)
    join = BackgroundJoin(view, "user", projected=("user", "followers"),
                          keep=lambda r: int(r["followers"].strip('"')) > 10000)  # the paper's threshold
    assert join.local_delta({"user": "<u1>", "post": "<p1>"}, +1) == []  # 10 followers: filtered out
    assert join.local_delta({"user": "<u2>", "post": "<p2>"}, +1) == [
        (1, (("followers", '"20000"'), ("user", "<u2>")))]
    change = view.apply_refresh("<u1>", row(12000), 1)  # u1 became famous
    assert join.refresh_change(change) == [(1, (("followers", '"12000"'), ("user", "<u1>")))]
    change = view.apply_refresh("<u2>", row(20001), 1)
    assert join.refresh_change(change) == [(-1, (("followers", '"20000"'), ("user", "<u2>"))),
                                           (1, (("followers", '"20001"'), ("user", "<u2>")))]
    assert sorted(join.answers()) == [(("followers", '"12000"'), ("user", "<u1>")),
                                      (("followers", '"20001"'), ("user", "<u2>"))]
    assert join.local_delta({"user": "<u2>", "post": "<p2>"}, -1) == [
        (-1, (("followers", '"20001"'), ("user", "<u2>")))]


def test_service_options():
    from cbgp.background.service_query import ServiceOptions
    from cbgp.background.service_clause import ServiceError

    options = ServiceOptions.from_options({"service.policy": "wsj-lru", "service.rho_ms": "50", "service.alpha": "0.75",
                                           "service.refresh_ms": "30000", "service.gamma": "4", "window": "x"})
    assert (options.policy, options.rho_ms, options.alpha, options.refresh_ms, options.gamma) == (
        "WSJ-LRU", 50.0, 0.75, 30000.0, 4)
    assert ServiceOptions.from_options({}).policy == "WSJ-WBM"
    for bad in ({"service.policy": "WSJ-WBM*"}, {"service.alpha": "2"}, {"service.rho_ms": "-1"},
                {"service.colour": "red"}):
        with pytest.raises(ServiceError):
            ServiceOptions.from_options(bad)


def test_a_starved_budget_probes_and_recovers():
    now = [0.0]

    class FastRemote(DictRemote):
        def fetch(self, key, timeout=None):
            assert timeout is not None and timeout <= 0.1  # what is left of rho
            now[0] += 0.01
            return super().fetch(key)

    view = LocalView(prior_interval=5)
    keys = [f"k{i}" for i in range(20)]
    view.fill({k: 0 for k in keys}, 0)
    maintainer = Maintainer(view, FastRemote({k: 0 for k in keys}), "WSJ-LRU", WindowShape(10, 1), rho=0.1,
                            clock=lambda: now[0], refresh_time_hint=0.5)  # as after a stall of the endpoint
    refreshed = [len(maintainer.evaluate(t, {k: 0 for k in keys}).refreshed) for t in range(1, 7)]
    assert refreshed[:4] == [0, 1, 0, 1]  # Eq. 2 allows nothing; a probe every other evaluation re-measures
    assert refreshed[4] >= 5 and maintainer.refresh_time == pytest.approx(0.01)


def test_wbmp_weights_the_score_by_the_probability_of_being_stale():
    view = LocalView(prior_interval=5)
    view.put("old-slow", 0, best_before=100, refreshed_at=0, interval=50)  # not past its best-before: WBM skips
    view.put("new-fast", 0, best_before=7, refreshed_at=7, interval=1)  # looked at 1 unit ago, changes fast
    view.put("fresh-slow", 0, best_before=100, refreshed_at=7.9, interval=50)
    window = {k: 7.5 for k in ("old-slow", "new-fast", "fresh-slow")}
    shape = WindowShape(omega=10, beta=1)
    assert [e.key for e in elect("WBM", view, window, 8, 1, shape, random.Random(0), spare="none")] == ["new-fast"]
    # P(stale): old-slow 1 - e^(-8/50) = 0.15, score 0.15 * min(L=10, V=50) = 1.5; new-fast 0.63 * min(10, 1)
    assert [e.key for e in elect("WBMP", view, window, 8, 1, shape, random.Random(0))] == ["old-slow"]


def test_registry_accepts_a_service_query_as_a_view_graph_and_says_how_it_is_kept():
    from services.registry.core import Registry

    def register(sparql, **options):
        decision = Registry().decide({"command": "REGISTER", "query_id": "influential", "sparql": sparql,
                                      "options": options}, lambda: 0)
        return decision

    decision = register(PAPER_QUERY, **{"service.policy": "WSJ-LRU", "service.refresh_ms": "5000"})
    status = decision.status
    assert status["status"] == "ACCEPTED", status
    assert "SERVICE <http://127.0.0.1:8890/sparql> kept as graph <urn:cbgp:service-view:" in status["message"]
    assert "every 5 s with GNR-LRU (WSJ-LRU needs the query's window" in status["message"]
    assert decision.plan[1]["options"]["service.refresh_ms"] == "5000"  # the background service reads them
    bad = register(PAPER_QUERY, **{"service.policy": "WSJ-WBM*"}).status
    assert bad["status"] == "REJECTED" and "option service.policy" in bad["message"]
    no_service = register("SELECT * WHERE { ?s <http://e/p> ?o }", **{"service.rho_ms": "5"}).status
    assert "need a SERVICE" in no_service["message"]
    windowed = register(PAPER_QUERY, window="sliding", range="PT10S", step="PT5S").status  # the view: background
    assert windowed["status"] == "ACCEPTED" and "window sliding" in windowed["message"], windowed
    per_event = register(PAPER_QUERY, window="event", range="PT10S").status
    assert per_event["status"] == "REJECTED" and "per-event window" in per_event["message"]


def test_view_snapshot_restores_values_times_and_learnt_intervals():
    import json

    view = LocalView(prior_interval=10, stale_probability=0.5)
    rows = frozenset({(("followers", '"7"'),)})
    view.fill({"<u1>": rows, "<u2>": 5}, 0)
    view.put("<u3>", None, best_before=2, refreshed_at=2)
    view.apply_refresh("<u1>", frozenset({(("followers", '"8"'),)}), 4, best_before=9)
    view.pool()
    restored = LocalView.restore(json.loads(json.dumps(view.snapshot())))
    for key in ("<u1>", "<u2>", "<u3>"):
        assert restored.entry(key) == view.entry(key)
    assert restored.pooled_interval == view.pooled_interval and restored.scale == view.scale
    assert restored.apply_refresh("<u1>", frozenset({(("followers", '"9"'),)}), 6) is not None


def test_a_stalled_refresh_is_abandoned_at_rho():
    import time as real_time

    class StalledRemote(DictRemote):
        def fetch(self, key):  # no timeout parameter: only the pool's deadline can stop it
            real_time.sleep(0.5)
            return super().fetch(key)

    view = LocalView(prior_interval=5)
    view.fill({"k1": 0, "k2": 0}, 0)
    maintainer = Maintainer(view, StalledRemote({"k1": 1, "k2": 1}), "WSJ-LRU", WindowShape(10, 1), rho=0.1)
    evaluation = maintainer.evaluate(1, {"k1": 0.5, "k2": 0.5})
    assert evaluation.latency < 0.3 and evaluation.failures == 1 and evaluation.refreshed == []
    assert view.value("k1") == 0 and view.value("k2") == 0  # the late answer is dropped, not applied
