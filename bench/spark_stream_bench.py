"""The Spark job's streaming duties at a steady rate, on the embedded broker: sustained rates and latencies.

    .venv/bin/python bench/spark_stream_bench.py [--duration 60] [--windows-rate 30000] [--latency-rate 5000]
        [--assembly-rate 30000] [--compaction-deltas 1000000] [--compaction-batch 200000] [--only windows,latency,assembly,compaction]

Each phase runs the real streaming query (``spark.job.start_stateful`` / ``start_compaction``, trigger
interval = the job's default) against its own topics of one embedded noida-db broker, and a producer thread in
this process feeds it at a steady rate for ``--duration`` seconds after ``--warmup`` seconds (Python workers
start, first batches):

- ``windows``: EncodedBatch records on updates.encoded (one every 100 ms, event time = wall time) for a
  sliding-window query ``[RANGE PT10S STEP PT1S]`` joining two patterns over ``--subjects`` subjects, plus a
  tumbling one, offered at ``--windows-rate`` updates/s.  Sustained rate = updates the query finished
  (its batches' end offsets, mapped back to updates) within the measured interval / its length;
- ``latency``: the same at ``--latency-rate`` updates/s (5,000: the issue's latency goal); per micro-batch
  with input, latency = the batch's end - the produce time of its last record (so it includes the wait for
  the trigger), the definition of ``bench/assembly_bench.py``.  p50 and p99 over the measured interval;
- ``assembly``: part deltas of two multi-part queries (a two-star product and a gated star), one Kafka
  transaction per 50 updates, as a state worker writes them; generated and multiplied locally *before* the
  run (``cbgp.engine.assembly.Assembler``) so every transaction's answer count is known, then paced so that the
  answers they cause arrive at ``--assembly-rate`` answer deltas/s.  Sustained rate = answer deltas of the
  transactions the query finished within the interval / its length.  Afterwards the answer deltas on
  deltas.parts are counted and must equal the local count for everything finished;
- ``compaction``: ``--compaction-deltas`` Avro ``Answer`` records on ``answers`` (produced first, not timed),
  compacted by the real query (availableNow, at most ``--compaction-batch`` records per batch) into the Parquet
  snapshot and ``answers.current``.  Sustained rate = the deltas of every batch after the first / the wall time
  from the end of the first batch to the end of the last (Spark's planning and commits between batches
  included; the first batch pays the query's and the Python worker's start, reported apart as the rate from the
  query's start).  noida-db rewrites a JSON snapshot of its whole log about once a second and cannot take the
  6M records a 60 s run at 100k/s would need, so this drains a backlog of a few batches, not 60 s.

Prints a table, then as its last line one JSON object with the five figures.  local[2]; the machine is
shared (two cores, other agents): compare runs made side by side, repeat, and quote ranges.
"""

from __future__ import annotations

import secrets
import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("CBGP_CHECKPOINT_SECRET", secrets.token_hex(32))  # (services that checkpoint need one)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cbgp.change import Change  # noqa: E402
from cbgp.engine.assembly import Assembler, split_parts  # noqa: E402
from cbgp.engine.engine import Engine  # noqa: E402
from cbgp.terms import TermDictionary, iri, literal  # noqa: E402
from services import codec  # noqa: E402
from services.kafka.broker import EmbeddedBroker
from services.kafka.config import KafkaSettings
from services.kafka.topics import ensure_topics
from services.kafka.client import make_producer, read_all  # noqa: E402
from services.wire.records import query_partition  # noqa: E402
from tests.fleet_support import publish_plan  # noqa: E402

from spark_bench import produce_answer_log  # noqa: E402

EX = "http://example.org/"
WINDOW_QUERIES = {
    "recent": (f"PREFIX : <{EX}>\nSELECT ?x ?y FROM NAMED WINDOW :w ON :s [RANGE PT10S STEP PT1S]\n"
               "WHERE { WINDOW :w { ?x :knows ?y . ?y :likes :Tea } }"),
    "robots": (f"PREFIX : <{EX}>\nSELECT ?x FROM NAMED WINDOW :w ON :s [RANGE PT5S]\n"
               "WHERE { WINDOW :w { ?x :type :Robot } }"),
}
ASSEMBLY_QUERIES = {
    "product": f"SELECT ?x ?y WHERE {{ ?x <{EX}type> <{EX}Robot> . ?y <{EX}likes> <{EX}Tea> }}",
    "gated": f"SELECT ?x ?d WHERE {{ <{EX}s0> <{EX}knows> <{EX}s1> . ?x <{EX}likes> ?d }}",
}
TICK_S = 0.1


