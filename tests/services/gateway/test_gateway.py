"""``cbgp gateway`` end to end: one fleet (ingest, registry, worker, answers) and one gateway as real
processes on the embedded broker, shared by the tests of this module, with bearer tokens configured:

- the real SEPA client ``sepy`` subscribes over WebSocket, updates through ``/update`` and receives the added,
  then the removed bindings (and a later subscriber gets the current answers in its first notification);
- SSE: disconnect after answer N, reconnect with ``Last-Event-ID: N``: nothing lost, nothing repeated (and a
  gateway keeping only 2 answers per query says which were trimmed: ``event: gap``);
- scopes: no token 401, read token reads but cannot write (403), read-write does both, over HTTP and SEPA;
- mTLS: a second gateway serving HTTPS gives a verified client certificate its configured scope;
- ``POST /query`` over the current graph equals what was published;
- the console in headless Debian Chromium (playwright): register from the page, publish, the row appears and
  then disappears; screenshots kept in ``tests/artifacts/``;
- schemathesis (its CLI, deterministic, bounded) against ``/openapi.json``, last (it unregisters what it sees).
"""

from __future__ import annotations

import json
import queue
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

from services.kafka.topics import ensure_topics
from services.kafka.broker import free_port
from tests.fixtures.broker import fresh_settings
from tests.fleet_support import Fleet, wait_for

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
ARTIFACTS = ROOT / "tests" / "artifacts"
RW, RO = "rw-token-21-000000", "ro-token-21-000000"  # (a token is at least 16 characters)
EX = "http://example.org/"
CHROMIUM = "/usr/bin/chromium"


class Gw:
    def __init__(self, url: str, fleet: Fleet) -> None:
        self.url, self.fleet = url, fleet

    def h(self, token: str | None = RW) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if token else {}

    def get(self, path: str, token: str | None = RW, **kw: Any) -> requests.Response:
        return requests.get(self.url + path, headers={**self.h(token), **kw.pop("headers", {})}, timeout=60, **kw)

    def post(self, path: str, token: str | None = RW, **kw: Any) -> requests.Response:
        return requests.post(self.url + path, headers={**self.h(token), **kw.pop("headers", {})}, timeout=60, **kw)

    def delete(self, path: str, token: str | None = RW) -> requests.Response:
        return requests.delete(self.url + path, headers=self.h(token), timeout=60)

    def update(self, text: str, token: str | None = RW) -> requests.Response:
        return self.post("/update", token, data=text.encode(), headers={"Content-Type": "application/sparql-update"})

    def register(self, query_id: str, sparql: str) -> dict[str, Any]:
        reply = self.post("/queries", json={"id": query_id, "sparql": sparql})
        assert reply.status_code == 201, reply.text
        return reply.json()


@pytest.fixture(scope="module")
def gw(kafka_broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gw]:
    tmp = tmp_path_factory.mktemp("gateway")
    settings = fresh_settings(kafka_broker)
    ensure_topics(settings)
    tokens = tmp / "tokens"
    tokens.write_text(f"# token scope\n{RW} read-write\n{RO} read\n")
    with Fleet(settings, tmp / "logs") as fleet:
        fleet.start("ingest", "ingest", "--instance-id", "i1")
        fleet.start("registry", "registry", "--web-port", str(free_port()), "--state-dir", str(tmp / "state"))
        fleet.start("w0", "worker", "--worker-id", "w0")
        fleet.start("answers", "answers", "--instance-id", "a1")
        fleet.start("gateway", "gateway", "--port", "0", "--tokens-file", str(tokens), "--host", "127.0.0.1")
        deadline = time.monotonic() + 60
        port = None
        while port is None and time.monotonic() < deadline:
            found = re.search(r"event=started port=(\d+)", fleet.log_text("gateway"))
            port = int(found.group(1)) if found else None
            time.sleep(0.2)
        assert port, fleet.log_text("gateway")[-2000:]
        g = Gw(f"http://127.0.0.1:{port}", fleet)
        while time.monotonic() < deadline and requests.get(g.url + "/readyz", timeout=5).status_code != 200:
            time.sleep(0.2)
        # The registry (a faust app) takes a while to come up: the first registration waits for it.
        for _ in range(4):
            reply = g.post("/queries", json={"id": "warmup", "sparql": f"SELECT ?x WHERE {{ ?x <{EX}warm> ?y }}"})
            if reply.status_code == 201:
                break
        assert reply.status_code == 201, reply.text
        yield g


def uri(name: str) -> dict[str, str]:
    return {"type": "uri", "value": EX + name}


# ---------------------------------------------------------------------------------------- SEPA with sepy


