"""The remote side of a SERVICE pattern: one bulk query to fill the view, one query per key to refresh it.

``SparqlRemote`` talks the SPARQL 1.1 Protocol over HTTP with SPARQLWrapper.  A key is a term in SPARQL syntax
(``<http://...>`` or a literal such as ``"7"^^<http://www.w3.org/2001/XMLSchema#integer>``), the join variable's
value; a view value is, by default, the frozenset of the key's result rows without the key, each row a sorted
tuple of (variable, term in SPARQL syntax) -- one row for the paper's class (a functional SERVICE predicate),
none when the remote no longer has the key.  The per-key query substitutes the key for the join variable in
the pattern text: no VALUES, so it works on SPARQL 1.0 endpoints as the paper requires.
``fetch_many`` (an extension) refreshes several keys with one VALUES query.

``DictRemote`` is an in-memory remote for tests.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any, Callable, Iterable, Mapping

from cbgp.background.view import Key
from cbgp.query.limits import limit

Row = tuple[tuple[str, str], ...]
# The largest answer read from an endpoint (a named setting: an endpoint is outside the fleet).
MAX_RESPONSE_SETTING, DEFAULT_MAX_RESPONSE_BYTES = "CBGP_SERVICE_MAX_RESPONSE_BYTES", 64 * 1024 * 1024


class RemoteTermError(ValueError):
    """An endpoint answered something that is not an RDF term (an IRI with a space or a ">", a bad language tag)."""


def term_text(binding: Mapping[str, str]) -> str:
    """One SPARQL JSON results term as N-Triples text, built as a typed term and written by pyoxigraph: what an
    endpoint answers is never pasted into a query or an update, so it cannot close an IRI or a string and go on
    as SPARQL.  Raises :class:`RemoteTermError` for a value that is not a term."""
    import pyoxigraph as ox

    try:
        kind, value = binding["type"], binding["value"]
        if kind == "uri":
            return str(ox.NamedNode(value))
        if kind == "bnode":
            return str(ox.BlankNode(value))
        if kind not in ("literal", "typed-literal"):
            raise ValueError(f"unknown term type {kind!r}")
        if "xml:lang" in binding:
            return str(ox.Literal(value, language=binding["xml:lang"]))
        datatype = binding.get("datatype")
        if datatype and datatype != "http://www.w3.org/2001/XMLSchema#string":
            return str(ox.Literal(value, datatype=ox.NamedNode(datatype)))
        return str(ox.Literal(value))
    except (KeyError, TypeError, ValueError) as exc:
        raise RemoteTermError(f"not an RDF term: {str(binding)[:200]} ({exc})") from None


def literal_value(text: str) -> Any:
    """The Python value of a literal's text as written by term_text (ints and decimals as numbers)."""
    match = re.fullmatch(r'"(.*)"(?:\^\^<([^>]*)>|@[\w-]+)?', text, re.S)
    if not match:
        return text
    lexical, datatype = match.group(1), match.group(2) or ""
    if datatype.endswith(("#integer", "#int", "#long", "#short", "#nonNegativeInteger")):
        return int(lexical)
    if datatype.endswith(("#decimal", "#double", "#float")):
        return float(lexical)
    return lexical


def rows_value(rows: Iterable[Row]) -> frozenset[Row]:
    return frozenset(rows)


