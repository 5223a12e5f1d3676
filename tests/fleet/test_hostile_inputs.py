"""Hostile input through every door of a running fleet (Kafka records, admin commands, HTTP, slow clients), as a
user or an attacker could send it: each is refused in one line, no service stops, and the good input around the
bad is answered exactly (compared with ``cbgp replay`` of the good input alone).

One fleet (ingest, registry, worker, answers, gateway) on the embedded broker, shared by the steps of one test so
that each step also proves the services survived the ones before."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest
import requests

from services import codec
from services.client.requests import admin_request
from services.kafka.broker import free_port
from services.kafka.client import make_producer, read_all
from services.kafka.topics import ensure_topics
from tests.fixtures.broker import fresh_settings
from tests.fleet_support import EX, Fleet, final_answers, replay, wait_answers, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

TOKEN = "hostile-test-token-0123456789"
DEEP = "SELECT * WHERE " + "{ " * 2500 + f"?s <{EX}p> ?o" + " }" * 2500
STAR = f"SELECT ?s ?n WHERE {{ ?s <{EX}name> ?n . ?s <{EX}type> <{EX}Person> }}"


def good(i: int) -> list[str]:
    return [f"A <{EX}s{i}> <{EX}name> \"name {i}\" .", f"A <{EX}s{i}> <{EX}type> <{EX}Person> ."]


def produce(settings: Any, value: bytes, headers: dict[str, bytes] | None = None) -> None:
    producer = make_producer(settings)
    producer.produce(settings.topic("updates.raw"), value, headers=list((headers or {}).items()))
    assert producer.flush(30) == 0


def dead_letters(settings: Any) -> list[dict]:
    return [codec.decode("DeadLetter", m.value()) for m in read_all(settings, settings.topic("deadletter"))]


def alive(fleet: Fleet) -> None:
    dead = {name: proc.returncode for name, proc in fleet.procs.items() if proc.poll() is not None}
    assert not dead, f"services stopped: {dead}; " + " | ".join(fleet.log_text(n)[-800:] for n in dead)


def test_hostile_records_queries_and_requests_stop_nothing_and_the_good_input_is_answered(
        kafka_broker: Any, tmp_path: Path) -> None:
    settings = fresh_settings(kafka_broker)
    ensure_topics(settings)
    (tmp_path / "tokens").write_text(f"{TOKEN} read-write\n")
    with Fleet(settings, tmp_path / "logs") as fleet:
        fleet.start("ingest", "ingest", "--instance-id", "i1")
        fleet.start("registry", "registry", "--web-port", str(free_port()), "--state-dir", str(tmp_path / "state"))
        fleet.start("w0", "worker", "--worker-id", "w0")
        fleet.start("answers", "answers", "--instance-id", "a1")
        fleet.start("gateway", "gateway", "--port", "0", "--tokens-file", str(tmp_path / "tokens"),
                    "--slow-client-timeout", "2", "--max-connections-per-client", "4", "--query-timeout", "5")
        port = wait_for(lambda: re.search(r"event=started port=(\d+)", fleet.log_text("gateway")), 60, "gateway")
        url = f"http://127.0.0.1:{port.group(1)}"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        wait_for(lambda: requests.get(url + "/readyz", timeout=5).status_code == 200, 60, "gateway ready")

        # -- admin commands (the registry parses them): each refused in one line, the registry answers on
        register = lambda qid, text, **o: admin_request(  # noqa: E731
            settings, {"command": "REGISTER", "query_id": qid, "sparql": text, "options": o}, wait=60)
        status = wait_for(lambda: register("star", STAR), 120, "the registry's first reply")
        assert status["status"] == "ACCEPTED", status
        refused = {
            "deep": register("deep", DEEP),  # segfaulted the parser, which the registry runs on every restart
            "product": register("product", "SELECT * WHERE { ?a ?b ?c . ?d ?e ?f }"),
            "wide": register("wide", "SELECT * WHERE { " + " ".join(f"?s <{EX}p{i}> ?o{i} ." for i in range(20))
                             + " }"),
            # a sequence path of 400 steps: as many patterns once rewritten, whose plan took the registry 7 s
            "long_path": register("long_path", f"PREFIX : <{EX}> SELECT * WHERE {{ ?x " + "/".join([":p"] * 400)
                                  + " ?y }"),
            # an IN list of 8,000 numbers: rdflib's parser took 23 s over it, and a worker as long again
            "long_in": register("long_in", f"SELECT * WHERE {{ ?s <{EX}p> ?o FILTER(?o IN ("
                                + ", ".join(map(str, range(8000))) + ")) }"),
            "ssrf": register("ssrf", f"SELECT * WHERE {{ ?s <{EX}name> ?n SERVICE <http://169.254.169.254/x> "
                                     f"{{ ?s <{EX}p> ?v }} }}"),
        }
        producer = make_producer(settings)  # not even an AdminCommand: Avro's header, then invalid UTF-8
        producer.produce(settings.topic("admin"), codec.encode("AdminCommand", {"command": "LIST"})[:10] + b"\xff\xfe")
        assert producer.flush(30) == 0
        for name, reply in refused.items():
            assert reply["status"] == "REJECTED", (name, reply)
            assert "\n" not in reply["message"] and len(reply["message"]) < 400, (name, reply["message"])
        assert "CBGP_MAX_QUERY_NESTING" in refused["deep"]["message"]
        assert "cross product" in refused["product"]["message"]
        assert "CBGP_MAX_RECORD_BYTES" in refused["wide"]["message"]
        assert "CBGP_SERVICE_ALLOW" in refused["ssrf"]["message"]
        assert "CBGP_MAX_QUERY_PATTERNS" in refused["long_path"]["message"]
        assert "CBGP_MAX_QUERY_TOKENS" in refused["long_in"]["message"]
        # a valid query whose pattern a backtracking engine takes years over on a name of 64 letters (below)
        redos = register("redos", f'SELECT ?s WHERE {{ ?s <{EX}name> ?n FILTER(REGEX(?n, "^(a+)+$")) }}')
        assert redos["status"] == "ACCEPTED", redos
        alive(fleet)

        # -- records on updates.raw: bad ones among good ones
        good_lines: list[str] = []
        lines = good(0)
        good_lines += lines
        produce(settings, ("\n".join(lines) + "\n").encode(), {"cbgp-format": b"patch"})
        surrogate = json.dumps({"op": "+", "s": f"<{EX}s1>", "p": f"<{EX}name>", "o": '"x\ud800y"'})
        ok = json.dumps({"op": "+", "s": f"<{EX}s1>", "p": f"<{EX}type>", "o": f"<{EX}Person>"})
        name = json.dumps({"op": "+", "s": f"<{EX}s1>", "p": f"<{EX}name>", "o": '"name 1"'})
        produce(settings, "\n".join([surrogate, ok, name]).encode() + b"\n", {"cbgp-format": b"jsonl"})
        good_lines += good(1)
        # 12,500 answers of ~0.5 KB (more than the sockets buffer, for the slow client below), in records of ~1 MB,
        # one with a bad line in its middle
        padding = "x" * 400
        many = [f"A <{EX}s2> <{EX}type> <{EX}Person> ."] + [f"A <{EX}s2> <{EX}name> \"n{i} {padding}\" ."
                                                            for i in range(12_500)]
        many[4500] = "A this is not RDF ."
        for start in range(0, len(many), 2000):
            produce(settings, ("\n".join(many[start:start + 2000]) + "\n").encode(), {"cbgp-format": b"patch"})
        good_lines += [line for i, line in enumerate(many) if i != 4500]
        produce(settings, b"oops\n" * 10_000, {"cbgp-format": b"patch"})  # ten thousand bad lines
        big = "x" * 70_000
        produce(settings, f'A <{EX}s3> <{EX}name> "{big}" .\n'.encode(), {"cbgp-format": b"patch"})
        produce(settings, f"INSERT {{ ?a <{EX}q> ?d }} WHERE {{ ?a ?b ?c . ?d ?e ?f }}".encode(),
                {"content-type": b"application/sparql-update"})  # |G|^2 changes
        produce(settings, ("INSERT DATA { " + "{ " * 3000 + " }" * 3000 + " }").encode(),
                {"content-type": b"application/sparql-update"})
        produce(settings, codec.MAGIC + b"\x00" * 8 + b"garbage")  # an Avro header and nothing valid
        produce(settings, bytes(range(256)) * 4, {"cbgp-format": b"ntriples"})
        lines = [f'A <{EX}s5> <{EX}name> "{"a" * 64}!" .', *good(4)]  # the name "redos" matches against, then more
        good_lines += lines
        produce(settings, ("\n".join(lines) + "\n").encode(), {"cbgp-format": b"patch"})

        expected = replay(tmp_path, good_lines, {"star": STAR})
        got = wait_answers(settings, {"star": len(expected["star"])}, timeout=180)
        assert final_answers((a["sign"], a["key"]) for a in got["star"]) == final_answers(expected["star"])
        assert not got.get("redos")  # (no name matches: the worker answered, and nothing)
        letters = wait_for(lambda: (d := dead_letters(settings)) and len(d) >= 107 and d, 60, "dead letters")
        reasons = [d["reason"] for d in letters]
        assert reasons.count("too-many-errors") == 1 and "term-too-large" in reasons
        assert sum(1 for d in letters if d["reason"] == "invalid-update") == 2
        assert all(len(codec.encode("DeadLetter", d)) < 4096 for d in letters)  # excerpts, never whole records
        alive(fleet)

        # -- HTTP: refused in one line, the gateway serves on
        def get_query(text: str) -> requests.Response:  # (POSTed: a 10 KB text is over a URL's line)
            return requests.post(url + "/query", data=text.encode(), timeout=30,
                                 headers={**auth, "Content-Type": "application/sparql-query"})

        deep = get_query(DEEP)
        assert deep.status_code == 400 and "CBGP_MAX_QUERY_NESTING" in deep.json()["detail"]
        ssrf = get_query("SELECT * WHERE { SERVICE <http://169.254.169.254/latest> { ?s ?p ?o } }")
        assert ssrf.status_code == 403 and "CBGP_SERVICE_ALLOW" in ssrf.json()["detail"]
        product = get_query("SELECT * WHERE { ?a ?b ?c . ?d ?e ?f }")
        assert product.status_code == 400 and "cross product" in product.json()["detail"]
        update = requests.post(url + "/update", data=DEEP.replace("SELECT *", "DELETE WHERE").encode(),
                               headers={**auth, "Content-Type": "application/sparql-update"}, timeout=30)
        assert update.status_code == 400
        assert requests.get(url + "/queries", timeout=10).status_code == 401
        wrong = requests.get(url + "/queries", headers={"Authorization": "Bearer nope-nope-nope-nope"}, timeout=10)
        assert wrong.status_code == 401 and wrong.json()["detail"] == "the bearer token is not valid"

        # -- connections: at most 4 from one client; one that never reads is evicted, the others go on
        lazy = socket.socket()
        lazy.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        lazy.connect(("127.0.0.1", int(port.group(1))))
        lazy.sendall(f"GET /queries/star/answers?from=1&access_token={TOKEN} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        streams = [requests.get(url + "/queries/star/answers?live=true", headers=auth, stream=True, timeout=30)
                   for _ in range(3)]
        assert all(s.status_code == 200 for s in streams)
        over = requests.get(url + "/queries/star/answers", headers=auth, timeout=30)
        assert over.status_code == 429 and "--max-connections-per-client" in over.json()["detail"]
        for s in streams:
            s.close()
        metrics = lambda: requests.get(url + "/metrics", timeout=10).text  # noqa: E731
        wait_for(lambda: re.search(r'cbgp_gateway_evicted_total\{kind="sse"\} [1-9]', metrics()), 60,
                 "the client that never reads evicted")
        lazy.close()
        current = requests.get(url + "/queries/star/current", headers=auth, timeout=30)
        assert current.status_code == 200 and len(current.json()["results"]["bindings"]) == \
            sum(final_answers(expected["star"]).values())
        alive(fleet)
