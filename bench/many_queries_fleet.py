"""Many alert queries through the whole fleet: registrations/s, then the LSBench stream, 10 queries against N.

Usage:
  .venv/bin/python bench/many_queries_fleet.py [--queries 10,10000] [--updates 150000] [--workers 2] [--data DIR]
      [--kill-worker] [--extra 5000] [--sample 100]

Per query count, a fresh fleet as ``make run`` starts it (bench/lsbench_fleet.py's ``start_fleet``: embedded broker,
ingest, registry, workers, answers, Spark job, supervisor), by centre value:

1. the alert queries of bench/many_queries.py (per tag, per user, per post, user x tag) are sent to the admin topic
   as a subscription service would, all at once, each its own ``REGISTER`` command; registrations/s is the count
   over the time to the last reply on ``queries.status`` (every one must be ``ACCEPTED``);
2. the first ``--updates`` LSBench updates are published with one ``cbgp publish``; end-to-end updates/s runs from
   the publish to the moment the answers service's ``cbgp_deltas_emitted_total`` equals ``cbgp replay``'s count on
   the same file and queries (and stays there 3 s), and the CPU of every process of the fleet over that time;
3. the resident memory of every service at the end;
4. with ``--kill-worker``: worker 0 is killed with SIGKILL and started again as the fleet started it; its restore
   time (start to /readyz, to its first assignment with its shards restored, and the restore_seconds they log),
   then ``--extra`` more updates of the stream are published and the count must reach ``cbgp replay``'s on the whole file (no answer lost or repeated);
5. ``--sample`` queries (seeded) checked row by row: every answer of theirs on the answers topic, as (sign,
   binding) multisets, equals ``cbgp replay``'s on the same updates.

No assertion on timings: the figures are printed for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import lsbench  # noqa: E402
from lsbench_fleet import CBGP, ROOT, CpuTracker, expected_counts, metrics, start_fleet, stop_fleet, total  # noqa: E402
from lsbench_fleet import wait_for_answers  # noqa: E402
from many_queries import PREFIXES, make_queries, write_updates  # noqa: E402
from idle_bench import _group, _service_of  # noqa: E402
from confluent_kafka import TopicPartition  # noqa: E402
from services.codec import CodecError, decode, encode  # noqa: E402
from services.kafka.client import end_offsets, make_consumer, make_producer  # noqa: E402
from services.kafka.config import KafkaSettings  # noqa: E402
from services.kafka.replay import read_range  # noqa: E402

KEEP = [False]  # --keep


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


def _term(term: dict) -> tuple:
    """One answer term, as cbgp replay's JSON and the answers topic's Answer record both give it."""
    datatype = term.get("datatype")
    return (term["type"], term["value"], None if datatype == "http://www.w3.org/2001/XMLSchema#string" else datatype,
            term.get("lang") or term.get("xml:lang"))


def _row(sign: str, binding: dict) -> tuple:
    return sign, tuple(sorted((var, _term(t)) for var, t in binding.items()))


def replay_rows(patch: Path, files: dict[str, Path]) -> dict[str, Counter]:
    """``cbgp replay``'s answers of ``files``' queries on ``patch``: per query, Counter of (sign, binding)."""
    args = [*CBGP, "replay", "--patch", str(patch)]
    for name, path in files.items():
        args += ["--query", f"{name}={path}"]
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, check=True)
    rows: dict[str, Counter] = {name: Counter() for name in files}
    for line in done.stdout.splitlines():
        record = json.loads(line)
        rows[record["query"]][_row(record["sign"], record["binding"])] += 1
    return rows


def fleet_rows(settings: KafkaSettings, names: set[str]) -> dict[str, Counter]:
    """Every answer of ``names`` on the fleet's answers topic: per query, Counter of (sign, binding)."""
    topic = settings.topic("answers")
    rows: dict[str, Counter] = {name: Counter() for name in names}
    for partition, (low, high) in end_offsets(settings, topic).items():
        for msg in read_range(settings, topic, partition, low, high):
            if msg.key() is not None and msg.key().decode() not in names:
                continue
            answer = decode("Answer", msg.value())
            if answer["query_id"] in names:
                rows[answer["query_id"]][_row(answer["sign"], answer["binding"])] += 1
    return rows


