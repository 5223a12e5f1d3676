"""Idle CPU of the whole local fleet, started exactly as ``make run`` starts it (without the demo).

    .venv/bin/python bench/idle_bench.py [--repeat 3] [--seconds 10] [--settle 20] [--first-answer]

Each run starts ``python -m services.commands.run --no-demo --run-dir <tmp>`` (the embedded broker, ingest, the
registry, 2 workers, answers, the Spark job, and the supervisor with its live view), waits until every
service is ready (the registry answers /readyz, the Spark job logs that its queries run) and then ``--settle``
seconds more, and measures each process's CPU (user + system, psutil over the whole process tree, so the Spark
JVM and its Python workers count) over ``--seconds``.  It prints one line per process group and, last, one
JSON line ``{"total_cores": ..., "per_process": {...}}`` (with ``--repeat N``: the median run's figures plus
``total_cores_runs`` and the range).

``--first-answer`` registers a star query once the fleet is ready and, after the CPU window, publishes the one
update that answers it: ``first_answer_ms`` is that answer's latency (its ``produced_at_ms`` minus its update's
produce time), what the first update after a quiet spell of ``--settle`` + ``--seconds`` pays.  With ``--ring`` the
update rings ingest's doorbell after its acknowledgement, as ``cbgp publish`` and the gateway do
(``services.kafka.doorbell``); without, it stands for a producer of the user's own.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("CBGP_CHECKPOINT_SECRET", secrets.token_hex(32))  # (services that checkpoint need one)
SERVICES = ("ingest", "registry", "worker", "answers", "spark-job")


def _group(proc: psutil.Process, root_pid: int, service_of: dict[int, str]) -> str:
    """The name a process is reported under: its service (a child of the run and everything below it)."""
    if proc.pid == root_pid:
        return "supervisor"
    try:
        chain = [proc] + proc.parents()
    except psutil.Error:
        return "?"
    for p in chain:
        if p.pid in service_of:
            name = service_of[p.pid]
            if name == "spark-job" and p.pid != proc.pid:
                try:
                    exe = proc.name()
                except psutil.Error:
                    exe = "?"
                return "spark-jvm" if "java" in exe else "spark-python-workers"
            return name
    return "?"


def _service_of(children: list[psutil.Process]) -> dict[int, str]:
    names: dict[int, str] = {}
    for child in children:
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if "noida-db" in " ".join(cmd[:1]) or any("noida" in c for c in cmd[:1]):
            names[child.pid] = "broker"
        elif "services.commands.main" in cmd:
            sub = cmd[cmd.index("services.commands.main") + 1] if cmd.index("services.commands.main") + 1 < len(cmd) else "?"
            if sub == "worker" and "--worker-id" in cmd:
                sub = f"worker-{cmd[cmd.index('--worker-id') + 1].lstrip('w')}"
            names[child.pid] = sub
    return names


def _cpu(procs: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for p in procs:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def add_fleet_env_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fleet-env", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for every process of the fleet, e.g. CBGP_IDLE_PAUSE_MS=2 (repeatable)")


def fleet_env(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, str]:
    """The ``--fleet-env`` settings (the benches strip the caller's own CBGP_* variables)."""
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("CBGP_"):
            parser.error(f"--fleet-env {item!r}: expected CBGP_NAME=VALUE")
        env[key] = value
    return env


PROBE_QUERY = "SELECT ?name ?age WHERE { ?u <http://example.org/name> ?name ; <http://example.org/age> ?age }\n"
PROBE_UPDATE = ('A <http://example.org/u1> <http://example.org/name> "u1" .\n'
                'A <http://example.org/u1> <http://example.org/age> "42" .\n')


def _register_probe(run_dir: Path, env: dict[str, str]) -> None:
    query = run_dir / "probe.rq"
    query.write_text(PROBE_QUERY)
    subprocess.run([sys.executable, "-m", "services.commands.main", "register", "idle-probe", str(query)],
                   cwd=ROOT, env={**env, "CBGP_RUN_DIR": str(run_dir / "run")}, check=True, capture_output=True,
                   text=True, timeout=120)


def _probe_producer(run_dir: Path) -> tuple[Any, Any, Any]:
    """The run's settings and a producer already connected, made before the quiet spell: a new producer's
    first delivery waits for its connection (and an idempotent one's for its producer id, 0.5-1 s), which is
    the client's time, not the fleet's."""
    from services.kafka.client import make_producer
    from services.kafka.config import KafkaSettings
    from services.kafka.doorbell import DOORBELL_DIR_ENV, Doorbell
    from services.kafka.run_env import load_run_env

    values = {"CBGP_RUN_DIR": str(run_dir / "run")}
    if load_run_env(values) is None:
        raise RuntimeError(f"no run file in {run_dir / 'run'}")
    settings = KafkaSettings.from_env(values)
    producer = make_producer(settings, idempotent=False, linger_ms=0)
    producer.list_topics(settings.topic("updates.raw"), timeout=30)
    return settings, producer, Doorbell(values.get(DOORBELL_DIR_ENV))


def _first_answer_ms(settings: Any, producer: Any, bell: Any, answers_metrics: str, ring: bool) -> int:
    """Publish PROBE_UPDATE to the idle fleet (ringing ``bell`` if ``ring``); the latency of its answer, in ms."""
    sys.path.insert(0, str(ROOT / "bench"))
    from fleet_bench import AnswerReader

    producer.produce(settings.topic("updates.raw"), PROBE_UPDATE.encode(), partition=0)
    producer.flush(30)
    if ring:
        bell.ring([(settings.topic("updates.raw"), 0)])
    reader = AnswerReader(settings, answers_metrics)
    try:
        (produced, origin), = reader.until(1, 120)
    finally:
        reader.close()
    if origin is None:
        raise RuntimeError("the answer carries no origin time (cbgp-origin-ms)")
    return produced - origin


def _metrics_url(proc: psutil.Process) -> str:
    cmd = proc.cmdline()
    return f"http://127.0.0.1:{cmd[cmd.index('--metrics-port') + 1]}/metrics"


def measure_once(seconds: float, settle: float, ready_timeout: float, keep: bool,
                 settings: dict[str, str] | None = None, first_answer: bool = False, ring: bool = False) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="cbgp-idle-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CBGP_")}  # its own embedded broker
    env.update(settings or {})
    stderr_path = run_dir / "run.stderr"
    with open(stderr_path, "w") as err:
        run = subprocess.Popen([sys.executable, "-m", "services.commands.run", "--no-demo", "--run-dir", str(run_dir / "run")],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            text = stderr_path.read_text(errors="replace")
            spark_log = run_dir / "run" / "logs" / "spark-job.log"
            spark_ready = spark_log.exists() and "running windows" in spark_log.read_text(errors="replace")
            if "run: started" in text and spark_ready:
                break
            if run.poll() is not None:
                raise RuntimeError(f"services.commands.run exited with {run.returncode}:\n{text[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"fleet not ready after {ready_timeout:.0f} s:\n{text[-2000:]}")
            time.sleep(1.0)
        if first_answer:
            _register_probe(run_dir, env)
            probe = _probe_producer(run_dir)
        time.sleep(settle)
        root = psutil.Process(run.pid)
        procs = [root] + root.children(recursive=True)
        service_of = _service_of(root.children())
        groups = {p.pid: _group(p, root.pid, service_of) for p in procs}
        before, t0 = _cpu(procs), time.monotonic()
        time.sleep(seconds)
        after, t1 = _cpu(procs), time.monotonic()
        per: dict[str, float] = {}
        for pid, cpu in after.items():
            if pid in before:
                per[groups[pid]] = per.get(groups[pid], 0.0) + (cpu - before[pid]) / (t1 - t0)
        per = {k: round(v, 3) for k, v in sorted(per.items(), key=lambda kv: -kv[1])}
        result = {"total_cores": round(sum(per.values()), 3), "per_process": per, "processes": len(procs)}
        if first_answer:
            answers, = [p for p in root.children() if service_of.get(p.pid) == "answers"]
            result["first_answer_ms"] = _first_answer_ms(*probe, _metrics_url(answers), ring)
        return result
    finally:
        try:
            os.kill(run.pid, signal.SIGTERM)
            run.communicate(timeout=120)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(run.pid, signal.SIGKILL)
        if not keep:
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            print(f"(run dir kept: {run_dir})", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="fleets to start one after another (default 1)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window (default 10)")
    parser.add_argument("--settle", type=float, default=20.0,
                        help="seconds to wait after every service is ready (default 20)")
    parser.add_argument("--ready-timeout", type=float, default=300.0)
    parser.add_argument("--keep", action="store_true", help="keep each run's directory (logs)")
    parser.add_argument("--first-answer", action="store_true",
                        help="then the latency of the answer to one update published to the idle fleet")
    parser.add_argument("--ring", action="store_true",
                        help="with --first-answer: the update rings ingest's doorbell, as cbgp publish does")
    add_fleet_env_flag(parser)
    args = parser.parse_args(argv)
    settings = fleet_env(parser, args.fleet_env)
    runs = []
    for i in range(args.repeat):
        result = measure_once(args.seconds, args.settle, args.ready_timeout, args.keep, settings, args.first_answer,
                              args.ring)
        runs.append(result)
        first = f", first answer {result['first_answer_ms']} ms" if args.first_answer else ""
        print(f"run {i + 1}: total {result['total_cores']:.3f} cores over {args.seconds:.0f} s "
              f"({result['processes']} processes){first}", flush=True)
    totals = [r["total_cores"] for r in runs]
    median_run = sorted(runs, key=lambda r: r["total_cores"])[(len(runs) - 1) // 2]
    names = {n for r in runs for n in r["per_process"]}
    per_name = {n: [r["per_process"].get(n, 0.0) for r in runs] for n in names}
    for name in sorted(names, key=lambda n: (-statistics.median(per_name[n]), n)):
        values = per_name[name]
        print(f"{name:22s} {statistics.median(values):6.3f} core  [{min(values):.3f}-{max(values):.3f}]")
    print(f"{'total':22s} {statistics.median(totals):6.3f} core  [{min(totals):.3f}-{max(totals):.3f}]")
    print(json.dumps({"total_cores": median_run["total_cores"], "per_process": median_run["per_process"],
                      "total_cores_runs": totals, "total_cores_range": [min(totals), max(totals)],
                      "seconds": args.seconds, "fleet_env": settings,
                      **({"first_answer_ms": [r["first_answer_ms"] for r in runs]} if args.first_answer else {})}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
