"""services.state.forked: a function run in a forked child sees the memory as of the fork while the parent goes
on, and its result, or its failure, comes back; neither a cancelled child nor a parent killed before reading
the result leaves anything behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.state.forked import ForkedJob


def test_the_child_works_on_the_state_as_of_the_fork_while_the_parent_changes_it(tmp_path: Path) -> None:
    state = {i: [i] for i in range(50_000)}

    def snapshot() -> tuple[int, int, int]:
        time.sleep(0.3)  # the parent changes the state meanwhile
        return len(state), sum(v[0] for v in state.values()), os.getpid()

    expected = (len(state), sum(range(50_000)))
    job = ForkedJob(snapshot, directory=str(tmp_path))
    assert list(tmp_path.iterdir()) == [], "the result's file has no name"
    for i in range(50_000):
        state[i][0] = -1
    state[-1] = [7]
    assert not job.finished()  # still running: the parent was not held up
    assert job.finished(wait=True) and job.exit == 0
    size, total, pid = job.result()
    assert (size, total) == expected and pid != os.getpid()


def test_a_failure_in_the_child_is_reported_and_a_cancelled_child_is_reaped(tmp_path: Path) -> None:
    def fails() -> None:
        raise ValueError("cannot pickle that")

    job = ForkedJob(fails, directory=str(tmp_path))
    assert job.finished(wait=True) and job.exit == 1
    with pytest.raises(RuntimeError, match="ValueError: cannot pickle that"):
        job.result()
    slow = ForkedJob(lambda: time.sleep(30), directory=str(tmp_path))
    slow.cancel()
    assert slow.exit is not None and slow.exit != 0
    with pytest.raises(ChildProcessError):
        os.waitpid(slow.pid, os.WNOHANG)  # reaped: no zombie left
    assert list(tmp_path.iterdir()) == []


def test_a_parent_killed_before_it_read_the_result_leaves_no_file(tmp_path: Path) -> None:
    """A service killed -9 between its checkpoint child's exit and reading what it made (the fault tests do it)
    leaves nothing in the directory."""
    parent = subprocess.run([sys.executable, "-c", (
        "import os, signal, sys; from services.state.forked import ForkedJob\n"
        f"job = ForkedJob(lambda: list(range(100_000)), directory={str(tmp_path)!r})\n"
        "assert job.finished(wait=True) and job.exit == 0\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n")], cwd=Path(__file__).parents[3], capture_output=True, text=True,
        timeout=60)
    assert parent.returncode == -signal.SIGKILL, parent.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_child_dies_with_its_service_and_frees_the_port_for_its_restart() -> None:
    """A service killed -9 while its child pickles a checkpoint: the child goes with it, so the service started
    again binds its metrics port at once instead of failing on a socket the orphan still held."""
    from services.metrics.exposition import start_metrics_server
    from services.kafka.broker import free_port

    port = free_port()
    parent = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from services.metrics.exposition import start_metrics_server\n"
        "from services.state.forked import ForkedJob\n"
        f"start_metrics_server({port})\n"
        "job = ForkedJob(lambda: time.sleep(60))\n"
        "print(job.pid, flush=True)\n"
        "time.sleep(60)\n")], cwd=Path(__file__).parents[3], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
    finally:
        parent.kill()
        parent.wait(10)
    deadline = time.monotonic() + 5
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(child), "the checkpoint child outlived its service"
    with start_metrics_server(port):
        pass


def _running(pid: int) -> bool:
    """``pid`` exists and is not a zombie (an orphan's zombie waits for whoever adopted it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.parametrize("close_fds", [True, False])
def test_a_child_that_closes_what_it_inherited_leaves_a_connection_closed_by_the_parent_closed(
        close_fds: bool) -> None:
    """A server's child (the gateway's /query) must not keep a client's connection open after the server closed
    it: with ``close_fds`` the client reads the end at once; without, only when the child exits."""
    import socket

    server_end, client_end = socket.socketpair()
    job = ForkedJob(lambda: time.sleep(1.5) or "done", close_fds=close_fds)
    server_end.close()
    client_end.settimeout(5)
    started = time.monotonic()
    assert client_end.recv(1) == b""
    waited = time.monotonic() - started
    client_end.close()
    assert (waited < 0.5) if close_fds else (waited > 1.0)
    assert job.finished(wait=True) and job.result() == "done"