def default_trigger_interval() -> float:
    from spark.job import build_parser

    return float(build_parser().parse_args([]).trigger_interval)


class Vocabulary:
    def __init__(self, subjects: int) -> None:
        self.dictionary = TermDictionary(stable=True)
        enc = self.dictionary.encode
        self.subjects = [enc(iri(f"{EX}s{i}")) for i in range(subjects)]
        self.type, self.likes, self.knows = (enc(iri(f"{EX}{n}")) for n in ("type", "likes", "knows"))
        self.classes = [enc(iri(f"{EX}Robot")), enc(iri(f"{EX}Person"))]
        self.drinks = [enc(iri(f"{EX}Tea")), enc(iri(f"{EX}Coffee"))]
        enc(literal("unused"))

    def random_triple(self, rng: random.Random) -> tuple[int, int, int]:
        r = rng.random()
        s = rng.choice(self.subjects)
        if r < 0.3:
            return s, self.type, rng.choice(self.classes)
        if r < 0.6:
            return s, self.likes, rng.choice(self.drinks)
        return s, self.knows, rng.choice(self.subjects)


# ------------------------------------------------------------------ progress of a streaming query


def _offsets(value) -> dict[str, int]:  # noqa: ANN001 - JSON text or dict
    if value is None:
        return {}
    if isinstance(value, str):
        value = json.loads(value)
    return {str(k): int(v) for k, v in value.items()}


