"""A Python client of the gateway, for programs and notebooks: register queries, read current answers as RDF terms
(pyoxigraph's, or rdflib's) or a pandas DataFrame, and follow a query's deltas as an iterator of typed rows.

Plain HTTP (the standard library): answers are parsed by pyoxigraph, the deltas come from the gateway's server-sent
events and resume by answer number after a dropped connection, so nothing is lost or repeated.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Iterator

import pyoxigraph as ox

from cbgp.algebra.expressions import to_rdflib
from cbgp.terms import from_oxigraph, from_sparql_json, to_oxigraph
from services.kafka.run_env import load_run_env

__all__ = ["Delta", "GatewayClient", "GatewayError"]


class GatewayError(Exception):
    """The gateway refused a request: its HTTP status and the one line it gave (RFC 9457 ``detail``)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status, self.detail = status, detail


@dataclass(frozen=True)
class Delta:
    """One numbered answer of a query: ``+1`` (appears) or ``-1`` (disappears), its row, the change's seq."""

    n: int
    diff: int
    row: dict[str, Any]
    seq: int
    version: int
    snapshot: bool


class GatewayClient:
    """The gateway at ``url`` with bearer ``token``; by default those ``make run`` wrote (``CBGP_GATEWAY_URL``,
    ``CBGP_GATEWAY_TOKEN``, from the environment or ``.run/cbgp.env``).  ``terms="rdflib"`` gives rdflib terms."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 terms: str = "pyoxigraph") -> None:
        env = dict(os.environ)
        load_run_env(env)
        self.url = (url or env.get("CBGP_GATEWAY_URL") or "http://127.0.0.1:8080").rstrip("/")
        self.token = token if token is not None else env.get("CBGP_GATEWAY_TOKEN")
        self.timeout = timeout
        if terms not in ("pyoxigraph", "rdflib"):
            raise ValueError("terms is 'pyoxigraph' or 'rdflib'")
        self.terms = terms

    # ------------------------------------------------------------------ queries

    def register(self, query_id: str, sparql: str, **options: str) -> dict[str, Any]:
        """Register (or replace) a continuous query; the registry's reply once the gateway has its plan."""
        return json.loads(self._request("POST", "/queries", {"id": query_id, "sparql": sparql, "options": options}))

    def unregister(self, query_id: str) -> None:
        self._request("DELETE", f"/queries/{_quote(query_id)}")

    def queries(self) -> list[dict[str, Any]]:
        """Every registered query (the gateway lists them a page at a time: this follows ``next``)."""
        out: list[dict[str, Any]] = []
        path: str | None = "/queries"
        while path is not None:
            body = json.loads(self._request("GET", path))
            out += body["queries"]
            path = body.get("next")
        return out

    def current(self, query_id: str) -> list[dict[str, Any]] | bool | list[ox.Triple]:
        """The current answers: rows of terms (in ORDER BY order), a boolean (ASK) or triples (CONSTRUCT)."""
        return self._results(self._request("GET", f"/queries/{_quote(query_id)}/current",
                                           accept="application/sparql-results+json, application/n-triples"))

    def current_frame(self, query_id: str) -> Any:
        """The current answers as a pandas DataFrame: a column per variable, each cell the term's N-Triples
        text (None where unbound)."""
        import pandas as pd

        rows = self.current(query_id)
        if not isinstance(rows, list) or (rows and not isinstance(rows[0], dict)):
            raise TypeError(f"{query_id} is not a SELECT query: current() gives its boolean or triples")
        columns = self._columns(query_id)
        return pd.DataFrame([{c: None if row.get(c) is None else _text(row[c]) for c in columns} for row in rows],
                            columns=columns)

    def query(self, sparql: str) -> list[dict[str, Any]] | bool | list[ox.Triple]:
        """A one-off SPARQL query over the current graph (``/query``), typed as :meth:`current`."""
        return self._results(self._request("POST", "/query", sparql.encode(), content_type="application/sparql-query",
                                           accept="application/sparql-results+json, application/n-triples"))

    def update(self, request: str) -> int:
        """Publish a SPARQL Update request; the bytes published (ingest applies it asynchronously)."""
        body = self._request("POST", "/update", request.encode(), content_type="application/sparql-update")
        return json.loads(body)["published_bytes"]

    # ------------------------------------------------------------------ deltas

    def deltas(self, query_id: str, start: int = 1, *, live: bool = True, retries: int = 5) -> Iterator[Delta]:
        """The query's answers from number ``start``, as they come (``live=False``: those read so far).  A dropped
        connection is resumed after the last answer given (``Last-Event-ID``); ends when the query is
        registered again."""
        after, failures = start - 1, 0
        while True:
            try:
                for event, data in self._events(query_id, after + 1, live):
                    failures = 0
                    if event == "end":
                        return
                    if event == "gap":
                        raise GatewayError(410, f"answers before {json.loads(data)['oldest_kept']} are no longer "
                                                "kept (the gateway's --history)")
                    answer = json.loads(data)
                    after = answer["n"]
                    yield Delta(answer["n"], 1 if answer["sign"] == "+" else -1,
                                {v: self._term(t) for v, t in answer["binding"].items()}, answer["seq"],
                                answer["version"], answer.get("snapshot", False))
                return
            except (OSError, urllib.error.URLError):
                failures += 1
                if failures > retries:
                    raise
                time.sleep(min(5.0, 0.2 * 2 ** failures))

    def _events(self, query_id: str, start: int, live: bool) -> Iterator[tuple[str, str]]:
        params = urllib.parse.urlencode({"from": start, "live": str(live).lower()})
        request = self._build("GET", f"/queries/{_quote(query_id)}/answers?{params}", accept="text/event-stream")
        with self._open(request, timeout=None if live else self.timeout) as response:
            event, data = "message", []
            for raw in response:
                line = raw.decode("utf-8").rstrip("\r\n")
                if not line:
                    if data:
                        yield event, "\n".join(data)
                    event, data = "message", []
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip())

    # ------------------------------------------------------------------ plumbing

    def _columns(self, query_id: str) -> list[str]:
        return json.loads(self._request("GET", f"/queries/{_quote(query_id)}")).get("projected") or []

    def _term(self, term: dict[str, str]) -> Any:
        text = from_sparql_json(term)
        return to_rdflib(text) if self.terms == "rdflib" else to_oxigraph(text)

    def _convert(self, term: Any) -> Any:
        return to_rdflib(from_oxigraph(term)) if self.terms == "rdflib" else term

    def _results(self, body: bytes) -> list[dict[str, Any]] | bool | list[Any]:
        if body.lstrip().startswith(b"{"):
            results = ox.parse_query_results(body, format=ox.QueryResultsFormat.JSON)
            if isinstance(results, ox.QueryBoolean):
                return bool(results)
            names = [v.value for v in results.variables]
            return [{n: self._convert(row[n]) for n in names if row[n] is not None} for row in results]
        triples = [q.triple for q in ox.parse(body, format=ox.RdfFormat.N_TRIPLES)]
        if self.terms == "rdflib":
            return [tuple(self._convert(t) for t in (tr.subject, tr.predicate, tr.object)) for tr in triples]
        return triples

    def _build(self, method: str, path: str, body: Any = None, *, content_type: str | None = None,
               accept: str | None = None) -> urllib.request.Request:
        headers = {"Accept": accept or "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if isinstance(body, dict):
            body, content_type = json.dumps(body).encode(), "application/json"
        if content_type:
            headers["Content-Type"] = content_type
        return urllib.request.Request(self.url + path, data=body, method=method, headers=headers)

    def _open(self, request: urllib.request.Request, timeout: float | None) -> Any:
        try:
            return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 - the user's gateway URL
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("detail") or exc.reason
            except (ValueError, AttributeError):
                detail = exc.reason
            raise GatewayError(exc.code, str(detail)) from None

    def _request(self, method: str, path: str, body: Any = None, *, content_type: str | None = None,
                 accept: str | None = None) -> bytes:
        with self._open(self._build(method, path, body, content_type=content_type, accept=accept),
                        self.timeout) as response:
            return response.read()


def _quote(query_id: str) -> str:
    return urllib.parse.quote(query_id, safe="")


def _text(term: Any) -> str:
    return term.n3() if hasattr(term, "n3") else str(term)
