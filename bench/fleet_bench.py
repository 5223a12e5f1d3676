"""End-to-end benchmark of the whole fleet users run (as ``make run`` starts it) on its embedded broker.

    .venv/bin/python bench/fleet_bench.py [--workers 1,2,4] [--updates 10000] [--rate 5000] [--warmup 5000]
                                          [--repeat 3]

For each worker count, ``--repeat`` times, a fresh fleet started as ``make run`` starts it, without the demo:
``python -m services.commands.run --no-demo --run-dir <tmp> --workers W`` (embedded noida-db broker with 4 partitions
per topic, ingest, registry, W workers, answers, the Spark job, and the supervisor with its live view; the
start-up and the process grouping are bench/lsbench_fleet.py's and bench/idle_bench.py's).  Once every
service is ready, three queries (a star, a path, a DISTINCT component) are registered with ``cbgp register``
(through the registry), then:
- idle CPU: cores each process group uses for 5 s before any data flows, 10 s after the registrations
  (psutil over the whole process tree:
  broker, supervisor, ingest, registry, worker-i, answers, spark-job, spark-jvm, spark-python-workers; and
  the bench itself);
- warm-up: ``--warmup`` updates at ``--rate``, not measured except for their worst latency (the first
  answers wait for clients to find coordinators, transactions to add partitions, the answers service to
  fetch the dictionary...);
- latency: updates produced at ``--rate`` updates/s (messages of 50 updates every 10 ms) to ``updates.raw``;
  the latency of an answer is its ``produced_at_ms`` minus the produce time of the raw record that caused it
  (carried in the ``cbgp-origin-ms`` header); p50/p90/p99/max over every answer of the phase;
- throughput: ``--updates`` more updates produced as fast as possible; updates/s = updates / (time of the
  last answer - time of the first produce), with the CPU each process group spent per update meanwhile
  (sampled every second, so Spark's short-lived Python workers count).
Completion is known exactly: the expected answer count comes from ``cbgp replay``.  The bench stays off
the two cores while the fleet works: it polls the answers service's emitted-deltas counter and reads the
answers once they are all out (their times are in the records).  Runs stay under ~10^5 broker messages
(noida-db's comfortable range).  Prints a table: the median run per worker count, and the range.
"""

from __future__ import annotations

import os
import secrets
import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("CBGP_CHECKPOINT_SECRET", secrets.token_hex(32))  # (services that checkpoint need one)
sys.path.insert(0, str(ROOT / "bench"))

from services import codec  # noqa: E402
from confluent_kafka import OFFSET_BEGINNING, Producer  # noqa: E402

from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets, make_producer  # noqa: E402
from services.wire.records import ORIGIN_HEADER
from services.kafka.fetch import Fetcher
from services.kafka.replay import read_range  # noqa: E402
from tests.fleet_support import QUERIES, generate_patch, replay  # noqa: E402
# the fleet as make run starts it, its process groups and its /metrics: the LSBench and idle benches' helpers
from idle_bench import _group, _service_of  # noqa: E402
from lsbench_fleet import CBGP, CpuTracker, metrics, start_fleet, stop_fleet, total  # noqa: E402

BENCH_QUERIES = {name: QUERIES[name] for name in ("star", "path", "names")}
PER_MESSAGE = 50
IDLE_SECONDS = 5.0  # CPU of the idle fleet is measured over this long before the load starts
SETTLE_SECONDS = 10.0  # after the registrations: the plans reach every worker, the Spark job sees them


def produce(producer: Producer, settings: KafkaSettings, lines: list[str], rate: float | None) -> float:
    """Produce ``lines`` in messages of PER_MESSAGE; paced at ``rate`` updates/s if given. Returns t0 (s).

    One producer serves every phase: a new one holds its first records until it has connected and fetched
    metadata, which would show up as fleet latency."""
    topic = settings.topic("updates.raw")
    t0 = time.time()
    for i in range(0, len(lines), PER_MESSAGE):
        if rate:
            due = t0 + i / rate
            while time.time() < due:
                producer.poll(min(0.005, max(0.0, due - time.time())))
        producer.produce(topic, ("\n".join(lines[i:i + PER_MESSAGE]) + "\n").encode(), partition=0)
        producer.poll(0)
    producer.flush(60)
    return t0


