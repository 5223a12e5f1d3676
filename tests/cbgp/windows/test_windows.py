"""Event-time windows (cbgp.windows.windowed): exact against pyoxigraph on the window content.

The content at each instant is computed here independently, straight from the
definition in the module docstring (last update before tau is an ADD no older
than tau - range; per-event: the events with tau - range <= t < tau, each
evaluated alone), and pyoxigraph evaluates the query on it.  Our reports are
replayed into a multiset that must equal those answers at every grid instant,
reported or not (so a missing report is caught as well as a wrong one).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgp.query.sparql import QueryError, parse_query
from cbgp.terms import DEFAULT_GRAPH_ID, TermDictionary
from cbgp.windows.windowed import WindowedQuery
from cbgp.windows.spec import WindowError, WindowSpec
from cbgp.windows.spec import parse_duration, window_from_options
from cbgp.windows.rspql import parse_rspql
from tests.oracle import OracleGraph, ReplayedAnswers
from tests.cbgp.engine.test_engine_differential import EX, FIXED_QUERIES, graphs, objects, predicates, subjects

P, Q, R = (f"<{EX}{n}>" for n in ("p", "q", "r"))
A, B, C = (f"<{EX}{n}>" for n in ("a", "b", "c"))

TIME_QUERIES = {
    "edge": f"SELECT ?s ?o WHERE {{ ?s {P} ?o }}",
    "star": FIXED_QUERIES["star"],
    "path": FIXED_QUERIES["path"],
    "triangle": FIXED_QUERIES["triangle"],
    "product": f"SELECT * WHERE {{ ?x {P} {A} . ?x {Q} {B} . ?y {P} ?y }}",
    "distinct_product": FIXED_QUERIES["distinct_product"],
    "distinct": FIXED_QUERIES["distinct"],
    "projected": FIXED_QUERIES["projected"],
    "star_literal": FIXED_QUERIES["star_literal"],
    "named_graph": FIXED_QUERIES["named_graph"],
    "graph_var_path": FIXED_QUERIES["graph_var_path"],
}
EVENT_QUERIES = {k: v for k, v in TIME_QUERIES.items() if "graph" not in k}


# --- the reference, from the definition ---------------------------------------------------------------


def time_content(accepted, tau: int, range_ms: int) -> frozenset:
    last: dict = {}
    for op, quad, t in accepted:  # arrival order: a later arrival wins a tie
        if t < tau and (quad not in last or t >= last[quad][0]):
            last[quad] = (t, op)
    return frozenset(q for q, (t, op) in last.items() if op > 0 and t >= tau - range_ms)


def store_answers(quads, query: str) -> Counter:
    oracle = OracleGraph()
    for s, p, o, g in quads:
        oracle.apply(1, s, p, o, g)
    return oracle.answers(query)


class Reference:
    evaluate = staticmethod(store_answers)  # (quads, query text) -> the answers over just those quads

    def __init__(self, spec: WindowSpec, queries: dict[str, str]) -> None:
        self.spec = spec
        self.queries = queries
        self.accepted: list = []
        self.cache: dict = {}

    def answers(self, name: str, tau: int) -> Counter:
        range_ms = self.spec.range_ms
        if self.spec.kind != "event":
            content = time_content(self.accepted, tau, range_ms)
            key = (name, content)
            if key not in self.cache:
                self.cache[key] = self.evaluate(content, self.queries[name])
            return self.cache[key]
        events: dict[int, set] = {}
        for op, quad, t in self.accepted:
            if op > 0 and tau - range_ms <= t < tau:
                events.setdefault(t, set()).add(quad)
        total: Counter = Counter()
        for quads in events.values():
            key = (name, frozenset(quads))
            if key not in self.cache:
                self.cache[key] = self.evaluate(quads, self.queries[name])
            total.update(self.cache[key])
        return total


# --- driving a stream ------------------------------------------------------------------------------------


class Harness:
    """Feeds one stream to one WindowedQuery per query and checks every grid instant against the reference.

    A query with answers over no data (an aggregate's 0) is checked from its first report on: before the first
    instant the stream reaches, nothing is reported, and those answers arrive with that first report."""

    reference_class = Reference

    def __init__(self, spec: WindowSpec, queries: dict[str, str]) -> None:
        self.spec = spec
        self.queries = queries
        self.windows = {name: WindowedQuery(text, spec) for name, text in queries.items()}
        self.replayed = {name: ReplayedAnswers() for name in queries}
        # Per-event answers are a multiset even for DISTINCT (one set per event), so only time windows are sets.
        # (an operator query's DISTINCT is the engine's business: its rows are checked as a multiset)
        self.distinct = {name: getattr(w.query, "distinct", False) and spec.kind != "event"
                         for name, w in self.windows.items()}
        self.reference = self.reference_class(spec, queries)
        self.max_event: int | None = None
        self.watermark: int | None = None
        self.last: int | None = None
        self.min_event: int | None = None
        self.all_reports: dict[str, list] = {name: [] for name in queries}

    def add(self, op, s, p, o, g, t) -> None:
        late = self.last is not None and t < self.last
        admitted = not late or self.spec.late_policy == "admit"
        for w in self.windows.values():
            assert w.add_terms(op, s, p, o, g, t) is admitted, (op, s, p, o, g, t, self.last)
        if admitted:
            self.reference.accepted.append((op, (s, p, o, g), t))
        self.max_event = t if self.max_event is None else max(self.max_event, t)
        self.min_event = t if self.min_event is None else min(self.min_event, t)

    def advance(self, watermark: int | None) -> None:
        step = self.spec.step_ms
        wm = watermark if watermark is not None else (
            None if self.max_event is None else self.max_event - self.spec.lateness_ms)
        if wm is not None and (self.watermark is None or wm > self.watermark):
            self.watermark = wm
        previous = self.last
        if self.watermark is not None:
            target = self.watermark // step * step
            if self.last is None or target > self.last:
                self.last = target
        reports = {name: w.advance(watermark) for name, w in self.windows.items()}
        for name, w in self.windows.items():
            assert w.last_instant == self.last and w.watermark == self.watermark
            self.all_reports[name].extend(reports[name])
        if self.last is None or self.last == previous:
            assert not any(reports.values())
            return
        if previous is None:
            start = min(self.min_event // step * step, self.last) if self.min_event is not None else self.last
        else:
            start = previous + step
        for name, found in reports.items():
            instants = [r.instant_ms for r in found]
            assert instants == sorted(set(instants)), "instants strictly increase"
            assert all(start <= i <= self.last and i % step == 0 for i in instants)
            by_instant = {r.instant_ms: r for r in found}
            window = self.windows[name]
            first = start
            if previous is None and window.initial:
                first = instants[0] if instants else self.last
            for tau in range(first, self.last + 1, step):
                report = by_instant.get(tau)
                if report is not None:
                    assert report.deltas, "a report carries a change"
                    signs: dict = {}
                    for sign, row in report.deltas:
                        assert signs.setdefault(row, sign) == sign, f"{row} both added and removed at {tau}"
                        self.replayed[name].apply(sign, window.decode_row(row), self.distinct[name])
                expected = self.reference.answers(name, tau)
                assert self.replayed[name].rows == expected, f"{name} at instant {tau}"


# --- random streams -----------------------------------------------------------------------------------------

quads = st.tuples(st.sampled_from([1, 1, 1, -1]), subjects, predicates, objects, graphs)


@st.composite
def scenarios(draw, kinds):
    kind = draw(st.sampled_from(kinds))
    step = draw(st.sampled_from([1, 5, 10]))
    if kind == "tumbling":
        range_ms = step
    else:
        range_ms = draw(st.sampled_from([step, 2 * step, 3 * step + 2, 25, 3]))
    lateness = draw(st.sampled_from([0, 0, 6, 20]))
    policy = draw(st.sampled_from(["drop", "admit"]))
    spec = WindowSpec(kind, range_ms, step, lateness, policy)
    base = 0
    actions = []
    for _ in range(draw(st.integers(1, 40))):
        if draw(st.integers(0, 5)) == 0:
            explicit = draw(st.booleans())
            actions.append(("advance", base + draw(st.integers(-5, 30)) if explicit else None))
        else:
            base += draw(st.sampled_from([0, 0, 1, 2, 3, 5, 8]))
            jitter = draw(st.integers(0, lateness)) if lateness else 0
            actions.append(("add", *draw(quads), base - jitter))
    actions.append(("advance", None))
    actions.append(("advance", base + range_ms + 3 * step))  # everything expires
    return spec, actions


def run(spec: WindowSpec, queries: dict[str, str], actions, harness_class: type[Harness] | None = None) -> Harness:
    """Plays the actions through a harness, which checks every reported instant against its reference."""
    harness = (harness_class or Harness)(spec, queries)
    for action in actions:
        if action[0] == "add":
            harness.add(*action[1:])
        else:
            harness.advance(action[1])
    return harness


SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(scenario=scenarios(["sliding", "tumbling"]))
def test_time_windows_match_pyoxigraph_on_the_window_content(scenario):
    spec, actions = scenario
    harness = run(spec, TIME_QUERIES, actions)
    for name, w in harness.windows.items():
        assert not harness.replayed[name].rows  # all expired at the final watermark
        assert w.state_entries() == 0, "expired history is pruned"


@SETTINGS
@given(scenario=scenarios(["event"]))
def test_event_windows_match_the_sum_of_per_event_pyoxigraph_answers(scenario):
    spec, actions = scenario
    harness = run(spec, EVENT_QUERIES, actions)
    for name, w in harness.windows.items():
        assert not harness.replayed[name].rows
        assert w.state_entries() == 0


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(scenario=scenarios(["sliding", "tumbling", "event"]), data=st.data())
def test_restoring_a_saved_state_mid_stream_gives_the_same_later_reports(scenario, data):
    spec, actions = scenario
    cut = data.draw(st.integers(0, len(actions)))
    text = EVENT_QUERIES[data.draw(st.sampled_from(sorted(EVENT_QUERIES)))]

    assert_restore_mid_stream_reports_the_same(text, spec, actions, cut)


def assert_restore_mid_stream_reports_the_same(text: str, spec: WindowSpec, actions, cut: int) -> None:
    """A window saved after actions[:cut] (through JSON, as a checkpoint stores it) and restored reports what a
    window that never stopped reports, and ends in the same state."""
    def feed(w, chunk, out):
        for action in chunk:
            if action[0] == "add":
                out.append(w.add_terms(*action[1:]))
            else:
                out.append([(r.instant_ms, r.deltas) for r in w.advance(action[1])])

    straight = WindowedQuery(text, spec)
    expected: list = []
    feed(straight, actions, expected)
    first = WindowedQuery(text, spec)
    got: list = []
    feed(first, actions[:cut], got)
    state = json.loads(json.dumps(first.to_state()))
    # The state holds term ids; an operator query's expressions need their terms: the restoring process's
    # dictionary knows them (the Spark job reads the fleet's dictionary topic).
    known = TermDictionary(stable=True)
    for term, term_id in first.dictionary.items():
        known.add(term_id, term)
    restored = WindowedQuery.from_state(text, spec, state, known)
    feed(restored, actions[cut:], got)
    assert got == expected
    assert restored.to_state() == straight.to_state()


# --- explicit examples ----------------------------------------------------------------------------------------

SEC = 1000
EDGE = f"SELECT ?s ?o WHERE {{ ?s {P} ?o }}"


def rows(w: WindowedQuery, reports) -> list[tuple[int, list[tuple[int, dict]]]]:
    """Decoded reports, each report's deltas in a term order (ours are in id order)."""
    return [(r.instant_ms, sorted(((sign, w.decode_row(row)) for sign, row in r.deltas), key=_delta_key))
            for r in reports]


def _delta_key(delta: tuple[int, dict]) -> tuple:
    return delta[0], sorted(delta[1].items())


def ab() -> dict[str, str]:
    return {"s": A, "o": B}


def test_a_triple_is_in_the_windows_after_its_time_until_time_plus_range():
    w = WindowedQuery(EDGE, WindowSpec("sliding", 60 * SEC, 10 * SEC))
    w.add_terms(1, A, P, B, None, 5 * SEC)  # t + range = 65 s, not on the grid: last window 60 s
    assert rows(w, w.advance(10**6)) == [(10 * SEC, [(1, ab())]), (70 * SEC, [(-1, ab())])]

    w = WindowedQuery(EDGE, WindowSpec("sliding", 60 * SEC, 10 * SEC))
    w.add_terms(1, A, P, B, None, 0)  # t + range = 60 s on the grid: [0, 60 s) still holds t = 0
    assert w.advance(60 * SEC)[0].instant_ms == 10 * SEC
    assert w.advance(69 * SEC) == []
    assert rows(w, w.advance(70 * SEC)) == [(70 * SEC, [(-1, ab())])]


def test_tumbling_windows_hold_exactly_one_step_of_events():
    w = WindowedQuery(EDGE, WindowSpec("tumbling", 10, 10))
    w.add_terms(1, A, P, B, None, 10)
    w.add_terms(1, A, P, C, None, 19)
    w.add_terms(1, B, P, C, None, 20)
    assert rows(w, w.advance(40)) == [
        (20, [(1, ab()), (1, {"s": A, "o": C})]),
        (30, [(-1, ab()), (-1, {"s": A, "o": C}), (1, {"s": B, "o": C})]),
        (40, [(-1, {"s": B, "o": C})]),
    ]


def test_a_refresh_extends_the_life_of_a_present_triple():
    w = WindowedQuery(EDGE, WindowSpec("sliding", 30, 10))
    w.add_terms(1, A, P, B, None, 0)
    assert rows(w, w.advance(20)) == [(10, [(1, ab())])]
    w.add_terms(1, A, P, B, None, 25)  # still present: no report when it arrives, but it now lives to 55
    assert rows(w, w.advance(1000)) == [(60, [(-1, ab())])]


def test_a_delete_ends_the_triple_before_its_expiry():
    w = WindowedQuery(EDGE, WindowSpec("sliding", 60, 10))
    w.add_terms(1, A, P, B, None, 0)
    w.add_terms(-1, A, P, B, None, 23)
    assert rows(w, w.advance(1000)) == [(10, [(1, ab())]), (30, [(-1, ab())])]
    assert w.state_entries() == 0


def test_an_add_and_delete_in_the_same_millisecond_follow_arrival_order():
    w = WindowedQuery(EDGE, WindowSpec("sliding", 60, 10))
    w.add_terms(1, A, P, B, None, 5)
    w.add_terms(-1, A, P, B, None, 5)
    w.add_terms(-1, A, P, C, None, 5)
    w.add_terms(1, A, P, C, None, 5)
    assert rows(w, w.advance(100)) == [(10, [(1, {"s": A, "o": C})]), (70, [(-1, {"s": A, "o": C})])]


@pytest.mark.parametrize("policy", ["drop", "admit"])
def test_late_data_is_dropped_or_admitted(policy):
    w = WindowedQuery(EDGE, WindowSpec("sliding", 30, 10, late_policy=policy))
    w.add_terms(1, A, P, B, None, 40)
    assert rows(w, w.advance(50)) == [(50, [(1, ab())])]
    assert w.last_instant == 50
    assert w.add_terms(1, A, P, C, None, 50) is True  # at the last instant: not late
    admitted = w.add_terms(1, B, P, C, None, 35)  # late; its window would still be open at 60
    ignored = w.add_terms(1, C, P, C, None, 5)  # late and in no future window
    assert (admitted, ignored) == ((True, True) if policy == "admit" else (False, False))
    later = rows(w, w.advance(60))
    bc = [(1, {"s": B, "o": C})] if policy == "admit" else []
    assert later == [(60, [(1, {"s": A, "o": C})] + bc)]
    # b->c (t = 35) is in the engine until 70, but no history of it is kept: nothing can revive it
    assert w.state_entries() == 2


def test_admitted_late_updates_are_ordered_by_event_time_not_arrival():
    w = WindowedQuery(EDGE, WindowSpec("sliding", 100, 10, late_policy="admit"))
    w.add_terms(1, A, P, B, None, 0)
    w.add_terms(-1, A, P, B, None, 30)
    assert rows(w, w.advance(40)) == [(10, [(1, ab())]), (40, [(-1, ab())])]
    assert w.add_terms(1, A, P, B, None, 20) is True  # late, and behind the DEL at 30: stays deleted
    assert w.advance(60) == []
    assert w.add_terms(1, A, P, B, None, 55) is True  # late, after the DEL: back from the next instant
    assert w.add_terms(-1, A, P, C, None, 45) is True  # late DEL of an absent triple: nothing
    assert rows(w, w.advance(70)) == [(70, [(1, ab())])]
    assert w.add_terms(-1, A, P, B, None, 65) is True  # late DEL of a present triple: gone at the next instant
    assert rows(w, w.advance(80)) == [(80, [(-1, ab())])]


def test_the_default_watermark_lags_the_newest_event_by_the_lateness():
    w = WindowedQuery(EDGE, WindowSpec("sliding", 100, 10, lateness_ms=25))
    w.add_terms(1, A, P, B, None, 30)
    assert w.advance() == [] and w.watermark == 5 and w.last_instant == 0
    w.add_terms(1, A, P, C, None, 70)
    assert rows(w, w.advance()) == [(40, [(1, ab())])]  # the watermark is 45
    assert (w.watermark, w.last_instant) == (45, 40)
    assert w.add_terms(1, B, P, B, None, 41) is True  # behind the newest event, but not late
    assert w.add_terms(1, B, P, C, None, 39) is False  # before the last instant: late
    assert w.advance(20) == []  # the watermark never goes backwards
    assert (w.watermark, w.last_instant) == (45, 40)
    assert rows(w, w.advance(50)) == [(50, [(1, {"s": B, "o": B})])]


def test_a_huge_watermark_jump_reports_only_the_changing_instants():
    w = WindowedQuery(EDGE, WindowSpec("sliding", 5, 1))  # a step of 1 ms: 10^12 instants to cross
    w.add_terms(1, A, P, B, None, 3)
    w.add_terms(1, A, P, C, None, 10**9)
    reports = w.advance(10**12)
    assert [r.instant_ms for r in reports] == [4, 9, 10**9 + 1, 10**9 + 6]
    assert w.advance(2 * 10**12) == []
    assert w.state_entries() == 0


def test_irrelevant_updates_are_not_stored_and_old_history_is_pruned():
    w = WindowedQuery(f"SELECT * WHERE {{ GRAPH <{EX}g1> {{ ?s {P} ?o }} }}", WindowSpec("sliding", 20, 10))
    dictionary_size = len(w.dictionary)
    for t in range(0, 1000, 3):
        w.add_terms(1, A, Q, B, None, t)  # predicate of no pattern
        w.add_terms(1, A, P, B, None, t)  # right predicate, wrong graph
    assert w.state_entries() == 0 and len(w.dictionary) == dictionary_size
    for t in range(0, 10000, 1):
        w.add_terms(1, A, P, B, f"<{EX}g1>", t)  # refreshed every ms
        if t % 50 == 0:
            w.advance()
    assert w.state_entries() <= 10  # one update per step cell, none older than the window


def test_per_event_windows_never_join_across_events_and_ignore_deletes():
    w = WindowedQuery(FIXED_QUERIES["path"], WindowSpec("event", 20, 10))
    w.add_terms(1, A, P, B, None, 1)
    w.add_terms(1, B, P, C, None, 2)  # another event: no path a->b->c
    w.add_terms(1, A, P, B, None, 3)
    w.add_terms(1, B, P, C, None, 3)
    w.add_terms(-1, B, P, C, None, 4)  # events are immutable
    assert rows(w, w.advance(100)) == [
        (10, [(1, {"x": A, "y": B, "z": C})]),
        (30, [(-1, {"x": A, "y": B, "z": C})]),
    ]


def test_per_event_counts_the_same_answer_once_per_event():
    w = WindowedQuery(f"SELECT DISTINCT ?s WHERE {{ ?s {P} ?o }}", WindowSpec("event", 30, 10))
    for t in (1, 2, 2, 11):
        w.add_terms(1, A, P, B, None, t)
    w.add_terms(1, A, P, C, None, 2)
    assert rows(w, w.advance(60)) == [
        (10, [(1, {"s": A}), (1, {"s": A})]),
        (20, [(1, {"s": A})]),
        (40, [(-1, {"s": A}), (-1, {"s": A})]),
        (50, [(-1, {"s": A})]),
    ]


def test_ids_are_the_stable_ingest_ids():
    from cbgp.terms import stable_term_id

    w = WindowedQuery(EDGE, WindowSpec("tumbling", 10, 10))
    a, p, b = (stable_term_id(t) for t in (A, P, B))
    assert w.add(1, a, p, b, DEFAULT_GRAPH_ID, 3)
    (report,) = w.advance(10)
    assert report.deltas == [(1, (a, b))] and w.columns == ("s", "o")


def test_state_is_plain_json_and_checks_its_spec():
    spec = WindowSpec("sliding", 30, 10)
    w = WindowedQuery(EDGE, spec)
    w.add_terms(1, A, P, B, None, 3)
    state = w.to_state()
    assert json.loads(json.dumps(state)) == state
    with pytest.raises(WindowError, match="saved for window"):
        WindowedQuery.from_state(EDGE, WindowSpec("sliding", 40, 10), state)


def test_graph_is_rejected_in_a_per_event_query():
    with pytest.raises(WindowError, match="GRAPH is not supported") as info:
        WindowedQuery(f"SELECT *\nWHERE {{ GRAPH ?g {{ ?s {P} ?o }} }}", WindowSpec("event", 10, 10))
    assert (info.value.line, info.value.column) == (2, 9)


# --- specs, durations, options ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, ms", [
    ("PT60S", 60000), ("PT1M30S", 90000), ("PT0.5S", 500), ("PT2H", 7200000), ("P1D", 86400000),
    ("P1DT1S", 86401000), ("PT0.001S", 1), ("P1W", 604800000), ("pt10s", 10000),
])
def test_parse_duration(text, ms):
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text, message", [
    ("60S", "invalid duration"), ("PT", "invalid duration"), ("P", "invalid duration"), ("P1DT", "invalid"),
    ("-PT1S", "invalid duration"), ("PT1.5", "invalid duration"), ("P1M", "years and months"),
    ("P1Y", "years and months"), ("PT0.0001S", "whole number of milliseconds"), ("", "invalid duration"),
])
def test_parse_duration_errors(text, message):
    with pytest.raises(WindowError, match=message):
        parse_duration(text)


