"""End-to-end benchmark of the fleet (ingest -> workers -> answers) on the embedded broker.

    .venv/bin/python bench/fleet_bench.py [--workers 1,2,4] [--updates 10000] [--rate 5000] [--warmup 5000]

For each worker count, on a fresh noida-db broker with 4 routed partitions and three queries (a star, a
path, a DISTINCT component):
- idle CPU: cores each process uses for 5 s before any data flows;
- warm-up: ``--warmup`` updates at ``--rate``, not measured except for their worst latency (the first
  answers wait for clients to find coordinators, transactions to add partitions, the answers service to
  fetch the dictionary...);
- latency: updates produced at ``--rate`` updates/s (messages of 50 updates every 10 ms); the latency of
  an answer is its ``produced_at_ms`` minus the produce time of the raw record that caused it (carried in
  the ``cbgp-origin-ms`` header); p50/p90/p99/max over every answer of the phase;
- throughput: ``--updates`` more updates produced as fast as possible; updates/s = updates / (time of the
  last answer - time of the first produce), with the CPU each process spent per update meanwhile.
Completion is known exactly: the expected answer count comes from ``cbgp replay``.  Runs stay under
~10^5 broker messages (noida-db's comfortable range).  Prints a table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services import codec  # noqa: E402
from confluent_kafka import OFFSET_BEGINNING, Producer  # noqa: E402

from services.kafka import EmbeddedBroker, KafkaSettings, end_offsets, ensure_topics, make_producer  # noqa: E402
from services.runtime import ORIGIN_HEADER, Fetcher, read_range  # noqa: E402
from tests.fleet_support import QUERIES, Fleet, generate_patch, metric_total, publish_plan, replay  # noqa: E402

BENCH_QUERIES = {name: QUERIES[name] for name in ("star", "path", "names")}
PER_MESSAGE = 50
IDLE_SECONDS = 5.0  # CPU of the idle fleet is measured over this long before the load starts


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
    """One consumer reading the answers topic incrementally (re-reading the whole topic with ``read_all``
    several times a second would load the broker the fleet is being measured on)."""

    def __init__(self, settings: KafkaSettings) -> None:
        topic = settings.topic("answers")
        self.fetcher = Fetcher(settings, "bench-answers", 10000)  # idles unassigned: noida-db does not long-poll
        self.fetcher.set_positions({(topic, p): OFFSET_BEGINNING for p in end_offsets(settings, topic)})
        self.seen: list[tuple[int, int | None]] = []  # (produced_at_ms, origin_ms) of every answer so far

    def until(self, expected: int, timeout: float) -> list[tuple[int, int | None]]:
        """Read until ``expected`` answers in total; return (produced_at_ms, origin_ms) of each."""
        deadline = time.monotonic() + timeout
        while len(self.seen) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(self.seen)} of {expected} answers after {timeout}s")
            for msg in self.fetcher.poll():
                if msg.error() is not None:
                    continue
                origin = dict(msg.headers() or ()).get(ORIGIN_HEADER)
                self.seen.append((codec.decode("Answer", msg.value())["produced_at_ms"],
                                  int(origin) if origin else None))
        return list(self.seen)

    def close(self) -> None:
        self.fetcher.close()


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User+system CPU seconds so far of each named process (Linux /proc; 0 if it is gone)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            out[name] = 0.0
    return out


def transactions(fleet: Fleet) -> dict[str, tuple[float, float]]:
    """(transactions, records consumed) so far per service process, from its /metrics (one batch = one
    transaction: ``cbgp_processing_latency_seconds`` is observed once per committed batch)."""
    return {name: (metric_total(fleet.metrics_url(name), "cbgp_processing_latency_seconds_count"),
                   metric_total(fleet.metrics_url(name), "cbgp_updates_in_total")) for name in fleet.procs}


def cpu_spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: after[name] - before.get(name, 0.0) for name in after}


def wait_ready(fleet: Fleet, workers: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all("event=assigned" in fleet.log_text(f"w{i}") for i in range(workers)) and \
                "event=assigned" in fleet.log_text("answers"):
            time.sleep(1.0)  # let the last rebalance settle
            return
        time.sleep(0.2)
    raise TimeoutError("fleet not ready")


class CpuSampler:
    """Cores each process uses per ``step`` seconds while running (the burst's timeline)."""

    def __init__(self, pids: dict[str, int], step: float = 0.1) -> None:
        self.pids, self.step, self.rows = pids, step, []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        last, t_last = cpu_seconds(self.pids), time.time()
        while not self.done.wait(self.step):
            now, t_now = cpu_seconds(self.pids), time.time()
            self.rows.append((t_now, {k: (now[k] - last[k]) / (t_now - t_last) for k in now}))
            last, t_last = now, t_now

    def stop(self) -> list[tuple[float, dict[str, float]]]:
        self.done.set()
        self.thread.join()
        return self.rows


STAGE_TOPICS = ("updates.raw", "updates.encoded", "updates.routed", "deltas.parts", "answers")


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
    names = sorted(samples[0][1]) if samples else []
    print("    " + "t(s)  " + " ".join(f"{n:>7}" for n in names) + "    sum", file=sys.stderr)
    for t, cores in samples:
        print(f"    {t - t0:5.1f} " + " ".join(f"{cores[n]:7.2f}" for n in names) + f"  {sum(cores.values()):5.2f}",
              file=sys.stderr)


def answer_count(tmp: Path, lines: list[str]) -> int:
    return sum(len(d) for d in replay(tmp, lines, BENCH_QUERIES).values())


def run(workers: int, updates: int, rate: float, warmup: int, tmp: Path,
        batches: dict[str, list[str]], timeline: bool = False) -> dict[str, float]:
    lines = generate_patch(warmup + 2 * updates, seed=99, subjects=3000)
    warmup_lines = lines[:warmup]
    latency_lines, burst_lines = lines[warmup:warmup + updates], lines[warmup + updates:]
    n_warmup = answer_count(tmp, warmup_lines)
    n_latency = answer_count(tmp, lines[:warmup + updates])
    n_total = answer_count(tmp, lines)
    with EmbeddedBroker(tmp / "broker") as broker:
        settings = broker.settings(topic_prefix="bench.", partitions=4)
        ensure_topics(settings)
        for name, text in BENCH_QUERIES.items():
            publish_plan(settings, name, text)
        with Fleet(settings, tmp / "logs") as fleet:
            fleet.start("ingest", "ingest", "--instance-id", "i1", *batches["ingest"])
            for i in range(workers):
                fleet.start(f"w{i}", "worker", "--worker-id", f"w{i}", *batches["worker"])
            fleet.start("answers", "answers", "--instance-id", "a1", *batches["answers"])
            wait_ready(fleet, workers)
            pids = {"broker": broker.pid, **{name: proc.pid for name, proc in fleet.procs.items()},
                    "bench": os.getpid()}
            idle_start = cpu_seconds(pids)
            time.sleep(IDLE_SECONDS)
            idle = cpu_spent(idle_start, cpu_seconds(pids))
            reader = AnswerReader(settings)
            producer = make_producer(settings, linger_ms=1)
            try:
                produce(producer, settings, warmup_lines, rate)
                reader.until(n_warmup, 120)
                cold = max(produced - origin for produced, origin in reader.seen if origin is not None)
                produce(producer, settings, latency_lines, rate)
                first = reader.until(n_latency, 120)[n_warmup:]
                lat = sorted(produced - origin for produced, origin in first if origin is not None)
                burst_start, txn_start = cpu_seconds(pids), transactions(fleet)
                sampler = CpuSampler(pids) if timeline else None
                t0 = produce(producer, settings, burst_lines, None)
                every = reader.until(n_total, 300)
                burst = cpu_spent(burst_start, cpu_seconds(pids))
                if sampler is not None:
                    samples = sampler.stop()
                    print_timeline(stage_times(settings, t0), samples, t0)
                    for name in fleet.procs:
                        for line in fleet.log_text(name).splitlines():
                            if "slow-transaction" in line:
                                print(f"    {name}: {line}", file=sys.stderr)
                txn = {name: (t - txn_start[name][0], r - txn_start[name][1])
                       for name, (t, r) in transactions(fleet).items() if name in txn_start}
            finally:
                reader.close()
            t_end = max(produced for produced, _ in every) / 1000
            stored = sum(f.stat().st_size for f in (tmp / "broker").rglob("*.json"))
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
    parser.add_argument("--timeline", action="store_true",
                        help="also print, for the burst, when each stage wrote its first and last record and the "
                             "cores each process used every 0.1 s (where the wall time goes)")
    for service in ("ingest", "worker", "answers"):
        parser.add_argument(f"--{service}-batch", type=int, help=f"the {service} service's --batch (default: its own)")
    args = parser.parse_args(argv)
    batches = {service: ["--batch", str(getattr(args, f"{service}_batch"))] if getattr(args, f"{service}_batch") else []
               for service in ("ingest", "worker", "answers")}
    rows = []
    for workers in (int(w) for w in args.workers.split(",")):
        with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
            rows.append(run(workers, args.updates, args.rate, args.warmup, Path(tmp), batches, args.timeline))
        r = rows[-1]
        print(f"workers={r['workers']} throughput={r['updates_per_s']:,.0f} updates/s "
              f"latency@{args.rate:,.0f}/s p50={r['p50_ms']:.0f} ms p90={r['p90_ms']:.0f} ms p99={r['p99_ms']:.0f} ms "
              f"max={r['max_ms']:.0f} ms (warm-up max {r['cold_max_ms']:.0f} ms)", file=sys.stderr)
    print(f"\n{'workers':>7} | {'updates/s (burst)':>17} | {'p50 ms':>7} | {'p99 ms':>7} | answers")
    print(f"{'-' * 7}-+-{'-' * 17}-+-{'-' * 7}-+-{'-' * 7}-+--------")
    for r in rows:
        print(f"{r['workers']:>7} | {r['updates_per_s']:>17,.0f} | {r['p50_ms']:>7.0f} | {r['p99_ms']:>7.0f} | {r['answers']}")
    print("\nCPU per process: idle (cores busy while no data flows) and burst (CPU microseconds per update)")
    for r in rows:
        names = sorted(r["burst_cpu_us"], key=lambda n: -r["burst_cpu_us"][n])
        print(f"  {r['workers']} worker(s): idle " + ", ".join(f"{n} {r['idle_cpu'][n]:.2f}" for n in names))
        print(f"  {r['workers']} worker(s): burst " + ", ".join(f"{n} {r['burst_cpu_us'][n]:.0f}" for n in names) +
              f" = {sum(r['burst_cpu_us'].values()):.0f} us/update")
    print("\nBurst transactions per service (input records per transaction); the broker's JSON snapshot at the end")
    for r in rows:
        print(f"  {r['workers']} worker(s): " + ", ".join(
            f"{n} {t:,.0f} ({recs / t if t else 0:.1f})" for n, (t, recs) in sorted(r["burst_txn"].items())) +
            f"; snapshot {r['broker_snapshot_mb']:.0f} MB")
    print(f"(goals on 2 cores: >= 20,000 updates/s end to end; p99 < 250 ms at {args.rate:,.0f} updates/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
