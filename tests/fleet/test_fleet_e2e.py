"""The fleet end to end: ingest, workers and answers as real processes on the embedded broker, their
answers compared with ``cbgp replay`` (the reference) as multisets per query, numbering checked gap-free."""

from __future__ import annotations

import re
import shutil
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from cbgp.query.plan import BY_CENTRE, decompose
from cbgp.query.sparql import parse_query
from services import codec
from services.kafka.config import KafkaSettings
from services.kafka.topics import ensure_topics
from services.kafka.client import make_producer, produce_sync, read_all
from tests.fixtures.broker import fresh_settings
from tests.fleet_support import (EX, QUERIES, Fleet, final_answers, generate_patch, metric_total, publish_patch,
                                 publish_plan, read_answers, read_current, replay, unpublish_plan, wait_answers)

pytestmark = [pytest.mark.slow]


def assert_matches(got: dict[str, list[dict]], expected: dict[str, list[tuple[str, str]]]) -> None:
    for query, deltas in expected.items():
        answers = got.get(query, [])
        assert [a["n"] for a in answers] == list(range(1, len(answers) + 1)), f"{query}: numbering has gaps/repeats"
        assert Counter((a["sign"], a["key"]) for a in answers) == Counter(deltas), f"{query}: deltas differ"
        live = [a["seq"] for a in answers if not a["snapshot"]]
        assert live == sorted(live), f"{query}: live answers not in seq order"


def assert_current(settings: KafkaSettings, expected: dict[str, list[tuple[str, str]]]) -> None:
    current = read_current(settings)
    for query, deltas in expected.items():
        assert current.get(query, Counter()) == final_answers(deltas), f"{query}: answers.current differs"


def two_halves(tmp_path: Path, seed: int) -> tuple[list[str], list[str], dict, dict]:
    """A 3,000-update stream split in two, with the replay's deltas for all of it and for its first half."""
    lines = generate_patch(3000, seed=seed)
    return lines[:1500], lines[1500:], replay(tmp_path, lines, QUERIES), replay(tmp_path, lines[:1500], QUERIES)


def assert_final(settings: KafkaSettings, expected: dict[str, list[tuple[str, str]]]) -> None:
    """Once every expected delta arrived (and a moment more, for duplicates), the answers are exactly them."""
    wait_answers(settings, {q: len(d) for q, d in expected.items()})
    time.sleep(1.0)  # anything duplicated would arrive right after the expected count
    assert_matches(read_answers(settings), expected)
    assert_current(settings, expected)


def start_fleet(fleet: Fleet, workers: int) -> None:
    fleet.start("ingest", "ingest", "--instance-id", "i1")
    for i in range(workers):
        fleet.start(f"w{i}", "worker", "--worker-id", f"w{i}")
    fleet.start("answers", "answers", "--instance-id", "a1")


def committed_metadata(settings: KafkaSettings, group: str, topic: str) -> dict[int, str]:
    """The metadata of ``group``'s committed offsets of ``topic``, per partition it committed."""
    from confluent_kafka import TopicPartition

    from services.kafka.client import end_offsets, make_consumer

    name = settings.topic(topic)
    consumer = make_consumer(settings, f"{settings.topic_prefix}{group}")
    try:
        committed = consumer.committed([TopicPartition(name, p) for p in end_offsets(settings, name)], timeout=10)
    finally:
        consumer.close()
    return {tp.partition: tp.metadata or "" for tp in committed if tp.offset >= 0}


