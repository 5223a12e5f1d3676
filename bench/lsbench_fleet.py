"""The whole fleet users run, end to end, on the LSBench stream (or Stream-WatDiv), by-centre vs single-owner.

    .venv/bin/python bench/lsbench_fleet.py [--updates 150000] [--workers 1,2] [--with-4]
        [--placements by-centre,single-owner] [--workloads mix,heavy] [--heavy FILE.rq] [--repeat N]
        [--in-memory] [--stream lsbench|watdiv]

Data: the first ``--updates`` updates of the LSBench stream (bench/lsbench.py: the shared
``/work/shared/data/lsbench-1000`` files if present, else its generator of the same shape; static graph first,
then the post/photo/like streams with 20% deletions), written as one RDF Patch file.  ``--stream watdiv``: the
Stream-WatDiv stream instead (bench/watdiv.py: ``--data`` is its ``stream.txt.gz``, default the shared one; its
triples in timestamp order, a fifth deleted again), with the ``watdiv`` workload by default.

Per configuration (workload x placement x workers x repeat), a fresh fleet started as ``make run`` starts it,
without the demo: ``python -m services.commands.run --no-demo --run-dir <tmp> --workers W`` (embedded broker, ingest,
registry, W workers, answers, Spark job, the supervisor with its live view), with ``CBGP_PLACEMENT`` set for the
workers.  Once every service is ready, the queries are registered with ``cbgp register`` and the whole file is
published with one ``cbgp publish`` (the real CLI, against the broker services.commands.run started).

Measured:
- end-to-end updates/s: updates / (time the answers service's ``cbgp_deltas_emitted_total`` first equals the
  expected count - time ``cbgp publish`` was started); the expected count is ``cbgp replay``'s number of
  deltas on the same file and queries; the counter must then stay there for 3 s (else "MISMATCH");
- CPU seconds (user+system, psutil, sampled every second so short-lived Spark Python workers count) of every
  process of the fleet from just before the publish to the end, grouped: broker, supervisor (services.commands.run and
  its live view), ingest, registry, worker-i, answers, spark-jvm, spark-python-workers; and us of CPU per
  update; the ``cbgp publish`` client's CPU is reported apart (``publish-cli``), not in the fleet total; the
  kernel's share of each group's CPU (``system_share``: system time over user+system);
- per worker: its share of the state entries (``cbgp_query_state_entries`` summed over queries, and
  ``cbgp_state_entries`` summed over partitions, both from its /metrics at the end) and of the workers' CPU.
- per data-path service (ingest, each worker, answers), from its ``cbgp_hop_latency_seconds`` histogram at the
  end: p50/p99 of the time from the produce of the update behind each batch to the service polling it, having
  processed it and having committed it (``hops``): where the produce-to-answer latency goes, hop by hop;
  and the transactions it committed per second of the run (``transactions_per_s``: the turns of its loop).

Paced (``--paced RATE``): instead of one ``cbgp publish`` burst, the same updates are produced at RATE updates/s
(messages of 50, as bench/fleet_bench.py does), and once every answer is out the answers topic is read: the
latency of an answer is its ``produced_at_ms`` minus the produce time of the raw record that caused it (the
``cbgp-origin-ms`` header); p50/p99/max over every answer.  CPU is then per update at that rate.
``--latency-trace FILE`` keeps every answer's two times, to see when the slow ones happened.

Workloads: ``mix`` = the 10 queries of bench/queries/; ``heavy`` = one var-connected query alone (default: the
2-hop path ``?a foaf:knows ?b . ?b sib:like ?post`` over the like stream, centre ?b; ``--heavy FILE`` for another);
``operators`` = the 5 queries of bench/queries_operators/ (OPTIONAL, GROUP BY/HAVING, FILTER over a 3-hop path,
FILTER on a star's attribute, NOT EXISTS; by centre their leaves run on the workers and the operators in the
answers service); ``paths`` = the 4 property-path queries of bench/queries_paths/ (``knows+`` from and to a user,
a class hierarchy's ``*`` over a small SIOC/SIB hierarchy published before the stream, a sequence);
``watdiv`` = the 8 queries of bench/queries_watdiv/, shaped after WatDiv's basic templates (stars, linear paths,
a snowflake, a complex cycle) over the Stream-WatDiv vocabulary.

In memory (``--in-memory``: no fleet, no Kafka, for profiling the workers' CPU per update): ingest's records
made in memory, then per partition count in ``--workers`` (one routed partition per worker core) the workers'
cores (services.worker.core with the codec) fed their logs round robin, probes written back to the logs they go
to, CPU per update summed over the cores (by-centre vs single-owner: the whole shard on its owner); and, for a
one-query workload, cbgp.distributed.evaluator's evaluators alone (probes handed over as objects) against one engine.

Output: one line per configuration (with ``--repeat N``: median [min-max]; each run's line goes to stderr), then
as the last line one JSON object with every figure.  The bench itself only polls /metrics every 0.2 s.
"""

from __future__ import annotations

