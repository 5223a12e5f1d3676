"""Many alert queries through the whole fleet: registrations/s, then the LSBench stream, 10 queries against N.

Usage:
  .venv/bin/python bench/many_queries_fleet.py [--queries 10,10000] [--updates 150000] [--workers 2] [--data DIR]

Per query count, a fresh fleet as ``make run`` starts it (bench/lsbench_fleet.py's ``start_fleet``: embedded broker,
ingest, registry, workers, answers, Spark job, supervisor), by centre value:

1. the alert queries of bench/many_queries.py (per tag, per user, per post, user x tag) are sent to the admin topic
   as a subscription service would, all at once, each its own ``REGISTER`` command; registrations/s is the count
   over the time to the last reply on ``queries.status`` (every one must be ``ACCEPTED``);
2. the first ``--updates`` LSBench updates are published with one ``cbgp publish``; end-to-end updates/s runs from
   the publish to the moment the answers service's ``cbgp_deltas_emitted_total`` equals ``cbgp replay``'s count on
   the same file and queries (and stays there 3 s), and the CPU of every process of the fleet over that time;
3. the resident memory of every service at the end.

No assertion on timings: the figures are printed for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import lsbench  # noqa: E402
from lsbench_fleet import CBGP, ROOT, CpuTracker, expected_counts, start_fleet, stop_fleet, wait_for_answers  # noqa: E402
from many_queries import PREFIXES, make_queries, write_updates  # noqa: E402
from idle_bench import _group, _service_of  # noqa: E402
from confluent_kafka import TopicPartition  # noqa: E402
from services.codec import CodecError, decode, encode  # noqa: E402
from services.kafka.client import end_offsets, make_consumer, make_producer  # noqa: E402
from services.kafka.config import KafkaSettings  # noqa: E402


def register_all(settings: KafkaSettings, queries: list[tuple[str, str]], timeout: float) -> dict:
    """Send every REGISTER at once; wait for each reply.  Seconds, registrations/s, statuses by kind."""
    status_topic = settings.topic("queries.status")
    start = end_offsets(settings, status_topic).get(0, (0, 0))[1]
    consumer = make_consumer(settings, f"bench-{uuid.uuid4().hex}", fetch_wait_max_ms=50)
    consumer.assign([TopicPartition(status_topic, 0, start)])
    producer = make_producer(settings, linger_ms=5)
    waiting = {}
    t0 = time.monotonic()
    for name, text in queries:
        request_id = uuid.uuid4().hex
        waiting[request_id] = name
        producer.produce(settings.topic("admin"), value=encode("AdminCommand", {
            "command": "REGISTER", "query_id": name, "sparql": PREFIXES + text, "options": {},
            "request_id": request_id}))
        producer.poll(0)
    producer.flush(60)
    kinds: dict[str, int] = {}
    rejected: list[str] = []
    last_report = t0
    try:
        while waiting and time.monotonic() - t0 < timeout:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None or msg.value() is None:
                continue
            try:
                status = decode("QueryStatus", msg.value())
            except CodecError:
                continue
            if waiting.pop(status.get("request_id"), None) is None:
                continue
            kinds[status["status"]] = kinds.get(status["status"], 0) + 1
            if status["status"] != "ACCEPTED" and len(rejected) < 3:
                rejected.append(f"{status.get('query_id')}: {status.get('message')}")
            if time.monotonic() - last_report > 10:
                last_report = time.monotonic()
                print(f"  registered {len(queries) - len(waiting):,}/{len(queries):,}", file=sys.stderr, flush=True)
    finally:
        consumer.close()
    seconds = time.monotonic() - t0
    return {"seconds": round(seconds, 2), "per_s": round((len(queries) - len(waiting)) / seconds, 1),
            "statuses": kinds, "unanswered": len(waiting), "rejected_examples": rejected}


def memory_mb(root_pid: int) -> dict[str, float]:
    """Resident MB per service of the fleet (Spark's JVM and Python workers apart)."""
    root = psutil.Process(root_pid)
    service_of = _service_of(root.children())
    out: dict[str, float] = {}
    for proc in [root] + root.children(recursive=True):
        try:
            group = _group(proc, root_pid, service_of)
            out[group] = out.get(group, 0.0) + proc.memory_info().rss / 2**20
        except psutil.Error:
            pass
    return {k: round(v) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def run_one(n: int, queries: list[tuple[str, str]], patch: Path, n_updates: int, expected: int, workers: int,
            tmp: Path, args: argparse.Namespace) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix=f"run-{n}-", dir=tmp))
    proc, fleet = start_fleet(run_dir, workers, "by-centre", args.ready_timeout)
    settings = KafkaSettings(bootstrap_servers=fleet["broker"])
    answers_url = fleet["metrics"]["answers"]
    try:
        cpu = CpuTracker(proc.pid)
        registration = register_all(settings, queries, args.timeout)
        registration_cpu = cpu.stop()
        registration["fleet_cpu_s"] = round(sum(registration_cpu.values()), 1)
        registration["cpu_s"] = {k: round(v, 1) for k, v in registration_cpu.items() if v >= 0.1}
        print(f"  {n:,} queries: {registration}", file=sys.stderr, flush=True)
        cpu = CpuTracker(proc.pid)
        t0 = time.time()
        pub = subprocess.run([*CBGP, "publish", str(patch), "--format", "patch", "--bootstrap-servers",
                              fleet["broker"]], cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
        if pub.returncode != 0:
            raise RuntimeError(f"cbgp publish failed ({pub.returncode}): {pub.stderr[-1000:]}")
        t_done, emitted = wait_for_answers(answers_url, expected, t0, args.stall, args.timeout)
        per_cpu = cpu.stop()
        memory = memory_mb(proc.pid)
    finally:
        stop_fleet(proc)
        shutil.rmtree(run_dir, ignore_errors=True)
    ok = t_done is not None
    seconds = (t_done if ok else time.time()) - t0
    fleet_cpu = sum(per_cpu.values())
    return {"queries": n, "ok": ok, "emitted": int(emitted), "expected": expected, "registration": registration,
            "seconds": round(seconds, 2), "updates_per_s": round(n_updates / seconds) if ok else None,
            "fleet_cpu_us_per_update": round(1e6 * fleet_cpu / n_updates, 1),
            "cpu_us_per_update": {k: round(1e6 * v / n_updates, 1) for k, v in per_cpu.items()},
            "memory_mb": memory}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", default="10,10000", help="query counts, one fleet each (default 10,10000)")
    parser.add_argument("--updates", type=int, default=150_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data", type=Path, default=lsbench.DEFAULT_DATA)
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--stall", type=float, default=120.0)
    args = parser.parse_args()
    counts = [int(c) for c in args.queries.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="many-fleet-"))
    try:
        updates = lsbench.build_updates(lsbench.load_or_generate(args.data)).updates[: args.updates]
        patch = tmp / "lsbench.rdfp"
        write_updates(updates, patch)
        results = []
        for n in counts:
            queries = make_queries(updates, n)
            files = {}
            for name, text in queries:
                files[name] = tmp / f"{name}.rq"
                files[name].write_text(PREFIXES + text + "\n")
            expected, replay_s = expected_counts(patch, files)
            print(f"{n:,} queries: cbgp replay {replay_s:.1f} s, {sum(expected.values()):,} deltas "
                  f"({sum(1 for v in expected.values() if v)} queries answer)", flush=True)
            r = run_one(n, queries, patch, len(updates), sum(expected.values()), args.workers, tmp, args)
            r["replay_seconds"] = round(replay_s, 2)
            results.append(r)
            reg = r["registration"]
            print(f"{n:>6,} queries: registration {reg['per_s']:,.0f}/s ({reg['seconds']} s, {reg['statuses']}); "
                  f"{'ok' if r['ok'] else 'MISMATCH ' + str(r['emitted']) + '/' + str(r['expected'])} "
                  f"{r['updates_per_s'] or 0:,} updates/s, fleet CPU {r['fleet_cpu_us_per_update']} us/update; "
                  f"memory MB {r['memory_mb']}", flush=True)
        print(json.dumps({"updates": len(updates), "workers": args.workers, "results": results}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