def test_window_spec_validates_and_round_trips():
    spec = WindowSpec("sliding", 60000, 10000, 5000, "admit")
    assert WindowSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    for bad, message in [
        (dict(kind="hopping", range_ms=1, step_ms=1), "unknown window kind"),
        (dict(kind="sliding", range_ms=0, step_ms=1), "range must be positive"),
        (dict(kind="sliding", range_ms=10, step_ms=0), "step must be positive"),
        (dict(kind="tumbling", range_ms=10, step_ms=5), "tumbling window has step == range"),
        (dict(kind="sliding", range_ms=10, step_ms=5, late_policy="keep"), "late-data policy"),
        (dict(kind="sliding", range_ms=10, step_ms=5, lateness_ms=-1), "lateness cannot be negative"),
        (dict(kind="sliding", range_ms=1.5, step_ms=5), "integer number of milliseconds"),
        (dict(kind="sliding", range_ms=10), "lacks field"),
        (dict(kind="sliding", range_ms=10, step_ms=5, colour=1), "unknown window spec field"),
    ]:
        with pytest.raises(WindowError, match=message):
            WindowSpec.from_json(bad)


def test_window_from_options():
    assert window_from_options({}) is None
    assert window_from_options({"format": "json"}) is None
    assert window_from_options({"window": "sliding", "range": "PT60S", "step": "PT10S"}) == WindowSpec(
        "sliding", 60000, 10000)
    assert window_from_options({"window": "tumbling", "range": "PT1M"}) == WindowSpec("tumbling", 60000, 60000)
    assert window_from_options({"window": "event", "range": "PT5S", "lateness": "PT1S", "late": "admit"}) == (
        WindowSpec("event", 5000, 5000, 1000, "admit"))
    base = WindowSpec("sliding", 60000, 10000)
    assert window_from_options({}, base) == base
    assert window_from_options({"lateness": "PT2S", "late": "admit"}, base) == WindowSpec(
        "sliding", 60000, 10000, 2000, "admit")
    for options, base_spec, message in [
        ({"window": "hopping", "range": "PT1S"}, None, "expected sliding, tumbling or event"),
        ({"window": "sliding"}, None, "needs a range"),
        ({"window": "sliding", "range": "10s"}, None, "option range: invalid duration"),
        ({"window": "tumbling", "range": "PT10S", "step": "PT5S"}, None, "tumbling window has step == range"),
        ({"window": "sliding", "range": "PT10S", "late": "keep"}, None, "expected drop or admit"),
        ({"range": "PT10S"}, None, "without window="),
        ({"lateness": "PT1S"}, None, "without window="),
        ({"window": "sliding", "range": "PT10S"}, base, "declares its window"),
    ]:
        with pytest.raises(WindowError, match=message):
            window_from_options(options, base_spec)