class ProgressLog:
    """Every micro-batch's progress (polled: recentProgress keeps only the last 100)."""

    def __init__(self, query) -> None:  # noqa: ANN001
        self.query = query
        self.batches: dict[int, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.poll()

    def poll(self) -> None:
        try:
            for p in self.query.recentProgress:
                self.batches.setdefault(p["batchId"], p)
        except Exception:  # noqa: BLE001 - the query is stopping
            pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.poll()

    def ends(self) -> list[tuple[float, dict[str, int], dict]]:
        """(wall end time, end offsets, progress) of each batch that read something, in batch order."""
        out = []
        for _bid, p in sorted(self.batches.items()):
            if not p.get("numInputRows"):
                continue
            started = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            out.append((started + p["durationMs"].get("triggerExecution", 0) / 1000.0,
                        _offsets(p["sources"][0]["endOffset"]), p))
        return out


# ------------------------------------------------------------------ producers


class WindowFeed:
    """EncodedBatch records at a steady rate; remembers per offset the produce time and cumulative updates."""

    def __init__(self, settings: KafkaSettings, vocab: Vocabulary, rate: int, seed: int) -> None:
        self.settings, self.vocab, self.rate = settings, vocab, rate
        self.rng = random.Random(seed)
        self.producer = make_producer(settings, linger_ms=0)
        self.topic = settings.topic("updates.encoded")
        self.offsets: dict[int, tuple[float, int]] = {}  # offset -> (produce time, updates up to and incl.)
        self.sent = 0
        self.seq = 0
        self.present: list[tuple[int, int, int]] = []

    def _record(self, count: int, now_ms: int) -> bytes:
        rows = []
        for _ in range(count):
            self.seq += 1
            if self.present and self.rng.random() < 0.2:
                triple, sign = self.present[self.rng.randrange(len(self.present))], -1
            else:
                triple, sign = self.vocab.random_triple(self.rng), 1
                if len(self.present) < 50_000:
                    self.present.append(triple)
            rows.append(Change(self.seq, sign, *triple, 0, now_ms))
        return codec.encode_encoded_batch(rows, [(0, change.seq) for change in rows], "bench.updates.raw")

    def run(self, seconds: float, stop: threading.Event) -> None:
        per_tick = max(1, int(self.rate * TICK_S))
        start = time.perf_counter()
        tick = 0
        while not stop.is_set() and time.perf_counter() - start < seconds:
            due = start + tick * TICK_S
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            value = self._record(per_tick, int(time.time() * 1000))
            self.sent += per_tick
            total, sent_at = self.sent, time.time()

            def on_delivery(err, msg, total=total, sent_at=sent_at) -> None:  # noqa: ANN001
                if err is None:
                    self.offsets[msg.offset()] = (sent_at, total)

            self.producer.produce(self.topic, value, partition=0, on_delivery=on_delivery)
            self.producer.poll(0)
            tick += 1
        self.producer.flush(30)

    def done_by(self, end_offsets: dict[str, int]) -> tuple[int, float | None]:
        """(updates in offsets below the end, produce time of the last of those records)."""
        end = end_offsets.get("0", 0)
        below = [o for o in self.offsets if o < end]
        if not below:
            return 0, None
        sent_at, total = self.offsets[max(below)]
        return total, sent_at


class AssemblyFeed:
    """Pre-generated worker transactions of part deltas, paced by the answer deltas they cause."""

    def __init__(self, settings: KafkaSettings, vocab: Vocabulary, target_answers: int, seed: int) -> None:
        self.settings = settings
        self.topic = settings.topic("deltas.parts")
        rng = random.Random(seed)
        engine = Engine(vocab.dictionary)
        names: dict[str, tuple[str, int]] = {}
        assemblers = {q: Assembler(text) for q, text in ASSEMBLY_QUERIES.items()}
        for query_id, text in ASSEMBLY_QUERIES.items():
            for part in split_parts(text):
                engine.register(f"{query_id}#{part.index}", part.sparql)
                names[f"{query_id}#{part.index}"] = (query_id, part.index)
        self.transactions: list[tuple[list[tuple[bytes, bytes, int]], int]] = []  # (records, answers)
        present: set[tuple[int, int, int]] = set()
        answers = seq = 0
        while answers < target_answers:
            records, caused = [], 0
            for _ in range(50):
                seq += 1
                if present and rng.random() < 0.3:
                    triple = rng.choice(tuple(present)) if len(present) < 64 else _pick(rng, present)
                    present.discard(triple)
                    sign = -1
                else:
                    triple, sign = vocab.random_triple(rng), 1
                    present.add(triple)
                per_query: dict[str, list] = {}
                for index, (name, d_sign, row) in enumerate(engine.apply(sign, *triple)):
                    query_id, part = names[name]
                    per_query.setdefault(query_id, []).append((part, d_sign, row))
                    value = codec.encode_part_delta(query_id, part, seq, d_sign,
                                                    dict(zip(engine.columns(name), row)), -1, seq, index, False, None)
                    records.append((query_id.encode(), value, query_partition(query_id, settings.partitions)))
                for query_id, deltas in per_query.items():
                    caused += len(assemblers[query_id].apply(deltas))
            self.transactions.append((records, caused))
            answers += caused
        self.total_answers = answers
        self.part_deltas = sum(len(r) for r, _ in self.transactions)
        self.done: list[tuple[dict[int, int], float, int]] = []  # (max offset per partition, time, answers up to)

    def run(self, rate: float, stop: threading.Event) -> None:
        producer = make_producer(self.settings, transactional_id="bench-assembly-worker", linger_ms=5)
        start = time.perf_counter()
        cumulative = 0
        for records, caused in self.transactions:
            if stop.is_set():
                break
            delay = start + cumulative / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            cumulative += caused
            offsets: dict[int, int] = {}

            def on_delivery(err, msg, offsets=offsets) -> None:  # noqa: ANN001
                if err is None:
                    offsets[msg.partition()] = max(offsets.get(msg.partition(), -1), msg.offset())

            producer.begin_transaction()
            for key, value, partition in records:
                producer.produce(self.topic, value, key, partition=partition, on_delivery=on_delivery)
            producer.commit_transaction(30)
            self.done.append((offsets, time.time(), cumulative))

    def done_by(self, end_offsets: dict[str, int]) -> tuple[int, float | None]:
        answers, sent_at = 0, None
        for offsets, at, cumulative in self.done:
            if all(o < end_offsets.get(str(p), 0) for p, o in offsets.items()):
                answers, sent_at = cumulative, at
            else:
                break
        return answers, sent_at


def _pick(rng: random.Random, items: set) -> tuple:
    for i, item in enumerate(items):  # sets are unordered; a bounded random walk is enough here
        if i >= rng.randrange(64):
            return item
    return next(iter(items))


# ------------------------------------------------------------------ phases


def measure(progress: ProgressLog, feed, t0: float, t1: float) -> dict:  # noqa: ANN001
    """Sustained rate over [t0, t1] and per-batch latencies of the batches ending in it."""
    ends = progress.ends()
    done_at_t0 = max([feed.done_by(off)[0] for end, off, _p in ends if end <= t0] or [0])
    done_at_t1 = max([feed.done_by(off)[0] for end, off, _p in ends if end <= t1] or [0])
    latencies, durations = [], []
    for end, off, p in ends:
        if t0 <= end <= t1:
            _done, sent_at = feed.done_by(off)
            if sent_at is not None:
                latencies.append(end - sent_at)
            durations.append(p["durationMs"])
    parts = {}
    for name in ("triggerExecution", "addBatch", "latestOffset", "queryPlanning", "walCommit", "commitOffsets"):
        values = [d.get(name, 0) / 1000 for d in durations if name in d]
        if values:
            parts[name] = statistics.median(values)
    return {"rate": (done_at_t1 - done_at_t0) / (t1 - t0), "latencies": sorted(latencies), "batches": len(durations),
            "durations": parts}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def feed_and_measure(query, feed, feed_arg, feed_timeout: float | None, name: str,  # noqa: ANN001
                     args) -> tuple[ProgressLog, dict]:  # noqa: ANN001
    """Run ``feed.run(feed_arg, stop)`` in a producer thread while ``query`` runs (stopped after ``feed_timeout``
    seconds, None: never), let the query catch up, stop it, and :func:`measure` the measured interval."""
    progress = ProgressLog(query)
    stop = threading.Event()
    producer = threading.Thread(target=feed.run, args=(feed_arg, stop), daemon=True)
    started = time.time()
    producer.start()
    try:
        producer.join(feed_timeout)
        stop.set()
        producer.join()
        time.sleep(max(2.0, 2 * (args.trigger or 1)))
        progress.stop()
    finally:
        stop.set()
        query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"{name}: {query.exception()}")
    return progress, measure(progress, feed, started + args.warmup, started + args.warmup + args.duration)


