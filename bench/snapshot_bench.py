"""The CPU of ingest's successive snapshots, its terms packed anew each time against reused from the last one.

    .venv/bin/python bench/snapshot_bench.py [--quads 130000] [--terms 120000] [--new 2000] [--snapshots 5]

Ingest's checkpoint writer packs a snapshot (``services.state.presence.snapshot``) every few seconds in a burst:
the presence set and every published term.  Each of ``--snapshots`` rounds publishes ``--new`` more terms and
packs, side by side in the same round: with a fresh ``TermChunks`` (every term decoded and pickled again) and
with the writer's kept one (only the new terms).  Printed:
each way's process CPU per snapshot, median and range over the rounds after the first (the first packs every
term both ways), and the blob's size.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("CBGP_CHECKPOINT_SECRET", "0" * 64)  # (the snapshot is sealed; its key does not matter here)

from services.state import presence  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quads", type=int, default=130_000)
    parser.add_argument("--terms", type=int, default=120_000)
    parser.add_argument("--new", type=int, default=2_000, help="terms published between two snapshots")
    parser.add_argument("--snapshots", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(7)
    present = {(rng.randrange(1, 10 ** 9), rng.randrange(1, 100), rng.randrange(1, 10 ** 9), 0): seq
               for seq in range(args.quads)}
    names: dict[int, str] = {}

    def decode(term_id: int) -> str:  # (as the dictionary's decode: a lookup)
        return names[term_id]

    published: set[int] = set()
    kept = presence.TermChunks()
    cpu: dict[str, list[float]] = {"anew": [], "kept": []}
    size = 0
    for round_ in range(args.snapshots + 1):
        count = args.terms if round_ == 0 else args.new
        for term_id in range(len(names), len(names) + count):
            names[term_id] = f"<http://www.ins.cwi.nl/sib/user/u{term_id}/post/p{term_id * 7}>"
            published.add(term_id)
        for way in ("anew", "kept"):
            started = time.process_time()
            chunks = presence.TermChunks() if way == "anew" else kept
            chunks.update(set(published), decode)
            blob = presence.snapshot(present, chunks, {"seq": round_})
            if round_:
                cpu[way].append(time.process_time() - started)
            size = len(blob)
        print(f"snapshot {round_}: {len(present):,} quads, {len(published):,} terms, {size / 1e6:.1f} MB"
              + ("" if not round_ else f"; CPU anew {cpu['anew'][-1]:.3f} s, kept {cpu['kept'][-1]:.3f} s"),
              flush=True)
    for way, values in cpu.items():
        print(f"{way}: median {statistics.median(values):.3f} s [{min(values):.3f}-{max(values):.3f}] of CPU per "
              f"snapshot over {len(values)}")


if __name__ == "__main__":
    main()
