"""The Spark window query (spark.window_stream) on a real broker: expiry exact against pyoxigraph.

Raw records (each one an event: one Kafka record time for its triples) go through the real ingest
transform (set semantics, refresh records for re-inserted triples, event time = record time) onto
updates.encoded; the job runs in rounds (availableNow) from one checkpoint.  At every instant of the step
grid up to the final watermark, the replayed ``part = -1`` output of each windowed query must equal
pyoxigraph evaluating the query on the window's content at that instant, computed here from the
definition (cbgp.windows.windowed): time windows hold the quads whose last update before the instant is an ADD
inside [instant - range, instant); the per-event window is the union of per-event answers of the events
in that interval.  Queries with operators (FILTER, OPTIONAL, aggregates, ASK) are among them: their terms
(and those the operators make) are read back from the dictionary topic.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from cbgp.terms import TermDictionary, iri, literal
from services import codec
from services.ingest.core import IngestProcessor, RawRecord
from services.kafka.config import KafkaSettings
from services.kafka.topics import ensure_topics
from services.kafka.client import make_producer, read_all
from services.wire.registrations import read_registration
from services.worker.shard_engine import ASK_FALSE, ASK_TRUE
from spark.window_stream import GC_DELAY_MS
from services.wire.idempotence import WINDOW_SOURCE_PARTITION
from tests.fixtures.spark import run_stateful_once
from tests.fleet_support import publish_plan, unpublish_plan
from tests.oracle import OracleGraph

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

EX = "http://example.org/"
PREFIX = f"PREFIX : <{EX}>\n"
QUERIES = {
    "sliding": PREFIX + "SELECT ?x ?y FROM NAMED WINDOW :w ON :s [RANGE PT5S STEP PT1S]\n"
                        "WHERE { WINDOW :w { ?x :knows ?y . ?y :likes :Tea } }",
    "tumbling": PREFIX + "SELECT ?x ?n FROM NAMED WINDOW :w ON :s [RANGE PT4S]\n"
                         "WHERE { WINDOW :w { ?x :type :Robot . ?x :name ?n } }",
    "event": PREFIX + "SELECT ?x FROM NAMED WINDOW :w ON :s [RANGE PT3S STEP PT1S EVENT]\n"
                      "WHERE { WINDOW :w { ?x :type :Person . ?x :likes ?d } }",
    # operators over windows: an aggregate with HAVING, a COUNT over an OPTIONAL with a FILTER
    # (answers over an empty window: 0), an ASK (false, then flipped), a FILTER per event
    "having": PREFIX + "SELECT ?y (COUNT(?x) AS ?n) FROM NAMED WINDOW :w ON :s [RANGE PT5S STEP PT1S]\n"
                       "WHERE { WINDOW :w { ?x :likes ?y } } GROUP BY ?y HAVING (COUNT(?x) > 1)",
    "count": PREFIX + "SELECT (COUNT(?n) AS ?c) (COUNT(*) AS ?all) FROM NAMED WINDOW :w ON :s [RANGE PT4S]\n"
                      'WHERE { WINDOW :w { ?x :type :Robot OPTIONAL { ?x :name ?n FILTER(LANG(?n) = "en") } } }',
    "ask": PREFIX + "ASK FROM NAMED WINDOW :w ON :s [RANGE PT5S STEP PT1S]\n"
                    "WHERE { WINDOW :w { ?x :knows ?y . ?y :knows ?x } }",
    "event_filter": PREFIX + "SELECT ?x ?n FROM NAMED WINDOW :w ON :s [RANGE PT3S STEP PT1S EVENT]\n"
                             "WHERE { WINDOW :w { ?x :name ?n FILTER(isLiteral(?n) && STR(?n) != \"R2\") } }",
    # background data: a SERVICE clause's local view, as the fleet rewrites it, is not windowed
    "background": PREFIX + "SELECT ?x ?d ?c FROM NAMED WINDOW :w ON :s [RANGE PT4S STEP PT1S]\n"
                           "WHERE { WINDOW :w { ?x :likes ?d . GRAPH <urn:cbgp:service-view:drinks> { ?d :caffeine ?c } } }",
}
VIEW = iri("urn:cbgp:service-view:drinks")
STARTS_WITH_AN_ANSWER = {"count", "ask"}  # checked from their first report (their answers over no data come there)
BASE_MS = 1_700_000_000_000


def random_records(rng: random.Random, n: int) -> list[tuple[int, list[tuple[str, str, str, str]]]]:
    """``[(event time, [(op, s, p, o), ...])]`` in time order: gaps of 0-1.5 s (0 = same event time)."""
    people = [iri(f"{EX}u{i}") for i in range(5)]
    choices = [(iri(f"{EX}knows"), people), (iri(f"{EX}likes"), [iri(f"{EX}Tea"), iri(f"{EX}Beer")]),
               (iri(f"{EX}type"), [iri(f"{EX}Robot"), iri(f"{EX}Person")]),
               (iri(f"{EX}name"), [literal("R2"), literal("C3", language="en")])]
    records, now, sent = [], BASE_MS + 123, []
    for _ in range(n):
        now += rng.choice([0, 0, 250, 700, 1000, 1500])
        triples = []
        if rng.random() < 0.15:  # the background view's value for a drink changes (a refresh of the view)
            drink, level = rng.choice([iri(f"{EX}Tea"), iri(f"{EX}Beer")]), literal(str(rng.randint(0, 2)))
            view = (drink, iri(f"{EX}caffeine"), level, VIEW)
            records.append((now, [("D" if view in sent else "A", *view)]))
            sent = [t for t in sent if t != view] if view in sent else sent + [view]
            continue
        for _ in range(rng.randint(1, 3)):
            if sent and rng.random() < 0.2:
                triples.append(("D", *rng.choice([t for t in sent if len(t) == 3] or [sent[0]])))
                continue
            predicate, objects = rng.choice(choices)
            triple = (rng.choice(people), predicate, rng.choice(objects))
            sent.append(triple)
            triples.append(("A", *triple))
        records.append((now, triples))
    return records


def content_at(records, instant: int, range_ms: int) -> set[tuple]:  # noqa: ANN001
    """The window's quads at ``instant``: the stream's, and those of the view graph (background data, not
    windowed: present from their ADD to their DEL)."""
    last: dict[tuple, tuple[str, int]] = {}
    for time_ms, triples in records:  # in time order, then arrival: the last one wins
        if time_ms < instant:
            for op, *triple in triples:
                last[tuple(triple)] = (op, time_ms)
    return {t for t, (op, time_ms) in last.items()
            if op == "A" and (time_ms >= instant - range_ms or t[3:] == (VIEW,))}


def answers(graph: OracleGraph, query: str) -> Counter:
    """pyoxigraph's answers, an ASK as the fleet reports it (``?ask`` true or false)."""
    result = graph.store.query(query)
    if type(result).__name__ == "QueryBoolean":
        return Counter({(("ask", ASK_TRUE if bool(result) else ASK_FALSE),): 1})
    return graph.answers(query)


