"""The cbgpkafka data source against a real broker and the shared SparkSession.

What must hold for the Spark job to be exact: the source reads exactly the records produced (no more, no
less, aborted transactions excluded), a query restarted from its checkpoint reads only what arrived
since (checked on (partition, offset)), offset gaps left by transaction markers do not hang a read, and
the sink delivers every row.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from services.kafka.client import end_offsets, make_producer, read_all
from services.kafka.config import KafkaSettings
from services.kafka.topics import TopicSpec, ensure_topics
from spark.kafka_io import KafkaSourceError, read_ranges

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def make_topic(settings: KafkaSettings, name: str, partitions: int) -> str:
    ensure_topics(settings, [TopicSpec(name, partitions, "test", "spark test topic")])
    return settings.topic(name)


def produce(settings: KafkaSettings, topic: str, records: list[tuple[str, str]]) -> None:
    producer = make_producer(settings)
    for key, value in records:
        producer.produce(topic, key=key.encode(), value=value.encode())
    assert producer.flush(20) == 0


def source_options(settings: KafkaSettings, topic: str) -> dict[str, str]:
    return {"kafka.bootstrap.servers": settings.bootstrap_servers, "subscribe": topic, "readTimeoutMs": "15000"}


def stream_to_parquet(spark: SparkSession, settings: KafkaSettings, topic: str, base: Path) -> None:
    """One availableNow run of topic -> parquet with a checkpoint under ``base`` (restartable)."""
    query = (
        spark.readStream.format("cbgpkafka").options(**source_options(settings, topic)).load()
        .writeStream.format("parquet")
        .option("path", str(base / "out"))
        .option("checkpointLocation", str(base / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None


def rows_of(df: DataFrame) -> list[tuple]:
    return sorted((r["partition"], r["offset"], r["key"], r["value"]) for r in df.collect())


def expected_rows(settings: KafkaSettings, topic: str) -> list[tuple]:
    """What an independent read_committed consumer sees, in the same shape."""
    return sorted((m.partition(), m.offset(), m.key(), m.value()) for m in read_all(settings, topic))


def test_batch_read_returns_exactly_the_produced_records(spark: SparkSession, kafka_settings: KafkaSettings) -> None:
    topic = make_topic(kafka_settings, "src", 3)
    records = [(f"k{i % 11}", f"v{i}") for i in range(300)]
    produce(kafka_settings, topic, records)
    df = spark.read.format("cbgpkafka").options(**source_options(kafka_settings, topic)).load()
    got = rows_of(df)
    assert sorted((k.decode(), v.decode()) for _, _, k, v in got) == sorted(records)
    assert got == expected_rows(kafka_settings, topic)
    assert {p for p, *_ in got} == {0, 1, 2}
    assert df.where("topic = '%s' and timestamp_ms > 0" % topic).count() == 300
    # An explicit range reads only that range.
    sub = (spark.read.format("cbgpkafka").options(**source_options(kafka_settings, topic))
           .option("startingOffsets", '{"0": 2}').option("endingOffsets", '{"0": 5, "1": 0, "2": 0}').load())
    assert [(r["partition"], r["offset"]) for r in sub.orderBy("offset").collect()] == [(0, 2), (0, 3), (0, 4)]
    # ranges=true: one (partition, start, end) row per partition with records, which read_ranges reads (the
    # compaction job's path: Spark plans and checkpoints the offsets, the driver reads the records into Arrow).
    ranges = (spark.read.format("cbgpkafka").options(**source_options(kafka_settings, topic))
              .option("startingOffsets", '{"0": 2}').option("ranges", "true").load().collect())
    ends = {p: hi for p, (_lo, hi) in end_offsets(kafka_settings, topic).items()}
    assert sorted((r["partition"], r["start"], r["end"]) for r in ranges) == [(0, 2, ends[0]), (1, 0, ends[1]),
                                                                            (2, 0, ends[2])]
    table = read_ranges(source_options(kafka_settings, topic), topic, ranges)
    assert sorted(zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(),
                      table.column("key").to_pylist(), table.column("value").to_pylist())) == [
        row for row in got if row[0] != 0 or row[1] >= 2]


def test_stream_restart_from_checkpoint_reads_only_new_records(
    spark: SparkSession, kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    topic = make_topic(kafka_settings, "src", 3)
    produce(kafka_settings, topic, [(f"k{i % 7}", f"a{i}") for i in range(200)])
    stream_to_parquet(spark, kafka_settings, topic, tmp_path)
    first = rows_of(spark.read.parquet(str(tmp_path / "out")))
    assert first == expected_rows(kafka_settings, topic)

    produce(kafka_settings, topic, [(f"k{i % 7}", f"b{i}") for i in range(150)])
    stream_to_parquet(spark, kafka_settings, topic, tmp_path)
    both = rows_of(spark.read.parquet(str(tmp_path / "out")))
    positions = [(p, o) for p, o, _, _ in both]
    assert len(positions) == len(set(positions)) == 350  # no duplicates
    assert both == expected_rows(kafka_settings, topic)  # no gaps, nothing extra
    assert sorted(v.decode() for *_, v in both if v.startswith(b"b")) == sorted(f"b{i}" for i in range(150))


def test_transactional_topic_with_aborts_reads_committed_records_only_and_resumes(
    spark: SparkSession, kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    topic = make_topic(kafka_settings, "txn", 2)
    producer = make_producer(kafka_settings, transactional_id=f"{topic}-writer")

    def transaction(tag: str, count: int, commit: bool) -> None:
        producer.begin_transaction()
        for i in range(count):
            producer.produce(topic, key=f"k{i}".encode(), value=f"{tag}{i}".encode())
        (producer.commit_transaction if commit else producer.abort_transaction)(20)

    transaction("c1-", 20, True)
    transaction("x1-", 15, False)
    transaction("c2-", 10, True)
    stream_to_parquet(spark, kafka_settings, topic, tmp_path)
    first = rows_of(spark.read.parquet(str(tmp_path / "out")))
    assert sorted(v.decode() for *_, v in first) == sorted([f"c1-{i}" for i in range(20)] + [f"c2-{i}" for i in range(10)])

    # The log now ends with an abort marker, then more commits: resume must skip the gaps, not hang.
    transaction("x2-", 5, False)
    transaction("c3-", 12, True)
    transaction("x3-", 3, False)
    stream_to_parquet(spark, kafka_settings, topic, tmp_path)
    both = rows_of(spark.read.parquet(str(tmp_path / "out")))
    positions = [(p, o) for p, o, _, _ in both]
    assert len(positions) == len(set(positions)) == 42
    assert both == expected_rows(kafka_settings, topic)
    offsets = sorted(o for p, o, *_ in both if p == 0)
    assert offsets[-1] - offsets[0] + 1 > len(offsets)  # the topic really has offset gaps
    # Read in 7 tasks: pieces of a range start and end inside transactions and on markers.
    split = spark.read.format("cbgpkafka").options(**source_options(kafka_settings, topic), minPartitions="7").load()
    assert split.rdd.getNumPartitions() >= 7
    assert rows_of(split) == both


def test_split_ranges_cuts_large_ranges_into_contiguous_pieces_in_proportion() -> None:
    from spark.kafka_io import KafkaPartition, split_ranges

    parts = [KafkaPartition("t", 0, 100, 1100), KafkaPartition("t", 1, 5, 8)]
    pieces = split_ranges(parts, 4)
    assert len(pieces) >= 4
    for partition, (start, end) in ((0, (100, 1100)), (1, (5, 8))):
        mine = [(p.start, p.end) for p in pieces if p.partition == partition]
        assert mine[0][0] == start and mine[-1][1] == end
        assert all(a < b for a, b in mine) and all(x[1] == y[0] for x, y in zip(mine, mine[1:]))
    assert len([p for p in pieces if p.partition == 0]) >= 3  # the large range takes most pieces
    assert split_ranges(parts, 2) == parts  # already enough
    assert len(split_ranges([KafkaPartition("t", 0, 0, 2)], 8)) == 2  # at most one offset a piece


def test_max_offsets_per_trigger_splits_the_backlog_into_bounded_batches(
    spark: SparkSession, kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    topic = make_topic(kafka_settings, "src", 2)
    produce(kafka_settings, topic, [(f"k{i}", f"v{i}") for i in range(120)])
    query = (
        spark.readStream.format("cbgpkafka").options(**source_options(kafka_settings, topic))
        .option("maxOffsetsPerTrigger", "40").load()
        .writeStream.format("parquet").option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 120 and len(sizes) >= 3 and max(sizes) <= 40
    assert rows_of(spark.read.parquet(str(tmp_path / "out"))) == expected_rows(kafka_settings, topic)


def test_write_tasks_of_one_worker_share_a_producer_and_a_failed_one_is_dropped(kafka_settings: KafkaSettings) -> None:
    """A new idempotent producer waits 0.5 s for its producer id before its first delivery: every write task
    paid it, half of the windows' micro-batch latency at 5,000 updates/s."""
    from pyspark.sql.types import BinaryType, IntegerType, StructField, StructType

    from spark import kafka_io

    out = make_topic(kafka_settings, "shared", 1)
    options = {"kafka.bootstrap.servers": kafka_settings.bootstrap_servers, "topic": out}
    schema = StructType([StructField("value", BinaryType()), StructField("partition", IntegerType())])
    kafka_io.PRODUCERS.clear()
    try:
        _check_shared_producer(kafka_io, kafka_settings, out, options, schema)
    finally:
        kafka_io.PRODUCERS.clear()  # (a cached producer would outlive the test's broker, logging reconnects)


