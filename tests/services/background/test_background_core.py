"""The background service's transform (``services.background.core``) without Kafka, over an endpoint played by a
pyoxigraph store: its requests, applied to the stream's store, keep the view graph equal to what a fresh fill
of the endpoint's current data gives -- keys new at the endpoint join at the next discovery round, keys gone
from it leave -- and the known keys' values change only through the refresh policy."""

from __future__ import annotations

import pyoxigraph as ox

from services.background.core import BackgroundCore
from tests.cbgp.background.test_service_views import QUERY, REMOTE, ViewGraph_fill, quad, rows_by_key


class StoreRemote:
    """An endpoint over ``store``'s graph REMOTE: ``fill`` and ``fetch`` as ``SparqlRemote`` answers them."""

    def __init__(self, store: ox.Store, view) -> None:  # noqa: ANN001
        self.store, self.view = store, view
        self.fills = 0

    def fill(self) -> dict:
        self.fills += 1
        return rows_by_key(self.store, self.view)

    def fetch(self, key, timeout=None):  # noqa: ANN001, ANN201
        return rows_by_key(self.store, self.view).get(key, frozenset())


def view_quads(store: ox.Store, graph: str) -> set:
    return {(q.subject.value, q.predicate.value, q.object.value)
            for q in store.quads_for_pattern(None, None, None, ox.NamedNode(graph))}


def fresh_quads(view, rows) -> set:  # noqa: ANN001
    return {tuple(t[1:-1] for t in triple) for triple in ViewGraph_fill(view, rows)}


def test_keys_new_at_the_endpoint_join_and_gone_keys_leave_at_the_next_discovery_round() -> None:
    endpoint = ox.Store()
    endpoint.extend([quad("follows", 1, 2, REMOTE), quad("count", 2, 5, REMOTE), quad("name", 1, 7, REMOTE),
                     quad("follows", 3, 4, REMOTE), quad("count", 4, 9, REMOTE), quad("name", 3, 8, REMOTE)])
    now = [0.0]
    core = BackgroundCore(remote_factory=lambda *a, **k: None, clock=lambda: now[0])
    options = {"service.policy": "WST", "service.refresh_ms": "1000", "service.discover_ms": "5000"}
    core.on_plan("q", {"sparql": QUERY, "options": options})
    (graph, state), = core.views.items()
    state.remote = remote = StoreRemote(endpoint, state.view)  # (the view names the pattern it reads)
    stream = ox.Store()

    def publish() -> None:
        for _graph, text in core.due():
            stream.update(text)

    publish()  # the fill
    assert view_quads(stream, graph) == fresh_quads(state.view, rows_by_key(endpoint, state.view))
    assert remote.fills == 1
    # n5 is new at the endpoint, n3 is gone from it, n1's count changes (WST never refreshes it)
    endpoint.extend([quad("follows", 5, 6, REMOTE), quad("count", 6, 1, REMOTE), quad("name", 5, 3, REMOTE)])
    endpoint.remove(quad("follows", 3, 4, REMOTE))
    endpoint.remove(quad("count", 2, 5, REMOTE))
    endpoint.add(quad("count", 2, 6, REMOTE))
    now[0] = 4_000.0
    publish()  # refresh rounds only: nothing changes under WST
    assert remote.fills == 1 and "n5" not in str(view_quads(stream, graph))
    now[0] = 5_000.0
    publish()  # the discovery round
    assert remote.fills == 2
    got = view_quads(stream, graph)
    assert any("n5" in s for s, _p, _o in got), "the new key joined"
    assert not any(s.endswith("n3") for s, _p, _o in got), "the gone key left"
    assert ("http://ex.org/n2", "http://ex.org/count", "5") in got, "a known key's value stays with the policy"
    assert core.next_due() == 5_000.0 + 1_000.0