def query_state(url: str, query: str) -> float | None:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    found = re.search(rf'^cbgp_query_state_entries\{{query="{query}"\}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else None


@pytest.mark.timeout(330)
@pytest.mark.parametrize("workers", [1, 3, 4])
def test_answers_equal_replay_as_multisets(kafka_settings: KafkaSettings, tmp_path: Path, workers: int) -> None:
    """Star, path, product and DISTINCT queries over 2500 updates (deletions, duplicates, absent deletes,
    literals): the same deltas as the replay, numbered 1..n, and answers.current = the final answers;
    with one worker, with three workers sharing the 4 routed partitions, and with four (one partition
    each: every worker must get through the group's rebalances, which failed when idle consumers kept
    the broker saturated)."""
    lines = generate_patch(2500, seed=workers)
    expected = replay(tmp_path, lines, QUERIES)
    assert all(expected.values()), "the generated stream must give every query some answers"
    with Fleet(kafka_settings, tmp_path / "logs") as fleet:
        for query, text in QUERIES.items():
            publish_plan(kafka_settings, query, text)
        start_fleet(fleet, workers)
        publish_patch(kafka_settings, lines)
        # Patience, not a speed check: on a loaded 2-core machine four workers' rebalances take a while.
        got = wait_answers(kafka_settings, {q: len(d) for q, d in expected.items()}, timeout=240)
        assert_matches(got, expected)
        assert_current(kafka_settings, expected)
        assert not any(a["snapshot"] for answers in got.values() for a in answers)
        for name in list(fleet.procs):
            fleet.stop_cleanly(name)


@pytest.mark.timeout(330)
def test_by_centre_queries_over_eight_partitions_equal_replay(kafka_broker, tmp_path: Path) -> None:
    """Eight routed partitions held by three workers: the by-centre queries (a star with an attribute
    variable, a 2-hop path, DISTINCT without the centre, a 3-hop path, a triangle and a snowflake joined by
    probes, products with a ground part and with a multi-centre part) spread over all of them, and the answers
    service releases their deltas in seq order; and, over quads in named graphs, a GRAPH ?g path and a DISTINCT
    star across graphs, evaluated per graph where their centre lives, a GRAPH ?g 3-hop path joined by probes
    per graph, and a DISTINCT GRAPH ?g product joined on the graph by the answers service."""
    settings = fresh_settings(kafka_broker, partitions=8)
    ensure_topics(settings)
    lines = generate_patch(2500, seed=8) + generate_patch(600, seed=9, subjects=12, graphs=3)
    queries = {**QUERIES, "snowflake": (
        f"SELECT * WHERE {{ ?a <{EX}knows> ?b . ?a <{EX}type> <{EX}Person> . ?b <{EX}likes> ?c . "
        f"?b <{EX}name> ?n . ?c <{EX}type> ?t }}"),
        "ground_gated": f"SELECT ?x WHERE {{ <{EX}s2> <{EX}type> <{EX}Person> . ?x <{EX}likes> <{EX}Jazz> }}",
        "paths_if_robot": (f"SELECT DISTINCT ?a WHERE {{ ?a <{EX}knows> ?b . ?b <{EX}knows> ?c . "
                           f"?c <{EX}likes> <{EX}Jazz> . ?y <{EX}type> <{EX}Robot> . ?y <{EX}likes> <{EX}Tea> }}"),
        "graph_path": f"SELECT * WHERE {{ GRAPH ?g {{ ?a <{EX}knows> ?b . ?b <{EX}likes> ?c }} }}",
        "graph_distinct": (f"SELECT DISTINCT ?x WHERE {{ GRAPH ?g {{ ?x <{EX}knows> ?y . "
                           f"?x <{EX}type> <{EX}Person> }} }}"),
        "graph_path3": (f"SELECT ?g ?a ?d WHERE {{ GRAPH ?g {{ ?a <{EX}knows> ?b . ?b <{EX}knows> ?c . "
                        f"?c <{EX}likes> ?d }} }}"),
        "graph_product": (f"SELECT DISTINCT ?x ?y WHERE {{ GRAPH ?g {{ ?x <{EX}type> <{EX}Person> . "
                          f"?y <{EX}likes> ?z }} }}")}
    for name in ("ground_gated", "paths_if_robot", "graph_path", "graph_distinct", "graph_path3", "graph_product"):
        assert decompose(parse_query(queries[name])).placement == BY_CENTRE, name
    assert decompose(parse_query(queries["graph_path3"])).probed
    expected = replay(tmp_path, lines, queries)
    with Fleet(settings, tmp_path / "logs") as fleet:
        for query, text in queries.items():
            publish_plan(settings, query, text)
        start_fleet(fleet, 3)
        publish_patch(settings, lines)
        got = wait_answers(settings, {q: len(d) for q, d in expected.items()}, timeout=240)
        assert_matches(got, expected)
        assert_current(settings, expected)
        # Each worker holds some routed partitions' state (a member that rejoined late under load may still
        # be restoring its share: its gauges are set once its shards are open).
        deadline = time.monotonic() + 30
        while True:
            held = [metric_total(fleet.metrics_url(f"w{i}"), "cbgp_state_entries") for i in range(3)]
            if sum(1 for entries in held if entries > 0) == 3 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert sum(1 for entries in held if entries > 0) == 3, f"state not spread over the workers: {held}"


@pytest.mark.timeout(180)
def test_query_registered_after_data_gets_snapshot_then_live_deltas(kafka_settings: KafkaSettings,
                                                                    tmp_path: Path) -> None:
    """A query registered once the data is processed first gets the replay's answers at that point as
    snapshot answers (from every partition holding its centres), then exactly the later live deltas."""
    first, second = generate_patch(2000, seed=11), generate_patch(600, seed=12)
    late = {"star": QUERIES["star"], "path": QUERIES["path"]}
    before = replay(tmp_path, first, {"product": QUERIES["product"], **late})
    whole = replay(tmp_path, first + second, late)
    with Fleet(kafka_settings, tmp_path / "logs") as fleet:
        publish_plan(kafka_settings, "product", QUERIES["product"])
        start_fleet(fleet, 2)
        publish_patch(kafka_settings, first)
        wait_answers(kafka_settings, {"product": len(before["product"])})  # the workers are past the data
        graph_seq = max(c["seq"] for m in read_all(kafka_settings, kafka_settings.topic("updates.encoded"))
                        for c in codec.encoded_records(m.value()))
        for query, text in late.items():
            publish_plan(kafka_settings, query, text)
        snapshot = {q: final_answers(before[q]) for q in late}
        got = wait_answers(kafka_settings, {q: sum(snapshot[q].values()) for q in late})
        for query in late:
            assert all(a["snapshot"] and a["sign"] == "+" for a in got[query])
            assert Counter(a["key"] for a in got[query]) == snapshot[query], f"{query}: snapshot differs"
            # labelled with the graph's seq they are as of, not the registry's count of encoded records
            # Labelled with the seq they are as of (the last change each partition applied; a partition
            # restored in a rebalance knows no later frontier), not the registry's count of encoded records.
            seqs = Counter(a["seq"] for a in got[query])
            assert all(graph_seq - 60 <= seq <= graph_seq for seq in seqs), f"{query}: snapshot seqs {seqs}"
        publish_patch(kafka_settings, second)
        live = {q: [d for d in whole[q]] for q in late}
        # The replay of first+second ends at the same answers as snapshot + live deltas of the second part.
        got = wait_answers(kafka_settings, {q: sum(snapshot[q].values()) + len(live[q]) - len(before[q])
                                            for q in late})
        for query in late:
            answers = got[query]
            assert [a["n"] for a in answers] == list(range(1, len(answers) + 1))
            live_part = Counter((a["sign"], a["key"]) for a in answers if not a["snapshot"])
            assert live_part == Counter(live[query]) - Counter(before[query]), f"{query}: live deltas differ"
            final = Counter()
            for a in answers:
                final[a["key"]] += 1 if a["sign"] == "+" else -1
            assert +final == final_answers(whole[query])
        assert_current(kafka_settings, whole)
        # The answers service's commits name none of the opened registrations: a restore finds them open from
        # their place in queries.plans (a Kafka broker keeps at most 4 KB of commit metadata).
        metadata = committed_metadata(kafka_settings, "answers", "deltas.parts")
        assert metadata and all('"below"' in m and '"opened"' not in m for m in metadata.values()), metadata


@pytest.mark.timeout(180)
def test_unregister_stops_output_and_frees_state(kafka_settings: KafkaSettings, tmp_path: Path) -> None:
    """Unregistering a single-centre path, a multi-centre path (probes) and a product of parts placed by
    centre frees their state on every partition, retracts their current answers once and stops them; the
    query left running is untouched."""
    first, second = generate_patch(1500, seed=21), generate_patch(500, seed=22)
    gone = ("path", "path3", "product")
    queries = {"star": QUERIES["star"], **{name: QUERIES[name] for name in gone}}
    before = replay(tmp_path, first, queries)
    after = replay(tmp_path, first + second, {"star": QUERIES["star"]})
    with Fleet(kafka_settings, tmp_path / "logs") as fleet:
        for query, text in queries.items():
            publish_plan(kafka_settings, query, text)
        start_fleet(fleet, 1)
        url = fleet.metrics_url("w0")
        publish_patch(kafka_settings, first)
        wait_answers(kafka_settings, {q: len(d) for q, d in before.items()})
        deadline = time.monotonic() + 20
        while not all((query_state(url, q) or 0) > 0 for q in gone) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert all(query_state(url, q) > 0 for q in gone)
        for query in gone:
            unpublish_plan(kafka_settings, query)
        deadline = time.monotonic() + 30
        while any(query_state(url, q) for q in gone) and time.monotonic() < deadline:
            time.sleep(0.3)
        # (a query that holds nothing has no series: None)
        assert {q: query_state(url, q) or 0 for q in gone} == dict.fromkeys(gone, 0), "unregistered queries hold state"
        assert query_state(url, "star") > 0
        publish_patch(kafka_settings, second)
        got = wait_answers(kafka_settings, {"star": len(after["star"])})
        for query in gone:
            # Unregistering ends the stream: one '-' per current answer, then nothing.
            ended = len(before[query]) + sum(final_answers(before[query]).values())
            assert len(got[query]) == ended, f"{query}: an unregistered query kept producing answers"
            assert not final_answers((a["sign"], a["key"]) for a in got[query]), f"{query}: answers not retracted"
        assert_matches({"star": got["star"]}, {"star": after["star"]})


@pytest.mark.timeout(180)
def test_bad_input_is_dead_lettered_and_good_lines_are_answered(kafka_settings: KafkaSettings,
                                                                 tmp_path: Path) -> None:
    """A malformed line inside a good patch message, a message with invalid UTF-8 and a corrupt Avro
    record go to the dead-letter topic with reason, offset and line; everything else is answered."""
    good = generate_patch(300, seed=31)
    star = {"star": QUERIES["star"]}
    extra = f"<{EX}s1> <{EX}type> <{EX}Person>"
    avro_ok = codec.encode("RawUpdate", {"op": "ADD", "s": f"<{EX}s1>", "p": f"<{EX}likes>", "o": f"<{EX}Pizza>"})
    with Fleet(kafka_settings, tmp_path / "logs") as fleet:
        publish_plan(kafka_settings, "star", QUERIES["star"])
        start_fleet(fleet, 1)
        producer = make_producer(kafka_settings)
        raw = kafka_settings.topic("updates.raw")
        bad_line = "\n".join(good[:100] + ["A <broken line ."] + good[100:200]) + "\n"
        m1 = produce_sync(producer, raw, bad_line.encode())
        m2 = produce_sync(producer, raw, ("\n".join(good[200:]) + "\n").encode() + b'A <http://x/\xff> <p:p> "x" .\n')
        m3 = produce_sync(producer, raw, codec.encode("RawUpdate", {"op": "ADD", "s": "a", "p": "b", "o": "c"})[:12])
        m4 = produce_sync(producer, raw, f"A {extra} .\n".encode(), headers=[("content-type", b"application/rdf-patch")])
        m5 = produce_sync(producer, raw, avro_ok)
        expected = replay(tmp_path, good + [f"A {extra} .", f"A <{EX}s1> <{EX}likes> <{EX}Pizza> ."], star)
        got = wait_answers(kafka_settings, {"star": len(expected["star"])})
        assert_matches(got, expected)
        deadline = time.monotonic() + 30
        dead: list[dict] = []
        while len(dead) < 3 and time.monotonic() < deadline:
            dead = [codec.decode("DeadLetter", m.value()) for m in read_all(kafka_settings, kafka_settings.topic("deadletter"))]
            time.sleep(0.3)
        by_offset = {d["offset"]: d for d in dead}
        assert set(by_offset) == {m1.offset(), m2.offset(), m3.offset()}
        assert by_offset[m1.offset()]["reason"] == "malformed-rdf" and by_offset[m1.offset()]["line"] == 101
        assert "line 101" in by_offset[m1.offset()]["message"] and "\n" not in by_offset[m1.offset()]["message"]
        assert by_offset[m1.offset()]["original"] == b"A <broken line ."  # the line, never the whole record
        assert by_offset[m2.offset()]["reason"] == "invalid-utf8"
        assert by_offset[m3.offset()]["reason"] == "schema-mismatch"
        assert {m4.offset(), m5.offset()}.isdisjoint(by_offset)
        assert fleet.procs["ingest"].poll() is None, "ingest must survive bad input"


@pytest.mark.timeout(180)
def test_worker_restarted_after_sigterm_resumes_without_loss_or_duplicates(kafka_settings: KafkaSettings,
                                                                           tmp_path: Path) -> None:
    first, second, expected, partial = two_halves(tmp_path, seed=41)
    with Fleet(kafka_settings, tmp_path / "logs") as fleet:
        for query, text in QUERIES.items():
            publish_plan(kafka_settings, query, text)
        start_fleet(fleet, 1)
        publish_patch(kafka_settings, first)
        wait_answers(kafka_settings, {"product": len(partial["product"]) // 3})  # mid-stream
        assert fleet.stop("w0") == 0
        publish_patch(kafka_settings, second)
        fleet.start("w0", "worker", "--worker-id", "w0")
        assert_final(kafka_settings, expected)


@pytest.mark.parametrize("placement,disk", [("by-centre", "kept"), ("single-owner", "lost")])
def test_a_worker_killed_mid_stream_restores_its_shards_from_their_checkpoints(
        kafka_settings: KafkaSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, placement: str,
        disk: str) -> None:
    """A worker checkpointing after every transaction is killed -9 mid-stream; its successor opens the
    shards from their checkpoints (at or behind the committed offsets: the kill may fall between a commit and its
    checkpoint) and replays only the log after them, and the answers equal the replay.  By centre (routed shards)
    with its disk kept; single owner (whole shards, one per routed partition's owner group) with its disk lost,
    so the checkpoints come from Kafka."""
    queries = {q: QUERIES[q] for q in ("star", "path", "product", "names", "fof")}
    lines = generate_patch(3000, seed=43)
    expected, partial = replay(tmp_path, lines, queries), replay(tmp_path, lines[:1500], queries)
    state = ["--state-dir", str(tmp_path / "worker-state"), "--checkpoint-interval", "0", "--placement", placement]
    # a static member: the successor takes the killed worker's partitions without waiting for its session to end
    monkeypatch.setenv("CBGP_KAFKA_GROUP_INSTANCE_ID", f"{kafka_settings.topic_prefix}w0")
    with Fleet(kafka_settings, tmp_path / "logs") as fleet:
        for query, text in queries.items():
            publish_plan(kafka_settings, query, text)
        fleet.start("ingest", "ingest", "--instance-id", "i1")
        fleet.start("w0", "worker", "--worker-id", "w0", *state)
        fleet.start("answers", "answers", "--instance-id", "a1")
        publish_patch(kafka_settings, lines[:1500])
        wait_answers(kafka_settings, {"star": len(partial["star"]), "path": len(partial["path"])})
        fleet.procs["w0"].kill()  # -9: no clean stop, no last checkpoint
        fleet.procs["w0"].wait(10)
        if disk == "lost":
            shutil.rmtree(tmp_path / "worker-state")
        publish_patch(kafka_settings, lines[1500:])
        fleet.start("w0", "worker", "--worker-id", "w0", *state)
        assert_final(kafka_settings, expected)
        restored = [line for line in fleet.log_text("w0").splitlines() if "event=shard-restored" in line]
        used = [line for line in restored if "checkpoint=used" in line]
        assert used, "no shard was restored from its checkpoint:\n" + "\n".join(restored)
        assert all(int(re.search(r"replayed_from=(\d+)", line).group(1)) > 0 for line in used)
        kind = "routed" if placement == "by-centre" else "whole"
        source = "store" if disk == "kept" else "kafka"
        assert any(f"kind={kind}" in line and f"checkpoint=used-{source}" in line for line in used), "\n".join(used)


@pytest.mark.timeout(180)
def test_queries_registered_and_unregistered_through_the_registry_process(kafka_settings: KafkaSettings,
                                                                          tmp_path: Path) -> None:
    """The whole fleet including ``cbgp registry``: AdminCommands in, answers equal to the replay out; an
    UNREGISTER through the registry frees the worker's state for that query."""
    from services.kafka.broker import free_port

    lines = generate_patch(1500, seed=51)
    # registered while the fleet runs: a star, DISTINCT, a probed 3-hop path and a by-centre product
    queries = {q: QUERIES[q] for q in ("star", "names", "path3", "product")}
    expected = replay(tmp_path, lines, queries)
    admin = kafka_settings.topic("admin")
    producer = make_producer(kafka_settings)

    def command(kind: str, query_id: str, sparql: str | None = None) -> None:
        produce_sync(producer, admin, codec.encode("AdminCommand", {
            "command": kind, "query_id": query_id, "sparql": sparql, "options": {}, "request_id": query_id}))

    with Fleet(kafka_settings, tmp_path / "logs") as fleet:
        fleet.start("registry", "registry", "--web-port", str(free_port()), "--state-dir", str(tmp_path / "state"))
        start_fleet(fleet, 1)
        url = fleet.metrics_url("w0")
        for query, text in queries.items():
            command("REGISTER", query, text)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and \
                len(read_all(kafka_settings, kafka_settings.topic("queries.plans"))) < len(queries):
            time.sleep(0.3)
        publish_patch(kafka_settings, lines)
        got = wait_answers(kafka_settings, {q: len(d) for q, d in expected.items()})
        assert_matches(got, expected)
        assert_current(kafka_settings, expected)
        # the gauges are refreshed once a second: wait until they show both queries' state before the
        # UNREGISTER, or a stale 0 for "names" would end the wait below before the worker saw the command
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and \
                not all((query_state(url, query) or 0) > 0 for query in ("names", "star")):
            time.sleep(0.3)
        command("UNREGISTER", "names")
        deadline = time.monotonic() + 60
        while query_state(url, "names") and time.monotonic() < deadline:
            time.sleep(0.3)
        assert not query_state(url, "names") and query_state(url, "star") > 0


@pytest.mark.timeout(240)
def test_standby_ingest_takes_over_with_the_state_it_replaces(kafka_settings: KafkaSettings, tmp_path: Path) -> None:
    """updates.raw has one partition, so a second ingest waits as a standby.  When the active one stops, the
    standby must continue from the state the active one committed (presence set, order, dictionary), not
    from what it restored when it started: the second half re-inserts and deletes triples of the first."""
    first, second, expected, partial = two_halves(tmp_path, seed=43)
    with Fleet(kafka_settings, tmp_path / "logs") as fleet:
        for query, text in QUERIES.items():
            publish_plan(kafka_settings, query, text)
        start_fleet(fleet, 1)
        fleet.start("standby", "ingest", "--instance-id", "i2")
        fleet.metrics_url("standby")  # started: restored (nothing yet) and joining the group
        publish_patch(kafka_settings, first)
        wait_answers(kafka_settings, {q: len(d) for q, d in partial.items()})
        consumed = {name: metric_total(fleet.metrics_url(name), "cbgp_updates_in_total")
                    for name in ("ingest", "standby")}
        active = max(consumed, key=lambda name: consumed[name])
        assert sorted(consumed.values())[0] == 0, f"both ingests consumed: {consumed}"
        assert fleet.stop(active) == 0
        publish_patch(kafka_settings, second)
        assert_final(kafka_settings, expected)