def run_windows(spark, broker: EmbeddedBroker, work: Path, name: str, rate: int, args) -> dict:  # noqa: ANN001
    from spark.job import start_stateful

    settings = broker.settings(topic_prefix=f"bench-{name}.")
    ensure_topics(settings)
    for query_id, text in WINDOW_QUERIES.items():
        publish_plan(settings, query_id, text)
    feed = WindowFeed(settings, Vocabulary(args.subjects), rate, seed=7)
    query = start_stateful(spark, settings, "windows", work / f"cp-{name}", args.trigger)
    _progress, result = feed_and_measure(query, feed, args.warmup + args.duration, None, name, args)
    result.update(offered=rate, sent=feed.sent)
    out = sum(len(codec.part_deltas(m.value())) for m in read_all(settings, settings.topic("deltas.parts"), timeout=30))
    result["answer_deltas_out"] = out
    return result


def run_assembly(spark, broker: EmbeddedBroker, work: Path, args) -> dict:  # noqa: ANN001
    from spark.job import start_stateful

    settings = broker.settings(topic_prefix="bench-assembly.", partitions=2)
    ensure_topics(settings)
    for query_id, text in ASSEMBLY_QUERIES.items():
        publish_plan(settings, query_id, text)
    total = int(args.assembly_rate * (args.warmup + args.duration))
    generated = time.perf_counter()
    feed = AssemblyFeed(settings, Vocabulary(args.assembly_subjects), total, seed=11)
    print(f"  assembly: generated {len(feed.transactions):,} transactions, {feed.part_deltas:,} part deltas, "
          f"{feed.total_answers:,} answer deltas in {time.perf_counter() - generated:.1f} s", flush=True)
    query = start_stateful(spark, settings, "assembly", work / "cp-assembly", args.trigger,
                           single_owner=True)  # (its parts come as a single-owner worker sends them)
    progress, result = feed_and_measure(query, feed, args.assembly_rate, args.warmup + args.duration + 60,
                                        "assembly", args)
    finished = max([feed.done_by(off)[0] for _e, off, _p in progress.ends()] or [0])
    out = 0
    for msg in read_all(settings, settings.topic("deltas.parts"), timeout=60):
        try:
            cols = codec.part_delta_columns(msg.value())
        except codec.CodecError:
            continue
        if cols.part == -1:
            out += len(cols)
    result.update(offered=args.assembly_rate, answer_deltas_out=out, expected_for_finished=finished,
                  part_deltas=feed.part_deltas)
    return result


