"""The README's quickstart, run as written: `make run`'s fleet, then each command of the quickstart block pasted
into a shell with nothing exported (the commands find the fleet through the file make run writes). Its answers
are checked against pyoxigraph over the same files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyoxigraph
import pytest

REPO = Path(__file__).resolve().parents[2]


def quickstart_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("<!-- quickstart:", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("  #", 1)[0].strip() for line in block.strip().splitlines() if line.strip()]


def expected(after_unfriend: bool) -> set[tuple[str, str]]:
    store = pyoxigraph.Store()
    store.load(path=str(REPO / "docs/examples/people.ttl"), format=pyoxigraph.RdfFormat.TURTLE)
    if after_unfriend:
        store.update((REPO / "docs/examples/unfriend.ru").read_text())
    query = (REPO / "docs/examples/friends-of-friends.rq").read_text()
    return {(row["person"].value, row["fof"].value) for row in store.query(query)}


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_readme_quickstart_runs_as_written_and_answers_exactly(tmp_path: Path) -> None:
    run_dir = tmp_path / ".run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CBGP_")}
    env["CBGP_RUN_DIR"] = str(run_dir)  # the test's own run dir: a developer's .run is left alone
    log = open(tmp_path / "run.log", "w")
    fleet = subprocess.Popen([sys.executable, "-m", "services.commands.run", "--no-demo", "--no-spark",
                              "--run-dir", str(run_dir)], cwd=REPO, env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 180
        while not (run_dir / "cbgp.env").exists() and time.monotonic() < deadline and fleet.poll() is None:
            time.sleep(0.5)
        assert (run_dir / "cbgp.env").exists(), (tmp_path / "run.log").read_text()[-3000:]
        outputs = []
        for command in quickstart_commands():
            done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
                                  timeout=120)
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
            outputs.append((command, done.stdout))
    finally:
        fleet.send_signal(signal.SIGTERM)
        fleet.wait(timeout=120)
        log.close()
    assert not (run_dir / "cbgp.env").exists()  # removed when the fleet stops
    watched = [json.loads(line) for command, out in outputs if " watch " in command for line in out.splitlines()]
    rows = lambda answers: {(a["binding"]["person"]["value"], a["binding"]["fof"]["value"]) for a in answers}  # noqa: E731
    plus = [a for a in watched if a["sign"] == "+"]
    minus = [a for a in watched if a["sign"] == "-"]
    assert rows(plus) == expected(after_unfriend=False)
    assert rows(minus) == expected(after_unfriend=False) - expected(after_unfriend=True) and len(minus) == 2
    register = next(out for command, out in outputs if " register " in command)
    assert register.startswith("accepted")
    current = next(out for command, out in outputs if " current " in command)
    assert all(person in current and fof in current for person, fof in expected(after_unfriend=True))
    assert "Carol" not in current.split("fof", 1)[-1]
