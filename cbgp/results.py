"""A query's current answers in the SPARQL 1.1 result formats, chosen by content negotiation.

The query's form decides what its answers are: SELECT rows (JSON, XML, CSV, TSV), an ASK boolean (JSON, XML, CSV,
TSV), CONSTRUCT triples (Turtle, N-Triples, JSON-LD, RDF/XML). pyoxigraph writes every format. ORDER BY is applied
as SPARQL orders terms; rows the conditions cannot tell apart keep the order of their terms, as the engine breaks ties.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Iterable

import pyoxigraph as ox
from rdflib import BNode, Literal, URIRef, Variable
from rdflib.plugins.sparql.evalutils import _eval
from rdflib.plugins.sparql.sparql import FrozenBindings, QueryContext, SPARQLError

from cbgp.algebra.expressions import Descending, order_key, to_rdflib
from cbgp.terms import TermError, from_rdflib, from_sparql_json, to_oxigraph

JSON = "application/sparql-results+json"
XML = "application/sparql-results+xml"
CSV = "text/csv"
TSV = "text/tab-separated-values"
TURTLE = "text/turtle"
NTRIPLES = "application/n-triples"
JSONLD = "application/ld+json"
RDFXML = "application/rdf+xml"

#: media types each form can be written in, the default first
MEDIA = {"SELECT": (JSON, XML, CSV, TSV), "ASK": (JSON, XML, CSV, TSV), "CONSTRUCT": (TURTLE, NTRIPLES, JSONLD, RDFXML)}
#: ``?format=`` / ``--format`` names
FORMATS = {"json": JSON, "xml": XML, "csv": CSV, "tsv": TSV, "turtle": TURTLE, "ttl": TURTLE, "ntriples": NTRIPLES,
           "nt": NTRIPLES, "jsonld": JSONLD, "json-ld": JSONLD, "rdfxml": RDFXML}
#: what clients commonly ask for, and the type it means here
ALIASES = {"application/json": JSON, "application/xml": XML, "text/xml": XML, "text/plain": NTRIPLES,
           "application/x-turtle": TURTLE, "text/n3": TURTLE}
#: the variable an ASK query's current answer binds (``true``/``false``)
ASK_VARIABLE = "ask"


class NotAcceptable(ValueError):
    """No format the client accepts fits the query's form (HTTP 406)."""


@dataclass(frozen=True)
class Shape:
    """What a registered query's answers are: its form, its columns and the ORDER BY conditions that can be
    evaluated on them (``unordered`` names the conditions that read a variable the query does not project)."""

    form: str
    variables: tuple[str, ...]
    conditions: tuple = ()
    prologue: Any = None
    unordered: tuple[str, ...] = field(default=())
    keep_order: bool = False  # rows come already ordered (a one-off query's result)


@functools.lru_cache(maxsize=1024)
def shape_of(sparql: str, projected: tuple[str, ...]) -> Shape:
    """The :class:`Shape` of a registered query (the registry accepted its text; read again with rdflib)."""
    from rdflib.plugins.sparql import prepareQuery

    try:
        query = prepareQuery(sparql)
    except Exception:  # noqa: BLE001 - a text the registry took but rdflib does not read: plain rows, unordered
        return Shape("SELECT", projected)
    form = {"AskQuery": "ASK", "ConstructQuery": "CONSTRUCT"}.get(query.algebra.name, "SELECT")
    node, conditions, unordered = query.algebra.p, [], []
    while node is not None and getattr(node, "name", None) in ("Slice", "Project", "Distinct", "Reduced", "ToMultiSet"):
        node = node.get("p")
    if form == "SELECT" and getattr(node, "name", None) == "OrderBy":
        for condition in node["expr"]:
            expr, descending = (condition["expr"], condition.get("order") == "DESC") \
                if getattr(condition, "name", None) == "OrderCondition" else (condition, False)
            needs = {str(v) for v in getattr(expr, "_vars", ())} or ({str(expr)} if _is_variable(expr) else set())
            if needs <= set(projected):
                conditions.append((expr, descending))
            else:
                unordered.append(", ".join(sorted(needs - set(projected))))
    return Shape(form, projected, tuple(conditions), query.prologue, tuple(unordered))


def _is_variable(expr: Any) -> bool:
    return isinstance(expr, Variable)


