"""The background service's transform, with no Kafka in it: plans in, SPARQL Update texts for view graphs out.

How it works: docs/design/internals.md, services.background.core.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from cbgp.background.maintenance import Maintainer, WindowShape
from cbgp.background.service_query import ServiceOptions
from cbgp.background.remote import SparqlRemote
from cbgp.background.view import LocalView
from cbgp.background.view_graphs import ServiceView, ViewGraph, fleet_policy
from cbgp.query.sparql import QueryError
from services.metrics.instruments import BACKGROUND_ACCURACY, BACKGROUND_REFRESHES, BACKGROUND_VIEW_TRIPLES
from services.wire.registrations import read_registration, read_views
from services.wire.loglines import kv

log = logging.getLogger("cbgp.background")

RETRY_FILL_MS = 5_000.0  # an endpoint that failed the bulk fill is asked again after this long


class WindowKeys:
    """The join keys of a view in the current windows of the windowed queries that read it (Dehghanzadeh et al.'s
    WSJ proposer refreshes only those; WBM ranks them by their remaining life): for each key, the event time
    of the newest stream triple binding it.  Fed the changes of updates.encoded (term ids are stable hashes,
    so the view's key texts are compared by id, no dictionary needed); a triple counts from its ADD to its DEL
    or until it leaves the window (event time + range)."""

    def __init__(self, range_ms: int, step_ms: int, lateness_ms: int) -> None:
        self.range_ms, self.step_ms, self.lateness_ms = range_ms, step_ms, lateness_ms
        self.readers: dict[int, set[str]] = {}  # predicate id -> ends ("s"/"o") where the key variable sits
        self.keys: dict[int, dict[tuple[int, int, int, int], float]] = {}  # key id -> its triples

    def read(self, patterns: Any, key: str) -> None:
        """Follow the stream patterns (not in a view graph) with ``?key`` at their subject or object."""
        from cbgp.background.view_graphs import VIEW_PREFIX
        from cbgp.terms import stable_term_id

        for pattern in patterns:
            g = getattr(pattern, "g", None)
            in_view = g is not None and g.startswith("<" + VIEW_PREFIX)
            if in_view or not hasattr(pattern, "p") or pattern.p.startswith("?"):
                continue
            ends = {end for end, term in (("s", pattern.s), ("o", pattern.o)) if term == "?" + key}
            if ends:
                self.readers.setdefault(stable_term_id(pattern.p), set()).update(ends)

    def apply(self, op: int, s: int, p: int, o: int, g: int, event_time: float) -> None:
        ends = self.readers.get(p)
        if not ends:
            return
        triple = (s, p, o, g)
        for end in ends:
            key = s if end == "s" else o
            if op > 0:
                self.keys.setdefault(key, {})[triple] = event_time
            else:
                held = self.keys.get(key)
                if held is not None:
                    held.pop(triple, None)
                    if not held:
                        del self.keys[key]

    def window(self, now: float) -> dict[int, float]:
        """Key id -> t_i (its newest triple's event time) for the keys in the window at ``now``; what has left
        the window is forgotten."""
        horizon = now - self.range_ms - self.lateness_ms
        out: dict[int, float] = {}
        for key in list(self.keys):
            held = self.keys[key]
            for triple in [t for t, at in held.items() if at < horizon]:
                del held[triple]
            if not held:
                del self.keys[key]
                continue
            out[key] = max(held.values())
        return out


@dataclass
class ViewState:
    view: ServiceView
    options: ServiceOptions
    remote: Any
    graph: ViewGraph
    users: set[str] = field(default_factory=set)
    local: LocalView | None = None  # the paper's view R (values, best-before times), after the fill
    maintainer: Maintainer | None = None
    next_due: float = 0.0  # ms: the next fill attempt (unfilled) or refresh round
    next_discover: float = 0.0  # ms: the next read of the endpoint's key set (filled)
    window_keys: WindowKeys | None = None  # when windowed queries read it: their windows' join keys
    windowed_users: dict[str, tuple] = field(default_factory=dict)  # query -> (its patterns, its window)

    @property
    def filled(self) -> bool:
        return self.maintainer is not None


@dataclass
class Alert:
    query_ids: list[str]
    message: str


class BackgroundCore:
    def __init__(self, remote_factory: Callable[..., Any] = SparqlRemote,
                 clock: Callable[[], float] = lambda: time.time() * 1000.0) -> None:
        self.remote_factory = remote_factory
        self.clock = clock
        self.views: dict[str, ViewState] = {}  # view graph IRI -> its state
        self.uses: dict[str, tuple[str, ...]] = {}  # query id -> the view graphs it reads
        self.alerts: list[Alert] = []  # drained by the loop onto queries.status

    def on_plan(self, query_id: str, record: dict | None) -> list[tuple[str, str]]:
        """A queries.plans record (None: a tombstone).  Returns the requests to publish now (graph drops), as
        ``(view graph, SPARQL Update)`` pairs."""
        out: list[tuple[str, str]] = []
        views: tuple = ()
        window = None
        if record is not None:
            try:
                views = read_views(record["sparql"], record.get("options") or {})
                text, window = read_registration(record["sparql"], record.get("options") or {}) if views \
                    else (None, None)
            except QueryError as exc:  # the registry accepted it: only a newer release could disagree
                log.warning(kv(event="plan-skipped", query=query_id, reason=exc.message))
            options = ServiceOptions.from_options(record.get("options") or {}) if views else None
        windowed = window is not None
        for graph in self.uses.pop(query_id, ()):  # a new version replaces the old one's uses
            state = self.views.get(graph)
            if state is not None:
                state.users.discard(query_id)
                state.windowed_users.pop(query_id, None)
                self._rewindow(state)
        for view in views:
            state = self.views.get(view.graph)
            if state is None:
                remote = self.remote_factory(view.endpoint, view.pattern, view.key, prefixes=view.prologue)
                state = self.views[view.graph] = ViewState(view, options, remote, ViewGraph(view))
                log.info(kv(event="view-added", graph=view.graph, endpoint=view.endpoint, query=query_id))
            state.users.add(query_id)
            if windowed:
                from cbgp.windows.windowed import WindowedQuery

                state.windowed_users[query_id] = (WindowedQuery(text, window).patterns, window)
            self._rewindow(state)
            if windowed and state.filled:
                # A windowed query sees the updates that come after it (the Spark job), and the view is older:
                # its triples again, as refreshes, so the query's window starts with the view's content.
                text = state.graph.refresh_patch()
                if text:
                    out.append((view.graph, text))
        if views:
            self.uses[query_id] = tuple(v.graph for v in views)
        for graph, state in list(self.views.items()):
            if not state.users:
                del self.views[graph]
                BACKGROUND_VIEW_TRIPLES.labels(graph).set(0)
                log.info(kv(event="view-dropped", graph=graph))
                out.append((graph, state.graph.drop_text()))
        return out

    def next_due(self) -> float | None:
        """When (ms) :meth:`due` has work next; None without views."""
        return min((min(s.next_due, s.next_discover) if s.filled else s.next_due for s in self.views.values()),
                   default=None)

    def due(self) -> list[tuple[str, str]]:
        """Fill views that are not filled yet and run the refresh rounds that are due; the requests to publish."""
        out: list[tuple[str, str]] = []
        now = self.clock()
        for graph, state in self.views.items():
            if state.filled and state.next_discover <= now:
                text = self._discover(state, now)
                if text:
                    out.append((graph, text))
            if state.next_due > now:
                continue
            text = self._fill(state, now) if not state.filled else self._refresh(state, now)
            if text:
                out.append((graph, text))
            BACKGROUND_VIEW_TRIPLES.labels(graph).set(len(state.graph.count))
        return out

    def _discover(self, state: ViewState, now: float) -> str | None:
        """Keys new at the endpoint join the view, keys gone from it leave (one bulk query, every
        ``service.discover_ms``); the known keys' values stay with the refresh policy."""
        state.next_discover = now + state.options.discover_ms
        try:
            rows = state.remote.fill()
        except Exception as exc:  # noqa: BLE001 - any endpoint failure: the next round tries again
            BACKGROUND_REFRESHES.labels(state.view.graph, "failed").inc()
            log.warning(kv(event="discover-failed", graph=state.view.graph, endpoint=state.view.endpoint,
                           reason=str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__))
            return None
        BACKGROUND_REFRESHES.labels(state.view.graph, "discover").inc()
        added, removed = state.local.discover(rows, now)
        if not (added or removed):
            return None
        log.info(kv(event="view-keys-discovered", graph=state.view.graph, added=len(added), removed=len(removed)))
        return self._write(state, [(key, rows[key]) for key in added] + [(key, ()) for key in removed])

    @staticmethod
    def _write(state: ViewState, changes: list[tuple[Any, Any]]) -> str | None:
        """One request for keys' new rows (``()``: gone), the round's changes netted per triple (a triple's
        presence alternates)."""
        removed: set = set()
        added: set = set()
        for key, rows in changes:
            gone, new = state.graph.set_key(key, rows)
            for triple in gone:
                added.remove(triple) if triple in added else removed.add(triple)
            for triple in new:
                removed.remove(triple) if triple in removed else added.add(triple)
        return state.graph.update_text(sorted(removed), sorted(added))

    def _fill(self, state: ViewState, now: float) -> str | None:
        try:
            rows = state.remote.fill()
        except Exception as exc:  # noqa: BLE001 - any endpoint failure: try again later, the loop goes on
            BACKGROUND_REFRESHES.labels(state.view.graph, "failed").inc()
            log.warning(kv(event="fill-failed", graph=state.view.graph, endpoint=state.view.endpoint,
                           reason=str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__))
            state.next_due = now + RETRY_FILL_MS
            return None
        BACKGROUND_REFRESHES.labels(state.view.graph, "fill").inc()
        options = state.options
        state.local = LocalView(prior_interval=options.prior_interval_ms)
        state.local.fill(rows, now)
        self._maintain(state, now)
        state.next_discover = now + options.discover_ms
        log.info(kv(event="view-filled", graph=state.view.graph, keys=len(rows)))
        return state.graph.replace_all(rows)

    def _rewindow(self, state: ViewState) -> None:
        """Follow the join keys of the windowed queries that read the view now (the first one's window shapes
        the rounds).  None left, or a reader without a window (its answers need every key fresh): the whole-view
        policy.  A filled view's maintainer follows the change (its view R, values and best-before times, is
        kept)."""
        windowed = state.windowed_users
        before = state.window_keys
        if not windowed or len(windowed) < len(state.users):
            state.window_keys = None
        else:
            _patterns, window = next(iter(windowed.values()))
            keys = WindowKeys(window.range_ms, window.step_ms, window.lateness_ms)
            if before is not None and (before.range_ms, before.step_ms) == (keys.range_ms, keys.step_ms):
                keys.keys = before.keys  # (what the stream has shown so far stays)
            for patterns, _window in windowed.values():
                keys.read(patterns, state.view.key)
            state.window_keys = keys
        if state.filled and (before is None) != (state.window_keys is None):
            self._maintain(state, self.clock())

    def _maintain(self, state: ViewState, now: float) -> None:
        """The view's maintainer for its policy (a window-join one while windowed queries read it) and rounds."""
        options, keys = state.options, state.window_keys
        # (a windowed view: one maintenance round per window slide, the paper's evaluations)
        shape = WindowShape(keys.range_ms, keys.step_ms) if keys is not None else \
            WindowShape(options.refresh_ms, options.refresh_ms)
        state.maintainer = Maintainer(state.local, state.remote, fleet_policy(options.policy, keys is not None),
                                      shape, gamma=options.gamma, rho=options.rho_ms / 1000.0, alpha=options.alpha)
        state.next_due = now + self._round_ms(state)

    @staticmethod
    def _round_ms(state: ViewState) -> float:
        return state.window_keys.step_ms if state.window_keys is not None else state.options.refresh_ms

    def on_changes(self, changes: Iterable[tuple]) -> None:
        """Changes of updates.encoded (``cbgp.change.Change`` rows) for the windows' join keys."""
        trackers = [state.window_keys for state in self.views.values() if state.window_keys is not None]
        for seq, op, s, p, o, g, event_time, *_rest in changes:
            if event_time is not None:
                for keys in trackers:
                    keys.apply(op, s, p, o, g, event_time)

    def stream_horizon_ms(self) -> float | None:
        """How far back (ms before now) updates.encoded must be read for the windows' join keys; None: not read."""
        horizons = [s.window_keys.range_ms + s.window_keys.lateness_ms for s in self.views.values()
                    if s.window_keys is not None and s.window_keys.readers and s.options.policy.startswith("WSJ")]
        return max(horizons) if horizons else None

    def _window(self, state: ViewState, now: float) -> dict[str, float]:
        """The view's keys in the windows at ``now`` -> t_i (WSJ's candidates), by the view's key texts."""
        if state.window_keys is None or state.local is None:
            return {}
        from cbgp.terms import stable_term_id

        in_window = state.window_keys.window(now)
        return {key: in_window[stable_term_id(key)] for key in state.local
                if stable_term_id(key) in in_window}

    def _refresh(self, state: ViewState, now: float) -> str | None:
        evaluation = state.maintainer.evaluate(now, self._window(state, now))
        state.next_due = now + self._round_ms(state)
        graph = state.view.graph
        BACKGROUND_REFRESHES.labels(graph, "refresh").inc(len(evaluation.refreshed))
        BACKGROUND_REFRESHES.labels(graph, "failed").inc(evaluation.failures)
        BACKGROUND_ACCURACY.labels(graph).set(evaluation.expected)
        if evaluation.alert is not None:
            alert = evaluation.alert
            self.alerts.append(Alert(sorted(state.users), (
                f"ALERT background view {graph} (SERVICE <{state.view.endpoint}>): estimated accuracy "
                f"{alert.estimate:.3f} is below alpha {alert.alpha:g} with {alert.gamma} refreshes allowed per "
                f"round; raise service.rho_ms or lower service.refresh_ms")))
        if evaluation.changes:
            log.info(kv(event="view-refreshed", graph=graph, refreshed=len(evaluation.refreshed),
                        changed=len(evaluation.changes)))
        return self._write(state, [(change.key, change.new or ()) for change in evaluation.changes])
