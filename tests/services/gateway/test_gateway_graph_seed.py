"""The gateway's ``/query`` graph starts from ingest's snapshot in Kafka (a reader of updates.encoded
that no longer needs it from offset 0).

A real fleet (ingest checkpointing after every transaction, a gateway): triples go in through ``/update``, the
records of updates.encoded below ingest's last snapshot are deleted (``delete_records``, as retention would), one
more change comes, and a gateway started then answers ``/query`` exactly as pyoxigraph does over every change:
the snapshot's triples and the tail's.  Read from offset 0 instead, the deleted records' triples would be missing.
A gateway whose graph stood below the deleted records is seeded again on its next ``/query``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyoxigraph as ox
import pytest
import requests
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from services.kafka.client import end_offsets
from services.kafka.topics import ensure_topics
from tests.fixtures.broker import fresh_settings
from tests.fleet_support import Fleet, ingest_snapshot_at_end, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

EX = "http://example.org/"
TOKEN = "seed-rw-0123456789"


def _gateway(fleet: Fleet, name: str, tokens: Path) -> str:
    fleet.start(name, "gateway", "--port", "0", "--host", "127.0.0.1", "--tokens-file", str(tokens))
    started = wait_for(lambda: re.search(r"event=started port=(\d+)", fleet.log_text(name)), 60.0, f"{name} started")
    port = started.group(1)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: requests.get(url + "/readyz", timeout=5).status_code == 200, 60.0, f"{name} ready")
    return url


def test_a_gateway_answers_query_from_ingests_snapshot_after_the_log_below_it_was_deleted(
        kafka_broker: Any, tmp_path: Path) -> None:
    settings = fresh_settings(kafka_broker)
    ensure_topics(settings)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN} read-write\n")
    auth = {"Authorization": f"Bearer {TOKEN}"}
    oracle = ox.Store()
    updates = [f"INSERT DATA {{ <{EX}p{i}> <{EX}age> {20 + i} . <{EX}p{i}> <{EX}name> \"p {i}\"@en }}"
               for i in range(12)]
    updates += [f"DELETE DATA {{ <{EX}p3> <{EX}age> 23 }}", f"INSERT DATA {{ <{EX}p3> <{EX}age> 33 }}"]
    encoded = settings.topic("updates.encoded")
    with Fleet(settings, tmp_path / "logs") as fleet:
        fleet.start("ingest", "ingest", "--instance-id", "i1", "--checkpoint-interval", "0",
                    "--state-dir", str(tmp_path / "state"))
        first = _gateway(fleet, "gateway", tokens)
        text = "SELECT ?s ?p ?o WHERE { ?s ?p ?o }"

        def rows(url: str) -> set[tuple[str, str, str]]:
            reply = requests.post(url + "/query", data=text, timeout=60,
                                  headers={**auth, "Content-Type": "application/sparql-query"})
            assert reply.status_code == 200, reply.text
            return {(b["s"]["value"], b["p"]["value"], b["o"]["value"]) for b in reply.json()["results"]["bindings"]}

        for i, update in enumerate(updates):
            reply = requests.post(first + "/update", data=update.encode(), timeout=30,
                                  headers={**auth, "Content-Type": "application/sparql-update"})
            assert reply.status_code == 200, reply.text
            oracle.update(update)
            if i == 5:  # the first gateway's graph reads the log this far
                wait_for(lambda: len(rows(first)) == 12, 60.0, "the first gateway's graph of 6 updates")

        changes = 12 * 2 + 2  # (ingest numbers every change: its snapshot of them all is at this seq)
        position = wait_for(lambda: ingest_snapshot_at_end(settings, changes), 60.0,
                            "ingest's snapshot of every change").position
        admin = AdminClient(settings.admin_config())
        for future in admin.delete_records([TopicPartition(encoded, 0, position)], request_timeout=10).values():
            future.result(10)
        assert end_offsets(settings, encoded)[0][0] == position
        tail = f"INSERT DATA {{ <{EX}p99> <{EX}age> 99 }}"
        assert requests.post(first + "/update", data=tail.encode(), timeout=30,
                             headers={**auth, "Content-Type": "application/sparql-update"}).status_code == 200
        oracle.update(tail)
        wait_for(lambda: end_offsets(settings, encoded)[0][1] > position, 60.0, "the tail's change in updates.encoded")

        second = _gateway(fleet, "gateway-2", tokens)
        expected = {(s.value, p.value, o.value) for s, p, o in oracle.query(text)}
        assert len(expected) == 12 * 2 + 1
        assert rows(second) == expected
        assert "seeded from ingest's snapshot" in fleet.log_text("gateway-2")
        # The first gateway's graph stood below what was deleted: it is seeded again, not left without the records.
        assert rows(first) == expected
        assert "deleted below the /query graph's position: seeding it again" in fleet.log_text("gateway")
