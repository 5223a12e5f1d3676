"""``/query``: one SPARQL query over the current graph, within the gateway's limits.

pyoxigraph evaluates it and cannot be interrupted, so what can be decided before is: the text is measured
(``cbgp.query.limits``), SERVICE reaches allowed endpoints only (``CBGP_SERVICE_ALLOW``, as for registered queries),
a product of unconstrained patterns is refused, and the evaluation runs on its own bounded pool (``--query-workers``
threads, ``--query-queue`` waiting, else 503), so a heavy query never takes the threads /update and registrations
use. While its rows are read, the row cap (``--query-max-rows``) and the deadline (``--query-timeout``) hold; a
request past its deadline is answered at once, and its thread stops at the next row it reads.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from typing import Any

from cbgp.background.view_graphs import endpoint_problem
from cbgp.query.cost import cross_product
from cbgp.query.limits import text_problem
from cbgp.query.sparql import sparql_tokens
from cbgp.terms import from_oxigraph, to_sparql_json

SPARQL_RESULTS_JSON = "application/sparql-results+json"
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


def _term(term: Any) -> dict[str, str]:
    return to_sparql_json(from_oxigraph(term))


def evaluate(gw: Any, text: str, cancel: threading.Event) -> tuple[bytes, str, int]:
    """The query's serialized result, read row by row within the limits (runs on the query pool)."""
    import pyoxigraph as ox

    limits = gw.limits
    result, seq = gw.graph.query(text)
    deadline = time.monotonic() + limits.query_timeout_s
    if isinstance(result, ox.QueryBoolean):
        return json.dumps({"head": {}, "boolean": bool(result)}).encode(), SPARQL_RESULTS_JSON, seq
    rows: list[Any] = []
    for row in result:
        if cancel.is_set() or time.monotonic() > deadline:
            raise QueryRefused(503, f"the query ran past {limits.query_timeout_s:g} s (--query-timeout)")
        rows.append(row)
        if len(rows) > limits.query_max_rows:
            raise QueryRefused(413, f"the result has more than {limits.query_max_rows:,} rows (--query-max-rows); "
                               "add a LIMIT or make the query more selective")
    if isinstance(result, ox.QueryTriples):
        return ox.serialize(rows, format=ox.RdfFormat.N_TRIPLES), "application/n-triples", seq
    variables = [v.value for v in result.variables]
    bindings = [{v: _term(row[v]) for v in variables if row[v] is not None} for row in rows]
    body = {"head": {"vars": variables}, "results": {"bindings": bindings}}
    return json.dumps(body, separators=(",", ":")).encode(), SPARQL_RESULTS_JSON, seq


async def run_query(gw: Any, text: str) -> tuple[bytes, str, int]:
    """``(body, content type, seq)`` of ``text``; :class:`QueryRefused` otherwise (with the status to answer)."""
    check_query(text)
    if not gw.query_slots.acquire(blocking=False):
        raise QueryRefused(503, "every /query worker is busy and the queue is full (--query-workers, --query-queue); "
                           "try again later")
    cancel = threading.Event()

    def work() -> tuple[bytes, str, int]:
        try:
            return evaluate(gw, text, cancel)
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
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise QueryRefused(400, f"{type(exc).__name__}: {message}") from None