def test_sepy_subscribes_and_receives_added_then_removed_bindings(gw: Gw) -> None:
    import logging

    from sepy.SEPA import SEPA

    sparql = f"SELECT ?x ?y WHERE {{ ?x <{EX}follows> ?y }}"
    got: queue.Queue = queue.Queue()
    client = SEPA(logLevel=logging.CRITICAL)
    spuid = client.sparql_subscribe(sparql, "follows", handler=lambda added, removed: got.put((added, removed)),
                                    host=gw.url.replace("http", "ws") + f"/subscribe?access_token={RW}")
    assert spuid.startswith("sepa://subscription/")
    assert got.get(timeout=10) == ([], [])  # the first notification: the current answers (none yet)
    # The subscription registered the query under an id derived from its text.
    listed = {q["sparql"]: q for q in gw.get("/queries").json()["queries"]}
    assert sparql in listed and listed[sparql]["id"].startswith("sepa-")

    update_url = gw.url + f"/update?access_token={RW}"
    client.sparql_update(f"INSERT DATA {{ <{EX}ann> <{EX}follows> <{EX}bob> }}", host=update_url)
    added, removed = got.get(timeout=30)
    assert added == [{"x": uri("ann"), "y": uri("bob")}] and removed == []

    # A second subscriber of the same text reuses the registration and starts from the current answers.
    seen: queue.Queue = queue.Queue()
    other = SEPA(logLevel=logging.CRITICAL)
    other.sparql_subscribe(sparql, "again", handler=lambda a, r: seen.put((a, r)),
                           host=gw.url.replace("http", "ws") + f"/subscribe?access_token={RW}")
    assert seen.get(timeout=10) == ([{"x": uri("ann"), "y": uri("bob")}], [])
    assert len([q for q in gw.get("/queries").json()["queries"] if q["sparql"] == sparql]) == 1

    client.sparql_update(f"DELETE DATA {{ <{EX}ann> <{EX}follows> <{EX}bob> }}", host=update_url)
    added, removed = got.get(timeout=30)
    assert added == [] and removed == [{"x": uri("ann"), "y": uri("bob")}]
    assert seen.get(timeout=30) == ([], [{"x": uri("ann"), "y": uri("bob")}])
    client.unsubscribe(spuid)


# ---------------------------------------------------------------------------------------- SSE resume


def sse_events(gw: Gw, path: str, count: int | None, headers: dict[str, str] | None = None,
               timeout: float = 30.0) -> list[dict[str, Any]]:
    """The first ``count`` answer events of ``path`` (all of a live=false stream when None)."""
    events, current = [], {}
    deadline = time.monotonic() + timeout
    with requests.get(gw.url + path, headers={**gw.h(RO), **(headers or {})}, stream=True, timeout=timeout) as r:
        assert r.status_code == 200, r.text
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for line in r.iter_lines(decode_unicode=True):
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(events)} events")
            if line == "":
                if current.get("event") == "answer":
                    data = json.loads(current["data"])
                    assert current["id"] == str(data["n"])
                    events.append(data)
                    if count is not None and len(events) >= count:
                        return events
                current = {}
            elif not line.startswith(":") and ":" in line:
                key, _, value = line.partition(":")
                current[key] = value.lstrip(" ")
    return events