import secrets
import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("CBGP_CHECKPOINT_SECRET", secrets.token_hex(32))  # (services that checkpoint need one)
sys.path.insert(0, str(ROOT / "bench"))

import lsbench  # noqa: E402
import watdiv  # noqa: E402
from services.kafka.config import KafkaSettings
from services.kafka.client import make_producer  # noqa: E402
from idle_bench import _cpu, _group, _service_of, add_fleet_env_flag, fleet_env  # noqa: E402 - as the idle bench

CBGP = [sys.executable, "-m", "services.commands.main"]
QUERY_DIR = ROOT / "bench" / "queries"
OPERATOR_QUERY_DIR = ROOT / "bench" / "queries_operators"  # OPTIONAL, GROUP BY/HAVING, FILTERs, NOT EXISTS
PATH_QUERY_DIR = ROOT / "bench" / "queries_paths"  # knows+ from and to a user, a class hierarchy, a sequence
WATDIV_QUERY_DIR = ROOT / "bench" / "queries_watdiv"  # WatDiv's basic templates over Stream-WatDiv
HEAVY_DEFAULT = """# 2-hop path over the like stream (var-connected, single centre ?b): friends of someone, what they like
PREFIX foaf: <http://xmlns.com/foaf/0.1/>
PREFIX sib: <http://www.ins.cwi.nl/sib/vocabulary/>
SELECT * WHERE { ?a foaf:knows ?b . ?b sib:like ?post . }
"""


# ------------------------------------------------------------------------------------------- helpers


def metrics(url: str) -> dict[str, float]:
    """``{metric{labels}: value}`` of a Prometheus text page (empty if unreachable)."""
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def total(page: dict[str, float], metric: str) -> float:
    return sum(v for k, v in page.items() if k == metric or k.startswith(metric + "{"))


def histogram_quantile(page: dict[str, float], metric: str, q: float, **labels: str) -> float | None:
    """The ``q`` quantile of a Prometheus histogram's buckets on ``page`` (those with ``labels``), interpolated
    linearly inside its bucket as Prometheus' histogram_quantile does; None when it observed nothing."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    buckets = []
    for key, value in page.items():
        if key.startswith(metric + "_bucket{") and all(w in key for w in wanted):
            bound = key.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if bound == "+Inf" else float(bound), value))
    buckets.sort()
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, lower, below = q * buckets[-1][1], 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = bound, count
    return lower


def hop_latencies(pages: dict[str, dict[str, float]]) -> dict[str, dict[str, list[float | None]]]:
    """Per data-path service, per point (polled, processed, committed): [p50, p99] ms from the produce of the
    update behind each batch (``cbgp_hop_latency_seconds``); and "queued": the time the batch's oldest input record
    waited in Kafka before the poll (``cbgp_queue_wait_seconds``)."""
    out = {}
    for name, page in pages.items():
        points = {}
        series = [(point, "cbgp_hop_latency_seconds", {"point": point}) for point in ("polled", "processed", "committed")]
        series.append(("queued", "cbgp_queue_wait_seconds", {}))
        for point, metric, labels in series:
            quantiles = [histogram_quantile(page, metric, q, **labels) for q in (0.5, 0.99)]
            if quantiles[0] is not None:
                points[point] = [round(1000 * x, 1) if x is not None else None for x in quantiles]
        if points:
            out[name] = points
    return out


def transactions(pages: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per data-path service, the transactions it has committed (``cbgp_transaction_step_seconds`` of its commit
    step): one turn of its loop each."""
    return {name: count for name, page in pages.items()
            if (count := sum(v for k, v in page.items()
                             if k.startswith("cbgp_transaction_step_seconds_count{") and 'step="commit"' in k))}


def percentiles(ms: list[int]) -> dict[str, float]:
    """p50, p99 and max of answer latencies in ms."""
    ms = sorted(ms)
    return {"p50_ms": statistics.median(ms), "p99_ms": ms[min(len(ms) - 1, int(0.99 * len(ms)))], "max_ms": ms[-1]}


def wait_for_answers(answers_url: str, expected: int, t0: float, stall: float, timeout: float) -> tuple[float | None, float]:
    """Until the answers service's emitted counter equals ``expected`` and stays there 3 s (or stops moving short
    of it for ``stall`` s, or ``timeout`` s passed since ``t0``): (the time it first equalled it or None, the count)."""
    t_done, emitted, moved_at, last = None, 0.0, time.time(), -1.0
    while True:
        emitted = total(metrics(answers_url + "?name[]=cbgp_deltas_emitted_total"), "cbgp_deltas_emitted_total")
        now = time.time()
        if emitted != last:
            moved_at, last = now, emitted
            if emitted == expected:
                t_done = now
        if t_done is not None and emitted == expected and now - moved_at >= 3.0:
            return t_done, emitted
        if emitted > expected or now - moved_at > stall or now - t0 > timeout:
            return (t_done if emitted == expected else None), emitted
        time.sleep(0.2)


