"""SERVICE through the fleet: a query joining a mention stream with follower counts on a real Virtuoso
endpoint, the fleet as real processes on the embedded broker (ingest, worker, answers, background).

The background service fills the view graph, a count changes on Virtuoso through SPARQL Update, and after the
refresh that sees it the affected answers are retracted and asserted again; at every check the current answers
equal pyoxigraph's evaluation of the query with SERVICE answered from the endpoint's data at that moment.  A
restart of the background service re-fills the view and costs no answer; unregistering drops the graph."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pyoxigraph as ox
import pytest

from cbgp.background.endpoint import start_endpoint, virtuoso_available
from cbgp.background.remote import SparqlRemote
from services.kafka.config import KafkaSettings
from tests.derived_support import answers
from tests.fleet_support import Fleet, publish_patch, publish_plan, read_answers, read_current, unpublish_plan

pytestmark = [pytest.mark.slow]

EX = "http://example.org/"
BKG = f"{EX}bkg"
USERS = 6


def query(endpoint: str) -> str:
    return f"""PREFIX ex: <{EX}>
SELECT ?post ?user ?followers WHERE {{
  ?post ex:mentions ?user .
  SERVICE <{endpoint}> {{ ?user ex:hasFollowers ?followers . ?user ex:name ?name }}
}}"""


def stream() -> list[str]:
    lines = [f"A <{EX}post/{i}> <{EX}mentions> <{EX}user/{i % USERS}> ." for i in range(12)]
    lines += [f"D <{EX}post/3> <{EX}mentions> <{EX}user/3> .", f"A <{EX}post/3> <{EX}mentions> <{EX}user/3> .",
              f"D <{EX}post/11> <{EX}mentions> <{EX}user/5> ."]
    return lines


def oracle(lines: list[str], remote: SparqlRemote, endpoint: str) -> Counter:
    """The query over the stream's graph, with SERVICE answered by the endpoint's data now (read back from it)."""
    present: set = set()
    for line in lines:
        s, p, o = line[2:-2].split(" ", 2)
        (present.add if line[0] == "A" else present.discard)((s, p, o))
    store = ox.Store()
    store.extend(ox.Quad(ox.NamedNode(s[1:-1]), ox.NamedNode(p[1:-1]), ox.NamedNode(o[1:-1])) for s, p, o in present)
    remote_graph = ox.NamedNode(BKG)
    for binding in remote._select(f"SELECT ?s ?p ?o WHERE {{ GRAPH <{BKG}> {{ ?s ?p ?o }} }}"):
        terms = [ox.NamedNode(binding[v]["value"]) if binding[v]["type"] == "uri" else
                 ox.Literal(binding[v]["value"], datatype=ox.NamedNode(binding[v]["datatype"])
                            if "datatype" in binding[v] else None) for v in ("s", "p", "o")]
        store.add(ox.Quad(*terms, remote_graph))
    return answers(store, query(endpoint).replace(f"SERVICE <{endpoint}>", f"GRAPH <{BKG}>"))


def wait_current(settings: KafkaSettings, want: Counter, timeout: float) -> Counter:
    deadline = time.monotonic() + timeout
    got: Counter = Counter()
    while time.monotonic() < deadline:
        got = read_current(settings).get("mentions", Counter())
        if got == want:
            return got
        time.sleep(0.5)
    return got


def followers(record: dict) -> str:
    return json.loads(record["key"])["followers"].split('"')[1]


def set_followers(remote: SparqlRemote, user: int, count: int) -> None:
    u = f"<{EX}user/{user}>"
    remote.update(f"DELETE {{ GRAPH <{BKG}> {{ {u} <{EX}hasFollowers> ?old }} }} "
                  f"INSERT {{ GRAPH <{BKG}> {{ {u} <{EX}hasFollowers> {count} }} }} "
                  f"WHERE {{ GRAPH <{BKG}> {{ {u} <{EX}hasFollowers> ?old }} }}")


@pytest.mark.timeout(400)
def test_a_background_change_on_virtuoso_retracts_and_reasserts_the_answers_it_affects(
        kafka_settings: KafkaSettings, tmp_path: Path) -> None:
    if not virtuoso_available():
        pytest.fail("virtuoso-opensource is not installed: `make virtuoso` installs it (make test does)")
    with start_endpoint("virtuoso", writable=True) as endpoint:  # changed over HTTP, as a remote client would
        remote = SparqlRemote(endpoint.query_url, "?s ?p ?o", "s", update_endpoint=endpoint.update_url)
        data = " ".join(f"<{EX}user/{i}> <{EX}hasFollowers> {100 * i} . <{EX}user/{i}> <{EX}name> \"u{i}\" ."
                        for i in range(USERS - 1))  # user 5 is not on the endpoint: no answer for its posts
        remote.update(f"INSERT DATA {{ GRAPH <{BKG}> {{ {data} }} }}")
        lines = stream()
        text = query(endpoint.query_url)
        with Fleet(kafka_settings, tmp_path / "logs") as fleet:
            publish_plan(kafka_settings, "mentions", text,
                         options={"service.refresh_ms": "1000", "service.policy": "GNR-LRU", "service.rho_ms": "2000"})
            fleet.start("ingest", "ingest", "--instance-id", "i1")
            fleet.start("w0", "worker", "--worker-id", "w0")
            fleet.start("answers", "answers", "--instance-id", "a1")
            fleet.start("background", "background")
            publish_patch(kafka_settings, lines)
            want = oracle(lines, remote, endpoint.query_url)
            assert len(want) == 10  # 12 posts, less those of user 5 (not on the endpoint); post 3 re-added
            assert wait_current(kafka_settings, want, 120) == want, "answers != pyoxigraph over stream + endpoint"

            set_followers(remote, 2, 777)  # posts 2 and 8 mention user 2
            changed = oracle(lines, remote, endpoint.query_url)
            assert changed != want
            assert wait_current(kafka_settings, changed, 60) == changed, "the refresh did not reach the answers"
            records = [r for r in read_answers(kafka_settings)["mentions"]]
            retracted = [r for r in records if r["sign"] == "-" and followers(r) == "200"]
            asserted = [r for r in records if r["sign"] == "+" and followers(r) == "777"]
            assert len(retracted) == 2 and len(asserted) == 2
            assert max(r["n"] for r in retracted) < min(r["n"] for r in asserted)  # retract, then re-assert

            before = len(records)
            fleet.stop("background")  # a restart re-fills the view: ingest nets it to nothing
            fleet.start("background2", "background")
            time.sleep(6)
            assert len(read_answers(kafka_settings)["mentions"]) == before, "a restart changed the answers"

            unpublish_plan(kafka_settings, "mentions")  # the view graph is dropped with its last query
            deadline = time.monotonic() + 60
            while "event=view-dropped" not in fleet.log_text("background2"):
                assert time.monotonic() < deadline, "the background service did not drop the view"
                time.sleep(0.5)
