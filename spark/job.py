"""``cbgp spark-job``: the long-running Spark side of the fleet.

How it works: docs/design/internals.md, spark.job.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Callable, Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from services.kafka.config import KafkaConfigError, KafkaSettings, add_kafka_flags
from spark.snapshot_store import SnapshotStore
from spark.compaction import compact_batch, kafka_publisher
from spark.compaction_seed import needs_seed, seed_from_current
from spark.kafka_io import read_ranges

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
    publish_current: bool = False,
) -> StreamingQuery:
    """Start the compaction query; ``interval_s=None`` means availableNow (one pass over what exists).

    ``publish_current=True`` also writes each folded answer's current value to answers.current: only for a
    deployment without the answers service, which keeps that topic up to date live, or to rebuild the topic
    while it is stopped.  Next to a running answers service it would be a second writer a fold behind: a key
    whose answer changed after the fold's last delta would get its older value back, and keep it until the
    next fold (the topic keeps the latest record per key).

    A first start (no snapshot, no checkpoint) on an answers log whose start retention deleted seeds the
    snapshot from answers.current at a consistent cut and reads the log from there (``spark.compaction_seed``).
    """
    options = kafka_options(settings)
    store = SnapshotStore(snapshot_dir)
    # A first start on a log whose beginning retention deleted starts from answers.current, at a cut.
    cut = seed_from_current(settings, options, store) if needs_seed(store, checkpoint_dir) else None
    publish = kafka_publisher(options, settings.topic("answers.current")) if publish_current else None

    topic = settings.topic("answers")

    def on_batch(batch: DataFrame, batch_id: int) -> None:
        # The batch holds the offset ranges only: the records are read here, straight into Arrow (no trip
        # through the JVM), and decoded column-wise by the fold.
        started = time.monotonic()
        ranges = batch.collect()
        collected = time.monotonic()
        records = read_ranges({**options, **dict(extra_source_options or {})}, topic, ranges)
        read_s = time.monotonic() - collected
        report = compact_batch(batch.sparkSession, records, store, publish)
        log.info("batch %d folded %d deltas (%d duplicates, %d stale) -> %d snapshot rows, %d published in %.2fs "
                 "(+%.2fs reading Kafka, %.2fs collecting the ranges)", batch_id, report.deltas_in,
                 report.duplicates, report.already_folded, report.snapshot_rows, report.changed, report.seconds,
                 read_s, collected - started)

    reader = spark.readStream.format("cbgpkafka").options(**options).option("subscribe", topic).option("ranges", "true")
    reader = reader.option("commitGroup", f"{settings.topic_prefix}spark-compaction")
    if cut is not None:
        reader = reader.option("startingOffsets", json.dumps({str(p): offset for p, offset in cut.items()}))
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


DUTIES = ("windows", "assembly", "compaction")  # start order: the answer paths first


def start_stateful(spark: SparkSession, settings: KafkaSettings, duty: str, checkpoint_dir: str | Path,
                   interval_s: float | None, single_owner: bool = False) -> StreamingQuery:
    """Start ``spark.window_stream`` or ``spark.assembly_stream`` against the fleet's topics (``single_owner``:
    the workers run with ``--placement single-owner``)."""
    from services.kafka.client import end_offsets
    from spark.assembly_stream import start_assembly
    from spark.window_stream import start_windows

    topics = {name: settings.topic(name)
              for name in ("updates.encoded", "deltas.parts", "queries.plans", "dictionary")}
    deltas_partitions = len(end_offsets(settings, topics["deltas.parts"]))
    args = (spark, kafka_options(settings), topics, deltas_partitions, str(checkpoint_dir), interval_s,
            settings.client_config(), f"{settings.topic_prefix}spark-{duty}")
    return start_windows(*args) if duty == "windows" else start_assembly(*args, single_owner=single_owner)


# ------------------------------------------------------------------ checkpoints belong to one cluster

# Every duty's checkpoint (offsets, state store) and the compaction snapshot are derived from the topics of
# one broker/cluster.  Resumed against another one (a fresh embedded broker in a second ``make run``, a
# re-created cluster), the offsets point past the new topics' ends or, worse, into unrelated records, and
# the job either loops on "Offset out of range" or answers wrongly.  So the state dir records the identity
# of the cluster it was made against, and a start against another cluster starts clean.
#
# The identity: Kafka's cluster id is no help on noida-db (the same constant for every broker, and topic ids
# are all zeros), so the job keeps its own marker: the first record of a one-partition topic
# ``<prefix>spark.cluster-id``, written once (a random id) by the first job that finds the topic empty.
# A new broker has no such record, so it gets a new id.  Independently, a checkpoint whose committed
# offsets lie beyond its source topic's end cannot belong to that topic (this catches state dirs made
# before the marker existed and a broker that lost data).

IDENTITY_FILE = "cluster.json"
MARKER_TOPIC = "spark.cluster-id"
DUTY_SOURCES = {"windows": "updates.encoded", "assembly": "deltas.parts", "compaction": "answers"}


def cluster_identity(settings: KafkaSettings, timeout: float = 30.0) -> str:
    """``<broker cluster id>/<marker id>``: the marker topic's first record, written now if there is none."""
    import uuid

    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    from services.kafka.client import make_consumer, make_producer

    topic = settings.topic(MARKER_TOPIC)
    admin = AdminClient(settings.admin_config())
    metadata = admin.list_topics(timeout=timeout)
    if topic not in metadata.topics:
        futures = admin.create_topics([NewTopic(topic, 1, settings.replication_factor,
                                                config={"cleanup.policy": "compact"})])
        try:
            futures[topic].result(timeout)
        except Exception as exc:  # noqa: BLE001 - created meanwhile by another job is fine
            if "exist" not in str(exc).lower():
                raise
    consumer = make_consumer(settings, f"{settings.topic_prefix}spark-cluster-id", enable_partition_eof=True)
    try:
        for attempt in range(2):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout)
            if high > low:
                consumer.assign([TopicPartition(topic, 0, low)])
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    msg = consumer.poll(1.0)
                    if msg is not None and msg.error() is None and msg.value():
                        return f"{metadata.cluster_id}/{msg.value().decode('utf-8', 'replace')}"
                raise TimeoutError(f"cannot read the first record of {topic}")
            if attempt == 0:
                producer = make_producer(settings)
                producer.produce(topic, key=b"cluster-id", value=uuid.uuid4().hex.encode())
                if producer.flush(timeout):
                    raise TimeoutError(f"cannot write the cluster marker to {topic}")
        raise RuntimeError(f"{topic} is still empty after writing the cluster marker")
    finally:
        consumer.close()


