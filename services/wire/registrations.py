"""What a registered query's text and options mean, in one place for the registry, workers and Spark job.

A query's window comes either from RSP-QL clauses in its text (``FROM NAMED WINDOW ... [RANGE ...]`` and
``WINDOW :w { ... }``) or from register options (``window=sliding range=PT60S step=PT10S``); the options
``lateness`` and ``late`` tune either (``cbgp.windows.windowed.window_from_options``).  ``replace=true`` steers the
registration itself (the registry does not store it).  ``stream=<iri>`` makes a CONSTRUCT query a derived stream
(C-SPARQL's ``REGISTER STREAM ... AS CONSTRUCT``): its triple deltas are published on updates.raw
as changes of named graph ``<iri>`` (:func:`read_stream` checks it).  Any other option key is an error: a misspelt
``windw=sliding`` must not register a query without a window.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from cbgp.change import Change
from cbgp.engine.assembly import needs_assembly
from cbgp.query.plan import BY_CENTRE, SINGLE_OWNER, decompose
from cbgp.query.sparql import ParsedQuery, QueryError, parse_query
from cbgp.windows.spec import WindowError, WindowSpec
from cbgp.windows.rspql import parse_rspql
from cbgp.windows.spec import window_from_options

__all__ = ["OPERATORS_CLASS", "QUERY_OPTIONS", "REGISTER_OPTIONS", "GraphRead", "check_option_keys", "graphs_read",
           "multiplied_in_spark", "spark_multiplies", "read_query", "read_registration", "read_stream", "read_views",
           "recorded_class", "recorded_placement", "stream_iri"]

QUERY_OPTIONS = ("window", "range", "step", "lateness", "late", "stream", "cross_product")  # stored with the plan
REGISTER_OPTIONS = (*QUERY_OPTIONS, "replace")  # what `cbgp register --option` accepts
SERVICE_OPTION = "service."  # service.policy, service.refresh_ms, ...: cbgp.background.service_query.ServiceOptions


def check_option_keys(keys: object, known: tuple[str, ...] = REGISTER_OPTIONS) -> None:
    """Raise ``WindowError`` (a ``QueryError``) naming the first key not in ``known``, and the known ones."""
    for key in keys:  # type: ignore[attr-defined]
        if key not in known:
            close = difflib.get_close_matches(str(key), REGISTER_OPTIONS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise WindowError(f"unknown option {key!r}{hint}: the options are {', '.join(REGISTER_OPTIONS)}")


def change_seq_before(changes_in: Callable[[int, int], Iterable[Change]], end: int, log_start: int = 0) -> int:
    """The seq of the last change in updates.encoded below offset ``end`` (0 when none): what a registration made
    when the log ended there answers as of.  ``changes_in(start, end)`` gives the changes of the records in
    ``[start, end)``; the last record usually has one, so it is read alone first, then ever longer stretches
    before it (transaction markers and refresh-only records hold none), never below ``log_start`` (the floor
    keeps the record of the last change, ``cbgp topics floor``).  The registry writes it into the plan
    (``registered_at_change_seq``); workers read it for plans written before that field."""
    seq, chunk = 0, 1
    while end > log_start and not seq:
        start = max(log_start, end - chunk)
        seq = max((change.seq for change in changes_in(start, end)), default=0)
        end, chunk = start, min(chunk * 8, 512)
    return seq


def multiplied_in_spark(parsed: ParsedQuery | None, window: WindowSpec | None, placement: str) -> bool:
    """Whether workers that assemble in Spark (``--assembly spark``) send this query's parts to the Spark job to
    multiply: a product (several parts, no GRAPH ?g variable) without a window or operators (``parsed`` None),
    placed (``placement``: the record's, or the query's own decomposition's) on a single owner.  The workers and
    the Spark job's gate both decide by this."""
    return parsed is not None and window is None and placement != BY_CENTRE and needs_assembly(parsed)


def spark_multiplies(text: str, window: WindowSpec | None, recorded: str | None, fleet_single_owner: bool) -> bool:
    """:func:`multiplied_in_spark` of a registration's plain ``text``, placed as the workers place it: on a single
    owner in a fleet whose workers run so, else as its plan records (``recorded``) or its own decomposition.
    Raises ``QueryError`` for a text out of scope (the workers dead-letter it).  A query recorded by centre in a
    fleet that places so is not parsed: the answers service multiplies its products (the first parse in a process
    takes a third of a second, which the trimmer's first pass after a registration paid)."""
    if window is not None or (recorded == BY_CENTRE and not fleet_single_owner):
        return False
    parsed, _operators = read_query(text, None)
    if parsed is None:
        return False
    placement = SINGLE_OWNER if fleet_single_owner else recorded or decompose(parsed).placement
    return multiplied_in_spark(parsed, None, placement)


# The class of a query beyond a BGP: its operators run above its BGP leaves, which are placed by
# centre value like any BGP (the operators then run where the answers service releases the leaves' deltas),
# unless a leaf has a variable predicate or the query feeds a derived stream (one owner evaluates it whole).
OPERATORS_CLASS = "operators"


def recorded_class(plan_json: str) -> str | None:
    """The query class a QueryPlan's ``plan_json`` names (``operators``, or a BGP's class as ``cbgp.query.plan``
    names it); None when it names none or is not a JSON object with a string there."""
    try:
        plan = json.loads(plan_json or "{}")
    except ValueError:
        return None
    found = plan.get("class") if isinstance(plan, dict) else None
    return found if isinstance(found, str) else None


def recorded_placement(plan_json: str) -> str | None:
    """Where the registry placed a query: ``placement`` in a QueryPlan's ``plan_json`` (``by-centre`` or
    ``single-owner``; None when the record has none, as an older registry's).  Raises ValueError for a
    ``plan_json`` that is not a JSON object or names another placement."""
    plan = json.loads(plan_json or "{}")
    if not isinstance(plan, dict):
        raise ValueError(f"plan_json is not a JSON object: {plan_json[:80]!r}")
    placement = plan.get("placement")
    if placement not in (None, BY_CENTRE, SINGLE_OWNER):
        raise ValueError(f"plan_json names placement {placement!r}, neither {BY_CENTRE} nor {SINGLE_OWNER}")
    return placement


def read_registration(sparql: str, options: Mapping[str, str], *,
                      check_endpoints: bool = True) -> tuple[str, WindowSpec | None]:
    """``(plain SPARQL, window or None)`` of a registration; raises ``cbgp.windows.windowed.WindowError`` with a
    message that says what is wrong (an unknown option key included; the plain text's own errors come
    when it is parsed).  ``check_endpoints=False``: a reader that calls no endpoint and must read every accepted
    plan whatever its own ``CBGP_SERVICE_ALLOW`` (the floor, the answers service) skips the endpoint check.

    A ``SERVICE <e> { P }`` comes back as ``GRAPH <view> { P }`` (``cbgp.background.view_graphs``): the background
    service keeps that graph equal to P's matches at the endpoint, so every service evaluates the same query."""
    service_options = {k: v for k, v in options.items() if k.startswith(SERVICE_OPTION)}
    check_option_keys(k for k in options if not k.startswith(SERVICE_OPTION))
    plain, spec = parse_rspql(sparql)
    window = window_from_options({k: v for k, v in options.items() if not k.startswith(SERVICE_OPTION)}, base=spec)
    return _with_views(plain, service_options, window, check_endpoints), window


def _with_views(text: str, service_options: Mapping[str, str], window: WindowSpec | None,
                check_endpoints: bool = True) -> str:
    from cbgp.background.service_query import ServiceOptions
    from cbgp.background.service_clause import ServiceError
    from cbgp.background.view_graphs import rewrite_services

    try:
        rewritten, views = rewrite_services(text, check_endpoints)
        ServiceOptions.from_options(service_options)
    except ServiceError as exc:
        raise QueryError(f"SERVICE: {exc}") from None
    if service_options and not views:
        raise QueryError("service.* options need a SERVICE clause")
    if views and window is not None and window.kind == "event":
        raise QueryError("SERVICE is not supported in a per-event window (an event is a set of triples); use a "
                         "time window: its view graph is background data, not windowed (cbgp.windows.windowed)")
    return rewritten


def cross_product_of(text: str) -> str | None:
    """The unconstrained parts a registration's plain text multiplies (``cbgp.query.cost``), or None."""
    from rdflib.plugins.sparql import prepareQuery

    from cbgp.query.cost import bgp_cross_product, cross_product

    try:
        bgp = parse_query(text)
    except QueryError:
        bgp = None  # not a plain BGP: rdflib's algebra below
    if bgp is not None and len({t.g for t in bgp.patterns}) == 1:  # one BGP (in one graph): as the algebra's
        return bgp_cross_product((t.s, t.p, t.o) for t in bgp.patterns)
    try:
        return cross_product(prepareQuery(text).algebra)
    except QueryError:
        raise
    except Exception:  # noqa: BLE001 - the readers below give the syntax error, with its place
        return None


def read_views(sparql: str, options: Mapping[str, str]) -> tuple[object, ...]:
    """The SERVICE views (``cbgp.background.view_graphs.ServiceView``) of a registration, for the background service."""
    from cbgp.background.view_graphs import rewrite_services

    read_registration(sparql, options)  # the same checks as every other reader
    return rewrite_services(parse_rspql(sparql)[0])[1]


def read_query(text: str, window: WindowSpec | None) -> tuple[ParsedQuery | None, object | None]:
    """``(BGP query, None)`` or ``(None, operator query spec)`` of a registration's plain text.

    A BGP ``SELECT`` keeps its parsed form (decomposed and placed as always); any other query the operator
    algebra supports (``cbgp.algebra.analyse``: FILTER, OPTIONAL, UNION, aggregates, ASK, CONSTRUCT, ...) is
    returned as an ``OperatorQuerySpec`` (over a window: evaluated by the Spark job, ``cbgp.windows.windowed``).  Raises
    ``QueryError`` naming the construct, line and column of what is out of scope."""
    try:
        return parse_query(text), None
    except QueryError as error:
        original = error
    from cbgp.algebra import analyse

    try:
        spec = analyse(text)
    except QueryError as error:
        if error.message.startswith("SERVICE") or original.message.startswith("SERVICE"):
            raise original from None
        raise
    if isinstance(spec, ParsedQuery):  # (analyse agrees with parse_query; kept for safety)
        return spec, None
    if window is not None:  # the Spark job evaluates it (cbgp.windows.windowed): checked here as it will build it
        from cbgp.windows.windowed import WindowedQuery

        WindowedQuery(text, window)  # raises WindowError (a QueryError) for what a per-event window cannot run
    return None, spec



# -- derived streams -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GraphRead:
    """One ``GRAPH x { ... }`` of a query's text: ``graph`` is the IRI in N-Triples form (``<...>``) or the
    variable (``?g``); ``line``/``column`` where the keyword is."""

    graph: str
    line: int
    column: int

    @property
    def variable(self) -> bool:
        return self.graph[:1] in "?$"


_IRI_RE = re.compile(r'[^<>"{}|^`\\\s]+')


def stream_iri(value: str) -> str:
    """The named graph of a ``stream=`` option in N-Triples form: ``<http://ex.org/s>`` or
    ``http://ex.org/s`` -> ``<http://ex.org/s>``; raises ``QueryError`` if it is not an absolute IRI."""
    text = value.strip()
    inner = text[1:-1] if text.startswith("<") and text.endswith(">") else text
    if not _IRI_RE.fullmatch(inner) or not re.match(r"[A-Za-z][A-Za-z0-9+.\-]*:", inner):
        raise QueryError(f"option stream={value!r}: expected an absolute IRI, e.g. stream=<http://example.org/derived>")
    return f"<{inner}>"


def graphs_read(text: str) -> list[GraphRead]:
    """Every ``GRAPH x`` of a query's text, in source order, prefixed names expanded with its ``PREFIX``
    declarations (a pattern outside ``GRAPH`` reads the default graph, never a named one)."""
    from cbgp.query.sparql import line_col, sparql_tokens

    tokens = [t for t in sparql_tokens(text) if t[0] != "comment"]
    prefixes: dict[str, str] = {}
    base = ""
    out: list[GraphRead] = []
    for i, (kind, value, offset) in enumerate(tokens):
        if kind != "word":
            continue
        upper = value.upper()
        if upper == "PREFIX" and i + 2 < len(tokens) and tokens[i + 2][0] == "iri":
            prefixes[tokens[i + 1][1].split(":", 1)[0]] = tokens[i + 2][1][1:-1]
        elif upper == "BASE" and i + 1 < len(tokens) and tokens[i + 1][0] == "iri":
            base = tokens[i + 1][1][1:-1]
        elif upper == "GRAPH" and i + 1 < len(tokens):
            n_kind, n_value, _ = tokens[i + 1]
            if n_kind == "var":
                graph = "?" + n_value[1:]
            elif n_kind == "iri":
                from urllib.parse import urljoin

                graph = f"<{urljoin(base, n_value[1:-1]) if base else n_value[1:-1]}>"
            elif n_kind == "word" and ":" in n_value:
                prefix, local = n_value.split(":", 1)
                graph = f"<{prefixes.get(prefix, prefix + ':')}{local}>"
            else:
                continue
            out.append(GraphRead(graph, *line_col(text, offset)))
    return out


def read_stream(options: Mapping[str, str], text: str, operators: object | None,
                window: WindowSpec | None = None) -> tuple[str | None, list[str]]:
    """``(named graph fed, named graphs read)`` of a registration: ``(None, [])`` without ``stream=``.

    Raises ``QueryError`` when the option is given to anything but a CONSTRUCT query, names no absolute IRI, or
    the query reads its own graph or uses ``GRAPH ?g`` (which could): its output would feed itself.  Cycles
    across several derived streams need the other registrations (``services.registry.core``)."""
    value = options.get("stream")
    if value is None:
        return None, []
    form = getattr(operators, "form", "SELECT")
    if form != "CONSTRUCT":
        from cbgp.query.sparql import find_keyword

        line, column = find_keyword(text, form)
        raise QueryError(f"option stream= is only for CONSTRUCT queries (a derived stream of triples), not {form}",
                         line, column)
    graph = stream_iri(value)
    if window is not None:
        raise QueryError(f"a windowed query cannot feed a derived stream (stream={graph}): its triples would leave "
                         "the graph as they leave the window; register the CONSTRUCT without a window")
    reads: list[str] = []
    for read in graphs_read(text):
        if read.variable:
            raise QueryError(f"a derived stream (stream={graph}) cannot read GRAPH {read.graph}: it ranges over every "
                             f"named graph, its own output included; name the graphs it reads", read.line, read.column)
        if read.graph == graph:
            raise QueryError(f"a derived stream cannot read its own graph: GRAPH {graph} is what stream={graph} "
                             "feeds (its output would feed itself)", read.line, read.column)
        if read.graph not in reads:
            reads.append(read.graph)
    return graph, reads