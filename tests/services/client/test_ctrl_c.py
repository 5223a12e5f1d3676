"""Ctrl-C (or SIGTERM) ends a live follower at once with status 0, even while its main thread sits in a C call
that a KeyboardInterrupt cannot reach: one thread waits for the signal, the others have it blocked."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

FOLLOWER = """
import ctypes, sys
from services.client.reading import end_on_ctrl_c
end_on_ctrl_c()
sys.stdout.write("ready\\n")  # not flushed: ending must flush what was written
libc = ctypes.CDLL(None)
sys.stderr.write("waiting\\n")
sys.stderr.flush()
while True:
    libc.sleep(60)  # a C call: a signal only shortens it, and the loop goes back in
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_follower_ends_at_once_while_its_main_thread_waits_in_c(signum: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", FOLLOWER], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stderr.readline() == "waiting\n"  # imported (a loaded machine takes seconds) ...
        time.sleep(0.5)  # ... and inside the C call
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-2000:]
    assert out == "ready\n"
