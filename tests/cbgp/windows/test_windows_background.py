"""Background data in windowed queries (a SERVICE clause over a window, Dehghanzadeh et al.): the graph a
SERVICE is rewritten to (``GRAPH <urn:cbgp:service-view:...>``, the local view) is not windowed -- its quads are
in the content from their ADD to their DEL, however old -- while the stream's quads come and go with the window.
At every grid instant the answers rebuilt from the reports equal pyoxigraph's over that content, computed here
from the definition; random streams with deletions, duplicates, absent deletes and late data."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgp.background.view_graphs import VIEW_PREFIX
from cbgp.windows.windowed import WindowedQuery
from cbgp.windows.spec import WindowSpec
from tests.cbgp.windows.test_windows import run, time_content
from tests.cbgp.windows.test_windows_operators import OperatorHarness, OperatorReference, operator_answers

EX = "http://ex.org/"
VIEW = f"<{VIEW_PREFIX}test>"
PREFIX = f"PREFIX : <{EX}> "
QUERIES = {name: PREFIX + text for name, text in {
    "join": f"SELECT * WHERE {{ ?x :p ?y . GRAPH {VIEW} {{ ?y :q ?z }} }}",
    "count": f"SELECT ?x (COUNT(?z) AS ?n) WHERE {{ ?x :p ?y . GRAPH {VIEW} {{ ?y :q ?z }} }} GROUP BY ?x",
    "filtered": f"SELECT ?x ?v WHERE {{ ?x :p ?y . GRAPH {VIEW} {{ ?y :r ?v }} FILTER(isLiteral(?v)) }}",
    "optional": f"SELECT * WHERE {{ ?x :p ?y OPTIONAL {{ GRAPH {VIEW} {{ ?y :q ?z }} }} }}",
}.items()}

NODES = [f"<{EX}{n}>" for n in "abcd"]
updates = st.tuples(st.sampled_from([1, 1, 1, -1]), st.sampled_from(NODES[:3] * 2 + NODES[3:]),
                    st.sampled_from([f"<{EX}p>", f"<{EX}q>", f"<{EX}r>"]),
                    st.sampled_from(NODES + ['"1"', '"x"@en']), st.sampled_from([None, None, VIEW]))


class BackgroundReference(OperatorReference):
    """The content at tau: the stream's quads in the window, and the view's quads whose last update before tau
    is an ADD, whatever its age."""

    def answers(self, name: str, tau: int):  # noqa: ANN201
        stream = [(op, quad, t) for op, quad, t in self.accepted if quad[3] != VIEW]
        view = [(op, quad, t) for op, quad, t in self.accepted if quad[3] == VIEW]
        content = time_content(stream, tau, self.spec.range_ms) | time_content(view, tau, 1 << 62)
        key = (name, content)
        if key not in self.cache:
            self.cache[key] = operator_answers(content, self.queries[name])
        return self.cache[key]


class BackgroundHarness(OperatorHarness):
    reference_class = BackgroundReference


@st.composite
def scenarios(draw):
    kind = draw(st.sampled_from(["sliding", "tumbling"]))
    step = draw(st.sampled_from([1, 5, 10]))
    range_ms = step if kind == "tumbling" else draw(st.sampled_from([step, 2 * step, 25]))
    lateness = draw(st.sampled_from([0, 0, 6]))
    spec = WindowSpec(kind, range_ms, step, lateness, draw(st.sampled_from(["drop", "admit"])))
    base, actions = 0, []
    for _ in range(draw(st.integers(1, 40))):
        if draw(st.integers(0, 5)) == 0:
            actions.append(("advance", base + draw(st.integers(-5, 30)) if draw(st.booleans()) else None))
        else:
            base += draw(st.sampled_from([0, 1, 2, 5, 8, 20]))
            jitter = draw(st.integers(0, lateness)) if lateness else 0
            actions.append(("add", *draw(updates), base - jitter))
    actions.append(("advance", None))
    actions.append(("advance", base + range_ms + 3 * step))  # every stream quad expires; the view stays
    return spec, actions


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(scenario=scenarios())
def test_a_view_graph_is_background_data_and_the_stream_is_windowed(scenario):
    spec, actions = scenario
    harness = run(spec, QUERIES, actions, BackgroundHarness)
    for name in QUERIES:  # after the last advance: the view's quads alone (the harness checked every instant)
        assert harness.replayed[name].rows == harness.reference.answers(name, harness.last), name


def test_a_view_quad_older_than_the_range_still_joins_a_new_stream_quad():
    w = WindowedQuery(QUERIES["join"], WindowSpec("sliding", 10, 5))
    w.add_terms(1, f"<{EX}b>", f"<{EX}q>", f"<{EX}c>", VIEW, 0)  # the view's value, loaded long ago
    assert w.advance(1000) == []
    w.add_terms(1, f"<{EX}a>", f"<{EX}p>", f"<{EX}b>", None, 1001)
    (report,) = w.advance(1006)
    assert [(sign, w.decode_row(row)) for sign, row in report.deltas] == [
        (1, {"x": f"<{EX}a>", "y": f"<{EX}b>", "z": f"<{EX}c>"})]
    (report,) = w.advance(1020)  # the stream quad leaves the window; the view's stays
    assert report.deltas[0][0] == -1 and w.state_entries() == 1
