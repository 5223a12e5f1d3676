"""``cbgp spark-job``: the long-running Spark side of the fleet.

Phase 1 runs the periodic compaction of the ``answers`` delta log (``spark.compaction``) as a Structured
Streaming query: source = the cbgpkafka reader on ``answers`` (offsets in the checkpoint dir), trigger =
``processingTime(--compact-interval)``, sink = ``foreachBatch`` folding each micro-batch into the snapshot
store and publishing the touched answers to ``answers.current``.  Spark commits a micro-batch's offsets only
after ``foreachBatch`` returns, i.e. after the manifest swap, so a crash re-runs at most the last batch,
which the manifest's per-query ``n`` makes a no-op.  ``--once`` processes what is there and exits
(``Trigger.AvailableNow``), for cron-style deployments and tests.

SIGTERM / SIGINT stop the query and the session cleanly (the current batch is abandoned; its rerun after
restart is harmless for the reason above).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from services.kafka.config import KafkaConfigError, KafkaSettings, add_kafka_flags
from spark.compaction import SnapshotStore, compact_batch, decode_answers, kafka_publisher

log = logging.getLogger("cbgp.spark.job")


def kafka_options(settings: KafkaSettings) -> dict[str, str]:
    """cbgpkafka ``kafka.*`` options (connection and SASL/TLS) from the fleet's Kafka settings."""
    return {f"kafka.{k}": str(v) for k, v in settings.client_config().items()}


def start_compaction(
    spark: SparkSession,
    settings: KafkaSettings,
    snapshot_dir: str | Path,
    checkpoint_dir: str | Path,
    interval_s: float | None,
    *,
    max_offsets_per_trigger: int | None = None,
    extra_source_options: Mapping[str, str] | None = None,
) -> StreamingQuery:
    """Start the compaction query; ``interval_s=None`` means availableNow (one pass over what exists)."""
    options = kafka_options(settings)
    store = SnapshotStore(snapshot_dir)
    publish = kafka_publisher(options, settings.topic("answers.current"))

    def on_batch(batch: DataFrame, batch_id: int) -> None:
        report = compact_batch(batch.sparkSession, decode_answers(batch), store, publish)
        log.info("batch %d folded %d deltas (%d duplicates, %d stale) -> %d snapshot rows, %d published in %.2fs",
                 batch_id, report.deltas_in, report.duplicates, report.already_folded, report.snapshot_rows,
                 report.changed, report.seconds)

    reader = spark.readStream.format("cbgpkafka").options(**options).option("subscribe", settings.topic("answers"))
    reader = reader.option("commitGroup", f"{settings.topic_prefix}spark-compaction")
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    if extra_source_options:
        reader = reader.options(**dict(extra_source_options))
    writer = (
        reader.load().writeStream.queryName("cbgp-compaction")
        .foreachBatch(on_batch)
        .option("checkpointLocation", str(checkpoint_dir))
    )
    writer = writer.trigger(availableNow=True) if interval_s is None else writer.trigger(processingTime=f"{interval_s} seconds")
    return writer.start()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cbgp spark-job", description=__doc__.split("\n\n")[0])
    parser.add_argument("--compact-interval", type=float, default=60.0, metavar="SECONDS",
                        help="seconds between compactions (default 60)")
    parser.add_argument("--once", action="store_true", help="compact what is in the topic now, then exit")
    parser.add_argument("--master", default="local[2]", help="Spark master URL (default local[2])")
    parser.add_argument("--state-dir", default=".run/spark", type=Path,
                        help="holds snapshot/ and checkpoint/ unless given separately (default .run/spark)")
    parser.add_argument("--snapshot-dir", type=Path, help="current-answer snapshots and manifest")
    parser.add_argument("--checkpoint-dir", type=Path, help="Structured Streaming checkpoint (source offsets)")
    parser.add_argument("--max-offsets-per-trigger", type=int, metavar="N",
                        help="cap on deltas per compaction batch (default: everything available)")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting (repeatable)")
    parser.add_argument("--log-level", default="INFO")
    add_kafka_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``cbgp spark-job``; returns the process exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per callback otherwise
    try:
        settings = KafkaSettings.from_args(args)
        extra_conf = dict(kv.split("=", 1) for kv in args.spark_conf)
    except (KafkaConfigError, ValueError) as exc:
        print(f"cbgp spark-job: {exc} (--spark-conf takes KEY=VALUE)", file=sys.stderr)
        return 2
    snapshot_dir = args.snapshot_dir or args.state_dir / "snapshot"
    checkpoint_dir = args.checkpoint_dir or args.state_dir / "checkpoint"

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping after cleanup", signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    from spark.session import build_session

    spark = build_session(master=args.master, app_name="cbgp-spark-job", extra_conf=extra_conf)
    code = 0
    try:
        query = start_compaction(spark, settings, snapshot_dir, checkpoint_dir,
                                 None if args.once else args.compact_interval,
                                 max_offsets_per_trigger=args.max_offsets_per_trigger)
        log.info("compaction of %s every %s s; snapshots in %s, checkpoint in %s", settings.topic("answers"),
                 "once" if args.once else args.compact_interval, snapshot_dir, checkpoint_dir)
        # Short waits so the signal handler (which runs between bytecodes of this thread) gets a turn.
        while query.isActive and not stop.is_set():
            query.awaitTermination(1)
        if query.isActive:
            query.stop()
        if query.exception() is not None:
            log.error("compaction query failed: %s", query.exception())
            code = 1
    finally:
        spark.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


if __name__ == "__main__":
    sys.exit(main())