def kill_and_restart_worker(root_pid: int, run_dir: Path, timeout: float,
                            started: list[subprocess.Popen]) -> dict:
    """SIGKILL worker 0 and start it again with its command line and environment (added to ``started``, for
    the caller to stop: it is not the supervisor's child): seconds to its /readyz and to its first assignment,
    and the restore_seconds its shards logged."""
    root = psutil.Process(root_pid)
    victim = next(pid for pid, name in _service_of(root.children()).items() if name == "worker-0")
    proc = psutil.Process(victim)
    cmd, env, cwd = proc.cmdline(), proc.environ(), proc.cwd()
    port = cmd[cmd.index("--metrics-port") + 1] if "--metrics-port" in cmd else None
    proc.kill()
    proc.wait(30)
    log_path = run_dir / "worker-0-restarted.log"
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        started.append(subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                        start_new_session=True))
    ready = None
    while ready is None and time.monotonic() - t0 < timeout:
        text = log_path.read_text(errors="replace")
        found = re.search(r"metrics_port=(\d+)", text)
        url = f"http://127.0.0.1:{found.group(1) if found else port}/readyz"
        try:
            if urllib.request.urlopen(url, timeout=1).status == 200:
                ready = time.monotonic() - t0
        except OSError:
            time.sleep(0.2)
    assigned = None  # ... and to the end of its restore: the group gave it partitions, their shards restored
    while assigned is None and time.monotonic() - t0 < timeout:
        text = log_path.read_text(errors="replace")
        if re.search(r"event=assigned partitions=\d", text):
            assigned = time.monotonic() - t0
        else:
            time.sleep(0.2)
    text = log_path.read_text(errors="replace")
    restores = [float(x) for x in re.findall(r"event=shard-restored .*?restore_seconds=([\d.]+)", text)]
    return {"ready_seconds": round(ready, 2) if ready is not None else None,
            "restored_seconds": round(assigned, 2) if assigned is not None else None,
            "shard_restore_seconds": round(sum(restores), 2), "shards": len(restores)}


