"""The query registry: admin commands in, query plans and status replies out.

How it works: docs/design/internals.md, services.registry.core.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from cbgp.query.plan import BY_CENTRE, SINGLE_OWNER, ComponentPart, GroundPart, Plan, StarPart, decompose
from cbgp.query.sparql import QueryError
from cbgp.windows.spec import WindowSpec
from cbgp.background.service_query import ServiceOptions
from cbgp.background.view_graphs import view_summary
from cbgp.query.limits import limit
from services.wire.records import answer_size_problem
from services.wire.pages import PageError, page, page_params
from services.wire.registrations import (OPERATORS_CLASS, cross_product_of, graphs_read, read_query,
                                         read_registration, read_stream, read_views, stream_iri)

__all__ = ["OPERATORS_CLASS", "QUERY_ID_PATTERN", "VERSION_HEADER", "Decision", "Entry", "Registry", "operator_plan",
           "operator_summary", "plan_summary", "tombstone_version"]

QUERY_ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,128}")
# Header of a queries.plans tombstone: the version of the registration it ends (decimal).
VERSION_HEADER = "cbgp-version"


def tombstone_version(headers: Any) -> int | None:
    """The version a queries.plans tombstone ends, from its VERSION_HEADER (None: not named)."""
    for name, value in headers or ():
        if name == VERSION_HEADER and value:
            try:
                return int(value)
            except ValueError:
                return None
    return None
# Options that steer the registration itself and are not part of the query's stored options.
CONTROL_OPTIONS = ("replace",)
# How many queries a fleet, and one owner, may hold (named settings of the registry).
MAX_QUERIES_SETTING, DEFAULT_MAX_QUERIES = "CBGP_MAX_QUERIES", 20_000
MAX_PER_OWNER_SETTING, DEFAULT_MAX_PER_OWNER = "CBGP_MAX_QUERIES_PER_OWNER", 1_000
# Registrations one owner may make in a minute: each costs every worker a snapshot of its share of the graph.
PER_MINUTE_SETTING, DEFAULT_PER_MINUTE = "CBGP_MAX_QUERIES_PER_MINUTE", 600
# A query whose parts share no variable and have no constant answers with the product of their matches; it is
# registered only when asked for (``cross_product=true``).
CROSS_PRODUCT_OPTION = "cross_product"


@dataclass
class Entry:
    """One registered query, as the registry remembers it (and as the web views show it)."""

    query_id: str
    sparql: str
    query_class: str
    version: int
    options: dict[str, str] = field(default_factory=dict)
    registered_at_seq: int = 0
    owner: str | None = None  # a gateway token's owner name; None: an operator

    def view(self) -> dict[str, Any]:
        """The JSON shape of ``GET /queries`` items."""
        return {"query_id": self.query_id, "sparql": self.sparql, "class": self.query_class,
                "version": self.version, "status": "registered", "options": dict(self.options),
                "registered_at_seq": self.registered_at_seq, "owner": self.owner}


@dataclass
class Decision:
    """What one admin command leads to.

    ``plan`` is ``(key, QueryPlan dict)`` to publish, ``(key, None)`` for a tombstone, or ``None`` for
    nothing; ``status`` is the ``QueryStatus`` dict; ``entry``/``removed`` say how the registered set
    changes once the plan is acknowledged (:meth:`Registry.commit`).
    """

    status: dict[str, Any]
    plan: tuple[str, dict[str, Any] | None] | None = None
    entry: Entry | None = None
    removed: str | None = None


def plan_summary(plan: Plan) -> str:
    """One line: the query class, then each part (``star ?p [t0 t1]``), for ACCEPTED messages."""
    parts = []
    for part in plan.parts:
        pats = " ".join(f"t{i}" for i in part.patterns)
        if isinstance(part, GroundPart):
            parts.append(f"ground [{pats}]")
        elif isinstance(part, StarPart):
            parts.append(f"star {part.variable} [{pats}]")
        elif isinstance(part, ComponentPart):
            parts.append(f"component {{{','.join(part.variables)}}} [{pats}]")
    count = len(plan.query.patterns)
    return f"{plan.query_class}: {count} pattern{'s' if count != 1 else ''} in {len(parts)} part(s): " + "; ".join(parts)


def operator_columns(spec: Any) -> list[str]:
    """The variables of an operator query's answers in the fleet: its projection, ``ask`` for ASK (a boolean
    that flips), ``subject predicate object`` for CONSTRUCT (one row per constructed triple)."""
    return ["ask"] if spec.form == "ASK" else list(spec.columns)


def operator_placement(spec: Any, stream: bool = False) -> str:
    """``by-centre`` when every BGP leaf of the operator query is placed by centre (``cbgp.algebra.by_centre``)
    and it feeds no derived stream, else ``single-owner``."""
    from cbgp.algebra.by_centre import leaf_parts

    return BY_CENTRE if not stream and leaf_parts(spec) is not None else SINGLE_OWNER


def operator_plan(spec: Any, placement: str) -> dict[str, Any]:
    """The ``plan_json`` of an operator query: class, placement (``operator_placement``), form, answer
    variables and the operator tree."""
    from cbgp.algebra import OperatorQuery
    from cbgp.terms import TermDictionary

    tree = OperatorQuery(spec, TermDictionary()).explain().splitlines()
    return {"class": OPERATORS_CLASS, "placement": placement, "form": spec.form,
            "columns": operator_columns(spec), "operators": tree}


_OPERATOR_NAMES = {"Filter": "FILTER", "LeftJoin": "OPTIONAL", "Union": "UNION", "Minus": "MINUS", "Extend": "BIND",
                   "Constant": "VALUES", "Aggregate": "aggregates", "Distinct": "DISTINCT", "TopK": "ORDER BY/LIMIT",
                   "Join": "join", "Ask": "ASK", "Construct": "CONSTRUCT"}


def operator_summary(spec: Any, placement: str, windowed: bool = False) -> str:
    """``operators: SELECT with OPTIONAL, FILTER over 2 BGPs; ...`` (ACCEPTED messages)."""
    from cbgp.algebra import OperatorQuery
    from cbgp.terms import TermDictionary

    query = OperatorQuery(spec, TermDictionary())
    names = []
    for op in query.root.walk():
        name = _OPERATOR_NAMES.get(type(op).__name__)
        if name and name not in names and name != spec.form:  # (the form is said first: not "CONSTRUCT with CONSTRUCT")
            names.append(name)
    count = len(query.leaves) + len(query.pattern_leaves)
    where = ("evaluated over the window's content, the operators after the BGP engine" if windowed else
             "its BGP leaves by centre value on updates.routed, the operators by the answers service over their "
             "deltas in seq order" if placement == BY_CENTRE else
             "evaluated by its single owner on updates.encoded (the total order), the operators after the BGP engine")
    return (f"{OPERATORS_CLASS}: {spec.form}{' with ' + ', '.join(names) if names else ''} over "
            f"{count} BGP{'s' if count != 1 else ''}; {where}")


def window_summary(window: WindowSpec) -> str:
    """``sliding range 60000 ms step 10000 ms, lateness 0 ms, late updates dropped`` (ACCEPTED messages)."""
    shape = f"{window.kind} range {window.range_ms} ms" + \
        (f" step {window.step_ms} ms" if window.kind == "sliding" else "")
    late = "dropped" if window.late_policy == "drop" else "admitted"
    return f"{shape}, lateness {window.lateness_ms} ms, late updates {late} (evaluated by the Spark job)"


def _now_ms() -> int:
    return int(time.time() * 1000)


class Registry:
    """The registered queries and the rules for changing them (validation, versions, replace)."""

    def __init__(self, clock: Callable[[], int] = _now_ms) -> None:
        self.queries: dict[str, Entry] = {}
        # id -> the version of its last unregistered registration: a new registration of the id gets a higher
        # one, so its answers are a new stream.  Rebuilt from the plan before each tombstone.
        self.retired: dict[str, int] = {}
        self.owned: Counter[str] = Counter()  # queries per owner (the per-owner limit, without a scan)
        self.recent: dict[str, deque[int]] = {}  # owner -> when its registrations of the last minute were made (ms)
        self._clock = clock

    def snapshot(self) -> tuple:
        """The registered set as it is, for :meth:`rollback` (a batch whose plans the broker did not take)."""
        return (dict(self.queries), dict(self.retired), Counter(self.owned),
                {owner: deque(times) for owner, times in self.recent.items()})

    def rollback(self, snapshot: tuple) -> None:
        self.queries, self.retired, self.owned, self.recent = snapshot

    def _put(self, entry: Entry) -> None:
        old = self.queries.get(entry.query_id)
        if old is not None and old.owner is not None:
            self.owned[old.owner] -= 1
        if entry.owner is not None:
            self.owned[entry.owner] += 1
        self.queries[entry.query_id] = entry

    # ------------------------------------------------------------------ restore

    def restore(self, records: Iterable[tuple[str, dict[str, Any] | None]]) -> int:
        """Rebuild from ``queries.plans`` records ``(key, QueryPlan or None)`` in log order; return the count.

        The last record per key wins (what compaction would keep); a tombstone removes the key.
        """
        for key, plan in records:
            if plan is None:
                self._retire(key)
                continue
            try:
                query_class = json.loads(plan["plan_json"]).get("class", "?")
            except (ValueError, AttributeError):
                query_class = "?"
            self._put(Entry(key, plan["sparql"], query_class, plan["version"], dict(plan["options"]),
                            plan["registered_at_seq"], plan.get("owner")))
        return len(self.queries)

    # ------------------------------------------------------------------ decisions

    def decide(self, command: dict[str, Any], encoded_end: Callable[[], int],
               change_seq_before: Callable[[int], int] | None = None) -> Decision:
        """The decision for one decoded ``AdminCommand``; ``encoded_end()`` gives the end offset of
        ``updates.encoded`` (only called when a plan is published) and ``change_seq_before(offset)`` the seq of
        the last change below it (``services.wire.registrations.change_seq_before``; None: the plan leaves it to its readers,
        -1).  Does not change the registry: apply the decision with :meth:`commit` once its plan is durable."""
        kind = command.get("command")
        request_id = command.get("request_id")
        if kind == "LIST":
            try:  # a page at a time: options limit and after (services.wire.pages)
                after, limit = page_params(dict(command.get("options") or {}))
            except PageError as exc:
                return Decision(self._status(None, "REJECTED", str(exc), request_id))
            ids, cursor = page(sorted(self.queries), after, limit)
            total = len(self.queries)
            message = f"{total} quer{'y' if total == 1 else 'ies'} registered"
            if cursor is not None or after is not None:
                message += (f"; {len(ids)} listed" + (f" after {after!r}" if after is not None else "")
                            + (f"; the next page: --after {cursor}" if cursor is not None else ""))
            return Decision(self._status(None, "LISTED", message, request_id, queries=ids))
        query_id = command.get("query_id")
        if not isinstance(query_id, str) or not QUERY_ID_PATTERN.fullmatch(query_id):
            shown = "missing" if query_id is None else f"{query_id!r:.140} is invalid"
            return Decision(self._status(query_id, "REJECTED",
                                         f"query id {shown}: use 1 to 128 characters from A-Z a-z 0-9 _ . -",
                                         request_id))
        owner = command.get("owner")
        if kind == "UNREGISTER":
            if query_id not in self.queries:
                return Decision(self._status(query_id, "REJECTED", f"no query with id {query_id!r} is registered",
                                             request_id))
            refused = self._not_owner(self.queries[query_id], owner)
            if refused:
                return Decision(self._status(query_id, "REJECTED", refused, request_id))
            return Decision(self._status(query_id, "UNREGISTERED", f"query {query_id!r} unregistered", request_id),
                            plan=(query_id, None), removed=query_id)
        if kind == "REGISTER":
            return self._register(query_id, command.get("sparql"), dict(command.get("options") or {}), request_id,
                                  encoded_end, change_seq_before, owner)
        return Decision(self._status(query_id, "ERROR", f"unknown command {kind!r}: expected REGISTER, UNREGISTER or LIST",
                                     request_id))

    @staticmethod
    def _not_owner(entry: Entry, owner: str | None) -> str | None:
        """Why ``owner`` may not change ``entry`` (None: it may: an operator, or the query's own owner)."""
        if owner is None or entry.owner == owner:
            return None
        return f"query {entry.query_id!r} belongs to another owner: only its owner or an admin may change it"

    def _count_problem(self, query_id: str, owner: str | None) -> str | None:
        """Why one more query is over the fleet's or the owner's limit (None: it is not)."""
        if query_id in self.queries:
            return None  # a replacement adds nothing
        fleet = limit(MAX_QUERIES_SETTING, DEFAULT_MAX_QUERIES)
        if len(self.queries) >= fleet:
            return f"the fleet holds {len(self.queries):,} queries, its limit ({MAX_QUERIES_SETTING}={fleet:,})"
        mine = limit(MAX_PER_OWNER_SETTING, DEFAULT_MAX_PER_OWNER)
        if owner is not None and self.owned[owner] >= mine:
            return f"{owner!r} holds {mine:,} queries, the limit per owner ({MAX_PER_OWNER_SETTING})"
        return None

    def _rate_problem(self, owner: str | None) -> str | None:
        """Why one more registration by ``owner`` is over its limit per minute (None: it is not; an operator, with
        no owner, has none)."""
        times = self.recent.get(owner) if owner is not None else None
        if not times:
            return None
        now = self._clock()
        while times and times[0] <= now - 60_000:
            times.popleft()
        most = limit(PER_MINUTE_SETTING, DEFAULT_PER_MINUTE)
        if len(times) < most:
            return None
        wait = max(1, -(-(times[0] + 60_000 - now) // 1000))
        return (f"{owner!r} registered {len(times):,} queries in the last minute, the limit per owner "
                f"({PER_MINUTE_SETTING}={most:,}): try again in {wait} s")

    def _register(self, query_id: str, sparql: Any, options: dict[str, str], request_id: str | None,
                  encoded_end: Callable[[], int], change_seq_before: Callable[[int], int] | None,
                  owner: str | None = None) -> Decision:
        if not isinstance(sparql, str) or not sparql.strip():
            return Decision(self._status(query_id, "REJECTED", "REGISTER needs the SPARQL text of the query",
                                         request_id))
        replace = options.get("replace", "").strip().lower() in ("true", "1", "yes")
        stored_options = {k: v for k, v in options.items() if k not in CONTROL_OPTIONS}
        existing = self.queries.get(query_id)
        if existing is not None and existing.sparql == sparql and existing.options == stored_options:
            # Same query again (a retry, or a replayed command after a crash): nothing to publish.
            return Decision(self._status(query_id, "ACCEPTED",
                                         f"{existing.query_class}: already registered (version {existing.version})",
                                         request_id))
        if existing is not None and not replace:
            return Decision(self._status(
                query_id, "REJECTED",
                f"query id {query_id!r} is already registered with a different text or options; "
                "unregister it first or register with --option replace=true", request_id))
        refused = (self._not_owner(existing, owner) if existing is not None else None) or \
            self._count_problem(query_id, owner) or self._rate_problem(owner)
        if refused:
            return Decision(self._status(query_id, "REJECTED", refused, request_id))
        allow_product = stored_options.get(CROSS_PRODUCT_OPTION, "").strip().lower() in ("true", "1", "yes")
        try:
            text, window = read_registration(sparql, stored_options)
            product = None if allow_product else cross_product_of(text)
            if product:
                raise QueryError(f"the query is a cross product of {product}: parts with no shared variable and no "
                                 "constant, so each change can make as many answers as the graph has matches; "
                                 f"register it with --option {CROSS_PRODUCT_OPTION}=true if that is what you want")
            parsed, operators = read_query(text, window)
            plan = decompose(parsed) if parsed is not None else None
            stream, reads = read_stream(stored_options, text, operators, window)
            if stream is not None:
                self._check_stream(query_id, stream, reads, text)
        except QueryError as exc:  # WindowError included
            return Decision(self._status(query_id, "REJECTED", exc.message, request_id, exc.line, exc.column))
        version = max(existing.version if existing is not None else 0, self.retired.get(query_id, 0)) + 1
        seq = encoded_end()
        if plan is None:  # an operator query
            placement = operator_placement(operators, stream is not None)
            plan_json, projected = operator_plan(operators, placement), operator_columns(operators)
            query_class, summary = OPERATORS_CLASS, operator_summary(operators, placement, window is not None)
        else:
            plan_json, projected, query_class = plan.to_json(), list(plan.query.projected), plan.query_class
            summary = plan_summary(plan)
        too_large = answer_size_problem(len(projected))
        if too_large:
            return Decision(self._status(query_id, "REJECTED", too_large, request_id))
        record = {"query_id": query_id, "sparql": sparql, "options": stored_options,
                  "plan_json": json.dumps(plan_json, separators=(",", ":")),
                  "projected": projected, "registered_at_seq": seq, "version": version,
                  "registered_at_change_seq": change_seq_before(seq) if change_seq_before is not None else -1,
                  "owner": owner}
        if stream is not None:
            summary += (f"; derived stream: its triples are inserted into and deleted from graph {stream} on "
                        "updates.raw" + (f" (reads {', '.join(reads)})" if reads else ""))
        views = read_views(sparql, stored_options)
        if views:
            service = ServiceOptions.from_options(stored_options)
            summary += "; " + view_summary(views, service.policy, service.refresh_ms,
                                           window.step_ms if window is not None else None)
        summary += (f"; window {window_summary(window)}" if window else "") + \
            (f" (version {version}, replaced)" if existing is not None else "")
        entry = Entry(query_id, sparql, query_class, version, stored_options, seq, owner)
        return Decision(self._status(query_id, "ACCEPTED", summary, request_id), plan=(query_id, record), entry=entry)

    def _check_stream(self, query_id: str, stream: str, reads: list[str], text: str) -> None:
        """Raise ``QueryError`` if another registered query feeds ``stream`` too, or if the derived streams would
        form a cycle with this one (A feeds <a> and reads <b>, B feeds <b> and reads <a>): each would feed the
        other's input without end.  A registration being replaced is left out."""
        feeds: dict[str, tuple[str, list[str]]] = {}  # graph -> (query feeding it, graphs that query reads)
        for other in self.queries.values():
            if other.query_id == query_id or "stream" not in other.options:
                continue
            try:
                graph = stream_iri(other.options["stream"])
                other_text, _window = read_registration(other.sparql, {k: v for k, v in other.options.items()
                                                                       if not k.startswith("service.")})
            except QueryError:
                continue
            feeds[graph] = (other.query_id, [r.graph for r in graphs_read(other_text) if not r.variable])
        if stream in feeds:
            raise QueryError(f"graph {stream} is already fed by derived stream {feeds[stream][0]!r}: one query per "
                             "stream graph")
        # Which graphs does this stream's output reach?  stream -> queries reading it -> their streams -> ...
        path = {stream: [stream]}
        todo = [stream]
        while todo:
            graph = todo.pop()
            for fed, (other, other_reads) in feeds.items():
                if graph in other_reads and fed not in path:
                    path[fed] = path[graph] + [f"read by {other!r}, which feeds {fed}"]
                    todo.append(fed)
        for read in graphs_read(text):
            if read.graph in path and read.graph != stream:
                chain = ", ".join(path[read.graph])
                raise QueryError(f"a cycle across derived streams: {query_id!r} feeds {chain}, and reads it back "
                                 f"with GRAPH {read.graph}", read.line, read.column)

    def commit(self, decision: Decision) -> None:
        """Apply ``decision`` to the registered set (after its plan record was acknowledged)."""
        if decision.entry is not None:
            self._put(decision.entry)
            if decision.entry.owner is not None:
                self.recent.setdefault(decision.entry.owner, deque()).append(self._clock())
        if decision.removed is not None:
            self._retire(decision.removed)

    def _retire(self, query_id: str) -> None:
        entry = self.queries.pop(query_id, None)
        if entry is not None:
            if entry.owner is not None:
                self.owned[entry.owner] -= 1
            self.retired[query_id] = max(entry.version, self.retired.get(query_id, 0))

    def error(self, message: str, request_id: str | None = None) -> dict[str, Any]:
        """An ERROR status (undecodable admin record, internal failure)."""
        return self._status(None, "ERROR", message, request_id)

    def _status(self, query_id: str | None, status: str, message: str, request_id: str | None,
                line: int | None = None, column: int | None = None, queries: list[str] | None = None) -> dict[str, Any]:
        return {"query_id": query_id, "status": status, "message": message, "line": line, "column": column,
                "request_id": request_id, "at_ms": self._clock(), "queries": queries or []}