# --- RSP-QL text ------------------------------------------------------------------------------------------------

RSPQL = """PREFIX : <http://ex/>
SELECT ?s ?o
FROM NAMED WINDOW :w ON :stream [RANGE PT60S STEP PT10S]
WHERE { WINDOW :w { ?s :p ?o . ?o :q ?z } }"""


def test_parse_rspql_strips_the_window_and_keeps_positions():
    text, spec = parse_rspql(RSPQL)
    assert spec == WindowSpec("sliding", 60000, 10000)
    assert len(text) == len(RSPQL) and text.count("\n") == RSPQL.count("\n")
    assert "WINDOW" not in text and "FROM" not in text
    assert text.index("?s :p ?o") == RSPQL.index("?s :p ?o")
    query = parse_query(text)
    assert [(t.s, t.p, t.o) for t in query.patterns] == [("?s", "<http://ex/p>", "?o"), ("?o", "<http://ex/q>", "?z")]
    bad = RSPQL.replace("?o :q ?z", "?o :q ?z FILTER(?z)")
    with pytest.raises(QueryError) as info:
        parse_query(parse_rspql(bad)[0])
    assert info.value.line == 4 and info.value.column == bad.split("\n")[3].index("FILTER") + 1


@pytest.mark.parametrize("clause, spec", [
    ("[RANGE PT60S]", WindowSpec("tumbling", 60000, 60000)),
    ("[RANGE PT60S STEP PT60S]", WindowSpec("tumbling", 60000, 60000)),
    ("[range PT1M step PT0.5S]", WindowSpec("sliding", 60000, 500)),
    ("[RANGE PT5S EVENT]", WindowSpec("event", 5000, 5000)),
    ("[RANGE PT5S STEP PT1S EVENT]", WindowSpec("event", 5000, 1000)),
])
def test_parse_rspql_window_shapes(clause, spec):
    assert parse_rspql(RSPQL.replace("[RANGE PT60S STEP PT10S]", clause))[1] == spec