def negotiate(form: str, accept: str | None = None, fmt: str | None = None) -> str:
    """The media type to answer with: ``fmt`` (a :data:`FORMATS` name) if given, else the best of ``accept``
    (q-values honoured, wildcards allowed) that ``form`` can be written in; :class:`NotAcceptable` if none."""
    offered = MEDIA[form]
    if fmt:
        wanted = FORMATS.get(fmt.lower())
        if wanted is None or wanted not in offered:
            names = ", ".join(n for n, t in FORMATS.items() if t in offered)
            raise NotAcceptable(f"format {fmt!r} does not fit a {form} query; use one of: {names}")
        return wanted
    if not accept or not accept.strip():
        return offered[0]
    ranges = []
    for position, item in enumerate(accept.split(",")):
        media, *params = [p.strip() for p in item.split(";")]
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        media = ALIASES.get(media.lower(), media.lower())
        ranges.append((-quality, media.count("*"), position, media))
    for negative_quality, _wild, _position, media in sorted(ranges):
        if negative_quality >= 0:
            break
        if media == "*/*":
            return offered[0]
        for candidate in offered:
            if media == candidate or (media.endswith("/*") and candidate.startswith(media[:-1])):
                return candidate
    raise NotAcceptable(f"none of the accepted types ({accept}) fits a {form} query; it can answer "
                        + ", ".join(offered))


def ordered(shape: Shape, bindings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``bindings`` (SPARQL JSON) in the query's ORDER BY order, ties broken by the terms."""
    if shape.keep_order:
        return bindings
    terms = [{v: from_sparql_json(t) for v, t in b.items()} for b in bindings]
    tail = [tuple(row.get(v, "") for v in shape.variables) for row in terms]
    if not shape.conditions:
        return [b for _t, b in sorted(zip(tail, bindings), key=lambda pair: pair[0])]
    keys = [_sort_key(shape, row) + (t,) for row, t in zip(terms, tail)]
    return [b for _k, b in sorted(zip(keys, bindings), key=lambda pair: pair[0])]


def _sort_key(shape: Shape, row: dict[str, str]) -> tuple:
    ctx = QueryContext(initBindings={})
    if shape.prologue is not None:
        ctx.prologue = shape.prologue
    bindings = FrozenBindings(ctx, {Variable(v): to_rdflib(t) for v, t in row.items()})
    parts = []
    for expr, descending in shape.conditions:
        try:
            value = _eval(expr, bindings)
        except (SPARQLError, TypeError, ValueError, ZeroDivisionError):
            value = None
        key = order_key(from_rdflib(value)) if isinstance(value, (URIRef, BNode, Literal)) else (0,)
        parts.append(Descending(key) if descending else key)
    return tuple(parts)


def boolean_of(bindings: Iterable[dict[str, Any]]) -> bool:
    """An ASK query's current answer: its one row binds ``ask`` to ``true`` or ``false`` (none yet: false)."""
    return any(b.get(ASK_VARIABLE, {}).get("value") in ("true", "1") for b in bindings)


def serialize(shape: Shape, bindings: list[dict[str, Any]], media: str) -> bytes:
    """The current answers (SPARQL JSON bindings, repeated by multiplicity) written as ``media``."""
    if shape.form == "CONSTRUCT":
        triples = set()
        for b in bindings:
            try:
                triples.add(ox.Triple(*(to_oxigraph(from_sparql_json(b[v])) for v in ("subject", "predicate",
                                                                                         "object"))))
            except (KeyError, TermError, TypeError, ValueError):
                continue  # (never written by the fleet: a CONSTRUCT answer binds all three to a valid triple)
        return ox.serialize(sorted(triples, key=str), format=RDF_FORMATS[media])
    if shape.form == "ASK":
        body = json.dumps({"head": {}, "boolean": boolean_of(bindings)})
    else:
        body = json.dumps({"head": {"vars": list(shape.variables)}, "results": {"bindings": ordered(shape, bindings)}},
                          separators=(",", ":"), ensure_ascii=False)
    if media == JSON:
        return body.encode()
    return ox.parse_query_results(body, format=ox.QueryResultsFormat.JSON).serialize(format=_RESULTS[media])


_RESULTS = {XML: ox.QueryResultsFormat.XML, CSV: ox.QueryResultsFormat.CSV, TSV: ox.QueryResultsFormat.TSV}
RDF_FORMATS = {TURTLE: ox.RdfFormat.TURTLE, NTRIPLES: ox.RdfFormat.N_TRIPLES, JSONLD: ox.RdfFormat.JSON_LD,
        RDFXML: ox.RdfFormat.RDF_XML}


def content_type(media: str) -> str:
    """The Content-Type header for ``media`` (text types say their charset)."""
    return media + "; charset=utf-8" if media.startswith("text/") or media in (JSON, JSONLD) else media