def run_one(n: int, queries: list[tuple[str, str]], patch: Path, n_updates: int, expected: int, workers: int,
            tmp: Path, args: argparse.Namespace) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix=f"run-{n}-", dir=tmp))
    proc, fleet = start_fleet(run_dir, workers, "by-centre", args.ready_timeout)
    settings = KafkaSettings(bootstrap_servers=fleet["broker"])
    answers_url = fleet["metrics"]["answers"]
    restarted: list[subprocess.Popen] = []
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
        after: dict = {}
        if args.kill_worker and t_done is not None:
            after["restart"] = kill_and_restart_worker(proc.pid, run_dir, args.ready_timeout, restarted)
            print(f"  {n:,} queries: worker 0 killed and restarted: {after['restart']}", file=sys.stderr, flush=True)
            extra = subprocess.run([*CBGP, "publish", str(args.extra_patch), "--format", "patch",
                                    "--bootstrap-servers", fleet["broker"]], cwd=ROOT, capture_output=True, text=True,
                                   timeout=args.timeout)
            if extra.returncode != 0:
                raise RuntimeError(f"cbgp publish failed ({extra.returncode}): {extra.stderr[-1000:]}")
            done, count = wait_for_answers(answers_url, args.expected_full, time.time(), args.stall, args.timeout)
            after["exact_after_restart"] = done is not None
            after["emitted_after_restart"] = int(count)
            after["expected_after_restart"] = args.expected_full
        if args.sample_files:
            want = args.sample_rows
            got = fleet_rows(settings, set(args.sample_files))
            differ = sorted(name for name in want if got.get(name, Counter()) != want[name])
            after["sample"] = {"queries": len(want), "rows": sum(sum(c.values()) for c in want.values()),
                               "answering": sum(1 for c in want.values() if c), "differ": differ[:10]}
        after["final_emitted"] = int(total(metrics(answers_url), "cbgp_deltas_emitted_total"))
    finally:
        for worker in restarted:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
        stop_fleet(proc)
        if not KEEP[0]:
            shutil.rmtree(run_dir, ignore_errors=True)
    ok = t_done is not None
    seconds = (t_done if ok else time.time()) - t0
    fleet_cpu = sum(per_cpu.values())
    return {"queries": n, "ok": ok, "emitted": int(emitted), "expected": expected, "registration": registration,
            "seconds": round(seconds, 2), "updates_per_s": round(n_updates / seconds) if ok else None,
            "fleet_cpu_us_per_update": round(1e6 * fleet_cpu / n_updates, 1),
            "cpu_us_per_update": {k: round(1e6 * v / n_updates, 1) for k, v in per_cpu.items()},
            "memory_mb": memory, **after}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", default="10,10000", help="query counts, one fleet each (default 10,10000)")
    parser.add_argument("--updates", type=int, default=150_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data", type=Path, default=lsbench.DEFAULT_DATA)
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--stall", type=float, default=120.0)
    parser.add_argument("--kill-worker", action="store_true",
                        help="with the largest query count: kill -9 worker 0 after the stream, restart it, publish more")
    parser.add_argument("--extra", type=int, default=5000, help="updates published after the restart (default 5000)")
    parser.add_argument("--keep", action="store_true", help="keep each fleet's directory (logs)")
    parser.add_argument("--sample", type=int, default=100, help="queries checked row by row (default 100; 0: none)")
    args = parser.parse_args()
    counts = [int(c) for c in args.queries.split(",")]
    kill = args.kill_worker
    KEEP[0] = args.keep
    tmp = Path(tempfile.mkdtemp(prefix="many-fleet-"))
    try:
        stream = lsbench.build_updates(lsbench.load_or_generate(args.data)).updates
        updates = stream[: args.updates]
        patch = tmp / "lsbench.rdfp"
        write_updates(updates, patch)
        whole = tmp / "lsbench-and-extra.rdfp"  # what the fleet has read once the extra updates are in
        args.extra_patch = tmp / "extra.rdfp"
        write_updates(stream[args.updates: args.updates + args.extra], args.extra_patch)
        write_updates(stream[: args.updates + args.extra], whole)
        results = []
        for n in counts:
            queries = make_queries(updates, n)
            files = {}
            for name, text in queries:
                files[name] = tmp / f"{name}.rq"
                files[name].write_text(PREFIXES + text + "\n")
            expected, replay_s = expected_counts(patch, files)
            args.kill_worker = kill and n == max(counts)
            if args.kill_worker:
                args.expected_full = sum(expected_counts(whole, files)[0].values())
            sample = sorted(random.Random(7).sample(sorted(files), min(args.sample, len(files))))
            args.sample_files = {name: files[name] for name in sample}
            args.sample_rows = replay_rows(whole if args.kill_worker else patch, args.sample_files) if sample else {}
            print(f"{n:,} queries: cbgp replay {replay_s:.1f} s, {sum(expected.values()):,} deltas "
                  f"({sum(1 for v in expected.values() if v)} queries answer)", flush=True)
            r = run_one(n, queries, patch, len(updates), sum(expected.values()), args.workers, tmp, args)
            r["replay_seconds"] = round(replay_s, 2)
            results.append(r)
            reg = r["registration"]
            print(f"{n:>6,} queries: registration {reg['per_s']:,.0f}/s ({reg['seconds']} s, {reg['statuses']}); "
                  f"{'ok' if r['ok'] else 'MISMATCH ' + str(r['emitted']) + '/' + str(r['expected'])} "
                  f"{r['updates_per_s'] or 0:,} updates/s, fleet CPU {r['fleet_cpu_us_per_update']} us/update; "
                  f"memory MB {r['memory_mb']}"
                  + (f"; after kill -9 of worker 0: ready in {r['restart']['ready_seconds']} s, its "
                     f"{r['restart']['shards']} shards restored {r['restart']['restored_seconds']} s after its start "
                     f"(restoring took {r['restart']['shard_restore_seconds']} s), "
                     f"{'exact' if r['exact_after_restart'] else 'MISMATCH'} with {args.extra:,} more updates "
                     f"({r['emitted_after_restart']:,}/{r['expected_after_restart']:,})" if "restart" in r else "")
                  + (f"; sample of {r['sample']['queries']} queries ({r['sample']['answering']} answering, "
                     f"{r['sample']['rows']:,} rows) row by row: "
                     f"{'equal' if not r['sample']['differ'] else 'DIFFER ' + ','.join(r['sample']['differ'])}"
                     if "sample" in r else ""), flush=True)
        print(json.dumps({"updates": len(updates), "workers": args.workers, "results": results}))
    finally:
        if args.keep:
            print(f"kept: {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