def _check_shared_producer(kafka_io, kafka_settings: KafkaSettings, out: str, options: dict,  # noqa: ANN001
                           schema) -> None:  # noqa: ANN001
    from confluent_kafka import KafkaException

    for n in (3, 4):
        assert kafka_io.write_rows(options, schema, iter([{"value": b"v", "partition": 0}] * n)).count == n
    (first,) = kafka_io.PRODUCERS.values()
    assert len(read_all(kafka_settings, out)) == 7
    with pytest.raises((KafkaSourceError, KafkaException)):
        kafka_io.write_rows(options, schema, iter([{"value": b"v", "partition": 5}]))  # no such partition
    assert not kafka_io.PRODUCERS
    assert kafka_io.write_rows(options, schema, iter([{"value": b"v", "partition": 0}])).count == 1
    assert list(kafka_io.PRODUCERS.values()) != [first]


def test_batch_and_stream_writers_deliver_every_row(
    spark: SparkSession, kafka_settings: KafkaSettings, tmp_path: Path
) -> None:
    out = make_topic(kafka_settings, "out", 2)
    rows = [(f"k{i}", f"v{i}") for i in range(500)]
    (spark.createDataFrame(rows, "key string, value string").write.format("cbgpkafka").mode("append")
     .option("kafka.bootstrap.servers", kafka_settings.bootstrap_servers).option("topic", out).save())
    assert sorted((m.key().decode(), m.value().decode()) for m in read_all(kafka_settings, out)) == sorted(rows)

    src = make_topic(kafka_settings, "src", 3)
    streamed = [(f"s{i}", f"w{i}") for i in range(300)]
    produce(kafka_settings, src, streamed)
    query = (
        spark.readStream.format("cbgpkafka").options(**source_options(kafka_settings, src)).load()
        .selectExpr("key", "value")
        .writeStream.format("cbgpkafka")
        .option("kafka.bootstrap.servers", kafka_settings.bootstrap_servers).option("topic", out)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None
    got = sorted((m.key().decode(), m.value().decode()) for m in read_all(kafka_settings, out))
    assert got == sorted(rows + streamed)


def test_missing_topic_is_a_clear_error(spark: SparkSession, kafka_settings: KafkaSettings) -> None:
    with pytest.raises(Exception, match="does not exist"):
        spark.read.format("cbgpkafka").options(**source_options(kafka_settings, kafka_settings.topic("nope"))).load().count()
    with pytest.raises(KafkaSourceError, match="bootstrap.servers"):
        from spark.kafka_io import client_config

        client_config({"subscribe": "x"})


def test_an_idle_trigger_costs_one_watermark_request_per_partition_and_no_metadata_request() -> None:
    # A streaming query asks for the latest offsets every trigger (every second, data or not); it asked for
    # the topic's metadata and then the watermarks twice per trigger (latestOffset and reportLatestOffset).
    from spark.kafka_io import KafkaStreamReader
    from spark.kafka_io import OffsetPlanner as Planner

    class Partition:
        pass

    class Topic:
        error = None
        partitions = {0: Partition(), 1: Partition()}

    class Metadata:
        topics = {"t": Topic()}

    class Consumer:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def list_topics(self, topic: str, timeout: float) -> Metadata:
            self.calls.append("metadata")
            return Metadata()

        def get_watermark_offsets(self, tp: object, timeout: float) -> tuple[int, int]:
            self.calls.append("watermarks")
            return (0, 5)

    reader = KafkaStreamReader({"subscribe": "t", "kafka.bootstrap.servers": "127.0.0.1:1"})
    consumer = reader.planner._consumer = Consumer()
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    start = reader.latestOffset({}, ReadAllAvailable())
    assert reader.reportLatestOffset() == start == {"0": 5, "1": 5}
    consumer.calls.clear()
    for _trigger in range(10):
        assert reader.latestOffset(start, ReadAllAvailable()) == start
        assert reader.reportLatestOffset() == start
    assert consumer.calls == ["watermarks"] * 20  # two partitions per trigger, nothing else
    assert Planner.PARTITIONS_TTL_S > 0
