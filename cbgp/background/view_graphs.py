"""SERVICE in the fleet: the remote pattern's matches kept as a named graph of the stream.

How it works: docs/design/internals.md, cbgp.background.view_graphs.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping

from cbgp.query.sparql import QueryError, TriplePattern, is_var, parse_query

from cbgp.background.service_clause import ServiceError, split_service

VIEW_PREFIX = "urn:cbgp:service-view:"

Row = tuple[tuple[str, str], ...]  # (variable without '?', term in SPARQL syntax), as SparqlRemote builds it
Triple = tuple[str, str, str]


@dataclass(frozen=True)
class ServiceView:
    """One SERVICE clause as a view: where its data comes from and the graph that holds it."""

    graph: str  # the view graph's IRI (without <>)
    endpoint: str
    pattern: str  # P's text, as written
    prologue: str  # PREFIX / BASE lines P needs
    key: str  # the join variable (without '?'): the unit of a refresh
    patterns: tuple[TriplePattern, ...]  # P parsed: what a row instantiates

    def to_json(self) -> dict:
        return {"graph": self.graph, "endpoint": self.endpoint, "pattern": self.pattern, "prologue": self.prologue,
                "key": self.key}


def view_graph(endpoint: str, patterns: Iterable[TriplePattern]) -> str:
    """The view's graph IRI: a hash of the endpoint and P's triple patterns with their prefixes expanded, so the
    same clause under other prefix names, comments or layout shares one view."""
    text = "\0".join([endpoint] + [f"{t.s} {t.p} {t.o}" for t in patterns])
    return VIEW_PREFIX + hashlib.sha1(text.encode()).hexdigest()[:16]


ALLOW_SETTING = "CBGP_SERVICE_ALLOW"


def endpoint_problem(endpoint: str) -> str | None:
    """Why the fleet may not call ``endpoint`` (one line), or None.  Only http(s) endpoints whose URL starts with
    one of the prefixes in ``CBGP_SERVICE_ALLOW`` (comma-separated; empty: none) are called: a registered query
    must not make the fleet reach internal addresses (a cloud metadata service, the cluster's own APIs)."""
    allowed = [prefix.strip() for prefix in os.environ.get(ALLOW_SETTING, "").split(",") if prefix.strip()]
    if not re.match(r"https?://[^/?#\s]", endpoint):
        return f"SERVICE <{endpoint[:200]}>: only http and https endpoints are called"
    if not any(endpoint.startswith(prefix) for prefix in allowed):
        return (f"SERVICE <{endpoint[:200]}> is not an allowed endpoint: add its URL (or a prefix of it) to "
                f"{ALLOW_SETTING} on the registry, the background service and the gateway")
    return None


def has_service(text: str) -> bool:
    if "service" not in text.lower():
        return False
    try:
        split_service(text)
    except ServiceError as exc:
        return "no SERVICE clause" not in str(exc)
    return True


def rewrite_services(text: str, check_endpoints: bool = True) -> tuple[str, tuple[ServiceView, ...]]:
    """``text`` with each ``SERVICE [SILENT] <e> { P }`` replaced by ``GRAPH <view> { P }``, and the views.

    Raises :class:`ServiceError` for what the fleet cannot keep as a view: a variable endpoint, a SERVICE group
    that is not a basic graph pattern, or one sharing no variable with the rest of the query.  A query without
    SERVICE comes back unchanged with no views.  Endpoints not allowed (:func:`endpoint_problem`) are refused too,
    unless ``check_endpoints`` is false."""
    if "service" not in text.lower():  # (no keyword can be there: spare the lexer)
        return text, ()
    try:
        plan = split_service(text)
    except ServiceError as exc:
        if "no SERVICE clause" in str(exc):
            return text, ()
        raise
    from cbgp.background.service_clause import service_tokens

    out, views, cursor = [], [], 0
    tokens = service_tokens(text)
    i = 0
    for clause in plan.services:
        problem = endpoint_problem(clause.endpoint) if check_endpoints else None
        if problem:
            raise ServiceError(problem)
        # Find this clause's SERVICE keyword, its endpoint token and its opening brace (in text order).
        while not (tokens[i][0] == "word" and tokens[i][1].upper() == "SERVICE"):
            i += 1
        j = i + 1
        if tokens[j][0] == "word" and tokens[j][1].upper() == "SILENT":
            j += 1
        brace = j + 1
        out.append(text[cursor:tokens[i][2]])
        view = _view(clause.endpoint, plan.prologue, clause.pattern, clause.join_vars)
        out.append(f"GRAPH <{view.graph}> ")
        cursor = tokens[brace][2]  # keep from the '{' on: P and its closing brace stay as written
        views.append(view)
        i = brace
    out.append(text[cursor:])
    return "".join(out), tuple(views)


def _view(endpoint: str, prologue: str, pattern: str, join_vars: tuple[str, ...]) -> ServiceView:
    if not join_vars:
        raise ServiceError("the SERVICE pattern shares no variable with the rest of the query (a cross product "
                           "with the endpoint's data is not kept in a view)")
    try:
        parsed = parse_query(f"{prologue}\nSELECT * WHERE {{ {pattern} }}")
    except QueryError as exc:
        raise ServiceError(f"the fleet keeps a SERVICE view of a basic graph pattern (triple patterns only): "
                           f"{exc.message}") from None
    patterns = tuple(parsed.patterns)
    if any(is_var(t.p) for t in patterns):
        raise ServiceError("a SERVICE pattern with a variable predicate is not kept as a view")
    return ServiceView(view_graph(endpoint, patterns), endpoint, pattern, prologue, join_vars[0], patterns)


def instantiate(patterns: Iterable[TriplePattern], key_var: str, key: str, row: Row) -> list[Triple]:
    """The triples of one match: P with the key and the row's terms substituted."""
    binding = dict(row)
    binding[key_var] = key
    out = []
    for t in patterns:
        terms = []
        for term in (t.s, t.p, t.o):
            if is_var(term):
                value = binding.get(term[1:])
                if value is None:
                    break  # an unbound variable (cannot happen for a BGP match): no triple
                terms.append(value)
            else:
                terms.append(term)
        else:
            out.append((terms[0], terms[1], terms[2]))
    return out


class ViewGraph:
    """The triples a view's rows need, reference-counted across keys, and the SPARQL Update text of changes."""

    def __init__(self, view: ServiceView) -> None:
        self.view = view
        self.rows: dict[str, frozenset[Row]] = {}  # key -> its current rows
        self.count: Counter = Counter()  # triple -> how many (key, row) instantiations need it

    def _triples(self, key: str, rows: Iterable[Row]) -> list[Triple]:
        # A match binding a blank node is left out: an endpoint's blank node has no identity across requests
        # (and SPARQL Update's DELETE DATA cannot name one).
        if key.startswith("_:"):
            return []
        return [t for row in rows if not any(term.startswith("_:") for _v, term in row)
                for t in instantiate(self.view.patterns, self.view.key, key, row)]

    def set_key(self, key: str, rows: Iterable[Row]) -> tuple[list[Triple], list[Triple]]:
        """Replace ``key``'s rows; ``(triples removed from the graph, triples added)``."""
        new = frozenset(rows)
        old = self.rows.get(key, frozenset())
        if new == old:
            return [], []
        removed, added = [], []
        for t in self._triples(key, old):
            self.count[t] -= 1
            if self.count[t] == 0:
                del self.count[t]
                removed.append(t)
        for t in self._triples(key, new):
            self.count[t] += 1
            if self.count[t] == 1:
                added.append(t)
        if new:
            self.rows[key] = new
        else:
            self.rows.pop(key, None)
        gone = set(removed) & set(added)  # a triple dropped by one row and needed by another: no change
        return [t for t in removed if t not in gone], [t for t in added if t not in gone]

    def update_text(self, removed: Iterable[Triple], added: Iterable[Triple]) -> str | None:
        """One SPARQL Update for a set of changes (None when there is none)."""
        removed, added = list(removed), list(added)
        if not removed and not added:
            return None
        graph = f"<{self.view.graph}>"
        parts = []
        if removed:
            parts.append(f"DELETE DATA {{ GRAPH {graph} {{ {_block(removed)} }} }}")
        if added:
            parts.append(f"INSERT DATA {{ GRAPH {graph} {{ {_block(added)} }} }}")
        return " ;\n".join(parts)

    def refresh_patch(self) -> str | None:
        """Every triple of the graph re-added, as one RDF Patch transaction (None when the graph is empty):
        ingest forwards a re-added triple as a *refresh*, which a windowed query reads as the triple's ADD
        (``cbgp.windows.windowed``: a view graph is background data), while the graph itself does not change."""
        if not self.count:
            return None
        graph = f"<{self.view.graph}>"
        lines = [f"A {s} {p} {o} {graph} ." for s, p, o in sorted(self.count)]
        return "TX .\n" + "\n".join(lines) + "\nTC .\n"

    def replace_all(self, rows_by_key: Mapping[str, Iterable[Row]]) -> str:
        """The whole view from a bulk fill, as one request that first empties the graph: after a restart the
        service does not know what the graph holds, and ingest nets the request to its real changes."""
        self.rows.clear()
        self.count.clear()
        for key, rows in rows_by_key.items():
            self.set_key(key, rows)
        graph = f"<{self.view.graph}>"
        text = f"DROP SILENT GRAPH {graph}"
        if self.count:
            text += f" ;\nINSERT DATA {{ GRAPH {graph} {{ {_block(sorted(self.count))} }} }}"
        return text

    def drop_text(self) -> str:
        return f"DROP SILENT GRAPH <{self.view.graph}>"


def _block(triples: Iterable[Triple]) -> str:
    return " ".join(f"{s} {p} {o} ." for s, p, o in triples)


FLEET_POLICIES = ("GNR-LRU", "GNR-RND", "WST")


def fleet_policy(policy: str, windowed: bool = False) -> str:
    """The policy the background service runs for a registration's ``service.policy``: the whole-view (GNR)
    ones and WST as asked; a window-join (WSJ) policy as asked when windowed queries read the view (the service
    follows their windows' join keys), else GNR-LRU (an unwindowed query has no window to join)."""
    return policy if policy in FLEET_POLICIES or windowed else "GNR-LRU"


def view_summary(views: Iterable[ServiceView], policy: str, refresh_ms: float, step_ms: int | None = None) -> str:
    """What a registration's status says about its SERVICE clauses (``step_ms``: a windowed query's slide)."""
    parts = [f"SERVICE <{v.endpoint}> kept as graph <{v.graph}> on ?{v.key}" for v in views]
    windowed = step_ms is not None
    run = fleet_policy(policy, windowed)
    asked = "" if run == policy else f" ({policy} needs the query's window)"
    every = f"at every window slide ({step_ms / 1000:g} s)" if windowed else f"every {refresh_ms / 1000:g} s"
    return (", ".join(parts) + f", refreshed by `cbgp background` {every} with {run}{asked} within the budget"
            + ("; the window's join keys followed on updates.encoded" if windowed and run.startswith("WSJ") else ""))
