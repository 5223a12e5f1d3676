"""``/query``: one SPARQL query over the current graph, within the gateway's limits.

Before: the text is measured (``cbgp.query.limits``), SERVICE reaches allowed endpoints only (``CBGP_SERVICE_ALLOW``,
as for registered queries), and a product of unconstrained patterns is refused.  Then the evaluation waits for
its bounded pool (``--query-workers`` threads, ``--query-queue`` waiting, else 503), so a heavy query never takes
the threads /update and registrations use, and the row cap (``--query-max-rows``) and the deadline
(``--query-timeout``) hold while its rows are read.

pyoxigraph cannot be interrupted, and a short text can ask it for more than the machine has (``?a :knows+ ?b``
over a friendship graph is quadratic).  So on Linux each evaluation runs in a child process forked with the graph
as of its seq, copy-on-write (``GraphSource.forked``): the child may allocate ``--query-max-memory`` MB above what
it was forked with, is the first the kernel's out-of-memory killer picks, and is killed at the deadline, so neither
the gateway's memory nor its threads go to a query past its limits.  ``--query-max-memory 0`` evaluates in the
pool's thread instead (a request past its deadline is answered at once, and its thread stops at the next row).
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from typing import Any

from cbgp.background.view_graphs import endpoint_problem
from cbgp.query.cost import cross_product
from cbgp.query.limits import text_problem
from cbgp.query.sparql import sparql_tokens, text_error
from cbgp.results import ASK_VARIABLE, RDF_FORMATS, NotAcceptable, Shape, negotiate, serialize
from cbgp.terms import from_oxigraph, to_sparql_json
from services.state.forked import CAN_BOUND, OverMemory, OverTime, in_bounded_child

_TRUE = {"type": "literal", "value": "true", "datatype": "http://www.w3.org/2001/XMLSchema#boolean"}
CROSS_PRODUCTS_SETTING = "CBGP_ALLOW_QUERY_CROSS_PRODUCTS"


class QueryRefused(Exception):
    """A /query the gateway will not run or could not finish: the HTTP status and one line."""

    def __init__(self, status: int, message: str, line: int | None = None, column: int | None = None) -> None:
        super().__init__(message)
        self.status, self.line, self.column = status, line, column


def check_query(text: str) -> None:
    """Raise :class:`QueryRefused` for a text /query does not evaluate (see the module doc)."""
    problem = text_problem(text, "query")
    if problem is not None:
        raise QueryRefused(400, problem.message, problem.line, problem.column)
    tokens = sparql_tokens(text)
    for i, (kind, value, _offset) in enumerate(tokens):
        if kind == "word" and value.upper() == "SERVICE":
            rest = [t for t in tokens[i + 1:] if t[0] != "comment"]
            if rest and rest[0][0] == "word" and rest[0][1].upper() == "SILENT":
                rest = rest[1:]
            endpoint = rest[0][1][1:-1] if rest and rest[0][1].startswith("<") else ""
            why = endpoint_problem(endpoint) if endpoint else "SERVICE with a variable endpoint is not run by /query"
            if why:
                raise QueryRefused(403, why)
    if os.environ.get(CROSS_PRODUCTS_SETTING, "") not in ("1", "true"):
        try:
            from rdflib.plugins.sparql import prepareQuery

            product = cross_product(prepareQuery(text).algebra)
        except Exception:  # noqa: BLE001 - rdflib reads less than pyoxigraph: pyoxigraph decides those
            product = None
        if product:
            raise QueryRefused(400, f"the query is a cross product of {product} (no shared variable, no constant): "
                               f"refused unless {CROSS_PRODUCTS_SETTING}=1")


def evaluate(gw: Any, text: str, cancel: threading.Event, accept: str | None = None,
             fmt: str | None = None) -> tuple[bytes, str, int]:
    """``(body, media type, seq)``: the query's result, read row by row within the limits and written in the
    format negotiated for its form (runs on the query pool)."""
    if gw.limits.query_max_memory_mb > 0 and CAN_BOUND:  # (elsewhere in the pool's thread)
        return _in_a_child(gw, text, accept, fmt)
    result, seq = gw.graph.query(text)
    return _written(result, seq, gw.limits, cancel, accept, fmt)


def _in_a_child(gw: Any, text: str, accept: str | None, fmt: str | None) -> tuple[bytes, str, int]:
    limits = gw.limits

    def child(store: Any, seq: int) -> tuple:
        try:
            result = store.query(text, use_default_graph_as_union=False)
            return ("ok", *_written(result, seq, limits, threading.Event(), accept, fmt))
        except (QueryRefused, SyntaxError, ValueError, TypeError, OSError) as exc:
            refused = exc if isinstance(exc, QueryRefused) else _refusal(text, exc)
            return ("refused", refused.status, str(refused), refused.line, refused.column)

    try:
        outcome = in_bounded_child(gw.graph.forked, child, seconds=limits.query_timeout_s,
                                   megabytes=limits.query_max_memory_mb)
    except OverTime:
        raise QueryRefused(503, f"the query ran past {limits.query_timeout_s:g} s (--query-timeout)") from None
    except OverMemory:
        raise QueryRefused(413, f"the query needed more than {limits.query_max_memory_mb:,} MB "
                           "(--query-max-memory); make it more selective") from None
    except RuntimeError as exc:
        raise QueryRefused(500, f"the query failed: {str(exc)[:200]}") from None
    if outcome[0] == "ok":
        return outcome[1], outcome[2], outcome[3]
    raise QueryRefused(outcome[1], outcome[2], outcome[3], outcome[4])


def _written(result: Any, seq: int, limits: Any, cancel: threading.Event, accept: str | None,
             fmt: str | None) -> tuple[bytes, str, int]:
    import pyoxigraph as ox

    form = "ASK" if isinstance(result, ox.QueryBoolean) else "CONSTRUCT" if isinstance(result, ox.QueryTriples) \
        else "SELECT"
    try:
        media = negotiate(form, accept, fmt)
    except NotAcceptable as exc:
        raise QueryRefused(406, str(exc)) from None
    if form == "ASK":
        return serialize(Shape("ASK", ()), [{ASK_VARIABLE: _TRUE}] if result else [], media), media, seq
    deadline = time.monotonic() + limits.query_timeout_s
    rows: list[Any] = []
    for row in result:
        if cancel.is_set() or time.monotonic() > deadline:
            raise QueryRefused(503, f"the query ran past {limits.query_timeout_s:g} s (--query-timeout)")
        rows.append(row)
        if len(rows) > limits.query_max_rows:
            raise QueryRefused(413, f"the result has more than {limits.query_max_rows:,} rows (--query-max-rows); "
                               "add a LIMIT or make the query more selective")
    if form == "CONSTRUCT":
        return ox.serialize(rows, format=RDF_FORMATS[media]), media, seq
    variables = [v.value for v in result.variables]
    bindings = [{v: to_sparql_json(from_oxigraph(row[v])) for v in variables if row[v] is not None} for row in rows]
    # (in pyoxigraph's order: ORDER BY is already applied)
    return serialize(Shape("SELECT", tuple(variables), keep_order=True), bindings, media), media, seq


async def run_query(gw: Any, text: str, accept: str | None = None, fmt: str | None = None) -> tuple[bytes, str, int]:
    """``(body, media type, seq)`` of ``text``; :class:`QueryRefused` otherwise (with the status to answer)."""
    check_query(text)
    if not gw.query_slots.acquire(blocking=False):
        raise QueryRefused(503, "every /query worker is busy and the queue is full (--query-workers, --query-queue); "
                           "try again later")
    cancel = threading.Event()

    def work() -> tuple[bytes, str, int]:
        try:
            return evaluate(gw, text, cancel, accept, fmt)
        finally:
            gw.query_slots.release()  # when the thread is done, not when the request gave up

    future = asyncio.get_running_loop().run_in_executor(gw.query_pool, work)
    try:
        return await asyncio.wait_for(asyncio.shield(future), gw.limits.query_timeout_s)
    except asyncio.TimeoutError:
        cancel.set()
        raise QueryRefused(503, f"the query ran past {gw.limits.query_timeout_s:g} s (--query-timeout)") from None
    except QueryRefused:
        raise
    except (SyntaxError, ValueError, TypeError, OSError) as exc:
        raise _refusal(text, exc) from None


def _refusal(text: str, exc: Exception) -> QueryRefused:
    """What pyoxigraph raised for ``text``, as the 400 to answer."""
    if isinstance(exc, SyntaxError):
        return _syntax_refusal(text, str(exc))
    message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return QueryRefused(400, f"{type(exc).__name__}: {message[:200]}")


def _syntax_refusal(text: str, error: str) -> QueryRefused:
    """One line, as the CLI says it: the cause the text shows, else pyoxigraph's position and what it expected
    (unless that is a list of character ranges)."""
    cause = text_error(text)
    if cause is not None:
        return QueryRefused(400, cause.message, cause.line, cause.column)
    found = re.match(r"error at (\d+):(\d+): (.*)", " ".join(error.split()))
    if found is None:
        return QueryRefused(400, f"SPARQL syntax error: {' '.join(error.split())[:200]}")
    line, column, expected = int(found.group(1)), int(found.group(2)), found.group(3)
    return QueryRefused(400, "SPARQL syntax error: " + (expected if len(expected) <= 80 else "unexpected text"),
                        line, column)