class SparqlRemote:
    """SERVICE <endpoint> { pattern } with ``key_var`` the join variable (without ``?``)."""

    def __init__(self, endpoint: str, pattern: str, key_var: str, *, update_endpoint: str | None = None,
                 value_of: Callable[[list[Row]], Any] = rows_value, timeout: float = 10.0,
                 prefixes: str = ""):
        from SPARQLWrapper import POST, SPARQLWrapper

        self.endpoint = endpoint
        self.pattern = pattern
        self.key_var = key_var.lstrip("?$")
        self.value_of = value_of
        self.prefixes = prefixes
        self._key_re = re.compile(r"[?$]" + re.escape(self.key_var) + r"(?![\w])")
        self.timeout = timeout
        self._local = threading.local()  # one query client per thread (the maintainer may call from a pool)
        self._update = SPARQLWrapper(endpoint, updateEndpoint=update_endpoint or endpoint)
        self._update.setMethod(POST)
        self._update.setTimeout(timeout)
        self.calls = 0
        self.refused = 0  # result rows left out: they held something that is not an RDF term
        self.max_bytes = limit(MAX_RESPONSE_SETTING, DEFAULT_MAX_RESPONSE_BYTES)

    def _client(self):
        client = getattr(self._local, "client", None)
        if client is None:
            from SPARQLWrapper import JSON, POST, SPARQLWrapper

            client = SPARQLWrapper(self.endpoint)
            client.setReturnFormat(JSON)
            client.setMethod(POST)
            self._local.client = client
        return client

    def _select(self, text: str, timeout: float | None = None) -> list[dict[str, dict[str, str]]]:
        client = self._client()
        client.setQuery(self.prefixes + text)
        self.calls += 1
        client.timeout = self.timeout if timeout is None else max(0.001, timeout)  # urllib's socket timeout
        response = client.query().response
        body = response.read(self.max_bytes + 1)
        if len(body) > self.max_bytes:
            raise RemoteTermError(f"{self.endpoint} answered more than {self.max_bytes:,} bytes "
                                  f"({MAX_RESPONSE_SETTING}): the view is not filled from it")
        try:
            bindings = json.loads(body)["results"]["bindings"]
        except (ValueError, KeyError, TypeError) as exc:
            raise RemoteTermError(f"{self.endpoint} did not answer SPARQL JSON results ({exc})") from None
        if not isinstance(bindings, list) or not all(isinstance(b, dict) for b in bindings):
            raise RemoteTermError(f"{self.endpoint} did not answer SPARQL JSON results (bindings: not a list)")
        return bindings

    def _row(self, binding: Mapping[str, Mapping[str, str]]) -> Row:
        return tuple(sorted((var, term_text(term)) for var, term in binding.items() if var != self.key_var))

    def _rows(self, bindings: Iterable[Mapping[str, Mapping[str, str]]]) -> list[Row]:
        """The rows of results that hold RDF terms only (the others counted in ``refused``)."""
        rows = []
        for binding in bindings:
            try:
                rows.append(self._row(binding))
            except RemoteTermError:
                self.refused += 1
        return rows

    def _keyed_rows(self, bindings: Iterable[Mapping[str, Mapping[str, str]]]) -> Iterable[tuple[Key, Row]]:
        """``(key, row)`` of each result, leaving out (and counting) the ones that hold no RDF term."""
        for binding in bindings:
            if self.key_var not in binding:
                continue
            try:
                yield term_text(binding[self.key_var]), self._row(binding)
            except RemoteTermError:
                self.refused += 1

    def fill(self) -> dict[Key, Any]:
        """One bulk SERVICE query: every key's value."""
        rows: dict[Key, list[Row]] = {}
        for key, row in self._keyed_rows(self._select(f"SELECT * WHERE {{ {self.pattern} }}")):
            rows.setdefault(key, []).append(row)
        return {key: self.value_of(found) for key, found in rows.items()}

    def fetch(self, key: Key, timeout: float | None = None) -> Any:
        """One refresh query for one key (the key substituted for the join variable; no VALUES).

        ``timeout`` (seconds): give up after it (the maintainer passes what is left of rho)."""
        pattern = self._key_re.sub(lambda _: str(key), self.pattern)  # (a key is a term written by pyoxigraph)
        rows = self._select(f"SELECT * WHERE {{ {pattern} }}", timeout)
        return self.value_of(self._rows(rows))

    def fetch_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        """Extension (SPARQL 1.1 endpoints): several keys in one query with VALUES."""
        keys = list(keys)
        values = " ".join(str(k) for k in keys)
        rows: dict[Key, list[Row]] = {k: [] for k in keys}
        text = f"SELECT * WHERE {{ VALUES ?{self.key_var} {{ {values} }} {self.pattern} }}"
        for key, row in self._keyed_rows(self._select(text)):
            rows.setdefault(key, []).append(row)
        return {key: self.value_of(found) for key, found in rows.items()}

    def update(self, text: str) -> None:
        """A SPARQL 1.1 Update on the endpoint (benchmarks and tests change the background data with it)."""
        self._update.setQuery(self.prefixes + text)
        self._update.query().response.read()


class DictRemote:
    """An in-memory remote: ``data[key]`` is the current value; ``calls`` counts fetches."""

    def __init__(self, data: Mapping[Key, Any] | None = None):
        self.data = dict(data or {})
        self.calls = 0

    def fill(self) -> dict[Key, Any]:
        return dict(self.data)

    def fetch(self, key: Key, timeout: float | None = None) -> Any:
        self.calls += 1
        return self.data.get(key)