def patch_lines(updates: list[lsbench.UpdateRow]) -> list[str]:
    return [f"{'A' if sign > 0 else 'D'} {s} {p} {o} ." for sign, s, p, o in updates]


def expected_counts(patch: Path, queries: dict[str, Path]) -> tuple[dict[str, int], float]:
    """``cbgp replay``'s delta count per query on the same file, and its wall seconds."""
    args = [*CBGP, "replay", "--patch", str(patch)]
    for name, path in queries.items():
        args += ["--query", f"{name}={path}"]
    t0 = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, check=True)
    counts = dict.fromkeys(queries, 0)
    for line in done.stdout.splitlines():
        counts[json.loads(line)["query"]] += 1
    return counts, time.monotonic() - t0


def wait_quiet(root_pid: int, cores: float = 0.3, timeout: float = 90.0) -> float:
    """Wait until the fleet uses under ``cores`` over a second (the Spark job's first batches start its Python
    workers: seconds of CPU that are the job's start, not the stream's); the seconds waited."""
    root, started = psutil.Process(root_pid), time.monotonic()

    def total() -> float:
        return sum(_cpu([root] + root.children(recursive=True)).values())

    while time.monotonic() - started < timeout:
        before, t0 = total(), time.monotonic()
        time.sleep(1.0)
        if (total() - before) / (time.monotonic() - t0) < cores:
            break
    return time.monotonic() - started


class CpuTracker:
    """CPU seconds per process group of the fleet (the tree under services.commands.run), sampled every second, so that
    processes that start and end during the run (Spark's Python workers) are counted up to their last sample."""

    def __init__(self, root_pid: int) -> None:
        self.root = psutil.Process(root_pid)
        self.service_of = _service_of(self.root.children())
        self.t_start = time.time()
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.first_sys: dict[int, float] = {}
        self.last_sys: dict[int, float] = {}
        self.group: dict[int, str] = {}
        self._sample(baseline=True)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _sample(self, baseline: bool = False) -> None:
        try:
            procs = [self.root] + self.root.children(recursive=True)
        except psutil.Error:
            return
        for p in procs:
            try:
                t = p.cpu_times()
                cpu = t.user + t.system
                if p.pid not in self.first:
                    # born after the start: all its CPU is the run's
                    before = baseline or p.create_time() < self.t_start
                    self.first[p.pid] = cpu if before else 0.0
                    self.first_sys[p.pid] = t.system if before else 0.0
                    self.group[p.pid] = _group(p, self.root.pid, self.service_of)
                self.last[p.pid] = cpu
                self.last_sys[p.pid] = t.system
            except psutil.Error:
                pass

    def _run(self) -> None:
        while not self.done.wait(1.0):
            self._sample()

    def stop(self) -> dict[str, float]:
        self.done.set()
        self.thread.join()
        self._sample()
        per: dict[str, float] = {}
        for pid, cpu in self.last.items():
            per[self.group[pid]] = per.get(self.group[pid], 0.0) + cpu - self.first[pid]
        return dict(sorted(per.items(), key=lambda kv: -kv[1]))

    def system(self) -> dict[str, float]:
        """The kernel's part of each group's CPU seconds (after ``stop``)."""
        per: dict[str, float] = {}
        for pid, cpu in self.last_sys.items():
            per[self.group[pid]] = per.get(self.group[pid], 0.0) + cpu - self.first_sys[pid]
        return per


# ------------------------------------------------------------------------------------------- one run


PROFILE_DIR: list[str | None] = [None]  # --profile
FLEET_ENV: dict[str, str] = {}  # --fleet-env KEY=VALUE: settings every process of the fleet gets