class AnswerReader:
    """Reads the answers topic incrementally, once the answers service says it has emitted them.

    While the fleet works, the bench only asks the answers service's /metrics for its emitted-deltas count
    five times a second: reading every answer as it comes cost ~20 us of CPU per update on the two cores the
    fleet is measured on, and an answer's times (``produced_at_ms``, its origin header) do not depend on
    when it is read."""

    def __init__(self, settings: KafkaSettings, emitted_url: str) -> None:
        topic = settings.topic("answers")
        self.emitted_url = emitted_url
        self.fetcher = Fetcher(settings, "bench-answers", 10000)  # idles unassigned: noida-db does not long-poll
        self.fetcher.set_positions({(topic, p): OFFSET_BEGINNING for p in end_offsets(settings, topic)})
        self.seen: list[tuple[int, int | None]] = []  # (produced_at_ms, origin_ms) of every answer so far
        self.query_ids: list[str] = []  # the query of each of them

    def wait_emitted(self, expected: int, timeout: float) -> None:
        """Until the answers service has emitted ``expected`` answers in total (a /metrics poll every 0.2 s)."""
        deadline = time.monotonic() + timeout
        while (emitted := total(metrics(self.emitted_url), "cbgp_deltas_emitted_total")) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {emitted:.0f} of {expected} answers emitted after {timeout}s")
            time.sleep(0.2)

    def until(self, expected: int, timeout: float) -> list[tuple[int, int | None]]:
        """Wait until ``expected`` answers in total were emitted, read them; (produced_at_ms, origin_ms) each."""
        self.wait_emitted(expected, timeout)
        deadline = time.monotonic() + timeout
        while len(self.seen) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.seen)} of {expected} answers after {timeout}s")
            for msg in self.fetcher.poll():
                if msg.error() is not None:
                    continue
                origin = dict(msg.headers() or ()).get(ORIGIN_HEADER)
                answer = codec.decode("Answer", msg.value())
                self.seen.append((answer["produced_at_ms"], int(origin) if origin else None))
                self.query_ids.append(answer["query_id"])
        return list(self.seen)

    def close(self) -> None:
        self.fetcher.close()


def group_cpu(root: psutil.Process, service_of: dict[int, str]) -> dict[str, float]:
    """User+system CPU seconds so far of each process group of the fleet's tree (live processes only)."""
    out: dict[str, float] = {}
    try:
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return out
    for p in procs:
        try:
            t = p.cpu_times()
            name = _group(p, root.pid, service_of)
            out[name] = out.get(name, 0.0) + t.user + t.system
        except psutil.Error:
            pass
    return out


def self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def transactions(urls: dict[str, str]) -> dict[str, tuple[float, float]]:
    """(transactions, records consumed) so far per data-path service, from its /metrics (one batch = one
    transaction: ``cbgp_processing_latency_seconds`` is observed once per committed batch)."""
    out = {}
    for name, url in urls.items():
        if name == "ingest" or name == "answers" or name.startswith("worker-"):
            page = metrics(url)
            out[name] = (total(page, "cbgp_processing_latency_seconds_count"), total(page, "cbgp_updates_in_total"))
    return out


class CpuSampler:
    """Cores each process group uses per ``step`` seconds while running (the burst's timeline)."""

    def __init__(self, root: psutil.Process, service_of: dict[int, str], step: float = 0.1) -> None:
        self.root, self.service_of, self.step, self.rows = root, service_of, step, []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        last, t_last = group_cpu(self.root, self.service_of), time.time()
        while not self.done.wait(self.step):
            now, t_now = group_cpu(self.root, self.service_of), time.time()
            self.rows.append((t_now, {k: max(0.0, now[k] - last.get(k, 0.0)) / (t_now - t_last) for k in now}))
            last, t_last = now, t_now

    def stop(self) -> list[tuple[float, dict[str, float]]]:
        self.done.set()
        self.thread.join()
        return self.rows


STAGE_TOPICS = ("updates.raw", "dictionary", "updates.encoded", "updates.routed", "deltas.parts", "answers",
                "answers.current")


def stage_times(settings: KafkaSettings, t0: float) -> dict[str, tuple[int, float, float]]:
    """(records, first, last) create times in seconds after ``t0`` of each stage's committed output."""
    out = {}
    for name in STAGE_TOPICS:
        topic, stamps = settings.topic(name), []
        for partition, (low, high) in end_offsets(settings, topic).items():
            stamps += [m.timestamp()[1] / 1000 - t0 for m in read_range(settings, topic, partition, low, high)]
        stamps = [s for s in stamps if s >= -0.05]
        out[name] = (len(stamps), min(stamps, default=0.0), max(stamps, default=0.0))
    return out