def test_a_windowed_query_registered_on_a_filled_view_gets_its_triples_again_as_refreshes() -> None:
    """The Spark job gives a windowed query the updates that come after it: a view filled before it registered
    is published again as an RDF Patch of re-adds (ingest forwards them as refreshes; the graph is unchanged),
    so the query's window starts with the view's content.  An unwindowed query needs nothing (the workers
    replay the log)."""
    from cbgp.inputs.formats import parse_patch

    endpoint = ox.Store()
    endpoint.extend([quad("follows", 1, 2, REMOTE), quad("count", 2, 5, REMOTE), quad("name", 1, 7, REMOTE)])
    core = BackgroundCore(remote_factory=lambda *a, **k: None, clock=lambda: 0.0)
    core.on_plan("plain", {"sparql": QUERY, "options": {}})
    (graph, state), = core.views.items()
    state.remote = StoreRemote(endpoint, state.view)
    assert core.on_plan("windowed-early", {"sparql": QUERY, "options": {"window": "sliding", "range": "PT10S",
                                                                         "step": "PT1S"}}) == []  # not filled yet
    stream = ox.Store()
    for _graph, text in core.due():  # the fill
        stream.update(text)
    assert core.on_plan("plain-too", {"sparql": QUERY, "options": {}}) == []
    (request,) = core.on_plan("windowed", {"sparql": QUERY, "options": {"window": "sliding", "range": "PT10S",
                                                                          "step": "PT1S"}})
    assert request[0] == graph and request[1].startswith("TX .")
    readded = {(u.s[1:-1], u.p[1:-1], u.o[1:-1]) for u in parse_patch(request[1]) if u.g == f"<{graph}>"}
    assert all(u.op == 1 for u in parse_patch(request[1]))
    assert readded == view_quads(stream, graph) and readded


def test_a_window_join_policy_refreshes_only_the_keys_in_the_windows_of_its_windowed_queries() -> None:
    """WSJ in the fleet (Dehghanzadeh et al.): the service follows updates.encoded for the join keys of the windowed
    queries that read a view (``?u`` of ``?u ex:posted ?m``) and refreshes only the view's keys in the current
    windows -- a key whose stream triple was deleted or left the window is not refreshed; GNR would refresh
    any key."""
    from cbgp.terms import stable_term_id
    from tests.cbgp.background.test_service_views import EX

    endpoint = ox.Store()
    for n in range(1, 9, 2):  # keys n1, n3, n5, n7
        endpoint.extend([quad("follows", n, n + 1, REMOTE), quad("count", n + 1, n, REMOTE),
                         quad("name", n, n, REMOTE)])
    now = [1_000_000.0]
    core = BackgroundCore(remote_factory=lambda *a, **k: None, clock=lambda: now[0])
    options = {"service.policy": "WSJ-LRU", "service.rho_ms": "5000", "window": "sliding", "range": "PT10S",
               "step": "PT2S"}
    core.on_plan("w", {"sparql": QUERY, "options": options})
    (graph, state), = core.views.items()
    assert core.stream_horizon_ms() == 10_000 and state.window_keys is not None
    fetched: list = []
    state.remote = remote = StoreRemote(endpoint, state.view)
    remote.fetch = lambda key, timeout=None: fetched.append(key) or rows_by_key(endpoint, state.view).get(key)
    core.due()  # the fill
    assert state.maintainer.policy.name == "WSJ-LRU" and state.next_due == now[0] + 2_000
    posted, m = stable_term_id(f"<{EX}posted>"), stable_term_id(f"<{EX}m>")
    user = {n: stable_term_id(f"<{EX}n{n}>") for n in (1, 3, 5, 7)}
    core.on_changes([(1, 1, user[1], posted, m, 0, now[0] - 9_000, 0, False),  # leaves the window before the round
                     (2, 1, user[3], posted, m, 0, now[0] - 1_000, 0, False),
                     (3, 1, user[5], posted, m, 0, now[0] - 500, 0, False),
                     (4, -1, user[5], posted, m, 0, now[0] - 400, 0, False)])  # deleted again
    now[0] += 2_000
    core.due()
    assert fetched == [f"<{EX}n3>"]
    # An unwindowed query on the same view needs every key fresh: the whole-view policy, every refresh_ms, and
    # updates.encoded is no longer read.  When it goes, the window-join policy again.
    core.on_plan("plain", {"sparql": QUERY, "options": {"service.policy": "WSJ-LRU", "service.refresh_ms": "60000"}})
    assert state.window_keys is None and core.stream_horizon_ms() is None
    assert state.maintainer.policy.name == "GNR-LRU" and state.next_due == now[0] + state.options.refresh_ms
    core.on_plan("plain", None)
    assert state.maintainer.policy.name == "WSJ-LRU" and core.stream_horizon_ms() == 10_000
    core.on_plan("w", None)  # the last reader: the view goes
    assert not core.views and core.stream_horizon_ms() is None
