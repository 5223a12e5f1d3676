"""Idle CPU of the whole local fleet, started exactly as ``make run`` starts it (without the demo).

    .venv/bin/python bench/idle_bench.py [--repeat 3] [--seconds 10] [--settle 20]

Each run starts ``python -m services.commands.run --no-demo --run-dir <tmp>`` (the embedded broker, ingest, the
registry, 2 workers, answers, the Spark job, and the supervisor with its live view), waits until every
service is ready (the registry answers /readyz, the Spark job logs that its queries run) and then ``--settle``
seconds more, and measures each process's CPU (user + system, psutil over the whole process tree, so the Spark
JVM and its Python workers count) over ``--seconds``.  It prints one line per process group and, last, one
JSON line ``{"total_cores": ..., "per_process": {...}}`` (with ``--repeat N``: the median run's figures plus
``total_cores_runs`` and the range).
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


def measure_once(seconds: float, settle: float, ready_timeout: float, keep: bool,
                 settings: dict[str, str] | None = None) -> dict:
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
        return {"total_cores": round(sum(per.values()), 3), "per_process": per, "processes": len(procs)}
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
    add_fleet_env_flag(parser)
    args = parser.parse_args(argv)
    settings = fleet_env(parser, args.fleet_env)
    runs = []
    for i in range(args.repeat):
        result = measure_once(args.seconds, args.settle, args.ready_timeout, args.keep, settings)
        runs.append(result)
        print(f"run {i + 1}: total {result['total_cores']:.3f} cores over {args.seconds:.0f} s "
              f"({result['processes']} processes)", flush=True)
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
                      "seconds": args.seconds, "fleet_env": settings}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