def test_sse_resumes_with_last_event_id_without_loss_or_repeats(gw: Gw) -> None:
    gw.register("sse", f"SELECT ?x WHERE {{ ?x <{EX}likes> <{EX}tea> }}")
    for i in range(5):
        assert gw.update(f"INSERT DATA {{ <{EX}p{i}> <{EX}likes> <{EX}tea> }}").status_code == 200
    first = sse_events(gw, "/queries/sse/answers?from=1", 3)
    assert [e["n"] for e in first] == [1, 2, 3]
    # While disconnected: more answers, deletions among them.
    assert gw.update(f"DELETE DATA {{ <{EX}p0> <{EX}likes> <{EX}tea> }} ;\n"
                     f"INSERT DATA {{ <{EX}p9> <{EX}likes> <{EX}tea> }}").status_code == 200
    assert gw.update(f"DELETE DATA {{ <{EX}p1> <{EX}likes> <{EX}tea> }}").status_code == 200
    total = 8  # 5 + 1 delete + 1 insert + 1 delete
    wait_for(lambda: gw.get("/queries/sse").json()["answers"] >= total, what="8 answers")
    rest = sse_events(gw, "/queries/sse/answers", total - 3, headers={"Last-Event-ID": "3"})
    assert [e["n"] for e in rest] == list(range(4, total + 1))
    everything = sse_events(gw, "/queries/sse/answers?live=false", None)
    assert first + rest == everything
    assert [e["sign"] for e in everything].count("-") == 2
    for bad in ("-4", "three", "9" * 5000):  # (int() refuses more than 4,300 digits)
        refused = requests.get(gw.url + "/queries/sse/answers", headers={**gw.h(RO), "Last-Event-ID": bad}, timeout=10)
        assert refused.status_code == 400 and "Last-Event-ID must be an answer number" in refused.text
    # from=N is the same as Last-Event-ID: N-1; folding the stream gives /current.
    assert sse_events(gw, "/queries/sse/answers?from=6&live=false", None) == everything[5:]
    fold: dict[str, int] = {}
    for e in everything:
        key = json.dumps(e["binding"], sort_keys=True)
        fold[key] = fold.get(key, 0) + (1 if e["sign"] == "+" else -1)
    current = gw.get("/queries/sse/current").json()
    assert sorted(json.dumps(b, sort_keys=True) for b in current["results"]["bindings"]) == \
        sorted(k for k, n in fold.items() for _ in range(n))
    assert {b["x"]["value"] for b in current["results"]["bindings"]} == {f"{EX}p{i}" for i in (2, 3, 4, 9)}

    # A gateway keeping few answers per query (--history 2) says which were trimmed, then sends the rest.
    gw.fleet.start("gateway-h", "gateway", "--port", "0", "--host", "127.0.0.1", "--history", "2", "--auth", "none")
    try:
        found = wait_for(lambda: re.search(r"event=started port=(\d+)", gw.fleet.log_text("gateway-h")),
                         what="the second gateway")
        url = f"http://127.0.0.1:{found.group(1)}"
        wait_for(lambda: requests.get(url + "/readyz", timeout=5).status_code == 200, what="ready")
        text = requests.get(url + "/queries/sse/answers?from=1&live=false", timeout=30).text
        events = [dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
                  for block in text.split("\n\n") if "data: " in block]
        assert events[0]["event"] == "gap" and json.loads(events[0]["data"]) == {"from": 1, "oldest_kept": 7}
        assert [json.loads(e["data"])["n"] for e in events[1:]] == [7, 8]
        assert [json.loads(e["data"]) for e in events[1:]] == everything[6:]
    finally:
        gw.fleet.stop("gateway-h")


# ---------------------------------------------------------------------------------------- scopes, /query


def test_queries_are_listed_a_page_at_a_time_in_id_order(gw: Gw) -> None:
    from services.client.gateway import GatewayClient

    for i in range(3):
        gw.register(f"page{i}", f"SELECT ?x WHERE {{ ?x <{EX}page{i}> ?y }}")
    ids: list[str] = []
    path: str | None = "/queries?limit=1"
    while path:
        body = gw.get(path).json()
        assert len(body["queries"]) <= 1
        ids += [q["id"] for q in body["queries"]]
        path = body.get("next")
    assert {f"page{i}" for i in range(3)} <= set(ids) and ids == sorted(set(ids))
    assert [q["id"] for q in GatewayClient(gw.url, RW).queries()] == ids
    assert gw.get("/queries?limit=0").status_code == 400
    assert gw.get("/queries?limit=x").json()["detail"].startswith("limit must be a whole number")


