"""Compaction cost: seconds per million answer deltas, on the fold alone and on the Kafka path.

    .venv/bin/python bench/spark_bench.py [--deltas 1000000] [--kafka-deltas 20000] [--queries 100]

Rows of the table:

- ``fold (parquet input)``: ``compact_batch`` on a generated delta log already in Parquet (decoded form),
  into an empty snapshot -- the Spark fold, snapshot write and manifest, without Kafka or Avro;
- ``fold onto snapshot``: a further 10% of deltas folded onto that snapshot (the steady-state case);
- ``kafka -> fold -> answers.current``: Avro ``Answer`` records in an embedded noida-db broker, compacted by
  the real streaming query (availableNow) including decode and publishing.  Smaller, because noida-db
  rewrites a JSON snapshot of its whole log on every change and gets slow above ~10^5 messages.

The log: each query cycles through a pool of bindings (add all, retract all, add again...), and 5% of
deltas are delivered twice.  local[2], the project's session settings; the machine is shared, so expect
+-40% between runs.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from spark.compaction import DELTA_SCHEMA, compact_batch
from spark.snapshot_store import SnapshotStore  # noqa: E402
from spark.session import build_session  # noqa: E402


def generated_log(spark: SparkSession, deltas: int, queries: int, pool: int, first_n: int = 1) -> DataFrame:
    """``deltas`` rows of DELTA_SCHEMA (+5% duplicates), ``n`` from ``first_n`` per query."""
    ids = spark.range(deltas)
    per_query_n = F.floor(F.col("id") / queries) + first_n
    base = ids.select(
        F.concat(F.lit("q"), (F.col("id") % queries).cast("string")).alias("query_id"),
        per_query_n.cast("long").alias("n"),
    ).select(
        "query_id", "n",
        # Cycle: n in [1, pool] adds binding (n-1) % pool, the next pool deltas retract them, and so on.
        F.when(F.floor((F.col("n") - 1) / pool) % 2 == 0, 1).otherwise(-1).cast("int").alias("sign"),
        F.concat(F.lit('{"s":"<http://ex.org/item/'), ((F.col("n") - 1) % pool).cast("string"),
                 F.lit('>","t":"\\"label\\"@en"}')).alias("binding"),
        F.lit(None).cast("string").alias("error"),
    )
    return base.unionByName(base.sample(fraction=0.05, seed=1))


def timed(label: str, rows: list, deltas: int, fn) -> None:  # noqa: ANN001 - a thunk
    started = time.perf_counter()
    detail = fn()
    seconds = time.perf_counter() - started
    rows.append((label, deltas, seconds, deltas / seconds, seconds * 1_000_000 / deltas, detail))
    print(f"  {label}: {seconds:.1f} s", flush=True)


def bench_fold(spark: SparkSession, args: argparse.Namespace, work: Path, rows: list) -> None:
    src = work / "log.parquet"
    generated_log(spark, args.deltas, args.queries, args.pool).write.parquet(str(src))
    store = SnapshotStore(work / "snap")
    log_df = spark.read.schema(DELTA_SCHEMA).parquet(str(src))
    total = log_df.count()

    def first() -> str:
        r = compact_batch(spark, log_df, store, publish=None)
        return f"{r.snapshot_rows} answers, {r.duplicates} dups dropped"

    timed("fold (parquet input)", rows, total, first)
    more = args.deltas // 10
    src2 = work / "log2.parquet"
    generated_log(spark, more, args.queries, args.pool, first_n=args.deltas // args.queries + 1).write.parquet(str(src2))
    log2 = spark.read.schema(DELTA_SCHEMA).parquet(str(src2))
    total2 = log2.count()

    def second() -> str:
        r = compact_batch(spark, log2, store, publish=None)
        return f"{r.snapshot_rows} answers, {r.changed} touched"

    timed("fold onto snapshot", rows, total2, second)


def produce_answer_log(producer, settings, deltas: int, queries: int, pool: int,  # noqa: ANN001
                       partition_of: Callable[[str], int] | None = None) -> dict[str, set[int]]:
    """Produce ``deltas`` Avro ``Answer`` records on ``answers``: each adds or retracts a random binding of a random
    query (seed 1); ``partition_of(query_id)`` picks the partition when given.  Returns the bindings left present."""
    from services.codec import encode

    rng = random.Random(1)
    n: dict[str, int] = {}
    present: dict[str, set[int]] = {}
    for i in range(deltas):
        q = f"q{rng.randrange(queries)}"
        b = rng.randrange(pool)
        sign = "-" if b in present.setdefault(q, set()) else "+"
        (present[q].discard if sign == "-" else present[q].add)(b)
        n[q] = n.get(q, 0) + 1
        rec = {"query_id": q, "n": n[q], "seq": i + 1, "sign": sign, "snapshot": False, "produced_at_ms": 0,
               "binding": {"s": {"type": "uri", "value": f"http://ex.org/item/{b}"},
                           "t": {"type": "literal", "value": "label", "lang": "en"}}}
        placement = {} if partition_of is None else {"partition": partition_of(q)}
        while True:
            try:
                producer.produce(settings.topic("answers"), key=q.encode(), value=encode("Answer", rec), **placement)
                break
            except BufferError:
                producer.poll(0.1)
    return present


def bench_kafka(spark: SparkSession, args: argparse.Namespace, work: Path, rows: list) -> None:
    from services.kafka.broker import EmbeddedBroker
    from services.kafka.client import make_producer
    from services.kafka.topics import ensure_topics
    from spark.job import start_compaction

    with EmbeddedBroker(work / "broker") as broker:
        settings = broker.settings(topic_prefix="bench.", partitions=2)
        ensure_topics(settings)
        producer = make_producer(settings, linger_ms=20)
        started = time.perf_counter()
        present = produce_answer_log(producer, settings, args.kafka_deltas, args.queries, args.pool)
        producer.flush(60)
        print(f"  produced {args.kafka_deltas} Avro answers in {time.perf_counter() - started:.1f} s", flush=True)

        def run() -> str:
            query = start_compaction(spark, settings, work / "ksnap", work / "kck", interval_s=None,
                                     publish_current=True)
            query.awaitTermination(600)
            if query.exception() is not None:
                raise RuntimeError(str(query.exception()))
            got = SnapshotStore(work / "ksnap").read(spark).count()
            return f"{got} answers in snapshot (independent replay: {sum(len(v) for v in present.values())})"

        timed("kafka -> fold -> answers.current", rows, args.kafka_deltas, run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deltas", type=int, default=1_000_000)
    parser.add_argument("--kafka-deltas", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--pool", type=int, default=3000, help="bindings per query cycled through")
    parser.add_argument("--skip-kafka", action="store_true")
    args = parser.parse_args(argv)
    rows: list = []
    t0 = time.perf_counter()
    spark = build_session(app_name="cbgp-spark-bench")
    print(f"session start {time.perf_counter() - t0:.1f} s (cores={os.cpu_count()}, load={os.getloadavg()[0]:.1f})")
    try:
        with tempfile.TemporaryDirectory(prefix="cbgp-spark-bench-") as tmp:
            bench_fold(spark, args, Path(tmp), rows)
            if not args.skip_kafka:
                bench_kafka(spark, args, Path(tmp), rows)
    finally:
        spark.stop()
    print()
    print(f"{'case':36} {'deltas':>9} {'seconds':>8} {'deltas/s':>9} {'s per 1M':>9}  detail")
    for label, deltas, seconds, rate, per_m, detail in rows:
        print(f"{label:36} {deltas:>9} {seconds:>8.1f} {rate:>9.0f} {per_m:>9.1f}  {detail}")
    print(f"(load average at end: {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
