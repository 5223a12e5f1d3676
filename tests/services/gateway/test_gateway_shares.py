"""Two gateway replicas sharing the queries (``--share 0/2`` and ``1/2``) as real processes on the embedded
broker, with a fleet (ingest, registry, worker, answers) and bearer tokens:

- each replica reads only its share of ``answers``: between them they read every answer record once;
- a client of either replica gets the same answers, SSE and current answers, whichever replica holds the query
  (the other follows it from the holder); a SEPA subscription (``sepy``) on the replica that does not hold the
  query gets the current answers, then the added and removed bindings;
- a replica asked as holder for a query it does not hold says so (421), never relaying twice;
- the holder stopped: a new follower gets one line naming it (502); the holder back on its port: an open
  subscription on the other replica goes on from the next answer, nothing lost, nothing repeated.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from typing import Any, Iterator

import pytest
import requests

from services.kafka.broker import free_port
from services.kafka.client import end_offsets
from services.kafka.topics import ensure_topics
from services.wire.records import query_partition
from tests.fixtures.broker import fresh_settings
from tests.fleet_support import Fleet, metric_total, wait_for

pytestmark = [pytest.mark.slow]

RW, PEER = "rw-token-shares-0000", "peer-token-shares-000"
EX = "http://example.org/"
H = {"Authorization": f"Bearer {RW}"}


class Replicas:
    def __init__(self, fleet: Fleet, ports: list[int], args: list[list[str]], partitions: int) -> None:
        self.fleet, self.ports, self.args, self.partitions = fleet, ports, args, partitions
        self.urls = [f"http://127.0.0.1:{p}" for p in ports]

    def start(self, i: int) -> None:
        self.fleet.start(f"gw{i}", "gateway", *self.args[i])
        wait_for(lambda: _ready(self.urls[i]), 60, f"gateway replica {i} ready")

    def holder(self, query_id: str) -> int:
        return query_partition(query_id, self.partitions) % 2

    def get(self, i: int, path: str, **kw: Any) -> requests.Response:
        return requests.get(self.urls[i] + path, headers={**H, **kw.pop("headers", {})}, timeout=60, **kw)

    def update(self, text: str) -> None:
        reply = requests.post(self.urls[0] + "/update", data=text.encode(), timeout=60,
                              headers={**H, "Content-Type": "application/sparql-update"})
        assert reply.status_code in (200, 204), reply.text


def _ready(url: str) -> bool:
    try:
        return requests.get(url + "/readyz", timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


@pytest.fixture(scope="module")
def replicas(kafka_broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    tmp = tmp_path_factory.mktemp("shares")
    settings = fresh_settings(kafka_broker)
    ensure_topics(settings)
    (tmp / "tokens").write_text(f"{RW} read-write\n")
    (tmp / "peer").write_text(PEER + "\n")
    ports = [free_port(), free_port()]
    peers = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    args = [["--port", str(ports[i]), "--tokens-file", str(tmp / "tokens"), "--share", f"{i}/2", "--peers", peers,
             "--peer-token-file", str(tmp / "peer")] for i in range(2)]
    with Fleet(settings, tmp / "logs") as fleet:
        fleet.start("ingest", "ingest", "--instance-id", "i1")
        fleet.start("registry", "registry", "--web-port", str(free_port()), "--state-dir", str(tmp / "state"))
        fleet.start("w0", "worker", "--worker-id", "w0")
        fleet.start("answers", "answers", "--instance-id", "a1")
        r = Replicas(fleet, ports, args, len(end_offsets(settings, settings.topic("answers"))))
        r.start(0)
        r.start(1)
        for _ in range(4):  # the registry (a faust app) takes a while to come up
            reply = requests.post(r.urls[1] + "/queries", headers=H, timeout=60,
                                  json={"id": "warmup", "sparql": f"SELECT ?x WHERE {{ ?x <{EX}warm> ?y }}"})
            if reply.status_code == 201:
                break
        assert reply.status_code == 201, reply.text
        yield r


def _ids(r: Replicas, holder: int, count: int, prefix: str) -> list[str]:
    ids = [f"{prefix}-{n}" for n in range(200) if r.holder(f"{prefix}-{n}") == holder]
    return ids[:count]


def _register(r: Replicas, query_id: str, predicate: str) -> None:
    reply = requests.post(r.urls[0] + "/queries", headers=H, timeout=60, json={
        "id": query_id, "sparql": f"SELECT ?s ?o WHERE {{ ?s <{EX}{predicate}> ?o }}"})
    assert reply.status_code == 201, reply.text
    wait_for(lambda: r.get(1, f"/queries/{query_id}").status_code == 200, 30, f"{query_id}'s plan at replica 1")


def _sse(r: Replicas, i: int, query_id: str) -> list[tuple[int, str, str]]:
    reply = r.get(i, f"/queries/{query_id}/answers?from=1&live=false")
    assert reply.status_code == 200, reply.text
    events = [json.loads(line[5:]) for line in reply.text.splitlines() if line.startswith("data:")]
    return [(e["n"], e["sign"], json.dumps(e["binding"], sort_keys=True)) for e in events]


def test_each_replica_holds_its_share_and_either_serves_every_query_alike(replicas: Replicas) -> None:
    r = replicas
    queries = _ids(r, 0, 3, "share") + _ids(r, 1, 3, "share")
    for n, query_id in enumerate(queries):
        _register(r, query_id, f"p{n}")
    for n in range(len(queries)):
        r.update(f"INSERT DATA {{ <{EX}a> <{EX}p{n}> <{EX}b> . <{EX}a> <{EX}p{n}> <{EX}c> }}")
    r.update(f"DELETE DATA {{ <{EX}a> <{EX}p0> <{EX}b> . <{EX}a> <{EX}p4> <{EX}c> }}")
    for query_id in queries:
        want = 3 if query_id in (queries[0], queries[4]) else 2
        holder = r.holder(query_id)
        wait_for(lambda: r.get(holder, f"/queries/{query_id}").json()["answers"] == want, 60,
                 f"{want} answers of {query_id} at replica {holder}")
    for query_id in queries:
        holder = r.holder(query_id)
        described = [r.get(i, f"/queries/{query_id}").json() for i in (0, 1)]
        assert [d["held"] for d in described] == [holder == 0, holder == 1]
        direct, relayed = _sse(r, holder, query_id), _sse(r, 1 - holder, query_id)
        assert direct == relayed and [n for n, _s, _b in direct] == list(range(1, len(direct) + 1))
        currents = [r.get(i, f"/queries/{query_id}/current", headers={
            "Accept": "application/sparql-results+json"}).json()["results"]["bindings"] for i in (0, 1)]
        assert currents[0] == currents[1] and len(currents[0]) == (1 if query_id in (queries[0], queries[4]) else 2)
    # Between them the replicas read every answer record once (a follower's copies come from the holder).
    read = [metric_total(r.urls[i] + "/metrics", "cbgp_gateway_answers_read_total") for i in (0, 1)]
    total = sum(r.get(r.holder(q), f"/queries/{q}").json()["answers"] for q in [*queries, "warmup"])
    assert read[0] > 0 and read[1] > 0 and sum(read) == total


def test_a_sepa_subscriber_of_the_other_replica_gets_added_then_removed_bindings(replicas: Replicas) -> None:
    from sepy.SEPA import SEPA

    r = replicas
    query_id = _ids(r, 1, 1, "sepa-share")[0]
    _register(r, query_id, "likes")
    r.update(f"INSERT DATA {{ <{EX}ann> <{EX}likes> <{EX}tea> }}")
    wait_for(lambda: r.get(1, f"/queries/{query_id}").json()["answers"] == 1, 60, "the first answer")
    got: queue.Queue = queue.Queue()
    client = SEPA(logLevel=logging.CRITICAL)
    client.sparql_subscribe(f"SELECT ?s ?o WHERE {{ ?s <{EX}likes> ?o }}", "likes",
                            handler=lambda added, removed: got.put((added, removed)),
                            host=r.urls[0].replace("http", "ws") + f"/subscribe?access_token={RW}")
    row = {"s": {"type": "uri", "value": EX + "ann"}, "o": {"type": "uri", "value": EX + "tea"}}
    assert got.get(timeout=30) == ([row], [])  # the current answers, copied from replica 1
    r.update(f"INSERT DATA {{ <{EX}bob> <{EX}likes> <{EX}tea> }}")
    assert got.get(timeout=30) == ([{**row, "s": {"type": "uri", "value": EX + "bob"}}], [])
    r.update(f"DELETE DATA {{ <{EX}ann> <{EX}likes> <{EX}tea> }}")
    assert got.get(timeout=30) == ([], [row])
    assert got.empty()


def test_a_replica_asked_as_holder_of_a_query_it_does_not_hold_refuses(replicas: Replicas) -> None:
    r = replicas
    query_id = _ids(r, 1, 1, "misdirected")[0]
    _register(r, query_id, "misdirected")
    reply = r.get(0, f"/replica/queries/{query_id}", headers={"X-CBGP-Relay": "1"})
    assert reply.status_code == 421 and "replica 1 does" in reply.json()["detail"]
    assert r.get(1, f"/replica/queries/{query_id}", headers={"X-CBGP-Relay": "1"}).status_code == 200
    assert requests.get(r.urls[1] + f"/replica/queries/{query_id}", timeout=10).status_code == 401


def test_a_follower_goes_on_from_the_next_answer_when_the_holder_comes_back(replicas: Replicas) -> None:
    r = replicas
    followed, other = _ids(r, 1, 2, "restart")
    _register(r, followed, "restarted")
    _register(r, other, "other")
    r.update(f"INSERT DATA {{ <{EX}x1> <{EX}restarted> <{EX}y> }}")
    events: queue.Queue = queue.Queue()
    stop = threading.Event()

    def listen() -> None:
        try:
            with requests.get(r.urls[0] + f"/queries/{followed}/answers?from=1", headers=H, stream=True,
                              timeout=120) as reply:
                for line in reply.iter_lines():
                    if stop.is_set():
                        return
                    if line.startswith(b"data:"):
                        events.put(json.loads(line[5:]))
        except requests.RequestException:
            pass  # (the fleet stopping at the module's end)

    threading.Thread(target=listen, daemon=True).start()
    assert events.get(timeout=30)["n"] == 1
    r.fleet.stop("gw1")
    reply = r.get(0, f"/queries/{other}/answers?from=1&live=false")
    assert reply.status_code == 502 and r.urls[1] in reply.json()["detail"]
    r.update(f"INSERT DATA {{ <{EX}x2> <{EX}restarted> <{EX}y> }}")
    r.update(f"DELETE DATA {{ <{EX}x1> <{EX}restarted> <{EX}y> }}")
    r.start(1)
    got = [events.get(timeout=60), events.get(timeout=60)]
    holder_metrics = r.urls[0] + "/metrics"
    assert metric_total(holder_metrics, "cbgp_gateway_relay_failures_total") > 0
    assert metric_total(holder_metrics, "cbgp_gateway_relays") >= 2
    assert [(e["n"], e["sign"], e["binding"]["s"]["value"]) for e in got] == [(2, "+", EX + "x2"), (3, "-", EX + "x1")]
    time.sleep(1.0)
    assert events.empty()
    stop.set()
    assert _sse(r, 0, other) == []  # (the other query: its follower started once the holder was back)