def print_timeline(stages: dict[str, tuple[int, float, float]], samples: list, t0: float) -> None:
    print("  burst timeline: stage output (records, first s, last s) after the first produce", file=sys.stderr)
    for name, (count, first, last) in stages.items():
        print(f"    {name:<16} {count:>7,} records  {first:6.2f} .. {last:6.2f} s", file=sys.stderr)
    print("  cores per process, 0.1 s steps:", file=sys.stderr)
    names = sorted({n for _, cores in samples for n in cores})
    print("    " + "t(s)  " + " ".join(f"{n[:7]:>7}" for n in names) + "    sum", file=sys.stderr)
    for t, cores in samples:
        print(f"    {t - t0:5.1f} " + " ".join(f"{cores.get(n, 0.0):7.2f}" for n in names)
              + f"  {sum(cores.values()):5.2f}", file=sys.stderr)


def answer_count(tmp: Path, lines: list[str]) -> int:
    return sum(len(d) for d in replay(tmp, lines, BENCH_QUERIES).values())


def register(tmp: Path, bootstrap: str) -> None:
    """The bench queries through the registry, as a user registers them (``cbgp register ID FILE``)."""
    for name, text in BENCH_QUERIES.items():
        path = tmp / f"{name}.rq"
        path.write_text(text + "\n")
        subprocess.run([*CBGP, "register", name, str(path), "--bootstrap-servers", bootstrap], cwd=ROOT, check=True,
                       capture_output=True, text=True, timeout=120)