def _checkpoint_offsets(checkpoint_dir: Path) -> dict[str, int] | None:
    """The source offsets (``{"<partition>": next offset}``) of the checkpoint's last planned batch, if any."""
    offsets_dir = checkpoint_dir / "offsets"
    batches = sorted((int(p.name) for p in offsets_dir.glob("*") if p.name.isdigit()), reverse=True) \
        if offsets_dir.is_dir() else []
    for batch in batches:
        try:
            lines = (offsets_dir / str(batch)).read_text().splitlines()
            return {str(k): int(v) for k, v in json.loads(lines[2]).items()}
        except (OSError, IndexError, ValueError, AttributeError):
            continue  # a half-written file: the previous batch's
    return None


def offsets_mismatch(settings: KafkaSettings, duty: str, checkpoint_dir: Path) -> str | None:
    """Why ``checkpoint_dir`` cannot belong to this cluster's source topic of ``duty`` (None if it can)."""
    from services.kafka.client import end_offsets

    offsets = _checkpoint_offsets(checkpoint_dir)
    if not offsets:
        return None
    topic = settings.topic(DUTY_SOURCES[duty])
    ends = end_offsets(settings, topic)
    for partition, offset in sorted(offsets.items()):
        high = ends.get(int(partition), (0, 0))[1]
        if offset > high:
            return f"its {duty} offsets are past the end of {topic}/{partition} ({offset} > {high})"
    return None


