"""Work on a snapshot of the process's memory, in a forked child, while the process goes on (as Redis' BGSAVE).

A worker's checkpoint pickles its shards' whole state: 0.2-0.66 s for 280,000 state entries, during which it
answered nothing and the workers waiting for its probes waited too (the fleet's p99 latency at 300,000 LSBench
updates was 1.7-2.2 s, at those checkpoints).  ``os.fork`` takes 10-30 ms and gives the child the state as of
that moment, copy-on-write, so the child pickles it on the other core while the service processes the next
batches; the result comes back through a file without a name.  The child only runs ``fn`` (no Kafka client, no
lock another thread could hold: the threads are not copied) and leaves with ``os._exit``.  It can briefly double
the memory the pages it touches take (pickling touches every object).  On Linux it dies with the service: a
service killed -9 mid-checkpoint would otherwise leave it pickling for nobody, holding that memory and the
service's listening sockets (its restart could not bind its metrics port until the child finished).

:func:`in_bounded_child` runs work the process cannot interrupt (pyoxigraph evaluating a text from outside: the
gateway's ``/query``, ingest's WHERE clauses that may run away) in such a child, bounded in memory and killed at
its deadline.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import pickle
import resource
import select
import signal
import sys
import tempfile
import time
from typing import Any, Callable

from services.wire.loglines import kv

__all__ = ["CAN_BOUND", "FORKED_CHECKPOINTS", "ForkedCheckpoint", "ForkedJob", "OverMemory", "OverTime", "die_with",
           "in_bounded_child", "limit_memory"]

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _load_prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, looked up before any fork (None where there is none: not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def die_with(parent: int) -> None:
    """In a forked child: be killed when ``parent`` dies (and leave now if it already has).  Linux sends the signal
    when the *thread* that forked exits: the services fork from their main loop, which lives as long as they do."""
    if _PRCTL is not None and _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL) == 0 and os.getppid() != parent:
        os._exit(1)


# Where a child can be forked and bounded (memory, a parent-death signal): elsewhere bounded work runs in place.
CAN_BOUND = sys.platform.startswith("linux") and hasattr(os, "fork")

# The workers and the answers service pickle their checkpoints in a forked child unless CBGP_FORKED_CHECKPOINTS=0.
FORKED_CHECKPOINTS = hasattr(os, "fork") and os.environ.get("CBGP_FORKED_CHECKPOINTS", "1") not in ("0", "false", "no")


class ForkedJob:
    """``fn()`` run in a child forked now; :meth:`result` reads what it returned once it has exited.  The result
    goes through a file without a name (``tempfile.TemporaryFile``): whoever is killed when, nothing is left on
    disk."""

    def __init__(self, fn: Callable[[], Any], directory: str | None = None, close_fds: bool = False) -> None:
        """``close_fds``: the child closes every descriptor it inherited but stdin/out/err and its result's file
        (a server's child would otherwise keep its clients' connections open after the server closed them)."""
        self.file = tempfile.TemporaryFile(prefix="cbgp-forked-", suffix=".pickle", dir=directory)
        self.started = time.monotonic()
        parent = os.getpid()
        try:
            self.pid = os.fork()
        except OSError:
            self.file.close()
            raise
        if self.pid == 0:  # the child: fn, its outcome to the file, and out without any cleanup of the parent's
            code = 1
            try:
                die_with(parent)
                if close_fds:
                    keep = self.file.fileno()
                    os.closerange(3, keep)
                    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
                with os.fdopen(os.dup(self.file.fileno()), "wb") as out:
                    try:
                        outcome: tuple[str, Any] = ("ok", fn())
                    except BaseException as exc:  # noqa: BLE001 - said to the parent, which decides
                        outcome = ("error", f"{type(exc).__name__}: {exc}")
                    pickle.dump(outcome, out, protocol=pickle.HIGHEST_PROTOCOL)
                code = 0 if outcome[0] == "ok" else 1
            finally:
                os._exit(code)
        self.fork_seconds = time.monotonic() - self.started
        self.exit: int | None = None

    def finished(self, wait: bool = False) -> bool:
        if self.exit is None:
            pid, status = os.waitpid(self.pid, 0 if wait else os.WNOHANG)
            if pid == 0:
                return False
            self.exit = os.waitstatus_to_exitcode(status)
        return True

    def result(self) -> Any:
        """What ``fn`` returned (the child must have finished); raises RuntimeError with the child's reason when
        it failed or died."""
        assert self.exit is not None, "the child is still running"
        try:
            self.file.seek(0)  # (the child's writes moved the offset the two share)
            kind, value = pickle.load(self.file)
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            raise RuntimeError(f"the forked child exited {self.exit} without a result ({exc})") from None
        finally:
            self.discard()
        if kind != "ok":
            raise RuntimeError(f"the forked child failed: {value}")
        return value

    def wait_until(self, deadline: float) -> bool:
        """Until the child has exited (True) or ``time.monotonic()`` reaches ``deadline`` (False), without
        polling where Linux gives the child a file descriptor to wait on."""
        fd = None
        try:
            fd = os.pidfd_open(self.pid) if hasattr(os, "pidfd_open") else None
        except OSError:  # (an older kernel)
            fd = None
        try:
            while not self.finished():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                if fd is not None:
                    select.select([fd], [], [], left)
                else:
                    time.sleep(min(left, 0.005))
            return True
        finally:
            if fd is not None:
                os.close(fd)

    def cancel(self) -> None:
        """Stop the child if it still runs, and forget its result."""
        if self.exit is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.finished(wait=True)
        self.discard()

    def discard(self) -> None:
        self.file.close()


class OverTime(RuntimeError):
    """A bounded child ran past its time and was killed."""


class OverMemory(RuntimeError):
    """A bounded child asked for more memory than it may have."""


def in_bounded_child(start: Callable[[Callable[..., Any]], ForkedJob], fn: Callable[..., Any], *, seconds: float,
                     megabytes: int) -> Any:
    """``fn`` in the child ``start(child)`` forks (a ``ForkedJob`` made under whatever lock the fork needs, which calls
    ``child`` with what ``fn`` takes), with at most ``megabytes`` MB above what it was forked with and killed after
    ``seconds``: what ``fn`` returned; else :class:`OverTime`, :class:`OverMemory`, or RuntimeError when ``fn``
    raised (its type and message)."""
    deadline = time.monotonic() + seconds

    def child(*args: Any) -> tuple:
        gc.disable()  # (short-lived: a collection would touch, so copy, every page of the parent's objects)
        limit_memory(megabytes)
        try:
            return ("ok", fn(*args))
        except MemoryError:
            return ("memory",)

    job = start(child)
    if not job.wait_until(deadline):
        job.cancel()
        raise OverTime(f"ran past {seconds:g} s")
    if job.exit is not None and job.exit < 0:  # killed: past its memory the allocator aborts, or the OOM killer
        job.discard()
        raise OverMemory(f"needed more than {megabytes:,} MB")
    outcome = job.result()
    if outcome[0] == "memory":
        raise OverMemory(f"needed more than {megabytes:,} MB")
    return outcome[1]


def limit_memory(megabytes: int) -> None:
    """In a forked child: at most ``megabytes`` MB of address space above what it was forked with, and the first
    process the out-of-memory killer takes (over a container's memory the parent stays)."""
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (mapped + megabytes * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write("1000")
    except OSError:
        pass


class ForkedCheckpoint:
    """A service's checkpoints made in a forked child, one at a time: :meth:`start` it (False: make it in place),
    :meth:`done` returns what the child made once it has exited."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self.job: ForkedJob | None = None

    def running(self) -> bool:
        return self.job is not None

    def start(self, make: Callable[[], Any]) -> bool:
        """Fork a child to run ``make``; False when checkpoints are made in place (CBGP_FORKED_CHECKPOINTS=0, or a
        fork, or its file, that failed: one line)."""
        if not FORKED_CHECKPOINTS:
            return False
        try:
            self.job = ForkedJob(make)
        except OSError as exc:
            self.log.warning(kv(event="checkpoint-in-place", reason=f"{type(exc).__name__}: {exc}"))
            return False
        return True

    def done(self, wait: bool = False) -> tuple[Any, ForkedJob] | None:
        """``(what make returned, its job)`` once the child has exited (``wait``: until it has), once; None while
        it runs, when none was started, or when it failed (one line: the next checkpoint tries again)."""
        job = self.job
        if job is None or not job.finished(wait):
            return None
        self.job = None
        try:
            return job.result(), job
        except RuntimeError as exc:
            self.log.warning(kv(event="checkpoint-failed", reason=str(exc)))
            return None

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.job = None
