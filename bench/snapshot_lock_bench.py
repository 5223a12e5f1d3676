"""What ingest's background snapshot costs the service's own thread (the interpreter's lock).

    .venv/bin/python bench/snapshot_lock_bench.py [--quads 130000] [--terms 50000] [--repeat 3]

A thread packs a snapshot (``services.state.presence.snapshot``) of ``--quads`` random quads and ``--terms`` terms,
as ingest's checkpoint writer does, while the main thread turns a loop like the service's: a 0.3 ms wait with the
lock released (a Kafka call), then a little Python.  Printed per run, in one go and in slices (the writer's
``pause``, giving the lock back): the snapshot's time, and the loop's turns during it against what it makes alone
in that time.  A thread that holds the lock makes the other, back from each call, wait up to the interpreter's
switch interval (5 ms) for it.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("CBGP_CHECKPOINT_SECRET", "0" * 64)  # (the snapshot is sealed; its key does not matter here)

from services.state import presence  # noqa: E402


def turn() -> None:
    time.sleep(0.0003)
    total = 0
    for i in range(300):
        total += i


def one_run(present: dict, terms: list, sliced: bool) -> tuple[float, float]:
    """(snapshot seconds, the loop's turns during it as a share of its turns alone)."""
    done, took = threading.Event(), [0.0]

    def write() -> None:
        started = time.monotonic()
        presence.snapshot(present, iter(terms), {"seq": 1}, pause=(lambda: time.sleep(0)) if sliced else None)
        took[0] = time.monotonic() - started
        done.set()

    writer = threading.Thread(target=write)
    turns = 0
    writer.start()
    while not done.is_set():
        turn()
        turns += 1
    writer.join()
    started, alone = time.monotonic(), 0
    while time.monotonic() - started < took[0]:
        turn()
        alone += 1
    return took[0], turns / max(alone, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quads", type=int, default=130_000)
    parser.add_argument("--terms", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    rng = random.Random(1)
    present = {(rng.randrange(1 << 40), rng.randrange(1 << 40), rng.randrange(1 << 40), 0): i
               for i in range(args.quads)}
    terms = [(i, f"<http://example.org/term/{i}>") for i in range(args.terms)]
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for _ in range(args.repeat):
        for sliced in (False, True):
            results[sliced].append(one_run(present, terms, sliced))
    for sliced, runs in results.items():
        seconds, shares = [1000 * s for s, _ in runs], [share for _, share in runs]
        print(f"{'in slices' if sliced else 'in one go'}: snapshot {statistics.median(seconds):.0f} ms "
              f"[{min(seconds):.0f}-{max(seconds):.0f}], the loop's turns during it {statistics.median(shares):.0%} "
              f"[{min(shares):.0%}-{max(shares):.0%}] of its turns alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