def claim_state(settings: KafkaSettings, state_dir: Path, duty_checkpoints: Mapping[str, Path],
                snapshot_dir: Path | None) -> str | None:
    """Make the state dir belong to this cluster: if it was made against another one (or its offsets cannot
    be this cluster's), remove the checkpoints and the snapshot and start clean.  Returns the reason when it
    started clean, else None; records this cluster's identity in ``<state_dir>/cluster.json``."""
    import shutil

    try:
        identity: str | None = cluster_identity(settings)
    except Exception as exc:  # noqa: BLE001 - only a cluster that forbids the marker is let through
        if not any(word in str(exc).upper() for word in ("AUTHORIZATION", "POLICY")):
            raise
        log.warning("cannot keep the cluster marker %s (%s): only the offsets tell a foreign state dir",
                    settings.topic(MARKER_TOPIC), str(exc).replace("\n", " "))
        identity = None
    record = state_dir / IDENTITY_FILE
    reason = None
    try:
        saved = json.loads(record.read_text()).get("identity")
    except (OSError, ValueError, AttributeError):
        saved = None
    existing = [p for p in [*duty_checkpoints.values(), snapshot_dir] if p is not None and p.exists()]
    if existing:
        if saved is not None and identity is not None and saved != identity:
            reason = f"it was made against another cluster ({saved}, now {identity})"
        else:
            for duty, checkpoint in duty_checkpoints.items():
                reason = offsets_mismatch(settings, duty, checkpoint)
                if reason:
                    break
    if reason:
        for path in existing:
            shutil.rmtree(path, ignore_errors=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    if identity is None:
        return reason
    tmp = record.with_suffix(".tmp")
    tmp.write_text(json.dumps({"identity": identity, "bootstrap_servers": settings.bootstrap_servers,
                               "topic_prefix": settings.topic_prefix}))
    tmp.replace(record)
    return reason


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
    parser.add_argument("--publish-current", action="store_true",
                        help="also write answers.current (only without a running answers service, which keeps it "
                        "live: default off)")
    parser.add_argument("--trigger-interval", type=float, default=1.0, metavar="SECONDS",
                        help="micro-batch interval of the window and assembly queries (default 1)")
    parser.add_argument("--only", action="append", choices=DUTIES, metavar="DUTY",
                        help=f"run only these duties (repeatable; {', '.join(DUTIES)}; default all)")
    parser.add_argument("--placement", choices=["by-centre", "single-owner"],
                        default=os.environ.get("CBGP_PLACEMENT", "by-centre"),
                        help="the workers' --placement (env CBGP_PLACEMENT, default by-centre): with single-owner "
                             "they send every product's parts here to multiply, so the assembly duty reads them")
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
    duties = args.only or list(DUTIES)
    checkpoints = {duty: checkpoint_dir if duty == "compaction" else args.state_dir / f"checkpoint-{duty}"
                   for duty in duties}
    status = JobStatus(args.state_dir / STATUS_FILE, duties)
    while True:  # the broker may not be up yet (pods start in any order)
        try:
            reset = claim_state(settings, args.state_dir, checkpoints,
                                snapshot_dir if "compaction" in duties else None)
            break
        except Exception as exc:  # noqa: BLE001 - retried; one line per attempt
            log.warning("cannot check which cluster the state in %s belongs to yet: %s", args.state_dir,
                        str(exc).replace("\n", " "))
            status.note_error(f"waiting for the broker: {exc}")
            if stop.wait(2.0):
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                return 0
    if reset:
        log.warning("state in %s does not belong to the broker at %s: %s; started clean", args.state_dir,
                    settings.bootstrap_servers, reset)
        status.reset = reset
    from spark.session import build_session

    spark = build_session(master=args.master, app_name="cbgp-spark-job", extra_conf=extra_conf)
    interval = None if args.once else args.trigger_interval

    def starter(duty: str) -> Callable[[], StreamingQuery]:
        if duty == "compaction":
            return lambda: start_compaction(spark, settings, snapshot_dir, checkpoint_dir,
                                            None if args.once else args.compact_interval,
                                            max_offsets_per_trigger=args.max_offsets_per_trigger,
                                            publish_current=args.publish_current)
        return lambda: start_stateful(spark, settings, duty, checkpoints[duty], interval,
                                      args.placement == "single-owner")

    def before_restart(duty: str) -> None:
        # A query that fails because its checkpoint's offsets are past the topic's end (the broker was
        # replaced under the running job) would fail the same way forever: start that duty clean.
        import shutil

        try:
            reason = offsets_mismatch(settings, duty, checkpoints[duty])
        except Exception:  # noqa: BLE001 - the broker is away: restart as usual, check again next time
            return
        if reason:
            log.warning("%s: checkpoint %s does not belong to this broker: %s; starting it clean", duty,
                        checkpoints[duty], reason)
            shutil.rmtree(checkpoints[duty], ignore_errors=True)

    supervised = [SupervisedQuery(duty, starter(duty), restart=not args.once, status=status,
                                  before_restart=before_restart) for duty in duties]
    try:
        for query in supervised:
            # one at a time: each query's Python source worker must connect back within Spark's fixed
            # 10 s, which three workers importing pyspark at once on a loaded machine can miss
            query.start()
            query.wait_started(stop, timeout_s=30)
        log.info("running %s (%s); state in %s", ", ".join(q.duty for q in supervised),
                 "once" if args.once else f"every {args.trigger_interval} s, compaction every "
                 f"{args.compact_interval} s", args.state_dir)
        # Short waits so the signal handler (which runs between bytecodes of this thread) gets a turn.
        while not stop.is_set() and any([q.check() for q in supervised]):  # a list: check every duty
            status.write()
            time.sleep(0.5)
        code = 0 if stop.is_set() or all(q.failures == 0 for q in supervised) else 1
        for query in supervised:
            query.stop()
            status.set(query.duty, "stopped")
        status.write()
    finally:
        try:
            spark.stop()
        except Exception as exc:  # noqa: BLE001 - a SIGTERM to the process group already ended the JVM
            log.info("Spark was already stopped (%s)", type(exc).__name__)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return code


STATUS_FILE = "status.json"


class JobStatus:
    """The job's streaming queries as ``<state_dir>/status.json`` (what ``make run``'s live view shows):
    ``{"pid", "updated_ms", "reset", "error", "queries": {duty: {"state", "failures", "error"}}}``, with state
    one of starting, running, failed (waiting for its restart), finished, stopped.  Rewritten (atomically)
    only when something in it changed."""

    def __init__(self, path: Path, duties: list[str]) -> None:
        import os

        self.path = path
        self.pid = os.getpid()
        self.reset: str | None = None
        self.error: str | None = None
        self.queries = {duty: {"state": "starting", "failures": 0, "error": None} for duty in duties}
        self._written: str | None = None
        self.write()

    def set(self, duty: str, state: str, *, failures: int | None = None, error: str | None = None) -> None:
        entry = self.queries[duty]
        entry["state"] = state
        if failures is not None:
            entry["failures"] = failures
        if error is not None:
            entry["error"] = error

    def note_error(self, error: str | None) -> None:
        self.error = error
        self.write()

    def write(self) -> None:
        body = {"pid": self.pid, "reset": self.reset, "error": self.error, "queries": self.queries}
        text = json.dumps(body, sort_keys=True)
        if text == self._written:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({**body, "updated_ms": int(time.time() * 1000)}))
            tmp.replace(self.path)
            self._written = text
        except OSError as exc:
            log.warning("cannot write %s: %s", self.path, exc)


