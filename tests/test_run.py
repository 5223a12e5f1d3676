"""`make run` (python -m services.run) as a real process: answers for the example queries, no orphans."""

from __future__ import annotations

import json
import signal
import subprocess
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from services.supervise import ChildProcess

QUERIES = sorted(p.stem for p in (Path(__file__).parents[1] / "services" / "demo" / "queries").glob("*.rq"))
# cbgp replay has no event times, so it evaluates the unwindowed examples; the fleet run covers them all
UNWINDOWED = [q for q in QUERIES if not q.startswith("windowed_")]


def _survivors(pids: list[int], run_dir: Path) -> list[str]:
    """Processes still alive from the run: by pid, or anything whose command line names its run dir."""
    alive = [f"pid {pid}" for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if str(run_dir) in " ".join(proc.info["cmdline"] or []):
            alive.append(f"pid {proc.info['pid']}: {' '.join(proc.info['cmdline'])[:120]}")
    return alive


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_run_shows_answers_for_every_example_query_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    stderr_path = tmp_path / "run.stderr"
    with open(stderr_path, "w") as stderr:
        child = subprocess.Popen([sys.executable, "-m", "services.run", "--run-dir", str(run_dir)],
                                 stdout=subprocess.PIPE, stderr=stderr, text=True,
                                 # no CBGP_* from the test environment: run.py must start its own broker
                                 env={k: v for k, v in os.environ.items() if not k.startswith("CBGP_")})
    # Until the live view shows every example query (the Spark job's first micro-batches, which serve the
    # multi-part and windowed ones, need a JVM and Python workers: a minute or more on a loaded machine).
    deadline = time.monotonic() + 360
    while time.monotonic() < deadline and child.poll() is None:
        if all(f"  {query}: " in stderr_path.read_text(errors="replace") for query in QUERIES):
            break
        time.sleep(2)
    child.send_signal(signal.SIGTERM)  # the same ordered shutdown as Ctrl-C
    stdout, _ = child.communicate(timeout=100)
    proc = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr_path.read_text(errors="replace"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(summary["queries"]) == QUERIES, proc.stderr[-3000:]
    for query, seen in summary["queries"].items():
        assert seen["answers"] > 0 and seen["last"], query
    # The live view printed the same per-query lines on stderr.
    assert all(f"  {query}: " in proc.stderr for query in QUERIES)
    assert {"ingest", "registry", "worker-0", "worker-1", "answers", "spark-job"} <= set(summary["children"])
    assert all(child["exit"] == 0 for child in summary["children"].values()), summary["children"]
    pids = [c["pid"] for c in summary["children"].values()] + [summary["broker_pid"]]
    assert _survivors(pids, run_dir) == []


@pytest.mark.timeout(60)
def test_a_child_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    stubborn = ChildProcess("stubborn", [sys.executable, "-c",
                                          "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                          "print('ready', flush=True)\ntime.sleep(600)"],
                            log_path=tmp_path / "stubborn.log").start()
    stubborn.wait_until(lambda: "ready" in stubborn.log_tail(), timeout=30)
    assert stubborn.stop(grace=1) == -signal.SIGKILL  # SIGTERM was ignored, so SIGKILL ended it
    assert not stubborn.alive() and not psutil.pid_exists(stubborn.pid)


def test_shipped_demo_stream_is_what_the_generator_writes() -> None:
    from services.demo.generate import DEFAULT_PATH, generate

    text = DEFAULT_PATH.read_text(encoding="utf-8")
    assert text == generate()
    updates = [line for line in text.splitlines() if line[:2] in ("A ", "D ")]
    deletions = sum(line.startswith("D ") for line in updates)
    assert 2000 <= len(updates) <= 5000 and 0.15 <= deletions / len(updates) <= 0.30


def test_every_example_query_has_answers_on_the_demo_stream(tmp_path: Path) -> None:
    import io

    from cbgp.cli import replay

    demo = Path(__file__).parents[1] / "services" / "demo"
    out = io.StringIO()
    replay(str(demo / "updates.rdfp"), [(q, str(demo / "queries" / f"{q}.rq")) for q in UNWINDOWED], out)
    signs = {(json.loads(line)["query"], json.loads(line)["sign"]) for line in out.getvalue().splitlines()}
    assert signs == {(q, s) for q in UNWINDOWED for s in "+-"}  # every query gains and loses answers