def run(workers: int, updates: int, rate: float, warmup: int, tmp: Path, ready_timeout: float,
        timeline: bool = False) -> dict[str, float]:
    lines = generate_patch(warmup + 2 * updates, seed=99, subjects=3000)
    warmup_lines = lines[:warmup]
    latency_lines, burst_lines = lines[warmup:warmup + updates], lines[warmup + updates:]
    n_warmup = answer_count(tmp, warmup_lines)
    n_latency = answer_count(tmp, lines[:warmup + updates])
    n_total = answer_count(tmp, lines)
    proc, fleet = start_fleet(tmp, workers, "by-centre", ready_timeout)  # by-centre: the workers' default
    try:
        settings = KafkaSettings(bootstrap_servers=fleet["broker"])  # services.commands.run's topics: prefix cbgp., 4 partitions
        register(tmp, fleet["broker"])
        time.sleep(SETTLE_SECONDS)
        root = psutil.Process(proc.pid)
        service_of = _service_of(root.children())
        urls = fleet["metrics"]
        idle_tracker, idle_self = CpuTracker(proc.pid), self_cpu()
        time.sleep(IDLE_SECONDS)
        idle = {**idle_tracker.stop(), "bench": self_cpu() - idle_self}
        reader = AnswerReader(settings, urls["answers"])
        producer = make_producer(settings, linger_ms=1)
        try:
            produce(producer, settings, warmup_lines, rate)
            reader.until(n_warmup, 120)
            cold = max(produced - origin for produced, origin in reader.seen if origin is not None)
            produce(producer, settings, latency_lines, rate)
            first = reader.until(n_latency, 120)[n_warmup:]
            lat = sorted(produced - origin for produced, origin in first if origin is not None)
            txn_start = transactions(urls)
            sampler = CpuSampler(root, service_of) if timeline else None
            burst_tracker, burst_self = CpuTracker(proc.pid), self_cpu()
            t0 = produce(producer, settings, burst_lines, None)
            reader.wait_emitted(n_total, 300)
            burst = {**burst_tracker.stop(), "bench": self_cpu() - burst_self}  # the fleet's work, not the reading
            every = reader.until(n_total, 300)
            if sampler is not None:
                samples = sampler.stop()
                print_timeline(stage_times(settings, t0), samples, t0)
                for log in sorted((tmp / "run" / "logs").glob("*.log")):
                    for line in log.read_text(errors="replace").splitlines():
                        if "slow-transaction" in line:
                            print(f"    {log.stem}: {line}", file=sys.stderr)
            txn = {name: (t - txn_start[name][0], r - txn_start[name][1])
                   for name, (t, r) in transactions(urls).items() if name in txn_start}
        finally:
            reader.close()
        t_end = max(produced for produced, _ in every) / 1000
        stored = sum(f.stat().st_size for f in (tmp / "run" / "broker").rglob("*.json"))
    finally:
        stop_fleet(proc)
    return {"workers": workers, "updates_per_s": len(burst_lines) / (t_end - t0),
            "p50_ms": statistics.median(lat), "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "p90_ms": lat[int(0.9 * len(lat))], "max_ms": lat[-1], "cold_max_ms": cold,
            "answers": n_total, "idle_cpu": {k: v / IDLE_SECONDS for k, v in idle.items()},
            "burst_cpu_us": {k: 1e6 * v / len(burst_lines) for k, v in burst.items()},
            "burst_txn": txn, "broker_snapshot_mb": stored / 1e6}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4", help="worker counts to run (default 1,2,4)")
    parser.add_argument("--updates", type=int, default=10000, help="updates per phase (default 10000)")
    parser.add_argument("--rate", type=float, default=5000, help="paced rate of the latency phase (updates/s)")
    parser.add_argument("--warmup", type=int, default=5000,
                        help="updates sent at --rate before the latency phase, not measured (default 5000)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per worker count, each on a fresh broker; the table shows the median and the range "
                             "(the embedded broker's once-a-second snapshot makes single runs vary by +-20%%)")
    parser.add_argument("--timeline", action="store_true",
                        help="also print, for the burst, when each stage wrote its first and last record and the "
                             "cores each process used every 0.1 s (where the wall time goes)")
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds for the fleet to start")
    parser.add_argument("--keep", action="store_true", help="keep each run's directory (logs)")
    args = parser.parse_args(argv)
    rows = []  # per worker count, the run with the median throughput, plus every run's figures
    for workers in (int(w) for w in args.workers.split(",")):
        runs = []
        for attempt in range(1, args.repeat + 1):
            tmp = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
            try:
                runs.append(run(workers, args.updates, args.rate, args.warmup, tmp, args.ready_timeout, args.timeline))
            finally:
                if args.keep:
                    print(f"(run dir kept: {tmp})", file=sys.stderr)
                else:
                    shutil.rmtree(tmp, ignore_errors=True)
            r = runs[-1]
            print(f"workers={r['workers']} run {attempt}/{args.repeat}: throughput={r['updates_per_s']:,.0f} updates/s "
                  f"latency@{args.rate:,.0f}/s p50={r['p50_ms']:.0f} ms p90={r['p90_ms']:.0f} ms "
                  f"p99={r['p99_ms']:.0f} ms max={r['max_ms']:.0f} ms (warm-up max {r['cold_max_ms']:.0f} ms)",
                  file=sys.stderr, flush=True)
        runs.sort(key=lambda r: r["updates_per_s"])
        median = dict(runs[len(runs) // 2])
        median["all_updates_per_s"] = [r["updates_per_s"] for r in runs]
        median["all_p99_ms"] = sorted(r["p99_ms"] for r in runs)
        rows.append(median)
    print(f"\nMedian of {args.repeat} run(s) per worker count (range in brackets)")
    print(f"{'workers':>7} | {'updates/s (burst)':>26} | {'p50 ms':>6} | {'p99 ms':>14} | answers")
    print(f"{'-' * 7}-+-{'-' * 26}-+-{'-' * 6}-+-{'-' * 14}-+--------")
    for r in rows:
        rates, p99s = r["all_updates_per_s"], r["all_p99_ms"]
        rate = f"{statistics.median(rates):,.0f} [{min(rates):,.0f}-{max(rates):,.0f}]"
        p99 = f"{statistics.median(p99s):.0f} [{p99s[0]:.0f}-{p99s[-1]:.0f}]"
        print(f"{r['workers']:>7} | {rate:>26} | {r['p50_ms']:>6.0f} | {p99:>14} | {r['answers']}")
    print("\nCPU per process in the median run: idle (cores busy while no data flows) and burst (CPU us per update);"
          "\nthe fleet's total excludes the bench")
    for r in rows:
        names = sorted(r["burst_cpu_us"], key=lambda n: -r["burst_cpu_us"][n])
        idle = {n: v for n, v in r["idle_cpu"].items()}
        print(f"  {r['workers']} worker(s): idle " + ", ".join(f"{n} {idle.get(n, 0.0):.3f}" for n in names)
              + f" = {sum(v for n, v in idle.items() if n != 'bench'):.3f} cores")
        print(f"  {r['workers']} worker(s): burst " + ", ".join(f"{n} {r['burst_cpu_us'][n]:.0f}" for n in names) +
              f" = {sum(v for n, v in r['burst_cpu_us'].items() if n != 'bench'):.0f} us/update")
    print("\nBurst transactions per service (input records per transaction); the broker's JSON snapshot at the end")
    for r in rows:
        print(f"  {r['workers']} worker(s): " + ", ".join(
            f"{n} {t:,.0f} ({recs / t if t else 0:.1f})" for n, (t, recs) in sorted(r["burst_txn"].items())) +
            f"; snapshot {r['broker_snapshot_mb']:.0f} MB")
    print(f"(goals on 2 cores: >= 20,000 updates/s end to end; p99 < 250 ms at {args.rate:,.0f} updates/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
