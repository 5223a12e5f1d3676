"""The gateway's first ``/query``: its graph from ingest's snapshot plus the logs' tails, or from offset 0.

Usage: .venv/bin/python bench/gateway_graph_bench.py [--updates 200000] [--tail 2000] [--runs 3] [--data DIR]

On the embedded broker, the first ``--updates`` LSBench updates (20% of them deletions) are written as ingest
writes them (``IngestProcessor`` over raw records of 1,000 lines: its updates.encoded and dictionary records),
with ingest's snapshot (``checkpoints.ingest``) taken where a running ingest would have made its last one, before
the last ``--tail`` updates.  Then the gateway's ``GraphSource`` (what ``POST /query`` runs) builds its graph and
answers ``SELECT (COUNT(*) AS ?n) { ?s ?p ?o }``, timed from nothing to the answer, ``--runs`` times each way,
alternating: from the snapshot plus the tails, and from offset 0 (a second prefix holds the same logs and no
snapshot).  The count is checked against ingest's presence set.  Prints one line per way (median and range) and
one JSON line.
"""

from __future__ import annotations

import os
import secrets
import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("CBGP_CHECKPOINT_SECRET", secrets.token_hex(32))  # (services that checkpoint need one)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import lsbench  # noqa: E402
from lsbench_fleet import patch_lines  # noqa: E402
from restore_bench import write_history  # noqa: E402
from services.gateway.kafka_io import GraphSource  # noqa: E402
from services.ingest.service import KIND as INGEST_KIND  # noqa: E402
from services.kafka.broker import EmbeddedBroker
from services.kafka.config import KafkaSettings
from services.kafka.topics import ensure_topics  # noqa: E402
from services.kafka.checkpoint_log import CheckpointLog  # noqa: E402
from services.state.store import Store  # noqa: E402

COUNT = "SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }"


def first_query(settings: KafkaSettings, expected: int) -> float:
    started = time.perf_counter()
    graph = GraphSource(settings)
    try:
        result, _seq = graph.query(COUNT)
        count = int(next(iter(result))["n"].value)
    finally:
        graph.close()
    seconds = time.perf_counter() - started
    assert count == expected, f"the graph holds {count} triples, ingest {expected}"
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=200_000)
    parser.add_argument("--tail", type=int, default=2_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", type=Path, default=lsbench.DEFAULT_DATA)
    args = parser.parse_args(argv)
    stream = lsbench.build_updates(lsbench.load_or_generate(args.data))
    lines = patch_lines(stream.updates[: args.updates])
    print(f"gateway graph: {len(lines):,} LSBench updates ({stream.source}), snapshot {args.tail:,} updates before "
          f"the end; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)
    times: dict[str, list[float]] = {"snapshot": [], "offset_0": []}
    with tempfile.TemporaryDirectory(prefix="cbgp-gateway-graph-") as tmp, EmbeddedBroker(Path(tmp) / "broker") as broker:
        prefixes = {}
        for way in times:
            settings = broker.settings(topic_prefix=f"gg{uuid.uuid4().hex[:8]}.", partitions=4)
            ensure_topics(settings)
            remote = (CheckpointLog(settings, {INGEST_KIND: settings.topic("checkpoints.ingest")}, "bench")
                      if way == "snapshot" else None)
            with Store(Path(tmp) / f"store-{way}") as store:
                made = write_history(settings, lines, args.tail, store, remote)
            prefixes[way] = settings
            expected = len(made.present)
        for _ in range(args.runs):
            for way, settings in prefixes.items():
                times[way].append(first_query(settings, expected))
                print(f"  {way:9s}: {times[way][-1]:.2f} s", flush=True)
    summary = {"updates": len(lines), "triples": expected, "tail": args.tail}
    for way, values in times.items():
        summary[way] = {"median_s": round(statistics.median(values), 3), "range_s": [round(min(values), 3),
                                                                                     round(max(values), 3)]}
        print(f"{way:9s}: first /query in {statistics.median(values):.2f} s [{min(values):.2f}-{max(values):.2f}] "
              f"({expected:,} triples)", flush=True)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