def test_scopes_read_and_read_write(gw: Gw) -> None:
    assert gw.get("/queries", token=None).status_code == 401
    assert gw.get("/queries", token=None).headers["WWW-Authenticate"].startswith("Bearer")
    assert gw.get("/queries", token="wrong").status_code == 401
    missing, wrong = gw.get("/queries", token=None), gw.get("/queries", token="wrong")
    assert missing.headers["Content-Type"].startswith("application/problem+json")
    assert missing.json() == {"type": "about:blank", "title": "Unauthorized", "status": 401,
                              "detail": "a bearer token is required"}
    assert wrong.json()["detail"] == "the bearer token is not valid"
    assert gw.get("/queries", token=RO).status_code == 200
    assert gw.get(f"/queries?access_token={RO}", token=None).status_code == 200
    for public in ("/", "/console.js", "/openapi.json", "/healthz", "/readyz", "/metrics"):
        assert gw.get(public, token=None).status_code == 200, public
    assert gw.post("/queries", token=RO, json={"id": "nope", "sparql": "SELECT * WHERE { ?s ?p ?o }"}).status_code == 403
    assert gw.update(f"INSERT DATA {{ <{EX}a> <{EX}b> <{EX}c> }}", token=RO).status_code == 403
    assert gw.delete("/queries/warmup", token=RO).status_code == 403
    assert gw.get("/queries/warmup", token=RO).status_code == 200
    # SEPA: a read token may subscribe to a registered text, not register a new one.
    import websocket

    ws = websocket.create_connection(gw.url.replace("http", "ws") + "/subscribe", timeout=10,
                                     header=[f"Authorization: Bearer {RO}"])
    try:
        ws.send(json.dumps({"subscribe": {"sparql": f"SELECT ?z WHERE {{ ?z <{EX}unheard> ?w }}", "alias": "a"}}))
        reply = json.loads(ws.recv())
        assert reply["status_code"] == 403, reply
        warm = f"SELECT ?x WHERE {{ ?x <{EX}warm> ?y }}"
        ws.send(json.dumps({"subscribe": {"sparql": warm, "alias": "w"}}))
        reply = json.loads(ws.recv())
        assert reply["notification"]["sequence"] == 0 and reply["notification"]["alias"] == "w"
        ws.send(json.dumps({"unsubscribe": {"spuid": reply["notification"]["spuid"]}}))
        assert json.loads(ws.recv()) == {"unsubscribed": {"spuid": reply["notification"]["spuid"]}}
    finally:
        ws.close()
    # No token on the upgrade: each subscribe message must carry one (SEPA's "authorization" field).
    ws = websocket.create_connection(gw.url.replace("http", "ws") + "/subscribe", timeout=10)
    try:
        warm = f"SELECT ?x WHERE {{ ?x <{EX}warm> ?y }}"
        ws.send(json.dumps({"subscribe": {"sparql": warm, "alias": "w"}}))
        assert json.loads(ws.recv())["status_code"] == 401
        ws.send(json.dumps({"subscribe": {"sparql": warm, "alias": "w", "authorization": f"Bearer {RO}"}}))
        assert json.loads(ws.recv())["notification"]["sequence"] == 0
    finally:
        ws.close()
    # read-write: register and unregister
    assert gw.post("/queries", json={"id": "bad", "sparql": "SELECT ?x WHERE { ?x ?p }"}).status_code == 400
    gw.register("tmp", f"SELECT ?x WHERE {{ ?x <{EX}tmp> ?y }}")
    assert gw.delete("/queries/tmp").status_code == 200
    assert gw.get("/queries/tmp").status_code == 404
    assert gw.delete("/queries/tmp").status_code == 404
    metrics = gw.get("/metrics", token=None).text
    assert re.search(r'cbgp_gateway_requests_total\{code="403",method="POST",route="/queries"\} [1-9]', metrics)
    assert "# TYPE cbgp_gateway_notification_latency_seconds histogram" in metrics  # (buckets once a client was told)


def test_query_over_the_current_graph(gw: Gw) -> None:
    assert gw.update(f'INSERT DATA {{ <{EX}q1> <{EX}age> 41 . <{EX}q2> <{EX}age> 42 . <{EX}q3> <{EX}age> "x"@en }}'
                     ).status_code == 200
    assert gw.update(f"DELETE DATA {{ <{EX}q2> <{EX}age> 42 }}").status_code == 200
    text = f"SELECT ?s ?a WHERE {{ ?s <{EX}age> ?a }} ORDER BY ?s"

    def ages() -> list | None:
        reply = gw.post("/query", token=RO, data=text, headers={"Content-Type": "application/sparql-query"})
        assert reply.status_code == 200, reply.text
        rows = reply.json()["results"]["bindings"]
        return rows if len(rows) == 2 else None

    rows = wait_for(ages, what="the two remaining ages")
    assert [r["s"]["value"] for r in rows] == [f"{EX}q1", f"{EX}q3"]
    assert rows[1]["a"] == {"type": "literal", "value": "x", "xml:lang": "en"}
    assert gw.get("/query", token=RO, params={"query": "SELECT nonsense"}).status_code == 400


