"""Compaction folds the answers delta log exactly like a replay of the whole log.

The expected answers are computed here, independently of ``spark.compaction``: a plain-Python replay that
counts each (query_id, n) once and sums the signs per binding.  Logs are generated under the delta
contract (a ``+`` only for an absent answer, a ``-`` only for a present one), then at-least-once delivery
is imitated by re-sending some deltas, some of them much later.
"""

from __future__ import annotations

import json
import random
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from cbgp.terms import XSD_STRING, from_sparql_json
from services.codec import decode, encode
from services.kafka.client import end_offsets, make_producer, read_all
from services.kafka.config import KafkaSettings
from spark.answer_columns import Bindings
from spark.snapshot_store import SnapshotStore
from spark.compaction import compact_batch, current_key, decode_answers, delta_table, fold, kafka_publisher
from spark.answer_columns import canonical_binding
from spark.job import kafka_options, start_compaction

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TERMS: list[dict[str, Any]] = [
    {"type": "uri", "value": "http://ex.org/a"},
    {"type": "uri", "value": "http://ex.org/b"},
    {"type": "bnode", "value": "b0"},
    {"type": "literal", "value": "chat", "lang": "fr"},
    {"type": "literal", "value": "42", "datatype": "http://www.w3.org/2001/XMLSchema#integer"},
    {"type": "literal", "value": 'quote " and \u00e9'},
]


def term_key(term: dict[str, Any]) -> str:
    obj = {"type": term["type"], "value": term["value"]}
    if term.get("lang"):
        obj["xml:lang"] = term["lang"]
    if term.get("datatype"):
        obj["datatype"] = term["datatype"]
    return from_sparql_json(obj)


def binding_id(binding: dict[str, dict[str, Any]]) -> frozenset[tuple[str, str]]:
    """The test's own notion of solution-mapping identity: variable -> RDF term identity."""
    return frozenset((var, term_key(t)) for var, t in binding.items())


