"""Child processes of ``make run`` (and of the end-to-end tests): start a ``cbgp`` command, stop it for sure.

Each child runs in its own session (process group), so the terminal's Ctrl-C reaches only the
orchestrator, which then stops the children in order; and stopping a child signals its whole group, so
nothing it spawned survives it.  :meth:`ChildProcess.stop` is SIGTERM, then SIGKILL after a grace period:
a stuck child cannot leave an orphan behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Mapping, Sequence

__all__ = ["ChildProcess", "cbgp_command", "http_ok"]


def cbgp_command(*args: str) -> list[str]:
    """``cbgp ARGS`` with this interpreter (works without the installed entry point on PATH)."""
    return [sys.executable, "-m", "services.commands.main", *args]


def http_ok(url: str, timeout: float = 1.0) -> bool:
    """True if GET ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


class ChildProcess:
    """One child process in its own process group, with its output in ``log_path``."""

    def __init__(self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                 log_path: str | os.PathLike[str] | None = None, cwd: str | os.PathLike[str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(os.environ if env is None else env)
        self.log_path = Path(log_path) if log_path else None
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self.terminating = False  # SIGTERM sent

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> "ChildProcess":
        out: int | object = subprocess.DEVNULL
        log = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it; closed right after Popen
            out = log
        try:
            self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            if log is not None:
                log.close()
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the child's whole process group (if it still exists)."""
        if self.proc is None:
            return
        if sig == signal.SIGTERM:
            self.terminating = True
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the group, wait up to ``grace`` s, then SIGKILL it; return the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            if not self.terminating:
                # once only: a second SIGTERM can land after a service's graceful shutdown removed its
                # handler (faust does), and kill it mid-shutdown
                self.signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(10)
        # The leader may be gone while something it spawned lingers in the group: finish it too.
        self.signal(signal.SIGKILL)
        return self.proc.returncode

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_until(self, ready: Callable[[], bool], timeout: float = 60.0) -> None:
        """Poll ``ready()`` until true; raise RuntimeError (with the log tail) if the child dies or time runs out."""
        deadline = time.monotonic() + timeout
        while not ready():
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode if self.proc else '?'}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")
            time.sleep(0.2)

    def __repr__(self) -> str:
        return f"ChildProcess({self.name}, pid {self.pid}, {'running' if self.alive() else 'stopped'})"