def test_current_answers_and_query_results_in_every_standard_format(gw: Gw) -> None:
    """SELECT in JSON/XML/CSV/TSV (in ORDER BY order), ASK as a boolean, CONSTRUCT as Turtle/N-Triples/JSON-LD, by
    Accept or ?format=, each read by pyoxigraph's or rdflib's parser; 406 when nothing fits; errors as problem
    JSON with one line."""
    import io

    import pyoxigraph as ox
    from rdflib import Graph, Literal, URIRef
    from rdflib.query import Result

    gw.register("fmt-top", f"SELECT ?s ?a WHERE {{ ?s <{EX}fmt-age> ?a }} ORDER BY DESC(?a) LIMIT 3")
    gw.register("fmt-ask", f"ASK {{ ?s <{EX}fmt-age> 77 }}")
    gw.register("fmt-con", f"CONSTRUCT {{ ?s <{EX}fmt-old> ?a }} WHERE {{ ?s <{EX}fmt-age> ?a FILTER(?a > 60) }}")
    ages = {"p1": 66, "p2": 77, "p3": 67, "p4": 12}
    assert gw.update("INSERT DATA { " + " ".join(f"<{EX}{p}> <{EX}fmt-age> {a} ." for p, a in ages.items()) + " }"
                     ).status_code == 200

    def current(query_id: str, accept: str | None = None, fmt: str | None = None) -> requests.Response:
        reply = gw.get(f"/queries/{query_id}/current", headers={"Accept": accept} if accept else {},
                       params={"format": fmt} if fmt else None)
        assert reply.status_code == 200, reply.text
        return reply

    wait_for(lambda: len(current("fmt-top").json()["results"]["bindings"]) == 3 or None, what="the top 3")
    top = current("fmt-top").json()["results"]["bindings"]
    assert [b["a"]["value"] for b in top] == ["77", "67", "66"]  # in ORDER BY order, as pyoxigraph orders them
    for accept, fmt, parser in [("application/sparql-results+xml", ox.QueryResultsFormat.XML, "xml"),
                                ("text/tab-separated-values", ox.QueryResultsFormat.TSV, "tsv")]:
        reply = current("fmt-top", accept)
        assert reply.headers["Content-Type"].startswith(accept)
        rows = list(ox.parse_query_results(reply.content, format=fmt))
        assert [row["a"].value for row in rows] == ["77", "67", "66"]
        assert [str(row[1]) for row in Result.parse(io.BytesIO(reply.content), format=parser)] == ["77", "67", "66"]
    csv = current("fmt-top", fmt="csv")
    assert csv.headers["Content-Type"].startswith("text/csv")
    assert csv.text.splitlines() == ["s,a", f"{EX}p2,77", f"{EX}p3,67", f"{EX}p1,66"]
    assert [str(row[1]) for row in Result.parse(io.BytesIO(csv.content), format="csv")] == ["77", "67", "66"]

    wait_for(lambda: current("fmt-ask").json().get("boolean") or None, what="ASK true")
    assert current("fmt-ask").json() == {"head": {}, "boolean": True}
    assert Result.parse(io.BytesIO(current("fmt-ask", "application/sparql-results+xml").content),
                        format="xml").askAnswer is True

    expected = {(URIRef(f"{EX}{p}"), URIRef(f"{EX}fmt-old"), Literal(a)) for p, a in ages.items() if a > 60}
    wait_for(lambda: len(Graph().parse(data=current("fmt-con").text, format="turtle")) == 3 or None,
             what="3 constructed triples")
    for accept, fmt, name in [(None, None, "turtle"), ("application/n-triples", None, "nt"),
                              (None, "jsonld", "json-ld")]:
        graph = Graph().parse(data=current("fmt-con", accept, fmt).content, format=name)
        assert set(graph) == expected, name

    refused = gw.get("/queries/fmt-con/current", headers={"Accept": "text/csv"})
    assert refused.status_code == 406 and refused.headers["Content-Type"].startswith("application/problem+json")
    assert "CONSTRUCT" in refused.json()["detail"] and "text/turtle" in refused.json()["detail"]

    query = f"SELECT ?s WHERE {{ ?s <{EX}fmt-age> ?a }} ORDER BY ?a"
    reply = gw.get("/query", token=RO, params={"query": query}, headers={"Accept": "text/csv"})
    assert reply.status_code == 200 and reply.text.splitlines() == ["s", *(f"{EX}{p}" for p in ("p4", "p1", "p3",
                                                                                                 "p2"))]
    reply = gw.get("/query", token=RO, params={"query": f"CONSTRUCT {{ ?s <{EX}x> ?a }} WHERE {{ ?s <{EX}fmt-age> ?a }}",
                                               "format": "jsonld"})
    assert reply.status_code == 200 and len(Graph().parse(data=reply.content, format="json-ld")) == 4
    assert gw.get("/query", token=RO, params={"query": "ASK { ?s ?p ?o }"},
                  headers={"Accept": "text/turtle"}).status_code == 406

    # errors: one line that says what and where, as the CLI says it
    bad = gw.get("/query", token=RO, params={"query": "SELECT ?n WHERE { ?p foaf:name ?n }"})
    assert bad.status_code == 400 and bad.headers["Content-Type"].startswith("application/problem+json")
    assert bad.json()["detail"].startswith("undeclared prefix 'foaf:'") and bad.json()["column"] == 22
    bad = gw.update(f"INSERT DATA {{ <{EX}a> <{EX}b> \"open }}")
    assert bad.status_code == 400 and "unterminated string" in bad.json()["detail"] and "\n" not in bad.text
    bad = gw.post("/queries", json={"id": "fmt-bad", "sparql": "SELECT ?x WHERE { ?x ex:p ?y }"})
    assert bad.status_code == 400 and bad.json()["detail"].startswith("undeclared prefix 'ex:'")
    assert bad.json()["line"] == 1 and bad.json()["status"] == 400
    assert gw.update(f"INSERT DATA {{ <{EX}u> <{EX}v> <{EX}w> }}").json()["published_bytes"] > 0


