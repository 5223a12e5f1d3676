"""Kafka source and sink for Spark, on the Python Data Source API and confluent-kafka.

How it works: docs/design/internals.md, spark.kafka_io.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

FORMAT_NAME = "cbgpkafka"
KAFKA_SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp_ms long"
RANGES_SCHEMA = "partition int, start long, end long"
_COLUMNS = ["key", "value", "topic", "partition", "offset", "timestamp_ms"]
_ARROW_BATCH_ROWS = 10_000


class KafkaSourceError(RuntimeError):
    """Reading from or writing to Kafka failed; the message says which topic/partition and why."""


def client_config(options: Mapping[str, str], **defaults: Any) -> dict[str, Any]:
    """librdkafka config from the ``kafka.*`` options (prefix stripped), over ``defaults``."""
    conf: dict[str, Any] = dict(defaults)
    for key, value in options.items():
        if key.lower().startswith("kafka."):
            conf[key[len("kafka.") :]] = value
    if "bootstrap.servers" not in conf:
        raise KafkaSourceError("option kafka.bootstrap.servers is required (e.g. 127.0.0.1:9092)")
    return conf


def _reader_config(options: Mapping[str, str], group: str) -> dict[str, Any]:
    return client_config(
        options,
        **{
            "group.id": group,
            "enable.auto.commit": False,
            # Never read aborted transactional records; offsets of the end are then the LSO.
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        },
    )


class KafkaPartition(InputPartition):
    """One Kafka partition's offset range ``[start, end)`` for one Spark task."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end


