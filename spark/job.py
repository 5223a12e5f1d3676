"""``cbgp spark-job``: the long-running Spark side of the fleet.

Compaction: the periodic compaction of the ``answers`` delta log (``spark.compaction``) as a Structured
Streaming query: source = the cbgpkafka reader on ``answers`` (offsets in the checkpoint dir), trigger =
``processingTime(--compact-interval)``, sink = ``foreachBatch`` folding each micro-batch into the snapshot
store and publishing the touched answers to ``answers.current``.  Spark commits a micro-batch's offsets only
after ``foreachBatch`` returns, i.e. after the manifest swap, so a crash re-runs at most the last batch,
which the manifest's per-query ``n`` makes a no-op.  ``--once`` processes what is there and exits
(``Trigger.AvailableNow``), for cron-style deployments and tests.

SIGTERM / SIGINT stop the query and the session cleanly (the current batch is abandoned; its rerun after
restart is harmless for the reason above).

Next to it, in the same session, two stateful streaming queries (``--trigger-interval``, default 1 s):

- ``spark.windows``: event-time windows with expiry for windowed queries (updates.encoded in);
- ``spark.assembly``: cartesian-product assembly of multi-part queries (part deltas of deltas.parts in);

both write ``part = -1`` deltas to deltas.parts, numbered by the answers service like every other query's.
``--only`` picks a subset.  ``main`` waits on all of them and stops them all on SIGTERM; if one fails the
others are stopped and the exit code is 1, so the supervisor (or Kubernetes) restarts the job from its
checkpoints.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
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
    publish_current: bool = True,
) -> StreamingQuery:
    """Start the compaction query; ``interval_s=None`` means availableNow (one pass over what exists).

    ``publish_current=False`` only maintains the snapshot, for deployments where the answers service
    already keeps answers.current up to date live (both write the same key/value pairs, so running both
    is correct, just redundant).
    """
    options = kafka_options(settings)
    store = SnapshotStore(snapshot_dir)
    publish = kafka_publisher(options, settings.topic("answers.current")) if publish_current else None

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


DUTIES = ("compaction", "windows", "assembly")


def start_stateful(spark: SparkSession, settings: KafkaSettings, duty: str, checkpoint_dir: str | Path,
                   interval_s: float | None) -> StreamingQuery:
    """Start ``spark.windows`` or ``spark.assembly`` against the fleet's topics."""
    from services.kafka import end_offsets
    from spark.assembly import start_assembly
    from spark.windows import start_windows

    topics = {name: settings.topic(name) for name in ("updates.encoded", "deltas.parts", "queries.plans")}
    deltas_partitions = len(end_offsets(settings, topics["deltas.parts"]))
    start = start_windows if duty == "windows" else start_assembly
    return start(spark, kafka_options(settings), topics, deltas_partitions, str(checkpoint_dir), interval_s,
                 settings.client_config(), f"{settings.topic_prefix}spark-{duty}")


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
    parser.add_argument("--no-publish-current", action="store_true",
                        help="only write snapshots; leave answers.current to the answers service")
    parser.add_argument("--trigger-interval", type=float, default=1.0, metavar="SECONDS",
                        help="micro-batch interval of the window and assembly queries (default 1)")
    parser.add_argument("--only", action="append", choices=DUTIES, metavar="DUTY",
                        help=f"run only these duties (repeatable; {', '.join(DUTIES)}; default all)")
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
    duties = args.only or list(DUTIES)
    queries: list[StreamingQuery] = []
    try:
        if "compaction" in duties:
            queries.append(start_compaction(spark, settings, snapshot_dir, checkpoint_dir,
                                            None if args.once else args.compact_interval,
                                            max_offsets_per_trigger=args.max_offsets_per_trigger,
                                            publish_current=not args.no_publish_current))
            log.info("compaction of %s every %s s; snapshots in %s, checkpoint in %s", settings.topic("answers"),
                     "once" if args.once else args.compact_interval, snapshot_dir, checkpoint_dir)
        for duty in ("windows", "assembly"):
            if duty in duties:
                queries.append(start_stateful(spark, settings, duty, args.state_dir / f"checkpoint-{duty}",
                                              None if args.once else args.trigger_interval))
                log.info("%s: every %s s, checkpoint in %s", duty, "once" if args.once else args.trigger_interval,
                         args.state_dir / f"checkpoint-{duty}")
        # Short waits so the signal handler (which runs between bytecodes of this thread) gets a turn.
        # --once: until every query has drained what it found; otherwise until one of them ends (fails).
        while not stop.is_set():
            active = [q.isActive for q in queries]
            if not any(active) or (not args.once and not all(active)):
                break
            time.sleep(0.5)
        for query in queries:
            if query.isActive:
                query.stop()
            if query.exception() is not None:
                log.error("%s query failed: %s", query.name, query.exception())
                code = 1
    finally:
        spark.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


if __name__ == "__main__":
    sys.exit(main())