def test_the_python_client_reads_typed_answers_and_follows_deltas(gw: Gw) -> None:
    """``services.client.gateway``: typed rows, booleans and triples (pyoxigraph or rdflib terms), a DataFrame,
    deltas that resume, errors as one line; and ``docs/examples/client.py`` runs as documented."""
    import os

    import pyoxigraph as ox
    from rdflib import Literal, URIRef

    from services.client.gateway import GatewayClient, GatewayError

    client = GatewayClient(gw.url, RW)
    client.register("py-people", f"SELECT ?p ?n WHERE {{ ?p <{EX}py-name> ?n }} ORDER BY ?n")
    client.register("py-ask", f"ASK {{ ?p <{EX}py-name> \"Zoe\"@en }}")
    client.register("py-con", f"CONSTRUCT {{ ?p <{EX}py-called> ?n }} WHERE {{ ?p <{EX}py-name> ?n }}")
    assert client.update(f'INSERT DATA {{ <{EX}z> <{EX}py-name> "Zoe"@en . <{EX}y> <{EX}py-name> "Yan"@en }}') > 0
    first_two = []
    for delta in client.deltas("py-people"):
        first_two.append(delta)
        if len(first_two) == 2:
            break
    assert sorted((d.n, d.diff) for d in first_two) == [(1, 1), (2, 1)]
    assert {d.row["n"] for d in first_two} == {ox.Literal("Zoe", language="en"), ox.Literal("Yan", language="en")}
    assert client.current("py-people") == [{"p": ox.NamedNode(f"{EX}y"), "n": ox.Literal("Yan", language="en")},
                                           {"p": ox.NamedNode(f"{EX}z"), "n": ox.Literal("Zoe", language="en")}]
    wait_for(lambda: client.current("py-ask") or None, what="ASK true")
    wait_for(lambda: len(client.current("py-con")) == 2 or None, what="two triples")
    assert ox.Triple(ox.NamedNode(f"{EX}z"), ox.NamedNode(f"{EX}py-called"), ox.Literal("Zoe", language="en")) in \
        client.current("py-con")
    frame = client.current_frame("py-people")
    assert list(frame.columns) == ["p", "n"] and frame["n"].tolist() == ['"Yan"@en', '"Zoe"@en']
    rdf = GatewayClient(gw.url, RO, terms="rdflib")
    assert rdf.current("py-people")[1] == {"p": URIRef(f"{EX}z"), "n": Literal("Zoe", lang="en")}
    assert rdf.query(f"ASK {{ <{EX}z> <{EX}py-name> \"Zoe\"@en }}") is True
    # resuming after answer 1 gives answer 2 again, and nothing before it; live=False ends at the last one read
    assert [d.n for d in rdf.deltas("py-people", start=2, live=False)] == [2]
    try:
        rdf.register("py-x", "SELECT * WHERE { ?s ?p ?o }")
        raise AssertionError("a read token registered a query")
    except GatewayError as exc:
        assert exc.status == 403 and "scope" in exc.detail
    client.unregister("py-people")

    env = {**os.environ, "CBGP_GATEWAY_URL": gw.url, "CBGP_GATEWAY_TOKEN": RW, "PYTHONPATH": str(ROOT)}
    try:
        done = subprocess.run([sys.executable, "-u", str(ROOT / "docs" / "examples" / "client.py")], env=env,
                              cwd=ROOT, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the example hung; it printed: {exc.stdout!r} {exc.stderr!r}") from None
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert sorted(lines[:2]) == ["+ Alice -> Carol", "+ Alice -> Dave"] and lines[2] == "- Alice -> Dave"
    assert lines[3].split() == ["person", "fof"] and lines[4].split() == ['"Alice"', '"Carol"'] and len(lines) == 5


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl to make test certificates")
def test_mtls_client_certificate_has_its_configured_scope(gw: Gw, tmp_path: Path) -> None:
    """A second gateway on the same topics, serving HTTPS: a client certificate signed by --tls-client-ca is
    authenticated with --client-cert-scope (read here); without one a bearer token is still needed."""
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        (tmp_path / f"{name}.ext").write_text(ext + "\n")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=cbgp-test-ca", cwd=tmp_path)
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
                 f"/CN={name}", cwd=tmp_path)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
                 f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=tmp_path)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{RW} read-write\n")
    gw.fleet.start("gateway-tls", "gateway", "--port", "0", "--host", "127.0.0.1", "--tokens-file", str(tokens),
                   "--tls-cert", str(tmp_path / "server.crt"), "--tls-key", str(tmp_path / "server.key"),
                   "--tls-client-ca", str(tmp_path / "ca.crt"), "--client-cert-scope", "read")
    try:
        found = wait_for(lambda: re.search(r"event=started port=(\d+)", gw.fleet.log_text("gateway-tls")),
                         what="the TLS gateway")
        url = f"https://127.0.0.1:{found.group(1)}"
        ca, cert = str(tmp_path / "ca.crt"), (str(tmp_path / "client.crt"), str(tmp_path / "client.key"))
        wait_for(lambda: requests.get(url + "/readyz", verify=ca, timeout=5).status_code == 200, what="ready")
        assert requests.get(url + "/queries", verify=ca, timeout=10).status_code == 401
        listed = requests.get(url + "/queries", verify=ca, cert=cert, timeout=10)
        assert listed.status_code == 200 and "warmup" in {q["id"] for q in listed.json()["queries"]}
        assert requests.post(url + "/queries", verify=ca, cert=cert, timeout=10,
                             json={"id": "x", "sparql": "SELECT * WHERE { ?s ?p ?o }"}).status_code == 403
        assert requests.get(url + "/queries", verify=ca, timeout=10,
                            headers={"Authorization": f"Bearer {RW}"}).status_code == 200
    finally:
        gw.fleet.stop("gateway-tls")