def generate_log(rng: random.Random, queries: int = 3, steps: int = 150, pool: int = 12) -> list[dict[str, Any]]:
    """Answer records obeying the delta contract, numbered 1.. per query, then some re-sent (duplicates)."""
    bindings = [{"x": rng.choice(TERMS), "y": rng.choice(TERMS)} for _ in range(pool)]
    # The same solution written two ways: a plain literal and an xsd:string literal are one RDF term.
    bindings.append({"x": {"type": "literal", "value": "s"}})
    bindings.append({"x": {"type": "literal", "value": "s", "datatype": XSD_STRING}})
    present: dict[str, set] = {f"q{i}": set() for i in range(queries)}
    n = Counter()
    log = []
    for _ in range(steps):
        q = f"q{rng.randrange(queries)}"
        b = rng.choice(bindings)
        sign = "-" if binding_id(b) in present[q] else "+"
        (present[q].discard if sign == "-" else present[q].add)(binding_id(b))
        n[q] += 1
        log.append({"query_id": q, "n": n[q], "seq": len(log) + 1, "sign": sign, "binding": b,
                    "snapshot": False, "produced_at_ms": 1_700_000_000_000 + len(log)})
    for rec in rng.sample(log, len(log) // 8):  # at-least-once: re-sent, anywhere later in the log
        log.insert(rng.randrange(log.index(rec), len(log) + 1), dict(rec))
    return log


def expected_answers(log: list[dict[str, Any]]) -> dict[tuple[str, frozenset], int]:
    seen, state = set(), Counter()
    for rec in log:
        if (rec["query_id"], rec["n"]) in seen:
            continue
        seen.add((rec["query_id"], rec["n"]))
        state[(rec["query_id"], binding_id(rec["binding"]))] += 1 if rec["sign"] == "+" else -1
    return {k: v for k, v in state.items() if v != 0}


def snapshot_answers(spark: SparkSession, store: SnapshotStore) -> dict[tuple[str, frozenset], int]:
    df = store.read(spark)
    rows = df.collect() if df is not None else []
    return {(r["query_id"], frozenset(json.loads(r["binding"]).items())): r["multiplicity"] for r in rows}


def delta_rows(log: list[dict[str, Any]]) -> list[tuple]:
    return [(r["query_id"], r["n"], 1 if r["sign"] == "+" else -1, canonical_binding(r["binding"]), None) for r in log]


def test_canonical_binding_is_term_identity() -> None:
    plain = canonical_binding({"x": {"type": "literal", "value": "s", "datatype": None, "lang": None}})
    typed = canonical_binding({"x": {"type": "literal", "value": "s", "datatype": XSD_STRING}})
    assert plain == typed
    assert canonical_binding({"b": TERMS[0], "a": TERMS[3]}) == canonical_binding({"a": TERMS[3], "b": TERMS[0]})
    assert canonical_binding({"a": TERMS[3]}) != canonical_binding({"a": {**TERMS[3], "lang": "en"}})
    assert json.loads(current_key("q\"1", plain)) == ["q\"1", {"x": '"s"'}]


def test_answers_service_writes_the_same_answers_current_keys() -> None:
    """The answers service builds keys without importing Spark; both writers must agree byte for byte."""
    from services.codec.answers import canonical_binding as answers_binding
    from services.codec.answers import current_key as answers_key

    binding = {"y": TERMS[3], "x": TERMS[4], "z": TERMS[5]}
    ours = canonical_binding(binding)
    theirs = answers_binding({var: term_key(t) for var, t in binding.items()})
    assert ours == theirs
    assert current_key("q/é", ours) == answers_key("q/é", theirs)


def test_fold_equals_replay_of_the_whole_log_with_duplicates_and_retractions(spark: SparkSession, tmp_path: Path) -> None:
    log = generate_log(random.Random(7), steps=300)
    assert any(r["sign"] == "-" for r in log) and len({(r["query_id"], r["n"]) for r in log}) < len(log)
    store = SnapshotStore(tmp_path / "snap")
    deltas = spark.createDataFrame(delta_rows(log), "query_id string, n long, sign int, binding string, error string")
    report = compact_batch(spark, deltas, store, publish=None)
    assert snapshot_answers(spark, store) == expected_answers(log)
    assert report.duplicates == len(log) - len({(r["query_id"], r["n"]) for r in log})
    assert report.gaps == {} and report.missing == {} and report.negative == 0 and report.undecodable == 0
    max_n = {q: max(r["n"] for r in log if r["query_id"] == q) for q in {r["query_id"] for r in log}}
    assert store.folded_n() == max_n


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), cut=st.floats(0.05, 0.95))
def test_snapshot_plus_later_deltas_replays_like_the_whole_log(spark: SparkSession, seed: int, cut: float) -> None:
    log = generate_log(random.Random(seed), steps=120)
    head = log[: int(len(log) * cut)]
    with tempfile.TemporaryDirectory() as tmp:
        store = SnapshotStore(Path(tmp) / "snap")
        schema = "query_id string, n long, sign int, binding string, error string"
        compact_batch(spark, spark.createDataFrame(delta_rows(head), schema), store, publish=None)
        folded = store.folded_n()
        # A reader: snapshot, then the *whole* log filtered to n above the manifest (duplicates once).
        state = Counter(snapshot_answers(spark, store))
        seen = set()
        for rec in log:
            key = (rec["query_id"], rec["n"])
            if rec["n"] > folded.get(rec["query_id"], 0) and key not in seen:
                seen.add(key)
                state[(rec["query_id"], binding_id(rec["binding"]))] += 1 if rec["sign"] == "+" else -1
        assert {k: v for k, v in state.items() if v != 0} == expected_answers(log)
        # And folding the rest (the whole log again: already-folded deltas must be skipped) converges too.
        report = compact_batch(spark, spark.createDataFrame(delta_rows(log), schema), store, publish=None)
        assert report.already_folded == len([r for r in log if r["n"] <= folded.get(r["query_id"], 0)])
        assert snapshot_answers(spark, store) == expected_answers(log)


def test_gaps_in_n_are_reported_and_recorded(spark: SparkSession, tmp_path: Path) -> None:
    b = canonical_binding({"x": TERMS[0]})
    rows = [("q1", n, 1 if n % 2 else -1, b, None) for n in (1, 2, 3, 6, 7, 9)] + [("q2", 2, 1, b, None)]
    rows += [("q3", n, 1 if n % 4 == 1 else -1, b, None) for n in range(2, 43, 2)]  # every odd n missing
    store = SnapshotStore(tmp_path / "snap")
    report = compact_batch(spark, spark.createDataFrame(rows, "query_id string, n long, sign int, binding string, error string"),
                           store, publish=None)
    assert report.missing == {"q1": 3, "q2": 1, "q3": 21}
    assert report.gaps["q1"] == [[4, 5], [8, 8]] and report.gaps["q2"] == [[1, 1]]
    assert report.gaps["q3"] == [[n, n] for n in range(1, 20, 2)]  # only the first ranges are listed
    manifest = store.manifest()
    assert manifest["gaps"] == report.gaps and manifest["missing"] == report.missing
    assert store.folded_n() == {"q1": 9, "q2": 2, "q3": 42}