def test_parse_rspql_names_as_iris_or_prefixed_names_and_no_window():
    full = RSPQL.replace("FROM NAMED WINDOW :w ON :stream", "FROM NAMED WINDOW <http://ex/w> ON <http://ex/s>")
    assert parse_rspql(full)[1] == WindowSpec("sliding", 60000, 10000)
    mixed = "PREFIX ex: <http://ex/>\n" + full.replace("WINDOW :w {", "WINDOW ex:w {")
    text, spec = parse_rspql(mixed)
    assert spec is not None and len(parse_query(text).patterns) == 2
    plain = "SELECT * WHERE { ?s <http://ex/window> \"WINDOW :w\" } # WINDOW"
    assert parse_rspql(plain) == (plain, None)


def position(text: str, marker: str, occurrence: int = 1) -> tuple[int, int]:
    offset = -1
    for _ in range(occurrence):
        offset = text.index(marker, offset + 1)
    return text.count("\n", 0, offset) + 1, offset - (text.rfind("\n", 0, offset) + 1) + 1


@pytest.mark.parametrize("change, message, marker", [
    (("WHERE {", "FROM NAMED WINDOW :v ON :stream [RANGE PT1S]\nWHERE {"), "only one window", ("FROM", 2)),
    (("?o :q ?z }", "?o :q ?z } WINDOW :w { ?s :r ?o }"), "only one WINDOW block", ("WINDOW", 3)),
    (("WINDOW :w {", "WINDOW :v {"), "names an undeclared window", ("WINDOW :v", 1)),
    (("WINDOW :w { ?s :p ?o . ?o :q ?z }", "?s :p ?o"), "declared but never used", ("FROM", 1)),
    (("WHERE { WINDOW", "WHERE { ?a :r ?b . WINDOW"), "patterns outside the WINDOW block", ("?a", 1)),
    (("?z } }", "?z } ?z :r ?y }"), "patterns outside the WINDOW block", ("?z :r", 1)),
    (("?z } }", "?z } FILTER NOT EXISTS { ?z :r ?y } }"), "patterns outside the WINDOW block", ("FILTER", 1)),
    (("PT60S", "60S"), "RANGE: invalid duration '60S'", ("60S", 1)),
    (("PT10S", "PT0S"), "STEP must be a positive duration", ("PT0S", 1)),
    (("PT60S", "PT0S"), "RANGE must be a positive duration", ("PT0S", 1)),
    (("STEP PT10S]", "STEP PT10S"), "expected ']'", ("WHERE", 1)),
    ((" ON :stream", ""), "expected ON <stream>", ("[", 1)),
    ((":w ON", "nope:w ON"), "undeclared prefix 'nope:'", ("nope:w", 1)),
    (("WINDOW :w {", "WINDOW :w ?s {"), "expected '{' after WINDOW", ("?s {", 1)),
    (("SELECT ?s ?o", "SELECT ?s ?o WINDOW :w"), "WINDOW without FROM NAMED", ("WINDOW", 1)),
])
def test_parse_rspql_errors(change, message, marker):
    text = RSPQL.replace(*change)
    with pytest.raises(WindowError, match=message) as info:
        parse_rspql(text)
    assert (info.value.line, info.value.column) == position(text, *marker)