# ---------------------------------------------------------------------------------------- console


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (make chromium)")
def test_console_in_chromium_register_publish_row_appears_and_disappears(gw: Gw, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    profile = tmp_path / "chromium-profile"
    with sync_playwright() as p:
        # A fresh profile (--user-data-dir, which playwright sets from user_data_dir) and no network chatter:
        # the machine is offline, and without these flags Chromium hangs on connections.
        browser = p.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, viewport={"width": 1400, "height": 900}, args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(gw.url + "/")
            page.fill("#token", RW)
            page.dispatch_event("#token", "change")
            expect(page.locator("#queries tbody tr[data-id=warmup]")).to_be_visible(timeout=15000)
            expect(page.locator("#fleet")).to_contain_text("state:", timeout=15000)

            page.fill("#reg-id", "people")
            page.fill("#reg-sparql", f"SELECT ?who ?name WHERE {{ ?who <{EX}name> ?name . ?who a <{EX}Person> }}")
            page.click("#reg-button")
            expect(page.locator("#reg-msg")).to_contain_text("ACCEPTED", timeout=40000)
            expect(page.locator("#queries tbody tr[data-id=people]")).to_be_visible(timeout=15000)
            expect(page.locator("#sel-id")).to_have_text("people")

            page.fill("#upd-text", f'INSERT DATA {{ <{EX}zoe> <{EX}name> "Zoé"@fr . <{EX}zoe> a <{EX}Person> . '
                                   f'<{EX}max> <{EX}name> "Max" . <{EX}max> a <{EX}Person> }}')
            page.click("#upd-button")
            expect(page.locator("#upd-msg")).to_contain_text("published", timeout=15000)
            zoe = page.locator("#answers tbody tr", has_text='"Zoé"@fr')
            expect(zoe).to_be_visible(timeout=30000)
            expect(page.locator("#answers tbody tr", has_text='"Max"')).to_be_visible(timeout=30000)
            expect(page.locator("#queries tbody tr[data-id=people] td").nth(7)).to_have_text("2", timeout=10000)
            expect(page.locator("#queries tbody tr[data-id=people] td").nth(1)).to_have_text("registered")
            page.screenshot(path=str(ARTIFACTS / "console-added.png"), full_page=True)

            page.fill("#upd-text", f'DELETE DATA {{ <{EX}zoe> <{EX}name> "Zoé"@fr }}')
            page.click("#upd-button")
            expect(zoe).to_have_class(re.compile("removed"), timeout=30000)
            page.screenshot(path=str(ARTIFACTS / "console-removed.png"), full_page=True)
            expect(zoe).to_have_count(0, timeout=10000)
            expect(page.locator("#answers tbody tr", has_text='"Max"')).to_be_visible()
            expect(page.locator("#deltas tbody tr").first).to_contain_text("-")

            page.locator("#queries tbody tr[data-id=people] button.unregister").click()
            expect(page.locator("#queries tbody tr[data-id=people]")).to_have_count(0, timeout=30000)
            assert not errors, errors
        except AssertionError:
            page.screenshot(path=str(ARTIFACTS / "console-failure.png"), full_page=True)
            print("gateway's view:", gw.get("/queries").text[:3000], errors, file=sys.stderr)
            raise
        finally:
            browser.close()
    shutil.rmtree(profile, ignore_errors=True)


# ---------------------------------------------------------------------------------------- schemathesis


def test_a_gateway_started_after_retention_deleted_answers_gets_the_current_ones_from_answers_current(gw: Gw) -> None:
    """The answers topic keeps 7 days, so a gateway may start on an answers partition whose first answers are gone.
    Their fold cannot be rebuilt from the log: the new gateway seeds its current answers from answers.current (the
    answers service writes both in one transaction) and folds only what follows; its history says what is gone."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from services.kafka.client import end_offsets
    from services.wire.records import query_partition

    gw.register("kept", f"SELECT ?x ?y WHERE {{ ?x <{EX}met> ?y }}")
    for i in range(6):
        assert gw.update(f"INSERT DATA {{ <{EX}m{i}> <{EX}met> <{EX}n{i % 2}> }}").status_code == 200
    assert gw.update(f"DELETE DATA {{ <{EX}m0> <{EX}met> <{EX}n0> }}").status_code == 200

    def current(url: str) -> list[str]:
        reply = requests.get(url + "/queries/kept/current", headers=gw.h(), timeout=30)
        return sorted(json.dumps(b, sort_keys=True) for b in reply.json()["results"]["bindings"])

    wait_for(lambda: len(current(gw.url)) == 5, what="5 current answers")
    settings = gw.fleet.settings
    topic, partition = settings.topic("answers"), query_partition("kept", settings.partitions)
    _low, high = end_offsets(settings, topic)[partition]
    admin = AdminClient(settings.admin_config())
    for future in admin.delete_records([TopicPartition(topic, partition, high - 3)], request_timeout=10).values():
        future.result(10)  # as retention would: every answer of the partition but the last few is gone
    gw.fleet.start("gateway-r", "gateway", "--port", "0", "--host", "127.0.0.1", "--tokens-file",
                   str(gw.fleet.logs.parent / "tokens"))
    try:
        found = wait_for(lambda: re.search(r"event=started port=(\d+)", gw.fleet.log_text("gateway-r")),
                         what="the gateway started after the deletion")
        url = f"http://127.0.0.1:{found.group(1)}"
        wait_for(lambda: requests.get(url + "/readyz", timeout=5).status_code == 200, what="ready")
        assert current(url) == current(gw.url)
        assert "seeded from answers.current" in gw.fleet.log_text("gateway-r")
        assert gw.update(f"DELETE DATA {{ <{EX}m1> <{EX}met> <{EX}n1> }} ;\n"
                         f"INSERT DATA {{ <{EX}m7> <{EX}met> <{EX}n1> }}").status_code == 200
        after = {f"{EX}m{i}" for i in (2, 3, 4, 5, 7)}
        wait_for(lambda: {json.loads(b)["x"]["value"] for b in current(gw.url)} == after, what="the update answered")
        wait_for(lambda: current(url) == current(gw.url), what="the new gateway folded it too")
        text = requests.get(url + "/queries/kept/answers?from=1&live=false", headers=gw.h(), timeout=30).text
        events = [dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
                  for block in text.split("\n\n") if "data: " in block]
        assert events[0]["event"] == "gap" and json.loads(events[0]["data"])["from"] == 1  # the deleted ones
    finally:
        gw.fleet.stop("gateway-r")


def test_openapi_holds_under_schemathesis(gw: Gw, tmp_path: Path) -> None:
    """Deterministic and bounded: positive cases, fixed seed; the SSE operation is left out (a live stream
    never ends; test_sse_* covers it).  Last in this module: schemathesis reuses ids it saw in responses, so it
    unregisters the queries the other tests registered (DELETE /queries/warmup)."""
    st = str(Path(sys.executable).with_name("st"))
    checks = ("not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,"
              "response_headers_conformance,ignored_auth")
    done = subprocess.run(
        [st, "run", gw.url + "/openapi.json", "--checks", checks, "--mode", "positive", "--max-examples", "8",
         "--seed", "21", "--generation-deterministic", "--phases", "examples,fuzzing", "--workers", "1",
         "--exclude-path-regex", "/answers$", "-H", f"Authorization: Bearer {RW}", "--request-timeout", "45",
         "--no-color"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)  # st keeps its reports in ./.schemathesis
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Tested: 12" in done.stdout, done.stdout[-3000:]
    cases = re.search(r"(\d+) generated, (\d+) passed", done.stdout)
    assert cases and int(cases.group(1)) >= 50 and cases.group(1) == cases.group(2), done.stdout[-3000:]
