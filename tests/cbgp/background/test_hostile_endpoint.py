"""A SERVICE endpoint is outside the fleet: what it answers becomes typed terms (a value that is not an RDF term is
left out, never pasted into SPARQL), its answers are bounded in size, and only allowed endpoints are called."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pyoxigraph as ox
import pytest

from cbgp.background.remote import RemoteTermError, SparqlRemote
from cbgp.background.service_clause import ServiceError
from cbgp.background.view_graphs import ViewGraph, rewrite_services

INJECTION = ("http://a/x> } } ; DROP ALL ; INSERT DATA { GRAPH <http://a/g> { <http://a/y> <http://a/p> "
             "<http://a/z")
P = "http://ex.org/followers"


@pytest.fixture
def hostile() -> Iterator[tuple[str, dict]]:
    """An endpoint whose answers are set by the test."""
    answer: dict = {"body": b""}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/sparql-results+json")
            self.send_header("Content-Length", str(len(answer["body"])))
            self.end_headers()
            self.wfile.write(answer["body"])

        do_GET = do_POST

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/sparql", answer
    server.shutdown()


def results(*rows: dict) -> bytes:
    return json.dumps({"head": {"vars": ["u", "n"]}, "results": {"bindings": list(rows)}}).encode()


def test_values_that_are_not_rdf_terms_are_left_out_and_never_become_update_text(hostile) -> None:  # noqa: ANN001
    url, answer = hostile
    answer["body"] = results(
        {"u": {"type": "uri", "value": "http://ex.org/u1"}, "n": {"type": "literal", "value": "3"}},
        {"u": {"type": "uri", "value": INJECTION}, "n": {"type": "literal", "value": "4"}},
        {"u": {"type": "uri", "value": "http://ex.org/u2"}, "n": {"type": "literal", "value": "5",
                                                                "xml:lang": "en} } ; DROP ALL"}},
        {"u": {"type": "uri", "value": "http://ex.org/u3"}, "n": {"type": "literal", "value": "x",
                                                                "datatype": "http://a> ; DROP ALL ; <b"}})
    remote = SparqlRemote(url, f"?u <{P}> ?n", "u")
    rows = remote.fill()
    assert list(rows) == ["<http://ex.org/u1>"] and remote.refused == 3
    text, (view,) = rewrite_services(f"SELECT * WHERE {{ ?u <http://ex.org/name> ?x SERVICE <{url}> {{ ?u <{P}> ?n }} }}")
    graph = ViewGraph(view)
    store = ox.Store()
    unrelated = ox.Quad(ox.NamedNode("http://ex.org/keep"), ox.NamedNode(P), ox.Literal("1"))
    store.add(unrelated)
    store.update(graph.replace_all(rows))
    assert unrelated in store and len(store) == 2


def test_an_endpoint_answer_is_bounded_and_must_be_sparql_results(hostile, monkeypatch) -> None:  # noqa: ANN001
    url, answer = hostile
    monkeypatch.setenv("CBGP_SERVICE_MAX_RESPONSE_BYTES", "1000")
    answer["body"] = results(*[{"u": {"type": "uri", "value": f"http://ex.org/u{i}"}} for i in range(100)])
    with pytest.raises(RemoteTermError, match=r"more than 1,000 bytes \(CBGP_SERVICE_MAX_RESPONSE_BYTES\)"):
        SparqlRemote(url, f"?u <{P}> ?n", "u").fill()
    monkeypatch.delenv("CBGP_SERVICE_MAX_RESPONSE_BYTES")
    answer["body"] = b"<html>not results</html>"
    with pytest.raises(RemoteTermError, match="did not answer SPARQL JSON results"):
        SparqlRemote(url, f"?u <{P}> ?n", "u").fill()


@pytest.mark.parametrize("endpoint", ["http://169.254.169.254/latest/meta-data", "file:///etc/passwd",
                                      "http://kubernetes.default.svc/api"])
def test_only_allowed_endpoints_are_called(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CBGP_SERVICE_ALLOW", "http://127.0.0.1:8890/")
    with pytest.raises(ServiceError, match="not an allowed endpoint|only http and https"):
        rewrite_services(f"SELECT * WHERE {{ ?u <http://ex.org/name> ?x SERVICE <{endpoint}> {{ ?u <{P}> ?n }} }}")
    monkeypatch.delenv("CBGP_SERVICE_ALLOW")  # a fleet allows none unless told
    with pytest.raises(ServiceError, match="CBGP_SERVICE_ALLOW"):
        rewrite_services(f"SELECT * WHERE {{ ?u <http://ex.org/n> ?x SERVICE <http://127.0.0.1:8890/s> {{ ?u <{P}> ?n }} }}")
