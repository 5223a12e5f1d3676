"""What one idle turn of a data-path input costs: the client (librdkafka's threads included) and the broker.

    .venv/bin/python bench/fetch_cycle_cost.py [--turns 300] [--repeat 3] [--partitions 1,4,8]

A caught-up input (``services.kafka.fetch.Fetcher``) is parked between turns: each idle turn assigns its
partitions, waits for their ends (one fetch round trip) and unassigns them, then sleeps the idle pause (15 ms).
For each partition count this measures, over ``--turns`` turns on an idle topic of the embedded broker:

- ``turn``: the whole idle turn, as above;
- ``assign``: assign and unassign alone, nothing fetched;
- ``held``: a consumer that exists and sleeps as long (librdkafka's own timers: the baseline).

It prints the CPU per turn in ms, median [range] of ``--repeat`` series, the process's (every thread) and the
broker's, and one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, TopicPartition  # noqa: E402

from broker_snapshot_cost import cpu_seconds  # noqa: E402
from services.kafka.broker import EmbeddedBroker  # noqa: E402
from services.kafka.fetch import IDLE_PAUSE_SECONDS, Fetcher  # noqa: E402
from services.kafka.topics import ensure_topics  # noqa: E402

KINDS = ("turn", "assign", "held")


def series(settings, topic: str, partitions: int, kind: str, turns: int, broker_pid: int) -> tuple[float, float]:
    """(client, broker) CPU ms per turn of ``kind`` over ``turns`` turns."""
    positions = {(topic, p): 0 for p in range(partitions)}
    fetcher = Fetcher(settings, "bench-cycle", 5000)
    fetcher.set_positions(positions)
    fetcher.take()
    fetcher.wait(0.5)
    fetcher.park()
    consumer: Consumer = fetcher.consumer
    parts = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
    client0, broker0 = time.process_time(), cpu_seconds(broker_pid)
    for _ in range(turns):
        if kind == "turn":
            fetcher.take() or fetcher.wait(fetcher.listen)
            fetcher.park()
        elif kind == "assign":
            consumer.assign(parts)
            consumer.unassign()
        time.sleep(IDLE_PAUSE_SECONDS)
    client, broker = time.process_time() - client0, cpu_seconds(broker_pid) - broker0
    fetcher.close()
    return client / turns * 1e3, broker / turns * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--partitions", default="1,4,8")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.partitions.split(",")]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="broker-cycle-") as tmp, EmbeddedBroker(Path(tmp) / "broker") as broker:
        settings = broker.settings(topic_prefix="cycle.", partitions=max(counts))
        ensure_topics(settings)
        topic = settings.topic("answers")
        runs: dict[tuple[int, str], list[tuple[float, float]]] = {}
        for round_no in range(args.repeat):  # kinds alternate within each round: the machine drifts
            for partitions in counts:
                for kind in KINDS:
                    runs.setdefault((partitions, kind), []).append(
                        series(settings, topic, partitions, kind, args.turns, broker.pid))
            print(f"round {round_no + 1}/{args.repeat} done", file=sys.stderr, flush=True)
    for (partitions, kind), values in runs.items():
        client = [c for c, _b in values]
        brokers = [b for _c, b in values]
        results[f"{partitions}:{kind}"] = {"client_ms": statistics.median(client), "client_range": [min(client), max(client)],
                                           "broker_ms": statistics.median(brokers),
                                           "broker_range": [min(brokers), max(brokers)]}
        print(f"{partitions} partition(s), {kind:6}: client {statistics.median(client):.2f} "
              f"[{min(client):.2f}-{max(client):.2f}] ms, broker {statistics.median(brokers):.2f} "
              f"[{min(brokers):.2f}-{max(brokers):.2f}] ms per turn")
    print(json.dumps({"turns": args.turns, "repeat": args.repeat, "pause_ms": IDLE_PAUSE_SECONDS * 1e3,
                      "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