def oracle_at(records, query: str, kind: str, instant: int, range_ms: int) -> Counter:  # noqa: ANN001
    if kind != "event":
        graph = OracleGraph()
        for quad in content_at(records, instant, range_ms):
            graph.apply(1, *quad)
        return answers(graph, query)
    events: dict[int, set] = defaultdict(set)
    for time_ms, triples in records:
        if instant - range_ms <= time_ms < instant:
            events[time_ms] |= {tuple(t) for op, *t in triples if op == "A"}
    total: Counter = Counter()
    for triples in events.values():
        graph = OracleGraph()
        for triple in triples:
            graph.apply(1, *triple)
        total.update(graph.answers(query))
    return total


def publish_records(settings: KafkaSettings, ingest: IngestProcessor, records, offset: int) -> int:  # noqa: ANN001
    producer = make_producer(settings)
    for time_ms, triples in records:
        text = "".join(f"{op} {' '.join(quad)} .\n" for op, *quad in triples)
        for out in ingest.process(RawRecord(text.encode(), offset=offset, timestamp_ms=time_ms)):
            if out.topic == settings.topic("updates.encoded"):
                producer.produce(out.topic, out.value, partition=0)
            elif out.topic == settings.topic("dictionary"):  # (a windowed operator query reads terms)
                producer.produce(out.topic, out.value, out.key, partition=out.partition)
        offset += 1
    assert producer.flush(30) == 0
    return offset