def test_retracting_every_answer_leaves_an_empty_snapshot_that_later_folds_build_on(spark: SparkSession, tmp_path: Path) -> None:
    a, b = canonical_binding({"x": TERMS[0]}), canonical_binding({"x": TERMS[1]})
    schema = "query_id string, n long, sign int, binding string, error string"
    store = SnapshotStore(tmp_path / "snap")
    report = compact_batch(spark, spark.createDataFrame([("q", 1, 1, a, None), ("q", 2, -1, a, None)], schema),
                           store, publish=None)
    assert report.snapshot_rows == 0 and store.read(spark).count() == 0 and store.folded_n() == {"q": 2}
    compact_batch(spark, spark.createDataFrame([("q", 3, 1, b, None), ("q", 1, 1, a, None)], schema), store, publish=None)
    assert [(r["binding"], r["multiplicity"], r["last_n"]) for r in store.read(spark).collect()] == [(b, 1, 3)]
    # Nothing new (an empty batch, or only already-folded deltas) keeps the current version.
    version = store.manifest()["version"]
    for rows in ([], [("q", 2, -1, a, None)]):
        report = compact_batch(spark, spark.createDataFrame(rows, schema), store, publish=None)
        assert report.changed == 0 and report.deltas_in == len(rows)
        assert store.manifest()["version"] == version and store.folded_n() == {"q": 3}


class CrashAfterPublish(RuntimeError):  # noqa: N818 - a simulated crash, not an error class
    pass


def test_a_crash_before_the_manifest_swap_is_repaired_by_rerunning_the_batch(spark: SparkSession, tmp_path: Path) -> None:
    """Spark re-runs a batch whose offsets were not committed; the rerun must converge, not double-count."""
    log = generate_log(random.Random(3), steps=120)
    schema = "query_id string, n long, sign int, binding string, error string"
    current: dict[tuple[str, str], int] = {}  # an in-memory answers.current: latest value per key

    def record(changed, _bindings) -> None:  # noqa: ANN001 - an Arrow table of the changed answers
        for r in changed.to_pylist():
            if r["multiplicity"] > 0:
                current[(r["query_id"], r["binding"])] = r["multiplicity"]
            else:
                current.pop((r["query_id"], r["binding"]), None)

    def crash(changed, _bindings) -> None:  # noqa: ANN001 - the broker was unreachable: nothing was published
        raise CrashAfterPublish()

    def record_then_crash(changed, bindings) -> None:  # noqa: ANN001 - published, then died before the manifest swap
        record(changed, bindings)
        raise CrashAfterPublish()

    store = SnapshotStore(tmp_path / "snap")
    head, tail = log[:60], log[60:]
    compact_batch(spark, spark.createDataFrame(delta_rows(head), schema), store, record)
    before = (store.manifest()["version"], store.folded_n())
    for publisher in (crash, record_then_crash):
        with pytest.raises(CrashAfterPublish):
            compact_batch(spark, spark.createDataFrame(delta_rows(tail), schema), store, publisher)
        assert (store.manifest()["version"], store.folded_n()) == before  # not durable: the batch will be re-run
    compact_batch(spark, spark.createDataFrame(delta_rows(tail), schema), store, record)
    assert snapshot_answers(spark, store) == expected_answers(log)
    assert {(q, frozenset(json.loads(b).items())): m for (q, b), m in current.items()} == expected_answers(log)


def produce_answers(settings: KafkaSettings, log: list[dict[str, Any]], extra_values: list[bytes] = ()) -> None:
    producer = make_producer(settings)
    for rec in log:
        producer.produce(settings.topic("answers"), key=rec["query_id"].encode(), value=encode("Answer", rec))
    for value in extra_values:
        producer.produce(settings.topic("answers"), key=b"junk", value=value)
    assert producer.flush(20) == 0


