"""Reading a SPARQL Update's WHERE clause that may run away, outside ingest and within bounds.

pyoxigraph computes a closure, a subquery or an aggregate whole before the first solution and cannot be
interrupted (``cbgp.inputs.sparql_update.may_run_away``): read in place, one such clause could hold ingest, or take
its memory and every life after it that reads the same record.  So it is read in a child with at most
CBGP_MAX_UPDATE_MEMORY_MB more memory than it started with, killed at CBGP_MAX_UPDATE_SECONDS; past either the
request is dead-lettered in one line that names the setting.

- A graph in memory is read in a child forked at that point (``services.state.forked``): the graph as it is.
- A graph on disk (ingest ``--state-on-disk``) cannot be read in a forked copy: RocksDB's threads, and the locks
  they may hold, are not in it.  Its state is cut into a RocksDB checkpoint beside it (``Store.backup``: hard
  links, the unflushed writes flushed first) and read by a new interpreter (``python -m services.ingest.where``),
  which opens it read-only; the checkpoint is removed once read.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

from cbgp.inputs.sparql_update import (DEFAULT_MAX_MEMORY_MB, DEFAULT_MAX_SECONDS, MAX_MEMORY_SETTING,
                                       MAX_SECONDS_SETTING, read_solutions)
from cbgp.query.limits import limit
from services.state.forked import CAN_BOUND, ForkedJob, OverMemory, OverTime, die_with, in_bounded_child, limit_memory

__all__ = ["bounded_where", "isolation"]

Isolate = Callable[[str, "str | None", dict, int], tuple]


def isolation(store: Any, path: Path | None) -> Isolate | None:
    """``UpdateExtractor``'s ``isolate`` for ingest's graph ``store`` (on disk at ``path``, or in memory when None);
    None where a child cannot be bounded (not Linux): such clauses are then read in place."""
    if not CAN_BOUND:
        return None
    if path is None:
        return lambda where, base, dataset, most: bounded_where(lambda: read_solutions(store, where, base, dataset,
                                                                                      most))
    return lambda where, base, dataset, most: _read_on_disk(store, path.with_name(path.name + ".where"),
                                                            (where, base, dataset, most))


def bounded_where(read: Callable[[], tuple]) -> tuple:
    """``read()`` in a child forked now, within CBGP_MAX_UPDATE_MEMORY_MB and CBGP_MAX_UPDATE_SECONDS."""
    seconds, megabytes = _limits()
    try:
        return in_bounded_child(lambda child: ForkedJob(child, close_fds=True), read, seconds=seconds,
                                megabytes=megabytes)
    except OverTime:
        raise _over_time(seconds) from None
    except OverMemory:
        raise _over_memory(megabytes) from None


def _read_on_disk(store: Any, checkpoint: Path, query: tuple) -> tuple:
    """``read_solutions`` of ``store`` as it is now, from a checkpoint at ``checkpoint`` read by a new interpreter
    within the same bounds (a checkpoint a killed ingest left is removed first)."""
    seconds, megabytes = _limits()
    shutil.rmtree(checkpoint, ignore_errors=True)
    store.backup(str(checkpoint))
    child = subprocess.Popen([sys.executable, "-m", "services.ingest.where"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        request = pickle.dumps((str(checkpoint), os.getpid(), megabytes, *query), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            out, _ = child.communicate(request, timeout=seconds)
        except subprocess.TimeoutExpired:
            raise _over_time(seconds) from None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        shutil.rmtree(checkpoint, ignore_errors=True)
    try:
        outcome = pickle.loads(out)  # (our own child's, from our own request)
    except (pickle.UnpicklingError, EOFError, ValueError) as exc:
        if child.returncode < 0:  # killed: past its memory the allocator aborts, or the OOM killer
            raise _over_memory(megabytes) from None
        raise RuntimeError(f"its WHERE clause's reader exited {child.returncode} without a result ({exc})") from None
    if outcome[0] == "memory":
        raise _over_memory(megabytes)
    return outcome


def _limits() -> tuple[float, int]:
    return limit(MAX_SECONDS_SETTING, DEFAULT_MAX_SECONDS), limit(MAX_MEMORY_SETTING, DEFAULT_MAX_MEMORY_MB)


def _over_time(seconds: float) -> RuntimeError:
    return RuntimeError(f"its WHERE clause ran past {seconds:g} s ({MAX_SECONDS_SETTING}); make it more selective")


def _over_memory(megabytes: int) -> RuntimeError:
    return RuntimeError(f"its WHERE clause needed more than {megabytes:,} MB ({MAX_MEMORY_SETTING}); make it more "
                        "selective")


def _child() -> None:
    """The reader ``_read_on_disk`` starts: its request on stdin, ``read_solutions``' outcome (or ``("memory",)``)
    on stdout."""
    import pyoxigraph as ox

    path, parent, megabytes, where, base, dataset, most = pickle.load(sys.stdin.buffer)
    die_with(parent)
    store = ox.Store.read_only(path)
    limit_memory(megabytes)  # (after opening: RocksDB's own allocations at open are not the query's)
    try:
        outcome = read_solutions(store, where, base, dataset, most)
    except MemoryError:
        outcome = ("memory",)
    pickle.dump(outcome, sys.stdout.buffer, protocol=pickle.HIGHEST_PROTOCOL)


if __name__ == "__main__":
    _child()