def split_ranges(parts: list[KafkaPartition], min_partitions: int) -> list[KafkaPartition]:
    """``parts`` with each range cut into contiguous pieces, in proportion to its size, so that there are at
    least ``min_partitions`` of them (where the ranges hold that many offsets); as they are when already
    enough."""
    if len(parts) >= min_partitions:
        return parts
    total = sum(p.end - p.start for p in parts)
    out: list[KafkaPartition] = []
    for part in parts:
        size = part.end - part.start
        pieces = max(1, min(size, -(-size * min_partitions // total)))  # ceil, at most one offset a piece
        bounds = [part.start + size * i // pieces for i in range(pieces)] + [part.end]
        out.extend(KafkaPartition(part.topic, part.partition, a, b) for a, b in zip(bounds, bounds[1:]))
    return out


def _parse_offsets(spec: str, default: str) -> str | dict[str, int]:
    spec = (spec or default).strip()
    if spec in ("earliest", "latest"):
        return spec
    try:
        parsed = json.loads(spec)
        return {str(p): int(o) for p, o in parsed.items()}
    except (ValueError, AttributeError) as exc:
        raise KafkaSourceError(f"offsets must be earliest, latest or JSON {{partition: offset}}, got {spec!r}") from exc


class OffsetPlanner:
    """Driver-side: one cached consumer answering watermark queries for the topic."""

    # A streaming query asks for the latest offsets at every trigger (every second, data or not): the topic's
    # partition list is cached this long instead of a Metadata request per trigger (a new partition is seen
    # within this time; a failing watermark request refreshes it at once).
    PARTITIONS_TTL_S = 30.0

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options
        if "subscribe" not in options:
            raise KafkaSourceError("option subscribe (the topic to read) is required")
        self.topic = options["subscribe"]
        self._consumer: Any = None
        self._partitions: list[int] | None = None
        self._partitions_at = 0.0

    def consumer(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer(_reader_config(self.options, self.options.get("commitGroup", "cbgp-spark-planner")))
        return self._consumer

    def watermarks(self) -> dict[str, tuple[int, int]]:
        """``{partition: (low, high)}``; high is the last stable offset under read_committed."""
        from confluent_kafka import TopicPartition

        consumer = self.consumer()
        if self._partitions is None or time.monotonic() - self._partitions_at > self.PARTITIONS_TTL_S:
            meta = consumer.list_topics(self.topic, timeout=10).topics.get(self.topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise KafkaSourceError(f"topic {self.topic!r} does not exist or has no partitions ({meta and meta.error})")
            self._partitions, self._partitions_at = sorted(meta.partitions), time.monotonic()
        try:
            return {str(p): consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)
                    for p in self._partitions}
        except Exception:
            self._partitions = None  # partitions may have changed (or the broker did): ask again next time
            raise

    def resolve(self, spec: str | dict[str, int]) -> dict[str, int]:
        marks = self.watermarks()
        if spec == "earliest":
            return {p: lo for p, (lo, _) in marks.items()}
        if spec == "latest":
            return {p: hi for p, (_, hi) in marks.items()}
        assert isinstance(spec, dict)
        # Partitions absent from an explicit spec start at their beginning (new partitions).
        return {p: spec.get(p, lo) for p, (lo, _) in marks.items()}

    def __getstate__(self) -> dict[str, Any]:
        # Readers are pickled to Python workers; a live librdkafka client cannot travel.
        return {**self.__dict__, "_consumer": None, "_partitions": None}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


_ARROW_SCHEMA: Any = None


def _arrow_schema() -> Any:
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        import pyarrow as pa

        _ARROW_SCHEMA = pa.schema(
            [("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
             ("offset", pa.int64()), ("timestamp_ms", pa.int64())])
    return _ARROW_SCHEMA


def read_partition(options: Mapping[str, str], part: KafkaPartition) -> Iterator[Any]:
    """Yield the records of ``part`` (tuples, or Arrow batches with ``arrow=true``).

    Arrow batches are built column by column from each ``consume()`` call's messages (no per-record
    tuple), up to ``_ARROW_BATCH_ROWS`` rows each."""
    if options.get("ranges", "false").lower() == "true":
        if part.end > part.start:
            yield (part.partition, part.start, part.end)
        return
    use_arrow = options.get("arrow", "true").lower() == "true"
    if not use_arrow:
        for msgs in _read_messages(options, part):
            for msg in msgs:
                yield (msg.key(), msg.value(), part.topic, part.partition, msg.offset(), msg.timestamp()[1])
        return
    import pyarrow as pa

    schema = _arrow_schema()
    buf: list[Any] = []

    def batch() -> Any:
        n = len(buf)
        return pa.RecordBatch.from_arrays([
            pa.array([m.key() for m in buf], pa.binary()), pa.array([m.value() for m in buf], pa.binary()),
            pa.array([part.topic] * n, pa.string()), pa.array([part.partition] * n, pa.int32()),
            pa.array([m.offset() for m in buf], pa.int64()), pa.array([m.timestamp()[1] for m in buf], pa.int64()),
        ], schema=schema)

    for msgs in _read_messages(options, part):
        buf.extend(msgs)
        if len(buf) >= _ARROW_BATCH_ROWS:
            yield batch()
            buf = []
    if buf:
        yield batch()


def read_ranges(options: Mapping[str, str], topic: str, ranges: Any) -> Any:
    """The records of ``ranges`` (rows ``(partition, start, end)``, as ``ranges=true`` produces them) of
    ``topic`` as one Arrow table (``key, value, topic, partition, offset, timestamp_ms``), read here."""
    import pyarrow as pa

    batches = []
    for row in ranges:
        part = KafkaPartition(topic, int(row["partition"]), int(row["start"]), int(row["end"]))
        batches.extend(read_partition({**options, "arrow": "true", "ranges": "false"}, part))
    return pa.Table.from_batches(batches, schema=_arrow_schema())


def _read_messages(options: Mapping[str, str], part: KafkaPartition) -> Iterator[list[Any]]:
    """The messages of ``part``, one list per ``consume()`` call (the batched read)."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    if part.end <= part.start:
        return
    timeout_s = int(options.get("readTimeoutMs", "30000")) / 1000.0
    consumer = Consumer(_reader_config(options, "cbgp-spark-reader"))
    tp = TopicPartition(part.topic, part.partition, part.start)
    consumer.assign([tp])
    position, last_progress = part.start, time.monotonic()
    try:
        while position < part.end:
            # (a range ending on a transaction marker holds fewer records than offsets: consume() would wait out
            # its whole timeout for the last of them, so wait briefly and look at the position)
            msgs = consumer.consume(num_messages=min(10_000, part.end - position), timeout=0.05)
            good = []
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        # The log ends before `end`: only possible if records were truncated.
                        if msg.offset() < part.end:
                            raise KafkaSourceError(
                                f"{part.topic}/{part.partition}: log ends at {msg.offset()} before planned end "
                                f"{part.end} (records deleted or truncated?)"
                            )
                        position = part.end
                        break
                    raise KafkaSourceError(f"{part.topic}/{part.partition}@{position}: {err}")
                if msg.offset() >= part.end:
                    position = part.end
                    break
                good.append(msg)
                position, last_progress = msg.offset() + 1, time.monotonic()
            if good:
                yield good
            if position >= part.end:
                break
            if not msgs:
                # Transaction markers and compaction leave offsets with no record: the consumer's
                # position moves past them although nothing is delivered.
                pos = consumer.position([TopicPartition(part.topic, part.partition)])[0].offset
                if pos >= part.end:
                    break
                if time.monotonic() - last_progress > timeout_s:
                    raise KafkaSourceError(
                        f"timeout reading {part.topic}/{part.partition}: at {max(pos, position)}, "
                        f"range ends at {part.end}, nothing for {timeout_s:.0f}s"
                    )
    finally:
        consumer.close()


class DutyGate:
    """Whether a duty's queries need its source topic now, from the plans topic (option ``onlyWhenNeededBy``:
    ``windows`` or ``assembly``, with ``plansTopic``): while no registered query needs it the source reports no
    new offsets, so Spark runs no batch and the duty costs nothing.

    - ``windows``: a windowed query is registered; it sees updates.encoded from its registration offset (its
      plan's ``registered_at_seq``), so the source reads from the lowest of those;
    - ``assembly``: a product whose parts the workers send to the Spark job (``RegisteredPlan.assembled_by_spark``;
      option ``fleetSingleOwner``: the workers run with ``--placement single-owner``)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.duty = options["onlyWhenNeededBy"]
        if self.duty not in ("windows", "assembly"):
            raise KafkaSourceError(f"onlyWhenNeededBy must be windows or assembly, got {self.duty!r}")
        if "plansTopic" not in options:
            raise KafkaSourceError("option plansTopic is required with onlyWhenNeededBy")
        self.config = client_config(options)
        self.plans_topic = options["plansTopic"]
        self.single_owner = options.get("fleetSingleOwner", "false").lower() == "true"
        self._assembled: dict[tuple[str, int], bool] = {}  # (query id, version) -> assembled_by_spark

    def floor(self) -> dict[str, int] | None:
        """None while nothing needs the topic; else the lowest offset per partition anything needs."""
        from spark.plan_topic import plan_cache

        plans = plan_cache(self.config, self.plans_topic).refresh().values()
        if self.duty == "windows":
            seqs = [plan.registered_at_seq for plan in plans if plan.window is not None]
            return {"0": min(seqs)} if seqs else None
        assembled = self._assembled
        live = {}
        for plan in plans:
            key = (plan.query_id, plan.version)
            live[key] = assembled[key] if key in assembled else plan.assembled_by_spark(self.single_owner)
        self._assembled = live
        return {} if any(live.values()) else None


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader; offsets ``{"<partition>": next_offset}`` live in Spark's checkpoint."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options
        self.planner = OffsetPlanner(options)
        self.topic = self.planner.topic
        self.max_per_trigger = int(options.get("maxOffsetsPerTrigger", "0")) or None
        self._available_now_target: dict[str, int] | None = None
        self._latest: dict[str, int] | None = None
        self.gate = DutyGate(options) if options.get("onlyWhenNeededBy") else None
        # The latest offsets found while nothing needed the topic (taken before the plans were read): what lies
        # below them came before any query that needs it, so a batch after a quiet spell starts there.
        self._idle_end: dict[str, int] = {}
        self._floor: dict[str, int] | None = None  # the gate's floor latestOffset found, for the batch it plans

    def initialOffset(self) -> dict:
        return self.planner.resolve(_parse_offsets(self.options.get("startingOffsets", ""), "earliest"))

    def prepareForTriggerAvailableNow(self) -> None:
        # availableNow must not read past what existed when the query started.
        self._available_now_target = self.planner.resolve("latest")

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        end = self._latest = self.planner.resolve("latest")
        # (the offsets before the plans: a query registered after them has its registration offset at or past them)
        if self.gate is not None:
            self._floor = self.gate.floor()
            if start and self._floor is None:
                self._idle_end = end
                return dict(start)  # nothing needs the topic now: no batch at all
        if self._available_now_target is not None:
            end = {p: min(o, self._available_now_target.get(p, o)) for p, o in end.items()}
        # Never go backwards (a partition's end cannot shrink below what was already read).
        end = {p: max(o, start.get(p, 0)) for p, o in end.items()} if start else end
        if isinstance(limit, ReadMaxRows) and start:
            per_partition = max(1, limit.max_rows // max(1, len(end)))
            end = {p: min(o, start.get(p, 0) + per_partition) for p, o in end.items()}
        return end

    def reportLatestOffset(self) -> dict | None:
        # Progress reporting only: what latestOffset found at this trigger, not a second broker round trip.
        return self._latest if self._latest is not None else self.planner.resolve("latest")

    def partitions(self, start: dict, end: dict) -> list[KafkaPartition]:
        # (the floor latestOffset found; a batch planned before a restart is planned again without it)
        floor = self._floor if self._floor is not None or self.gate is None else self.gate.floor()
        begin = {p: max(int(start.get(p, 0)), (floor or {}).get(p, 0), self._idle_end.get(p, 0)) for p in end}
        return split_ranges([
            KafkaPartition(self.topic, int(p), begin[p], int(e))
            for p, e in sorted(end.items(), key=lambda kv: int(kv[0]))
            if int(e) > begin[p]
        ], int(self.options.get("minPartitions", "0") or 0))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaPartition)
        return read_partition(self.options, partition)

    def commit(self, end: dict) -> None:
        group = self.options.get("commitGroup")
        if group:
            from confluent_kafka import TopicPartition

            offsets = [TopicPartition(self.topic, int(p), int(o)) for p, o in end.items()]
            self.planner.consumer().commit(offsets=offsets, asynchronous=False)

    def stop(self) -> None:
        self.planner.close()


class KafkaBatchReader(DataSourceReader):
    """Batch read of ``[startingOffsets, endingOffsets)`` per partition."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options
        planner = OffsetPlanner(options)
        try:
            self.topic = planner.topic
            self.start = planner.resolve(_parse_offsets(options.get("startingOffsets", ""), "earliest"))
            self.end = planner.resolve(_parse_offsets(options.get("endingOffsets", ""), "latest"))
        finally:
            planner.close()

    def partitions(self) -> list[KafkaPartition]:
        parts = [
            KafkaPartition(self.topic, int(p), self.start.get(p, 0), e)
            for p, e in sorted(self.end.items(), key=lambda kv: int(kv[0]))
            if e > self.start.get(p, 0)
        ]
        # Spark requires at least one partition; an empty range reads nothing.
        return split_ranges(parts, int(self.options.get("minPartitions", "0") or 0)) or \
            [KafkaPartition(self.topic, 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaPartition)
        return read_partition(self.options, partition)


PRODUCERS: dict[tuple, Any] = {}  # per process: client config -> producer (see reused_producer)


class ProducedCount(WriterCommitMessage):
    """What a write task reports back: how many records were acknowledged by the broker."""

    def __init__(self, count: int) -> None:
        self.count = count


def write_rows(options: Mapping[str, str], schema: StructType, rows: Iterator[Any]) -> ProducedCount:
    """Produce ``rows`` (columns key, value and optionally topic/partition) and wait for every ack.

    Raises if any delivery failed, so the Spark task fails and the batch is not committed
    (at-least-once: a retried batch may produce some records twice; consumers dedupe by key/number).
    """
    names = set(schema.fieldNames())
    if "value" not in names:
        raise KafkaSourceError(f"the DataFrame written to Kafka needs a value column, got {sorted(names)}")
    fixed_topic = options.get("topic")
    if fixed_topic is None and "topic" not in names:
        raise KafkaSourceError("set option topic or provide a topic column")
    by_row = "topic" in names
    config = client_config(options, **{"enable.idempotence": True, "acks": "all", "linger.ms": 5})
    with reused_producer(config) as producer:
        return _produce_all(producer, options, names, fixed_topic, by_row, rows)


@contextmanager
def reused_producer(config: Mapping[str, Any]) -> Iterator[Any]:
    """This process's producer for ``config``, kept for the next batch: a new idempotent producer spends 0.5-1 s
    getting its producer id from the broker before its first delivery (measured on noida-db), which every write
    task and every compaction batch paid (Spark's Kafka sink caches its producers the same way).  A producer
    whose block raised is dropped, not reused: its state is unknown."""
    from confluent_kafka import Producer

    key = tuple(sorted((k, str(v)) for k, v in config.items()))
    producer = PRODUCERS.get(key)
    if producer is None:
        producer = PRODUCERS[key] = Producer(dict(config))
    try:
        yield producer
    except BaseException:
        PRODUCERS.pop(key, None)
        raise


def close_producers(timeout_s: float = 10.0) -> None:
    """Flush and drop this process's kept producers (before their broker goes away: a kept producer would log
    its reconnects until the process ends)."""
    while PRODUCERS:
        PRODUCERS.popitem()[1].flush(timeout_s)


def _produce_all(producer: Any, options: Mapping[str, str], names: set[str], fixed_topic: str | None, by_row: bool,
                 rows: Iterator[Any]) -> ProducedCount:
    errors: list[str] = []
    acked = 0

    def on_delivery(err: Any, _msg: Any) -> None:
        nonlocal acked
        if err is not None:
            errors.append(str(err))
        else:
            acked += 1

    sent = 0
    for row in rows:
        topic = row["topic"] if by_row and row["topic"] else fixed_topic  # (a row's own topic wins)
        kwargs: dict[str, Any] = {"key": _as_bytes(row["key"]) if "key" in names else None,
                                  "value": _as_bytes(row["value"]), "on_delivery": on_delivery}
        if "partition" in names and row["partition"] is not None:
            kwargs["partition"] = int(row["partition"])
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)  # local queue full: let deliveries drain, then retry
        sent += 1
        if errors:
            break
        producer.poll(0)
    remaining = producer.flush(float(options.get("flushTimeoutS", "60")))
    if errors or remaining or acked != sent:
        raise KafkaSourceError(
            f"Kafka write failed: {acked}/{sent} acknowledged, {remaining} undelivered, errors: {errors[:3]}"
        )
    return ProducedCount(acked)


def write_batches(options: Mapping[str, str], schema: StructType, batches: Iterator[Any]) -> ProducedCount:
    """:func:`write_rows` (which checks the columns) for Arrow record batches (the Arrow writers): not Row objects."""

    def rows() -> Iterator[dict[str, Any]]:
        for batch in batches:
            columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
            n = batch.num_rows
            for i in range(n):
                yield {name: column[i] for name, column in columns.items()}

    return write_rows(options, schema, rows())


def _as_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8")


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink; Spark hands each task Arrow record batches (no Row object per record)."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options, self.schema = options, schema
        client_config(options)  # fail at query start, not in a task, if bootstrap servers are missing

    def write(self, iterator: Iterator[Any]) -> ProducedCount:
        return write_batches(self.options, self.schema, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Nothing to do: every record was acknowledged before its task returned.
        return None

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Records already produced stay (Kafka has no rollback without transactions); the batch is
        # retried, which is the at-least-once contract consumers dedupe against.
        return None


class KafkaBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options, self.schema = options, schema
        client_config(options)

    def write(self, iterator: Iterator[Any]) -> ProducedCount:
        return write_batches(self.options, self.schema, iterator)


class KafkaDataSource(DataSource):
    """``spark.read/readStream/write/writeStream.format("cbgpkafka")``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return RANGES_SCHEMA if self.options.get("ranges", "false").lower() == "true" else KAFKA_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise KafkaSourceError("Kafka topics are append-only: use mode('append')")
        return KafkaBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return KafkaStreamWriter(self.options, schema)