class SupervisedQuery:
    """One duty's streaming query, restarted from its checkpoint when it fails (a Python worker that did
    not start in time on a loaded machine, a broker that went away), with a growing pause in between."""

    def __init__(self, duty: str, start: Callable[[], StreamingQuery], restart: bool,
                 status: JobStatus | None = None, before_restart: Callable[[str], None] | None = None) -> None:
        self.duty = duty
        self._start = start
        self.restart = restart
        self.status = status
        self.before_restart = before_restart
        self.query: StreamingQuery | None = None
        self.failures = 0
        self.retry_at = 0.0

    def _set(self, state: str, **kw: object) -> None:
        if self.status is not None:
            self.status.set(self.duty, state, **kw)  # type: ignore[arg-type]

    def start(self) -> None:
        self.query = self._start()
        self._set("starting")

    def wait_started(self, stop: threading.Event, timeout_s: float) -> None:
        """Until the query's source is initialised (its Python source worker connected back), it ended, or
        the job is stopping."""
        deadline = time.monotonic() + timeout_s
        try:
            while (self.query is not None and self.query.isActive
                   and self.query.status["message"] == "Initializing sources"
                   and not stop.is_set() and time.monotonic() < deadline):
                time.sleep(0.5)
        except Exception:  # noqa: BLE001 - the JVM is gone; check() reports it
            pass

    def check(self) -> bool:
        """False once the duty is over for good (finished, or failed with restarts off)."""
        if self.query is None:  # waiting for a restart
            if time.monotonic() >= self.retry_at:
                if self.before_restart is not None:
                    self.before_restart(self.duty)
                log.info("%s: restarting from its checkpoint", self.duty)
                try:
                    self.start()
                except Exception as exc:  # noqa: BLE001 - e.g. the broker is away: try again later
                    self._failed(exc)
            return True
        try:
            if self.query.isActive:
                if self.status is not None and self.status.queries[self.duty]["state"] == "starting" \
                        and self.query.status["message"] != "Initializing sources":
                    self._set("running")
                return True
            error = self.query.exception()
        except Exception as exc:  # noqa: BLE001 - the JVM is gone (shutdown)
            log.info("%s: cannot reach Spark (%s)", self.duty, type(exc).__name__)
            return False
        if error is None:
            self._set("finished")
            return False  # availableNow finished
        return self._failed(error)

    def _failed(self, error: object) -> bool:
        self.failures += 1
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        # PySpark wraps the source's exception: keep the line that names it when there is one
        for line in str(error).splitlines():
            if "Error:" in line and ("Kafka" in line or "Exception" in line):
                first_line = line.strip()
                break
        log.error("%s query failed (%d so far): %s", self.duty, self.failures, first_line)
        self._set("failed", failures=self.failures, error=first_line[:300])
        if not self.restart:
            return False
        self.query = None
        self.retry_at = time.monotonic() + min(2.0 * 2 ** min(self.failures - 1, 4), 30.0)
        return True

    def stop(self) -> None:
        try:
            if self.query is not None and self.query.isActive:
                self.query.stop()
        except Exception as exc:  # noqa: BLE001 - the JVM is gone (shutdown)
            log.info("%s: not stopped cleanly (%s)", self.duty, type(exc).__name__)


if __name__ == "__main__":
    sys.exit(main())