def run_compaction(spark, broker: EmbeddedBroker, work: Path, args) -> dict:  # noqa: ANN001
    from spark.snapshot_store import SnapshotStore
    from spark.job import start_compaction
    from spark.kafka_io import close_producers

    settings = broker.settings(topic_prefix="bench-compaction.", partitions=2)
    ensure_topics(settings)
    producer = make_producer(settings, linger_ms=20)
    started = time.perf_counter()
    present = produce_answer_log(producer, settings, args.compaction_deltas, args.queries, args.pool,
                                 partition_of=lambda q: query_partition(q, settings.partitions))
    producer.flush(120)
    print(f"  compaction: produced {args.compaction_deltas:,} Answer records in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    import logging
    import re

    # per batch: (deltas, seconds folding, seconds reading Kafka, seconds of the Spark job collecting the ranges,
    # when it ended)
    batches: list[tuple[int, float, float, float, float]] = []

    class BatchLog(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found = re.search(r"folded (\d+) deltas .* in ([\d.]+)s \(\+([\d.]+)s reading Kafka, ([\d.]+)s collecting",
                              record.getMessage())
            if found:
                batches.append((int(found[1]), float(found[2]), float(found[3]), float(found[4]), time.perf_counter()))

    job_log = logging.getLogger("cbgp.spark.job")
    handler, level = BatchLog(), job_log.level
    job_log.addHandler(handler)
    job_log.setLevel(logging.INFO)
    started = time.perf_counter()
    try:
        query = start_compaction(spark, settings, work / "snap", work / "cp-compaction", interval_s=None,
                                 max_offsets_per_trigger=args.compaction_batch, publish_current=True)
        query.awaitTermination(1800)
    finally:
        close_producers()  # (the publisher's, kept across batches, before the broker stops)
        job_log.removeHandler(handler)
        job_log.setLevel(level)
    seconds = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"compaction: {query.exception()}")
    got = SnapshotStore(work / "snap").read(spark).count()
    expected = sum(len(v) for v in present.values())
    if got != expected:
        raise RuntimeError(f"compaction: {got} answers in the snapshot, the replay has {expected}")
    if sum(b[0] for b in batches) != args.compaction_deltas or len(batches) < 2:
        raise RuntimeError(f"compaction: {len(batches)} batches of {[b[0] for b in batches]} deltas, expected "
                           f"{args.compaction_deltas:,} in batches of {args.compaction_batch:,}")
    after_first = sum(b[0] for b in batches[1:])
    return {"rate": after_first / (batches[-1][4] - batches[0][4]), "from_start_rate": args.compaction_deltas / seconds,
            "seconds": seconds, "first_batch_s": batches[0][4] - started, "answers": got, "batches": len(batches),
            "fold_s": sum(b[1] for b in batches[1:]), "read_s": sum(b[2] for b in batches[1:]),
            "collect_s": sum(b[3] for b in batches[1:]), "after_first": after_first}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="measured seconds per phase (default 60)")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds fed before measuring (default 15)")
    parser.add_argument("--windows-rate", type=int, default=30_000, help="updates/s offered (default 30,000)")
    parser.add_argument("--latency-rate", type=int, default=5_000, help="updates/s of the latency phase")
    parser.add_argument("--assembly-rate", type=int, default=30_000, help="answer deltas/s offered (default 30,000)")
    parser.add_argument("--compaction-deltas", type=int, default=1_000_000, help="compaction: backlog")
    parser.add_argument("--compaction-batch", type=int, default=200_000, help="compaction: records per batch")
    parser.add_argument("--subjects", type=int, default=2_000, help="windows: distinct subjects")
    parser.add_argument("--assembly-subjects", type=int, default=300, help="assembly: distinct subjects")
    parser.add_argument("--queries", type=int, default=100, help="compaction: queries")
    parser.add_argument("--pool", type=int, default=3000, help="compaction: bindings per query")
    parser.add_argument("--trigger", type=float, default=None,
                        help="trigger interval of windows and assembly (default: the job's default)")
    parser.add_argument("--only", default="latency,windows,assembly,compaction")
    args = parser.parse_args(argv)
    if args.trigger is None:
        args.trigger = default_trigger_interval()
    phases = args.only.split(",")
    from spark.session import build_session

    t0 = time.perf_counter()
    spark = build_session(master="local[2]", app_name="cbgp-spark-stream-bench")
    print(f"session start {time.perf_counter() - t0:.1f} s (cores={os.cpu_count()}, load={os.getloadavg()[0]:.1f}, "
          f"trigger {args.trigger} s, {args.duration:.0f} s measured per phase after {args.warmup:.0f} s)", flush=True)
    results: dict[str, dict] = {}
    try:
        # Spark's state store maintenance may still write into a checkpoint while the directory goes
        with tempfile.TemporaryDirectory(prefix="cbgp-stream-bench-", ignore_cleanup_errors=True) as tmp:
            work = Path(tmp)
            with EmbeddedBroker(work / "broker") as broker:
                for phase in phases:
                    print(f"{phase} ...", flush=True)
                    if phase == "windows":
                        results[phase] = run_windows(spark, broker, work, "windows", args.windows_rate, args)
                    elif phase == "latency":
                        results[phase] = run_windows(spark, broker, work, "latency", args.latency_rate, args)
                    elif phase == "assembly":
                        results[phase] = run_assembly(spark, broker, work, args)
                    elif phase == "compaction":
                        results[phase] = run_compaction(spark, broker, work, args)
                    print(f"  {phase}: {json.dumps(results[phase], default=str)[:600]}", flush=True)
    finally:
        spark.stop()
    print()
    print(f"{'phase':11} {'offered/s':>10} {'sustained/s':>12} {'batches':>8} {'lat p50':>8} {'lat p99':>8} "
          f"{'batch s':>8}  detail")
    for phase, r in results.items():
        lat = r.get("latencies", [])
        p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
        detail = {k: round(v, 2) for k, v in r.get("durations", {}).items() if k != "triggerExecution"}
        if phase == "compaction":
            detail = (f"{r['after_first']:,} deltas in {r['batches'] - 1} batches after the first; inside them "
                      f"{r['collect_s']:.1f} s collecting the offset ranges (a Spark job) + {r['read_s']:.1f} s "
                      f"reading Kafka + {r['fold_s']:.1f} s folding; from the query's start: "
                      f"{r['from_start_rate']:,.0f} deltas/s ({r['seconds']:.1f} s, first batch "
                      f"{r['first_batch_s']:.1f} s); {r['answers']:,} answers in the snapshot")
        elif phase == "assembly":
            detail = (f"out {r['answer_deltas_out']:,} (expected >= {r['expected_for_finished']:,}); "
                      f"{json.dumps(detail)}")
        print(f"{phase:11} {r.get('offered', '-'):>10} {r['rate']:>12,.0f} {r.get('batches', '-'):>8} "
              f"{'-' if p50 is None else f'{p50:.2f}':>8} {'-' if p99 is None else f'{p99:.2f}':>8} "
              f"{r.get('durations', {}).get('triggerExecution', 0):>8.2f}  {detail}")
    print(f"(load average at end: {os.getloadavg()[0]:.1f})")

    def get(phase: str, key: str) -> float | None:
        r = results.get(phase)
        return None if r is None else r[key]

    lat = results.get("latency", {}).get("latencies", [])
    summary = {
        "windows_updates_per_s": None if get("windows", "rate") is None else round(get("windows", "rate")),
        "assembly_deltas_per_s": None if get("assembly", "rate") is None else round(get("assembly", "rate")),
        "batch_latency_p50_s": None if not lat else round(pct(lat, 0.5), 3),
        "batch_latency_p99_s": None if not lat else round(pct(lat, 0.99), 3),
        "compaction_deltas_per_s": None if get("compaction", "rate") is None else round(get("compaction", "rate")),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
