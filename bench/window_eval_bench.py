"""The window evaluator alone, in-process: the stream and query of ``bench/spark_stream_bench.py``'s windows phase
fed to ``spark.window_stream.window_group`` and persisted with ``spark.state_log.save`` (over in-memory stand-ins of
Spark's state) batch by batch, without Spark, Kafka or Arrow.  What the Spark job's stateful stage can do at
best on one core.

    .venv/bin/python bench/window_eval_bench.py [--rate 30000] [--batch-s 10] [--duration-s 60]

Prints one line per batch (updates, the part the query reads, seconds in the evaluator and in saving, window
entries), then as its last line one JSON object ``{"updates_per_s": ..., "evaluate_s": ..., "save_s": ...}``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from cbgp.windows.rspql import parse_rspql  # noqa: E402
from cbgp.windows.windowed import WindowedQuery  # noqa: E402
from spark import state_log  # noqa: E402
from spark import window_stream as spark_windows  # noqa: E402
from spark_stream_bench import WINDOW_QUERIES, Vocabulary  # noqa: E402
from tests.fixtures.memory_state import Rows, Value  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=30_000, help="updates per second of stream time")
    parser.add_argument("--batch-s", type=float, default=10.0, help="stream seconds per batch")
    parser.add_argument("--duration-s", type=float, default=60.0, help="stream seconds in all")
    parser.add_argument("--subjects", type=int, default=2_000)
    args = parser.parse_args()
    vocabulary, rng = Vocabulary(args.subjects), random.Random(7)
    text, spec = parse_rspql(WINDOW_QUERIES["recent"])
    evaluator = WindowedQuery(text, spec)
    read = np.array(sorted(evaluator.predicates), dtype=np.int64)
    base, tail, tail_inputs = Value(), Rows(), 0
    start_ms, seq, total, evaluate_s, save_s = 1_000_000_000_000, 0, 0, 0.0, 0.0
    factor = getattr(spark_windows, "TAIL_FACTOR", 1)
    for batch in range(int(args.duration_s / args.batch_s)):
        n = int(args.rate * args.batch_s)
        rows = []
        for i in range(n):
            s, p, o = vocabulary.random_triple(rng)
            seq += 1
            rows.append((0, i, seq, 1, s, p, o, 0, start_ms + int((batch * args.batch_s + i / args.rate) * 1000)))
        matrix = np.array(rows, dtype=np.int64)
        matrix = matrix[np.isin(matrix[:, 5], read)]
        updates = pd.DataFrame({"first_offset": [batch], "top_seq": [seq], "top_time": [int(matrix[:, 8].max())],
                                "updates": [matrix.tobytes()]})
        a = time.perf_counter()
        *_, record = spark_windows.window_group("q", updates, evaluator, 0, None, 4)
        b = time.perf_counter()
        save = state_log.save
        extra = (batch + 1,) if "version" in save.__code__.co_varnames else ()  # (releases before tagged rows)
        tail_inputs = save(base, tail, tail_inputs, max(len(record[0]), 1), record, *extra, evaluator.state_entries,
                           evaluator.to_state, spark_windows.MIN_TAIL, *((factor,) if extra else ()))
        c = time.perf_counter()
        total, evaluate_s, save_s = total + n, evaluate_s + b - a, save_s + c - b
        print(f"batch {batch}: {n:,} updates ({len(matrix):,} read by the query): evaluate {b - a:.2f} s, "
              f"save {c - b:.2f} s, {evaluator.state_entries():,} entries", flush=True)
    print(json.dumps({"updates_per_s": round(total / (evaluate_s + save_s)), "evaluate_s": round(evaluate_s, 2),
                      "save_s": round(save_s, 2)}))


if __name__ == "__main__":
    main()