def test_parse_rspql_allows_service_filter_and_bind_outside_the_window_block():
    """A SERVICE clause is background data (not windowed), and a FILTER or BIND over it and the window's
    variables must sit beside it (Dehghanzadeh et al.'s query: a mention stream's users with many followers)."""
    text = RSPQL.replace("?z } }", "?z } SERVICE <http://e/sparql> { ?z :followers ?n } FILTER(?n > 10) "
                                   "BIND(?n + 1 AS ?m) }")
    plain, spec = parse_rspql(text)
    assert spec == WindowSpec("sliding", 60000, 10000) and "SERVICE <http://e/sparql>" in plain
    assert len(plain) == len(text)
    event = text.replace("STEP PT10S", "EVENT")
    with pytest.raises(WindowError, match="SERVICE is not supported in a per-event window"):
        parse_rspql(event)


def test_parse_rspql_allows_graph_in_a_time_window():
    text, spec = parse_rspql(RSPQL.replace("?s :p ?o .", "GRAPH :g { ?s :p ?o } ."))
    assert spec is not None and parse_query(text).patterns[0].g == "<http://ex/g>"


def test_parse_rspql_rejects_graph_in_an_event_window_and_a_stray_window_block():
    text = RSPQL.replace("STEP PT10S", "EVENT").replace("?s :p ?o .", "GRAPH :g { ?s :p ?o } .")
    with pytest.raises(WindowError, match="GRAPH is not supported in a per-event window") as info:
        parse_rspql(text)
    assert (info.value.line, info.value.column) == (4, 21)
    with pytest.raises(WindowError, match="undeclared window"):
        parse_rspql("PREFIX : <http://ex/>\nSELECT * WHERE { WINDOW :w { ?s :p ?o } }")