def test_sliding_tumbling_and_per_event_windows_expire_exactly(spark: SparkSession, kafka_settings: KafkaSettings,
                                                               tmp_path: Path) -> None:
    ensure_topics(kafka_settings)
    for query_id, text in QUERIES.items():
        publish_plan(kafka_settings, query_id, text)
    records = random_records(random.Random(5), 90)
    ingest = IngestProcessor(kafka_settings, kafka_settings.partitions, kafka_settings.partitions)
    checkpoint = tmp_path / "checkpoint"
    offset = 0
    for start in range(0, len(records), 30):  # three rounds, each a restart from the checkpoint
        offset = publish_records(kafka_settings, ingest, records[start:start + 30], offset)
        run_stateful_once(spark, kafka_settings, "windows", checkpoint)
    # A far-future record moves every watermark past the whole stream: everything must expire.
    flush_time = records[-1][0] + 60_000
    publish_records(kafka_settings, ingest, [(flush_time, [("A", iri(f"{EX}z"), iri(f"{EX}other"), iri(f"{EX}z"))])],
                    offset)
    run_stateful_once(spark, kafka_settings, "windows", checkpoint)

    # Every term of the answers is on the dictionary topic: ingest's, and those the operators made (a COUNT).
    dictionary = TermDictionary(stable=True)
    for msg in read_all(kafka_settings, kafka_settings.topic("dictionary"), timeout=30):
        for term_id, term in codec.dictionary_entries(msg.value()):
            dictionary.add(term_id, term)
    outputs: dict[str, list[dict]] = defaultdict(list)
    for msg in read_all(kafka_settings, kafka_settings.topic("deltas.parts"), timeout=30):
        for record in codec.part_deltas(msg.value()):  # PartDeltaColumns records (or single PartDeltas)
            assert record["part"] == -1 and record["source_partition"] == WINDOW_SOURCE_PARTITION
            outputs[record["query_id"]].append(record)
    for query_id, text in QUERIES.items():
        plain, spec = read_registration(text, {})
        records_out = outputs[query_id]
        keys = [(r["source_offset"], r["index"]) for r in records_out]
        assert len(keys) == len(set(keys)), f"{query_id}: an idempotence key was produced twice"
        assert records_out, f"{query_id}: the stream must give some answers"
        by_instant: dict[int, list[dict]] = defaultdict(list)
        for record in records_out:
            by_instant[record["source_offset"]].append(record)
        assert all(instant % spec.step_ms == 0 for instant in by_instant)
        replayed: Counter = Counter()
        first = (records[0][0] // spec.step_ms + 1) * spec.step_ms
        if query_id in STARTS_WITH_AN_ANSWER:
            first = min(by_instant)
        for instant in range(first, flush_time - spec.step_ms, spec.step_ms):
            for record in by_instant.get(instant, []):
                row = tuple(sorted((v, dictionary.decode(t)) for v, t in record["binding"].items()))
                replayed[row] += 1 if record["sign"] == "PLUS" else -1
                assert replayed[row] >= 0, f"{query_id} at {instant}: a - of an absent row"
            replayed = +replayed
            assert replayed == oracle_at(records, plain, spec.kind, instant, spec.range_ms), \
                f"{query_id}: answers differ at instant {instant - BASE_MS} ms"
        assert replayed == oracle_at([], plain, spec.kind, flush_time, spec.range_ms), \
            f"{query_id}: answers left after every triple expired"


def _window_state_keys(spark: SparkSession, checkpoint: Path) -> set[str]:
    """Query ids with window state in the checkpoint's latest version (Spark's state data source)."""
    rows = spark.read.format("statestore").option("path", str(checkpoint)).option("stateVarName", "meta").load()
    return {row["key"]["query_id"] for row in rows.select("key").collect()}


def test_an_unregistered_windowed_query_state_is_removed_by_its_expiry_timer(
        spark: SparkSession, kafka_settings: KafkaSettings, tmp_path: Path) -> None:
    ensure_topics(kafka_settings)
    publish_plan(kafka_settings, "gone", QUERIES["sliding"])
    publish_plan(kafka_settings, "stays", QUERIES["tumbling"])
    records = random_records(random.Random(3), 12)
    ingest = IngestProcessor(kafka_settings, kafka_settings.partitions, kafka_settings.partitions)
    checkpoint = tmp_path / "checkpoint"
    offset = publish_records(kafka_settings, ingest, records, 0)
    run_stateful_once(spark, kafka_settings, "windows", checkpoint)
    assert _window_state_keys(spark, checkpoint) == {"gone", "stays"}
    # Unregistered: the query gets no more rows, so only its timer can collect its state.  A record past
    # its stream time + range + step + the watermark delay moves the watermark beyond that timer.
    unpublish_plan(kafka_settings, "gone")
    later = records[-1][0] + GC_DELAY_MS + 60_000
    publish_records(kafka_settings, ingest, [(later, [("A", iri(f"{EX}z"), iri(f"{EX}other"), iri(f"{EX}z"))])],
                    offset)
    run_stateful_once(spark, kafka_settings, "windows", checkpoint)
    assert _window_state_keys(spark, checkpoint) == {"stays"}


def test_the_windows_duty_reads_nothing_while_no_windowed_query_is_registered(kafka_settings: KafkaSettings) -> None:
    """The source of the windows duty on the broker: with only plain queries registered it reports no new
    offsets, so Spark runs no batch at all; once a windowed query is registered it reads from that query's
    registration offset, not the updates nobody needed before it."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from spark.job import kafka_options
    from spark.kafka_io import KafkaStreamReader
    from spark.topic_tail import close_instances

    ensure_topics(kafka_settings)
    publish_plan(kafka_settings, "plain", PREFIX + "SELECT ?x WHERE { ?x :p ?y }")
    ingest = IngestProcessor(kafka_settings, kafka_settings.partitions, kafka_settings.partitions)
    offset = publish_records(kafka_settings, ingest, random_records(random.Random(1), 6), 0)
    options = {**kafka_options(kafka_settings), "subscribe": kafka_settings.topic("updates.encoded"),
               "onlyWhenNeededBy": "windows", "plansTopic": kafka_settings.topic("queries.plans")}
    reader = KafkaStreamReader(options)
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == start, "a batch with no windowed query registered"
    publish_plan(kafka_settings, "windowed", QUERIES["sliding"])  # registered at the current end: 6
    publish_records(kafka_settings, ingest, random_records(random.Random(2), 3), offset)
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"0": 9}
    assert [(p.start, p.end) for p in reader.partitions(start, end)] == [(6, 9)]
    unpublish_plan(kafka_settings, "windowed")
    assert reader.latestOffset(end, ReadAllAvailable()) == end
    reader.stop()
    close_instances()  # (the plans' reader of this process, before the broker goes)
