"""How long the cyclic collector stops a worker, with and without the heap settler (``CBGP_GC_FREEZE_INTERVAL_MS``).

    .venv/bin/python bench/gc_pause_bench.py [--updates 600000] [--interval-ms 1000] [--repeat 2]

The workers' cores in memory (bench/lsbench_fleet.py ``cores_in_memory``: two routed partitions, the 10 mix
queries, by centre) over the first N LSBench updates, each configuration in a fresh process, alternated: the
settler off, and on with ``--interval-ms`` (called after each core's turn, as the runner calls it after each
transaction; the cores in memory run several times the fleet's paced rate, so 1 s here spans about what the
default 10 s spans there).  Per run: the cores' CPU, the collections by generation, the longest one and the time
in all of them (``gc.callbacks``), the objects frozen, and the cyclic garbage left once the run is over (unfrozen and
collected, the cores still alive): as much with the settler as without it means the freezes kept none from the
collector.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def one_run(updates: int, interval_ms: int, data: Path) -> dict:
    """One configuration, in this process."""
    os.environ["CBGP_GC_FREEZE_INTERVAL_MS"] = str(interval_ms)
    import lsbench
    import lsbench_fleet
    from services.runtime.gc_tuning import HeapSettler, tune_gc

    tune_gc()
    rows = lsbench.build_updates(lsbench.load_or_generate(data)).updates[:updates]
    terms: dict[int, str] = {}
    routed, encoded = lsbench_fleet.ingest_in_memory(rows, 2, terms=terms)
    queries = {p.stem: p for p in sorted(lsbench_fleet.QUERY_DIR.glob("*.rq"))}
    del rows
    gc.collect()
    pauses: list[tuple[int, float]] = []
    began = [0.0]

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - began[0]))

    settler = HeapSettler()
    cores: list = []
    gc.callbacks.append(timed)
    try:
        run = lsbench_fleet.cores_in_memory(routed, encoded, queries, "by-centre", terms, after_turn=settler.settle,
                                            keep=cores)
    finally:
        gc.callbacks.remove(timed)
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    garbage = gc.collect()
    return {"interval_ms": interval_ms, "cpu_s": round(sum(run["cpu_s"]), 2), "answer_deltas": run["answer_deltas"],
            "collections": {g: sum(1 for gen, _ in pauses if gen == g) for g in (0, 1, 2)},
            "longest_ms": round(1000 * max((s for _, s in pauses), default=0.0), 1),
            "total_ms": round(1000 * sum(s for _, s in pauses)), "frozen": frozen, "garbage_at_end": garbage,
            "cores": len(cores)}


def main(argv: list[str] | None = None) -> int:
    import lsbench

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=600_000)
    parser.add_argument("--interval-ms", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each configuration, alternated")
    parser.add_argument("--data", type=Path, default=lsbench.DEFAULT_DATA)
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # (a child: this interval)
    args = parser.parse_args(argv)
    if args.one is not None:
        print(json.dumps(one_run(args.updates, args.one, args.data)))
        return 0
    runs: dict[int, list[dict]] = {0: [], args.interval_ms: []}
    for i in range(args.repeat):
        for interval in runs:
            print(f"run {i + 1}/{args.repeat}, settler {'off' if not interval else f'every {interval} ms'} ...",
                  flush=True)
            out = subprocess.run([sys.executable, __file__, "--updates", str(args.updates), "--data", str(args.data),
                                  "--one", str(interval)], check=True, capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            runs[interval].append(result)
            print(f"  cpu {result['cpu_s']} s, collections {result['collections']}, longest {result['longest_ms']} "
                  f"ms, all {result['total_ms']} ms, frozen {result['frozen']:,}, cyclic garbage at the end "
                  f"{result['garbage_at_end']:,}", flush=True)
    summary = {}
    for interval, results in runs.items():
        name = "off" if not interval else f"every {interval} ms"
        longest = [r["longest_ms"] for r in results]
        cpu = [r["cpu_s"] for r in results]
        summary[name] = {"longest_ms_median": round(statistics.median(longest), 1),
                         "longest_ms_range": [min(longest), max(longest)],
                         "cpu_s_median": round(statistics.median(cpu), 2), "cpu_s_range": [min(cpu), max(cpu)],
                         "garbage_at_end_max": max(r["garbage_at_end"] for r in results)}
        got = summary[name]
        print(f"settler {name}: longest collection {got['longest_ms_median']} ms {got['longest_ms_range']}, cores' "
              f"CPU {got['cpu_s_median']} s {got['cpu_s_range']}, cyclic garbage at the end "
              f"{got['garbage_at_end_max']:,}")
    print(json.dumps({"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "updates": args.updates, "summary": summary,
                      "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
