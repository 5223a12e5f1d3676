"""The Spark assembly query (spark.assembly_stream) on a real broker: part deltas in, exact answers out.

The part deltas are what a state worker publishes for a multi-part query (each part registered in an
Engine as ``split_parts`` gives it, one Kafka transaction per batch of updates); the test folds the job's
``part = -1`` output per update seq and compares it with pyoxigraph re-evaluating the whole query on the
graph after that update.  The job runs in rounds (availableNow) from one checkpoint, so restarts are part
of every run: no output may repeat an idempotence key and no update may be missing.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cbgp.engine.assembly import needs_assembly, split_parts
from cbgp.engine.engine import Engine
from cbgp.terms import TermDictionary, iri, literal
from services import codec
from services.kafka.config import KafkaSettings
from services.kafka.topics import ensure_topics
from services.kafka.client import make_producer, read_all
from services.wire.records import query_partition
from services.wire.idempotence import ASSEMBLY_SOURCE_BASE
from tests.fixtures.spark import run_stateful_once
from tests.fleet_support import publish_plan, unpublish_plan
from tests.oracle import OracleGraph

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EX = "http://example.org/"
QUERIES = {
    # two stars: a pure cartesian product
    "product": f"SELECT ?x ?y WHERE {{ ?x <{EX}type> <{EX}Robot> . ?y <{EX}likes> <{EX}Tea> }}",
    # a ground part gating a star
    "gated": f"SELECT ?x WHERE {{ <{EX}s0> <{EX}knows> <{EX}s1> . ?x <{EX}likes> <{EX}Tea> }}",
    # star x var-connected component, projection and DISTINCT, literals
    "mixed": f"SELECT DISTINCT ?x ?c WHERE {{ ?x <{EX}type> <{EX}Person> . ?x <{EX}name> ?n . "
             f"?a <{EX}knows> ?b . ?b <{EX}knows> ?c }}",
}


def random_stream(rng: random.Random, n: int) -> list[tuple[int, str, str, str]]:
    subjects = [iri(f"{EX}s{i}") for i in range(6)]
    objects = {f"{EX}type": [iri(f"{EX}Robot"), iri(f"{EX}Person")],
               f"{EX}likes": [iri(f"{EX}Tea"), iri(f"{EX}Coffee")],
               f"{EX}knows": subjects,
               f"{EX}name": [literal("Ann"), literal("Bob", language="en"), literal("7", datatype=f"{EX}n")]}
    present: list[tuple[str, str, str]] = []
    out = []
    for _ in range(n):
        if present and rng.random() < 0.35:
            triple = rng.choice(present)
            present.remove(triple)
            out.append((-1, *triple))
            continue
        predicate = rng.choice(list(objects))
        triple = (rng.choice(subjects), iri(predicate), rng.choice(objects[predicate]))
        if triple not in present:
            present.append(triple)
        out.append((1, *triple))
    return out


class PartPublisher:
    """What a state worker does for assembled queries: each part in the engine, part deltas on Kafka."""

    def __init__(self, settings: KafkaSettings, queries: dict[str, str]) -> None:
        self.settings = settings
        self.dictionary = TermDictionary(stable=True)
        self.engine = Engine(self.dictionary)
        self.names: dict[str, tuple[str, int]] = {}
        for query_id, text in queries.items():
            assert needs_assembly(text)
            for part in split_parts(text):
                name = f"{query_id}#{part.index}"
                self.engine.register(name, part.sparql)
                self.names[name] = (query_id, part.index)
        self.producer = make_producer(settings, transactional_id=f"{settings.topic_prefix}test-worker")
        self.topic = settings.topic("deltas.parts")
        self.offset = 0

    def publish(self, updates: list[tuple[int, int, str, str, str]], per_transaction: int = 7) -> None:
        for start in range(0, len(updates), per_transaction):
            self.producer.begin_transaction()
            for seq, sign, s, p, o in updates[start:start + per_transaction]:
                self.offset += 1
                ids = [self.dictionary.encode(t) for t in (s, p, o)]
                for index, (name, d_sign, row) in enumerate(self.engine.apply(sign, *ids)):
                    query_id, part = self.names[name]
                    record = {"query_id": query_id, "part": part, "seq": seq,
                              "sign": "PLUS" if d_sign > 0 else "MINUS",
                              "binding": dict(zip(self.engine.columns(name), row)), "source_partition": -1,
                              "source_offset": self.offset, "index": index, "snapshot": False,
                              "event_time_ms": None}
                    self.producer.produce(self.topic, codec.encode("PartDelta", record), query_id.encode(),
                                          partition=query_partition(query_id, self.settings.partitions))
            self.producer.commit_transaction(30)


def assembled(settings: KafkaSettings, dictionary: TermDictionary) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for msg in read_all(settings, settings.topic("deltas.parts"), timeout=30):
        for record in codec.part_deltas(msg.value()):  # the job writes PartDeltaColumns records
            if record["part"] == -1:
                record["terms"] = {v: dictionary.decode(t) for v, t in record["binding"].items()}
                out[record["query_id"]].append(record)
    return out


def test_assembly_is_exact_per_update_across_restarts(spark: SparkSession, kafka_settings: KafkaSettings,
                                                      tmp_path: Path) -> None:
    ensure_topics(kafka_settings)
    for query_id, text in QUERIES.items():
        publish_plan(kafka_settings, query_id, text)
    stream = random_stream(random.Random(11), 240)
    updates = [(seq, sign, s, p, o) for seq, (sign, s, p, o) in enumerate(stream, start=1)]
    publisher = PartPublisher(kafka_settings, QUERIES)
    checkpoint = tmp_path / "checkpoint"
    for start in range(0, len(updates), 80):  # three rounds, each a restart from the checkpoint
        publisher.publish(updates[start:start + 80])
        run_stateful_once(spark, kafka_settings, "assembly", checkpoint, single_owner=True)
    # nothing new: must produce nothing
    run_stateful_once(spark, kafka_settings, "assembly", checkpoint, single_owner=True)

    outputs = assembled(kafka_settings, publisher.dictionary)
    oracle = OracleGraph()
    expected_by_seq: dict[int, dict[str, Counter]] = {}
    for seq, sign, s, p, o in updates:
        oracle.apply(sign, s, p, o)
        expected_by_seq[seq] = {q: oracle.answers(text) for q, text in QUERIES.items()}
    for query_id, text in QUERIES.items():
        records = outputs.get(query_id, [])
        keys = [(r["source_partition"], r["source_offset"], r["index"]) for r in records]
        assert len(keys) == len(set(keys)), f"{query_id}: an idempotence key was produced twice"
        assert all(r["source_partition"] <= ASSEMBLY_SOURCE_BASE for r in records)
        by_seq: dict[int, list[dict]] = defaultdict(list)
        for record in records:
            by_seq[record["seq"]].append(record)
        replayed: Counter = Counter()
        distinct = "DISTINCT" in text
        for seq, _sign, _s, _p, _o in updates:
            signs = Counter()
            for record in by_seq.get(seq, []):
                row = tuple(sorted(record["terms"].items()))
                signs[(row, record["sign"])] += 1
                replayed[row] += 1 if record["sign"] == "PLUS" else -1
            plus = {row for row, sign in signs if sign == "PLUS"}
            assert not plus & {row for row, sign in signs if sign == "MINUS"}, \
                f"{query_id} seq {seq}: a + and a - of the same row"
            assert all(v >= 0 for v in replayed.values()), f"{query_id} seq {seq}: a - of an absent row"
            replayed = +replayed
            assert replayed == expected_by_seq[seq][query_id], f"{query_id}: answers differ after seq {seq}"
            if distinct:
                assert all(v == 1 for v in replayed.values())
    assert sum(len(r) for r in outputs.values()) > 50, "the stream must exercise the assembly"


def test_an_unregistered_query_gets_no_more_answers_and_its_state_goes(spark: SparkSession,
                                                                       kafka_settings: KafkaSettings,
                                                                       tmp_path: Path) -> None:
    ensure_topics(kafka_settings)
    publish_plan(kafka_settings, "product", QUERIES["product"])
    publisher = PartPublisher(kafka_settings, {"product": QUERIES["product"]})
    robot, tea = (f"{EX}type", iri(f"{EX}Robot")), (f"{EX}likes", iri(f"{EX}Tea"))
    publisher.publish([(1, 1, iri(f"{EX}r1"), iri(robot[0]), robot[1]), (2, 1, iri(f"{EX}p1"), iri(tea[0]), tea[1])])
    run_stateful_once(spark, kafka_settings, "assembly", tmp_path / "cp", single_owner=True)
    before = assembled(kafka_settings, publisher.dictionary)["product"]
    assert [(r["sign"], r["terms"]) for r in before] == [("PLUS", {"x": iri(f"{EX}r1"), "y": iri(f"{EX}p1")})]
    unpublish_plan(kafka_settings, "product")
    publisher.publish([(3, 1, iri(f"{EX}r2"), iri(robot[0]), robot[1])])
    run_stateful_once(spark, kafka_settings, "assembly", tmp_path / "cp", single_owner=True)
    assert len(assembled(kafka_settings, publisher.dictionary)["product"]) == 1


def test_the_assembly_duty_reads_only_while_the_workers_send_it_a_products_parts(kafka_settings: KafkaSettings) -> None:
    """The source of the assembly duty on the broker: a product placed by centre is multiplied by the answers
    service, so with only such queries it reports no new offsets (no batch); a product placed on a single owner,
    by the registry's record or by the fleet's placement, opens it, and it reads from where it stood idle."""
    import json

    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from services import codec
    from services.kafka.client import make_producer
    from spark.job import kafka_options
    from spark.kafka_io import KafkaStreamReader
    from spark.topic_tail import close_instances

    ensure_topics(kafka_settings)
    publish_plan(kafka_settings, "by-centre", QUERIES["product"])
    producer = make_producer(kafka_settings)
    for i in range(5):  # by-centre deltas (PartDeltaColumns records): nothing for the job
        producer.produce(kafka_settings.topic("deltas.parts"), f"x{i}".encode(), partition=0)
    producer.flush(30)
    base = {**kafka_options(kafka_settings), "subscribe": kafka_settings.topic("deltas.parts"),
            "onlyWhenNeededBy": "assembly", "plansTopic": kafka_settings.topic("queries.plans")}
    reader = KafkaStreamReader(base)
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == start, "a batch for a product placed by centre"
    fleet_single_owner = KafkaStreamReader({**base, "fleetSingleOwner": "true"})
    assert fleet_single_owner.latestOffset(start, ReadAllAvailable()) != start
    fleet_single_owner.stop()

    record = {"query_id": "owned", "sparql": QUERIES["product"], "options": {}, "projected": ["x", "y"],
              "plan_json": json.dumps({"placement": "single-owner"}), "registered_at_seq": 0, "version": 1}
    producer.produce(kafka_settings.topic("queries.plans"), codec.encode("QueryPlan", record), b"owned", partition=0)
    producer.produce(kafka_settings.topic("deltas.parts"), b"part", partition=0)
    producer.flush(30)
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end["0"] == 6
    assert [(p.partition, p.start, p.end) for p in reader.partitions(start, end)] == [(0, 5, 6)]
    reader.stop()
    close_instances()