def start_fleet(run_dir: Path, workers: int, placement: str, timeout: float) -> tuple[subprocess.Popen, dict]:
    """services.commands.run as make run starts it (no demo); returns (process, {broker, metrics urls})."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CBGP_")}  # its own embedded broker
    env["CBGP_PLACEMENT"] = placement  # read by every worker (services/worker/service.py --placement default)
    if PROFILE_DIR[0]:
        env["CBGP_PROFILE"] = PROFILE_DIR[0]  # every service's cProfile stats, written when it stops
    env.update(FLEET_ENV)
    run_dir.mkdir(parents=True, exist_ok=True)
    err_path = run_dir / "run.stderr"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "services.commands.run", "--no-demo", "--run-dir", str(run_dir / "run"),
                                 "--workers", str(workers)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err,
                                start_new_session=True)
    deadline = time.monotonic() + timeout
    logs = run_dir / "run" / "logs"
    while True:
        text = err_path.read_text(errors="replace")
        if proc.poll() is not None:
            raise RuntimeError(f"services.commands.run exited with {proc.returncode}:\n{text[-2000:]}")
        dead = re.findall(r"!! ([\w-]+) exited \(.*?; log (\S+)\)", text)
        if dead or time.monotonic() > deadline:
            stop_fleet(proc)  # (not left running behind a failed start)
            why = f"{dead[0][0]} exited" if dead else f"not ready after {timeout:.0f} s"
            raise RuntimeError(f"fleet {why}:\n{text[-2000:]}" + "".join(
                f"\n--- {name}'s log, last lines:\n" + "\n".join(Path(log).read_text(errors="replace").splitlines()[-15:])
                for name, log in dict(dead).items() if Path(log).exists()))
        broker = re.search(r"run: embedded broker at (\S+)", text)
        ports = dict(re.findall(r"run: ports: ([\w-]+): .*?metrics (http://127\.0\.0\.1:\d+/metrics)", text))
        spark_log = logs / "spark-job.log"
        # (the Spark job warm: its compaction's first batch done, which starts its Python workers -- seconds of
        # CPU that are the job's start, not the stream's)
        spark_text = spark_log.read_text(errors="replace") if spark_log.exists() else ""
        ready = (broker and "run: started" in text and "registry" in ports and "answers" in ports
                 and "running windows" in spark_text and "batch 0 folded" in spark_text
                 and all("event=assigned" in (logs / f"{n}.log").read_text(errors="replace")
                         for n in [f"worker-{i}" for i in range(workers)] + ["answers"] if (logs / f"{n}.log").exists())
                 and all((logs / f"worker-{i}.log").exists() for i in range(workers)))
        if ready:
            try:
                urllib.request.urlopen(ports["registry"].replace("/metrics", "/readyz"), timeout=2)
                break
            except OSError:
                pass
        time.sleep(1.0)
    return proc, {"broker": broker.group(1), "metrics": ports}


def stop_fleet(proc: subprocess.Popen) -> None:
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=120)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def measure(patch: Path, n_updates: int, queries: dict[str, Path], expected: int, workers: int, placement: str,
            tmp: Path, args: argparse.Namespace) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=tmp))
    proc, fleet = start_fleet(run_dir, workers, placement, args.ready_timeout)
    bootstrap = ["--bootstrap-servers", fleet["broker"]]
    answers_url = fleet["metrics"]["answers"]
    try:
        for name, path in queries.items():
            subprocess.run([*CBGP, "register", name, str(path), *bootstrap], cwd=ROOT, check=True,
                           capture_output=True, text=True, timeout=120)
        time.sleep(3.0)  # the plans reach every worker (registered before any data: nothing to snapshot)
        settled = wait_quiet(proc.pid)
        settings = KafkaSettings(bootstrap_servers=fleet["broker"])  # services.commands.run's topics
        producer = make_producer(settings, linger_ms=1) if args.paced else None
        cpu = CpuTracker(proc.pid)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        turns_before = transactions({name: metrics(url) for name, url in fleet["metrics"].items()})
        t0 = time.time()
        if producer is not None:
            from fleet_bench import produce  # (fleet_bench imports this module)
            produce(producer, settings, patch.read_text().splitlines(), args.paced)
            pub = subprocess.CompletedProcess([], 0)
        else:
            pub = subprocess.run([*CBGP, "publish", str(patch), "--format", "patch", *bootstrap], cwd=ROOT,
                                 capture_output=True, text=True, timeout=args.timeout)
        t_published = time.time()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        publish_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if pub.returncode != 0:
            raise RuntimeError(f"cbgp publish failed ({pub.returncode}): {pub.stderr[-1000:]}")
        t_done, emitted = wait_for_answers(answers_url, expected, t0, args.stall, args.timeout)
        per_cpu = cpu.stop()  # (includes the 3 s of confirmation, idle by then)
        per_sys = cpu.system()
        pages = {name: metrics(url) for name, url in fleet["metrics"].items()}
        hops = hop_latencies(pages)
        turns = {name: count - turns_before.get(name, 0) for name, count in transactions(pages).items()}
        states = {}
        for name, url in fleet["metrics"].items():
            if name.startswith("worker-"):
                page = metrics(url)
                states[name] = {"query_state_entries": total(page, "cbgp_query_state_entries"),
                                "state_entries": total(page, "cbgp_state_entries"), "cpu_s": per_cpu.get(name, 0.0)}
        latency = None
        if producer is not None and emitted == expected:
            from fleet_bench import AnswerReader
            reader = AnswerReader(settings, answers_url)
            try:
                answers = list(zip(reader.query_ids, reader.until(expected, 300)))
            finally:
                reader.close()
            timed = [(query, produced - origin) for query, (produced, origin) in answers if origin]
            if args.latency_trace is not None:
                with open(args.latency_trace, "a", encoding="utf-8") as trace:
                    for query, (produced, origin) in answers:
                        trace.write(json.dumps({"run_dir": run_dir.name, "workers": workers, "placement": placement,
                                                "query": query, "origin_ms": origin, "produced_ms": produced}) + "\n")
            if not timed:
                raise RuntimeError("no answer carries its update's origin time (cbgp-origin-ms): no latency")
            latency = {"rate": args.paced, **percentiles([ms for _query, ms in timed]), "answers_timed": len(timed),
                       "by_query": {query: percentiles([ms for q, ms in timed if q == query])
                                    for query in sorted({q for q, _ms in timed})}}
    finally:
        stop_fleet(proc)
    ok = t_done is not None and emitted == expected
    kept = str(run_dir) if args.keep else None
    if not args.keep:
        if ok:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:  # (its logs tell why: kept outside the bench's own temporary directory, which goes at the end)
            kept = shutil.move(str(run_dir), tempfile.mkdtemp(prefix="lsbench-fleet-mismatch-"))
            print(f"  the run that did not match kept its directory (logs): {kept}", flush=True)
    seconds = (t_done if ok else time.time()) - t0
    fleet_cpu = sum(per_cpu.values())
    sums = {k: sum(s[k] for s in states.values()) for k in ("query_state_entries", "state_entries", "cpu_s")}
    for s in states.values():
        for k in ("query_state_entries", "state_entries", "cpu_s"):
            s[f"{k}_share"] = round(s[k] / sums[k], 3) if sums[k] else None
    return {"ok": ok, "emitted": int(emitted), "expected": expected, "seconds": round(seconds, 2),
            "publish_seconds": round(t_published - t0, 2), "settled_seconds": round(settled, 1),
            "updates_per_s": round(n_updates / seconds, 1) if ok else None,
            "cpu_s": {k: round(v, 2) for k, v in per_cpu.items()}, "fleet_cpu_s": round(fleet_cpu, 2),
            "cpu_us_per_update": {k: round(1e6 * v / n_updates, 1) for k, v in per_cpu.items()},
            "fleet_cpu_us_per_update": round(1e6 * fleet_cpu / n_updates, 1),
            "system_share": {k: round(per_sys.get(k, 0.0) / v, 2) for k, v in per_cpu.items() if v > 0},
            "publish_cli_cpu_s": round(publish_cpu, 2), "workers": states, "latency": latency, "hops": hops,
            "transactions_per_s": {k: round(v / seconds, 1) for k, v in turns.items()},
            "run_dir": kept}


def describe(r: dict) -> str:
    procs = ", ".join(f"{k} {v:.0f}" for k, v in r["cpu_us_per_update"].items() if v >= 0.5)
    ws = " ".join(f"{name.replace('worker-', 'w')}: state {_pct(s['query_state_entries_share'])}"
                  f"/{_pct(s['state_entries_share'])} cpu {_pct(s['cpu_s_share'])}" for name, s in r["workers"].items())
    rate = f"{r['updates_per_s']:,.0f} updates/s" if r["ok"] else f"MISMATCH ({r['emitted']:,} of {r['expected']:,} answers)"
    return (f"{rate} ({r['seconds']:.1f} s, publish {r['publish_seconds']:.1f} s); fleet CPU {r['fleet_cpu_s']:.1f} s = "
            f"{r['fleet_cpu_us_per_update']:.0f} us/update ({procs}); publish-cli {r['publish_cli_cpu_s']:.1f} s; "
            f"workers [query-state/state-entries, cpu share] {ws}"
            + (f"; latency at {r['latency']['rate']:,.0f}/s p50 {r['latency']['p50_ms']:.0f} ms p99 "
               f"{r['latency']['p99_ms']:.0f} ms max {r['latency']['max_ms']:.0f} ms" if r.get("latency") else "")
            + ("; by query p50/p99 ms: " + ", ".join(f"{q} {v['p50_ms']:.0f}/{v['p99_ms']:.0f}"
                                                      for q, v in r["latency"]["by_query"].items())
               if r.get("latency") else "")
            + ("; hops from produce, p50/p99 ms: " + ", ".join(
                f"{name} " + " ".join(f"{point} {p50:.0f}/{p99:.0f}" for point, (p50, p99) in points.items())
                for name, points in r["hops"].items()) if r.get("hops") else "")
            + ("; transactions/s: " + ", ".join(f"{name} {n:.0f}" for name, n in r["transactions_per_s"].items())
               if r.get("transactions_per_s") else ""))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


# ------------------------------------------------------------------------------------------- in memory


def ingest_in_memory(updates: list[lsbench.UpdateRow], partitions: int, chunk: int = 500,
                     terms: dict[int, str] | None = None) -> tuple[dict, list]:
    """The routed records per partition and the updates.encoded records ingest makes of ``updates`` (raw
    records of ``chunk`` lines, no Kafka); ``terms``: filled with the dictionary topic's entries."""
    from services import codec
    from services.ingest.core import IngestProcessor, RawRecord

    ingest = IngestProcessor(KafkaSettings(topic_prefix="m."), partitions, partitions)
    lines = patch_lines(updates)
    routed: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    encoded: list[bytes] = []
    for start in range(0, len(lines), chunk):
        raw = RawRecord(("\n".join(lines[start:start + chunk]) + "\n").encode(), offset=start // chunk)
        for out in ingest.process(raw):
            if out.topic == "m.updates.routed":
                routed[out.partition].append(out.value)
            elif out.topic == "m.updates.encoded":
                encoded.append(out.value)
            elif out.topic == "m.dictionary" and terms is not None:
                terms.update(codec.dictionary_entries(out.value))
    return routed, encoded


def cores_in_memory(routed: dict, encoded: list, queries: dict[str, Path], placement: str,
                    terms: dict[int, str], after_turn: Callable[[], object] | None = None,
                    keep: list | None = None) -> dict:
    """The workers' cores (services.worker.core, codec included) with one routed partition each, fed their
    logs round robin (3 records a turn, then a flush: one transaction), probes written back to the logs they
    go to; the whole shard of each query on its owner (single-owner); ``terms``: the dictionary topic (what
    FILTERs read).  CPU seconds per core (process time), and the state entries at the end.  ``after_turn``: called
    after each core's turn (as the runner's last step after a transaction); ``keep``: gets the cores."""
    from cbgp.query.plan import SINGLE_OWNER
    from services import codec
    from services.wire.records import query_partition
    from services.worker.core import WorkerCore
    from services.worker.shard import decode_changes

    n = len(routed)
    logs = {p: list(records) for p, records in routed.items()}
    topics = {"deltas.parts": "m.deltas.parts", "deadletter": "m.deadletter", "updates.routed": "m.updates.routed"}

    def reader(kind: str, partition: int, start: int, end: int) -> list:
        source = logs[partition] if kind == "routed" else encoded
        return [c for off, v in enumerate(source[start:end], start) for c in decode_changes(kind, v)]

    def records(partition: int, start: int, end: int | None) -> list:
        return list(enumerate(logs[partition][start:end], start))

    cores = [WorkerCore(topics, n, 1, 1, reader, assemble_in_spark=False, placement=placement,
                        record_reader=records, term_reader=lambda ids: {i: terms[i] for i in ids if i in terms})
             for _ in range(n)]
    owners: dict[int, list[int]] = {}
    for offset, (name, path) in enumerate(queries.items()):
        value = codec.encode("QueryPlan", {"query_id": name, "sparql": path.read_text(), "options": {},
                                           "plan_json": "{}", "projected": [], "registered_at_seq": 0, "version": 1})
        for p, core in enumerate(cores):
            core.on_plan(0, offset, name.encode(), value, [p])
        owners.setdefault(query_partition(name, n), [])
    for p, core in enumerate(cores):
        core.open_shard("routed", p, 0, None)
        if placement == SINGLE_OWNER and p in owners:
            core.open_shard("whole", p, 0, None)
    if keep is not None:
        keep.extend(cores)
    cpu = [0.0] * n
    cursors, encoded_cursor = [0] * n, [0] * n
    answers = 0
    busy = True
    while busy:
        busy = False
        for p, core in enumerate(cores):
            shard = core.shards[("routed", p)]
            whole = core.shards.get(("whole", p))
            started = time.process_time()
            outputs = []
            for _ in range(3):
                if cursors[p] < len(logs[p]):
                    outputs += core.on_routed(shard, cursors[p], logs[p][cursors[p]], None)[0]
                    cursors[p] += 1
                    busy = True
                if whole is not None and encoded_cursor[p] < len(encoded):
                    i = encoded_cursor[p]
                    outputs += core.on_record(whole, i, decode_changes("whole", encoded[i]))
                    encoded_cursor[p] += 1
                    busy = True
            outputs += core.flush_batches()
            if after_turn is not None:
                after_turn()
            cpu[p] += time.process_time() - started
            for out in outputs:
                if out.topic == "m.updates.routed":
                    logs[out.partition].append(out.value)
                elif codec.frontier_of(out.value) is None and codec.probe_ready_of(out.value) is None:
                    answers += len(codec.part_delta_columns(out.value).seq)
    probes = sum(c.shards[("routed", p)].evaluator.probes_sent for p, c in enumerate(cores)
                 if c.shards[("routed", p)].evaluator is not None)
    state = sum(sum(core.state_by_query().values()) for core in cores)
    return {"cpu_s": cpu, "answer_deltas": answers, "probes": probes, "state_entries": state}


def evaluator_in_memory(updates: list[lsbench.UpdateRow], query: str, partitions: int) -> dict:
    """cbgp.distributed.evaluator alone: every change to the PartitionEvaluator of its subject's and object's partitions
    (in seq order, each advancing its frontier; every partition's frontier moved every 500 changes, as ingest's
    marks do), probes and acks handed over as objects until none is left;
    against one plain Engine applying the same changes.  CPU seconds (process time) of each."""
    from cbgp.distributed.evaluator import PartitionEvaluator
    from cbgp.distributed.program import compile_component
    from cbgp.engine.engine import Engine
    from cbgp.query.plan import decompose
    from cbgp.query.sparql import parse_query
    from cbgp.terms import DEFAULT_GRAPH_ID, TermDictionary
    from cbgp.change import routes

    dictionary = TermDictionary(stable=True)
    encode = dictionary.encode
    changes = [(sign, encode(s), encode(p), encode(o)) for sign, s, p, o in updates]
    engine = Engine(dictionary)
    engine.register("q", query)
    started = time.process_time()
    engine_deltas = sum(len(engine.apply(sign, s, p, o)) for sign, s, p, o in changes)
    engine_s = time.process_time() - started
    program = compile_component("q", decompose(parse_query(query)), dictionary)
    parts = [PartitionEvaluator(p, partitions) for p in range(partitions)]
    for part in parts:
        part.register(program)
    deltas = 0
    started = time.process_time()
    for seq, (sign, s, p, o) in enumerate(changes, 1):
        outs = []
        for dest, role in routes(s, o, partitions):  # as ingest routes them
            part = parts[dest]
            outs.append(part.apply(seq, sign, s, p, o, DEFAULT_GRAPH_ID, role))
            outs.append(part.advance(seq))
        if seq % 500 == 0 or seq == len(changes):  # ingest's frontier marks, once per raw record of 500
            outs.extend(part.advance(seq) for part in parts)
        while outs:
            out = outs.pop()
            deltas += len(out.deltas)
            for ack in out.acks:
                parts[ack.dest].on_ack(ack)
            for probe in out.probes:
                outs.append(parts[probe.dest].on_probe(probe))
    evaluator_s = time.process_time() - started
    return {"engine_s": engine_s, "engine_deltas": engine_deltas, "evaluator_s": evaluator_s,
            "evaluator_deltas": deltas, "probes": sum(part.probes_sent for part in parts)}


def in_memory(updates: list[lsbench.UpdateRow], workloads: dict, worker_counts: list[int], placements: list[str],
              repeat: int) -> list[dict]:
    """``--in-memory``: the workers' cores and the evaluator without Kafka (see cores_in_memory and
    evaluator_in_memory); each figure the median [min-max] of ``repeat`` runs, in us of CPU per update."""
    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"

    results = []
    for n in worker_counts:
        terms: dict[int, str] = {}
        routed, encoded = ingest_in_memory(updates, n, terms=terms)
        for w, queries in workloads.items():
            for placement in placements:
                runs = [cores_in_memory(routed, encoded, queries, placement, terms) for _ in range(repeat)]
                per_update = [1e6 * sum(r["cpu_s"]) / len(updates) for r in runs]
                results.append({"mode": "cores", "workload": w, "placement": placement, "partitions": n,
                                "us_per_update": per_update, "runs": runs})
                print(f"cores in memory {w:5s} {placement:12s} partitions={n}: workers' CPU {spread(per_update)} "
                      f"us/update; {runs[0]['answer_deltas']:,} answer deltas, {runs[0]['probes']:,} probes, "
                      f"{runs[0]['state_entries']:,} state entries",
                      flush=True)
            if len(queries) == 1:
                (query,) = [path.read_text() for path in queries.values()]
                runs = [evaluator_in_memory(updates, query, n) for _ in range(repeat)]
                ev = [1e6 * r["evaluator_s"] / len(updates) for r in runs]
                en = [1e6 * r["engine_s"] / len(updates) for r in runs]
                results.append({"mode": "evaluator", "workload": w, "partitions": n, "evaluator_us_per_update": ev,
                                "engine_us_per_update": en, "runs": runs})
                print(f"evaluator in memory {w:5s} partitions={n}: {spread(ev)} us/update ({runs[0]['probes']:,} "
                      f"probes, {runs[0]['evaluator_deltas']:,} deltas) vs one engine {spread(en)} "
                      f"({runs[0]['engine_deltas']:,} deltas)", flush=True)
    return results


# ------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=150000, help="first N updates of the stream (default 150000)")
    parser.add_argument("--workers", default="1,2", help="worker counts (default 1,2)")
    parser.add_argument("--with-4", action="store_true", help="also 4 workers")
    parser.add_argument("--placements", default="by-centre,single-owner")
    parser.add_argument("--workloads", default=None,
                        help="mix (the 10 bench queries), heavy (one query), operators (bench/queries_operators), "
                             "paths (bench/queries_paths), watdiv (bench/queries_watdiv); default mix,heavy "
                             "(watdiv with --stream watdiv)")
    parser.add_argument("--stream", choices=("lsbench", "watdiv"), default="lsbench",
                        help="the LSBench stream (default) or Stream-WatDiv (--data: its stream.txt.gz)")
    parser.add_argument("--heavy", type=Path, default=None, help="the heavy query (default: a 2-hop path, see above)")
    parser.add_argument("--profile", type=Path, default=None,
                        help="write every service's cProfile stats to DIR/<service>-<pid>.prof (CBGP_PROFILE)")
    parser.add_argument("--repeat", type=int, default=1, help="fleets per configuration: median and range")
    parser.add_argument("--data", type=Path, default=None,
                        help="LSBench's directory, or Stream-WatDiv's stream.txt.gz (default: the shared data)")
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per run from the first publish")
    parser.add_argument("--stall", type=float, default=60.0, help="give up when no answer moved for this long")
    parser.add_argument("--keep", action="store_true",
                        help="keep each run's directory (logs); a run that does not match keeps its own anyway")
    add_fleet_env_flag(parser)
    parser.add_argument("--paced", type=float, default=None, metavar="RATE",
                        help="produce the updates at RATE updates/s and report answer latency (p50, p99, max)")
    parser.add_argument("--latency-trace", type=Path, default=None, metavar="FILE",
                        help="with --paced: append every answer's query, update produce time (origin_ms) and "
                             "answer produce time (produced_ms) to FILE, one JSON object a line, to see when the "
                             "slow answers happened")
    parser.add_argument("--in-memory", action="store_true",
                        help="no fleet: the workers' cores in memory, one routed partition each (--workers: the "
                             "partition counts), and the evaluator alone against one engine (see in_memory)")
    args = parser.parse_args(argv)
    PROFILE_DIR[0] = str(args.profile.resolve()) if args.profile else None
    FLEET_ENV.update(fleet_env(parser, args.fleet_env))
    worker_counts = [int(w) for w in args.workers.split(",")] + ([4] if args.with_4 else [])
    placements = args.placements.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="lsbench-fleet-"))
    try:
        workload_names = (args.workloads or ("watdiv" if args.stream == "watdiv" else "mix,heavy")).split(",")
        if args.stream == "watdiv":
            stream_file = args.data or watdiv.DEFAULT_DATA
            if not stream_file.is_file():
                raise SystemExit(f"lsbench_fleet: no Stream-WatDiv stream at {stream_file} (--data)")
            source = str(stream_file)
            updates = watdiv.updates(watdiv.load(stream_file))[:args.updates]
        else:
            dataset = lsbench.load_or_generate(args.data or lsbench.DEFAULT_DATA)
            source = dataset.source
            updates = lsbench.build_updates(dataset).updates[:args.updates]
        if "paths" in workload_names:  # (the class-hierarchy path's subClassOf triples, first)
            updates = lsbench.CLASS_HIERARCHY + updates
        patch = tmp / "lsbench.rdfp"
        patch.write_text("\n".join(patch_lines(updates)) + "\n")
        heavy = tmp / "heavy.rq"
        heavy.write_text(args.heavy.read_text() if args.heavy else HEAVY_DEFAULT)
        workloads = {"mix": {p.stem: p for p in sorted(QUERY_DIR.glob("*.rq"))}, "heavy": {"heavy": heavy},
                     "operators": {p.stem: p for p in sorted(OPERATOR_QUERY_DIR.glob("*.rq"))},
                     "paths": {p.stem: p for p in sorted(PATH_QUERY_DIR.glob("*.rq"))},
                     "watdiv": {p.stem: p for p in sorted(WATDIV_QUERY_DIR.glob("*.rq"))}}
        workloads = {w: workloads[w] for w in workload_names}
        print(f"data: {source}, first {len(updates):,} updates "
              f"({sum(1 for u in updates if u[0] < 0):,} deletions); {time.strftime('%Y-%m-%d %H:%M %Z')}", flush=True)
        if args.in_memory:
            results = in_memory(updates, workloads, worker_counts, placements, args.repeat)
            print(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "data": source, "in_memory": True,
                              "updates": len(updates), "heavy_query": heavy.read_text(), "results": results}))
            return 0
        expected, replay_s = {}, {}
        for w, queries in workloads.items():
            counts, replay_s[w] = expected_counts(patch, queries)
            expected[w] = counts
            print(f"expected ({w}, cbgp replay, {replay_s[w]:.1f} s): {sum(counts.values()):,} deltas "
                  + " ".join(f"{q}={n:,}" for q, n in counts.items()), flush=True)
        configs = [(w, p, n) for w in workloads for n in worker_counts for p in placements]
        results = []
        for w, p, n in configs:
            runs = []
            for i in range(args.repeat):
                r = measure(patch, len(updates), workloads[w], sum(expected[w].values()), n, p, tmp, args)
                runs.append(r)
                print(f"  {w} {p} workers={n} run {i + 1}/{args.repeat}: {describe(r)}", file=sys.stderr, flush=True)
            rates = [r["updates_per_s"] for r in runs if r["ok"]]
            median_run = sorted(runs, key=lambda r: (r["updates_per_s"] or 0))[(len(runs) - 1) // 2]
            row = {"workload": w, "placement": p, "workers": n, "median_run": median_run,
                   "updates_per_s_median": statistics.median(rates) if rates else None,
                   "updates_per_s_range": [min(rates), max(rates)] if rates else None,
                   "runs_ok": len(rates), "runs": runs}
            results.append(row)
            spread = f" [{min(rates):,.0f}-{max(rates):,.0f}] over {len(rates)} runs" if len(rates) > 1 else ""
            print(f"{w:5s} {p:12s} workers={n}: {describe(median_run)}{spread}", flush=True)
        print(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "data": source,
                          "updates": len(updates), "repeat": args.repeat, "expected": expected,
                          "replay_seconds": replay_s, "heavy_query": heavy.read_text(), "fleet_env": FLEET_ENV,
                          "cores": os.cpu_count(), "results": results}))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