def current_topic_answers(settings: KafkaSettings) -> dict[tuple[str, frozenset], int]:
    """Latest value per key of answers.current, tombstones removing the key (what compaction keeps)."""
    latest: dict[bytes, bytes | None] = {}
    for msg in read_all(settings, settings.topic("answers.current")):
        latest[msg.key()] = msg.value()
    out = {}
    for key, value in latest.items():
        if value is not None:
            rec = decode("CurrentAnswer", value)
            out[(rec["query_id"], binding_id(rec["binding"]))] = rec["multiplicity"]
            assert json.loads(key)[0] == rec["query_id"]
    return out


def test_kafka_batch_compaction_publishes_current_answers_and_reports_bad_records(
    spark: SparkSession, kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    log = generate_log(random.Random(11), steps=120)
    produce_answers(kafka_settings, log, extra_values=[b"not avro"])
    options = kafka_options(kafka_settings)
    raw = spark.read.format("cbgpkafka").options(**options).option("subscribe", kafka_settings.topic("answers")).load()
    store = SnapshotStore(tmp_path / "snap")
    report = compact_batch(spark, decode_answers(raw), store,
                           kafka_publisher(options, kafka_settings.topic("answers.current")))
    assert report.undecodable == 1 and "CodecError" in report.errors[0]
    assert snapshot_answers(spark, store) == expected_answers(log)
    assert current_topic_answers(kafka_settings) == expected_answers(log)


def test_the_publisher_keeps_one_producer_across_batches_and_drops_one_that_failed(
    kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    """A new idempotent producer costs 0.5-1 s before its first ack, so compaction keeps one across batches; after a
    failed delivery the next batch gets a new one (the failed one's state is unknown)."""
    from spark import kafka_io

    log = generate_log(random.Random(12), steps=60)
    options = kafka_options(kafka_settings)
    publish = kafka_publisher(options, kafka_settings.topic("answers.current"))
    store = SnapshotStore(tmp_path / "snap")

    def table(part: list[dict[str, Any]]) -> pa.Table:
        return pa.Table.from_pylist([dict(zip(("query_id", "n", "sign", "binding", "error"), row))
                                     for row in delta_rows(part)])

    kafka_io.PRODUCERS.clear()
    try:
        compact_batch(None, table(log[:30]), store, publish)
        (first,) = kafka_io.PRODUCERS.values()
        compact_batch(None, table(log[30:]), store, publish)
        assert list(kafka_io.PRODUCERS.values()) == [first]
        assert current_topic_answers(kafka_settings) == expected_answers(log)
        changed = pa.table({"query_id": ["q0"], "binding": ['{"x":"<http://ex/a>"}'], "multiplicity": [1],
                            "last_n": [1], "version": [0], "partition": pa.array([99], pa.int32())})
        with pytest.raises(Exception, match="(?i)partition"):
            publish(changed, Bindings())  # no partition 99
        assert not kafka_io.PRODUCERS
        compact_batch(None, table(log), SnapshotStore(tmp_path / "again"), publish)
        assert list(kafka_io.PRODUCERS.values()) not in ([], [first])
    finally:
        kafka_io.PRODUCERS.clear()  # (a kept producer would outlive the test's broker)


def test_streaming_job_resumes_and_keeps_answers_current_exact(
    spark: SparkSession, kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    rng = random.Random(5)
    log = generate_log(rng, steps=200)
    first, rest = log[:90], log[90:]
    produce_answers(kafka_settings, first)
    first_ends = {p: hi for p, (_, hi) in end_offsets(kafka_settings, kafka_settings.topic("answers")).items()}
    for part in (first, rest):
        if part is rest:
            produce_answers(kafka_settings, rest + rng.sample(first, 10))  # late duplicates of folded deltas
        query = start_compaction(spark, kafka_settings, tmp_path / "snap", tmp_path / "ck", interval_s=None,
                                 publish_current=True)
        query.awaitTermination(240)
        assert query.exception() is None
    store = SnapshotStore(tmp_path / "snap")
    assert snapshot_answers(spark, store) == expected_answers(log)
    assert current_topic_answers(kafka_settings) == expected_answers(log)
    retracted = {(r["query_id"], binding_id(r["binding"])) for r in log} - set(expected_answers(log))
    assert retracted, "the generated log should retract some answers"
    assert store.folded_n() == {q: max(r["n"] for r in log if r["query_id"] == q) for q in {r["query_id"] for r in log}}
    # Progress is mirrored to a consumer group for lag tools.  Spark commits a batch's source offsets when
    # it plans the next batch, so the mirror trails by one batch: here, the end of the first run.
    group = Consumer(kafka_settings.consumer_config(f"{kafka_settings.topic_prefix}spark-compaction"))
    try:
        topic = kafka_settings.topic("answers")
        committed = group.committed([TopicPartition(topic, p) for p in range(kafka_settings.partitions)], timeout=10)
        assert {tp.partition: tp.offset for tp in committed} == first_ends
    finally:
        group.close()


def test_a_new_registration_version_replaces_the_querys_folded_answers(spark: SparkSession, tmp_path: Path) -> None:
    """A re-registered id's answers are a new stream numbered from n = 1 (Answer.version);
    the fold keeps only the latest version's rows, tombstones the old ones and drops late old deltas."""
    schema = "query_id string, n long, sign int, binding string, error string, version int"
    a, b, c = (json.dumps({"x": t}, separators=(",", ":")) for t in ("<http://ex/a>", "<http://ex/b>", "<http://ex/c>"))
    published: dict[tuple[str, str], tuple[int, int]] = {}

    def record(changed, _bindings) -> None:  # noqa: ANN001 - an Arrow table of the changed answers
        for r in changed.to_pylist():
            if r["multiplicity"] > 0:
                published[(r["query_id"], r["binding"])] = (r["multiplicity"], r["version"])
            else:
                published.pop((r["query_id"], r["binding"]), None)

    store = SnapshotStore(tmp_path / "snap")
    v1 = [("q", 1, 1, a, None, 1), ("q", 2, 1, b, None, 1), ("q", 3, 1, b, None, 1), ("other", 1, 1, a, None, 0)]
    compact_batch(spark, spark.createDataFrame(v1, schema), store, record)
    assert published == {("q", a): (1, 1), ("q", b): (2, 1), ("other", a): (1, 0)}
    # Version 2 starts at n = 1 while version 1's deltas are still in the batch.
    v2 = [("q", 4, -1, a, None, 1), ("q", 1, 1, c, None, 2), ("q", 2, 1, b, None, 2)]
    report = compact_batch(spark, spark.createDataFrame(v2, schema), store, record)
    assert report.stale == 1 and store.versions() == {"q": 2, "other": 0} and store.folded_n()["q"] == 2
    assert published == {("q", c): (1, 2), ("q", b): (1, 2), ("other", a): (1, 0)}
    rows = {(r["query_id"], r["binding"], r["multiplicity"]) for r in store.read(spark).collect()}
    assert rows == {("q", c, 1), ("q", b, 1), ("other", a, 1)}
    # A late version-1 delta changes nothing; version 2 carries on from its own n.
    report = compact_batch(spark, spark.createDataFrame([("q", 5, 1, a, None, 1), ("q", 3, -1, c, None, 2)], schema),
                           store, record)
    assert report.stale == 1 and published == {("q", b): (1, 2), ("other", a): (1, 0)}


def test_column_wise_answer_decoding_and_current_answer_encoding_match_the_codec() -> None:
    """spark.answer_columns reads Answer records with numpy, field by field, and writes CurrentAnswer records
    column-wise; both must agree with services.codec record by record, including records it cannot read
    (an older or another schema, truncated bytes), which go through codec.decode or are reported."""
    import pyarrow as pa

    from spark.answer_columns import current_answer_columns, decode_answer_values

    rng = random.Random(13)
    variables = ["x", "y", "zé", "w"]
    records = []
    for i in range(400):
        binding = {v: rng.choice(TERMS + [{"type": "literal", "value": "s", "datatype": XSD_STRING}])
                   for v in rng.sample(variables, rng.randrange(0, 4))}
        records.append({"query_id": rng.choice(["q1", "q/2", "é"]), "n": rng.randrange(1, 10**12),
                        "seq": rng.randrange(10**6), "sign": rng.choice("+-"), "binding": binding,
                        "snapshot": rng.random() < 0.5, "produced_at_ms": rng.randrange(2**41),
                        "version": rng.randrange(2**31)})
    values = [encode("Answer", r) for r in records]
    junk = [b"not avro", values[0][:-1], encode("CurrentAnswer", {"query_id": "q", "binding": {}, "multiplicity": 1,
                                                                   "last_n": 1, "version": 0})]
    table, bindings = decode_answer_values(pa.array(values + [None] + junk, pa.binary()),
                                           pa.array([3] * (len(values) + 4), pa.int32()),
                                           pa.array(range(len(values) + 4), pa.int64()))
    rows = table.to_pylist()
    assert len(rows) == len(values) + len(junk)  # the null value (a tombstone) is skipped
    for rec, row in zip(records, rows):
        assert row["error"] is None
        assert (row["query_id"], row["n"], row["sign"], row["version"]) == (
            rec["query_id"], rec["n"], 1 if rec["sign"] == "+" else -1, rec["version"])
        assert bindings.canonical[row["bidx"]] == canonical_binding(rec["binding"])
    errors = [row["error"] for row in rows[len(values):]]
    assert errors[0].startswith(f"partition 3 offset {len(values) + 1}: CodecError")
    assert all(e and "CodecError" in e for e in errors)
    changed = pa.table({
        "query_id": [r["query_id"] for r in rows[:len(values)]],
        "binding": [bindings.canonical[r["bidx"]] for r in rows[:len(values)]],
        "bidx": [r["bidx"] for r in rows[:len(values)]],
        "multiplicity": [rng.randrange(-1, 2**40) for _ in values], "last_n": [r["n"] for r in rows[:len(values)]],
        "version": [r["version"] for r in rows[:len(values)]]})
    for avro in (bindings.avro, None):  # the bindings' Avro bytes from the records, or encoded afresh
        keys, out = current_answer_columns(changed if avro else changed.drop_columns(["bidx"]), avro)
        for row, key, value in zip(changed.to_pylist(), keys.to_pylist(), out.to_pylist()):
            assert key == current_key(row["query_id"], row["binding"])
            if row["multiplicity"] <= 0:
                assert value is None
                continue
            rec = decode("CurrentAnswer", value)
            assert (rec["query_id"], rec["multiplicity"], rec["last_n"], rec["version"]) == (
                row["query_id"], row["multiplicity"], row["last_n"], row["version"])
            assert canonical_binding(rec["binding"]) == row["binding"]


def test_a_version_rewrites_only_touched_queries_and_spark_reads_every_query_id(spark: SparkSession,
                                                                                tmp_path: Path) -> None:
    """Query ids with characters Spark escapes in partition directories read back as written, and a fold
    touching one query keeps the other queries' files (hard links to the previous version)."""
    schema = "query_id string, n long, sign int, binding string, error string"
    a, b = canonical_binding({"x": TERMS[0]}), canonical_binding({"x": TERMS[3]})
    odd = ["a/b=c%d", "é ?#", "plain"]
    store = SnapshotStore(tmp_path / "snap")
    compact_batch(spark, spark.createDataFrame([(q, 1, 1, a, None) for q in odd], schema), store, publish=None)
    compact_batch(spark, spark.createDataFrame([("plain", 2, 1, b, None), ("plain", 3, -1, a, None)], schema),
                  store, publish=None)
    rows = {(r["query_id"], r["binding"], r["multiplicity"], r["last_n"]) for r in store.read(spark).collect()}
    assert rows == {("a/b=c%d", a, 1, 1), ("é ?#", a, 1, 1), ("plain", b, 1, 2)}
    old, new = store.version_dir(1), store.version_dir(2)
    kept = [p for p in new.rglob("*.parquet") if "plain" not in str(p)]
    assert len(kept) == 2 and all(p.stat().st_nlink == 2 for p in kept)  # shared with version 1
    assert all((old / p.relative_to(new)).samefile(p) for p in kept)
    assert store.manifest()["rows"] == {"a/b=c%d": [1, 0], "é ?#": [1, 0], "plain": [1, 0]}


def test_a_first_compaction_on_a_log_whose_start_was_deleted_seeds_itself_from_answers_current(
    spark: SparkSession, kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    """The answers topic is bounded, so a compaction first started after retention deleted the log's start (a
    Spark job deployed later, or one that lost its state dir) must not fold only what is left.  It seeds its
    snapshot from answers.current at a consistent cut and folds from there: its answers equal the whole log's,
    its n each query's highest, and no gap is reported -- also for a query with no delta left below the cut,
    whose n then comes from its current answers (``late``: +b1 +b2 -b1 deleted, +b3 after)."""
    from confluent_kafka.admin import AdminClient

    rng = random.Random(21)
    log = generate_log(rng, queries=4, steps=240)
    log = [rec for i, rec in enumerate(log) if (rec["query_id"], rec["n"]) not in
           {(r["query_id"], r["n"]) for r in log[:i]} or i < 140]  # the answers service writes exactly once
    first, rest = log[:140], log[140:]
    b = [{"x": TERMS[i]} for i in range(3)]
    late = [{"query_id": "late", "n": n, "seq": n, "sign": sign, "binding": binding, "snapshot": False,
             "produced_at_ms": 1_700_000_000_000}
            for n, sign, binding in ((1, "+", b[0]), (2, "+", b[1]), (3, "-", b[0]))]
    late_after = [{**late[0], "n": 4, "binding": b[2]}]
    topic = kafka_settings.topic("answers")
    produce_answers(kafka_settings, late + first)
    # The answers service keeps answers.current equal to the fold of the log; a compaction publishing it stands in.
    stand_in = start_compaction(spark, kafka_settings, tmp_path / "stand-in", tmp_path / "stand-in-ck", interval_s=None,
                                publish_current=True)
    stand_in.awaitTermination(240)
    assert stand_in.exception() is None
    admin = AdminClient(kafka_settings.admin_config())
    (late_partition,) = {msg.partition() for msg in read_all(kafka_settings, topic) if msg.key() == b"late"}
    cut = {p: high if p == late_partition else high * 3 // 4
           for p, (_low, high) in end_offsets(kafka_settings, topic).items()}
    deleting = admin.delete_records([TopicPartition(topic, p, o) for p, o in cut.items()], request_timeout=10)
    for future in deleting.values():
        future.result(10)  # as retention would
    left = [decode("Answer", msg.value()) for msg in read_all(kafka_settings, topic)]
    assert expected_answers(left) != expected_answers(late + first), "the deletion must matter"
    assert not any(rec["query_id"] == "late" for rec in left)

    def compaction() -> SnapshotStore:
        query = start_compaction(spark, kafka_settings, tmp_path / "snap", tmp_path / "ck", interval_s=None)
        query.awaitTermination(240)
        assert query.exception() is None
        return SnapshotStore(tmp_path / "snap")

    store = compaction()
    assert snapshot_answers(spark, store) == expected_answers(late + first)
    assert store.manifest()["seeded"]["log_start"] == {str(p): o for p, o in cut.items()}
    assert store.lower_bound() == ["late"] and store.folded_n()["late"] == 2  # its -b1 (n = 3) was deleted
    produce_answers(kafka_settings, rest + late_after)
    store = compaction()  # resumes from its checkpoint: no second seed
    whole = late + first + rest + late_after
    assert snapshot_answers(spark, store) == expected_answers(whole)
    assert store.folded_n() == {q: max(r["n"] for r in whole if r["query_id"] == q)
                                for q in {r["query_id"] for r in whole}}
    manifest = store.manifest()
    assert manifest["gaps"] == {} and manifest["missing"] == {}
    assert store.lower_bound() == []  # "late" took its next delta (n = 4) and is exact again


def test_a_lower_bound_n_takes_the_next_delta_as_the_next_number_and_then_checks_gaps_again() -> None:
    """A seeded query's folded n may be below the n it reached (its last deltas were deleted): its first new
    delta is not a gap after it; the numbers after that are checked as ever."""
    def batch(ns: list[int]) -> pa.Table:
        return pa.Table.from_pylist([{"query_id": "q", "n": n, "sign": 1, "error": None,
                                      "binding": canonical_binding({"x": TERMS[n % 3]})} for n in ns])

    store_n = {"q": 2}
    strict = fold(delta_table(batch([5, 6, 9])), store_n, {})
    assert strict.report.gaps == {"q": [[3, 4], [7, 8]]} and strict.report.lower_bound == []
    loose = fold(delta_table(batch([5, 6, 9])), store_n, {}, lower_bound=["q", "other"])
    assert loose.report.gaps == {"q": [[7, 8]]} and loose.report.missing == {"q": 2}
    assert loose.report.folded_n == {"q": 9} and loose.report.lower_bound == ["other"]
