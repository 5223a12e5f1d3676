"""What one fetch costs the embedded broker (noida-db 0.2.3), by how many record batches its partition holds.

    .venv/bin/python bench/broker_fetch_cost.py [--batches 0,2000,8000,32000] [--fetches 400]

noida-db finds a fetch's first batch by walking the partition's batches from the oldest, so a fetch of the
newest record costs in proportion to every batch the partition still holds; every transaction adds one data batch
and one commit marker to each partition it wrote.  For each held count this tops the partition up (one-record
batches), waits for the broker's snapshot of them, then reads the newest record ``--fetches`` times (assign at it,
take it, unassign: what a data-path input does each turn) with nothing written meanwhile, and prints the broker's
CPU per fetch.  A Kafka broker finds the offset in its segment index instead.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, TopicPartition  # noqa: E402

from broker_snapshot_cost import cpu_seconds, one_partition_broker  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="0,2000,8000,32000", help="held batch counts to measure at")
    parser.add_argument("--fetches", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"{'held batches':>12} | broker CPU per fetch of the newest record, µs (median [range] of {args.repeat})")
    with one_partition_broker("fetch", 0) as (broker, settings, producer, topic, _data_dir):
        consumer = Consumer(settings.consumer_config("fetch.bench", enable_partition_eof=True))
        held = 0
        for target in (int(n) for n in args.batches.split(",")):
            print(f"  holding {target:,} batches ...", file=sys.stderr, flush=True)
            for _ in range(max(1, target - held)):  # (at least one record to fetch)
                producer.produce(topic, b"x" * 60, partition=0)
                producer.flush(10)
            held = max(held, target, 1)
            time.sleep(2.5)  # the snapshot of the top-up is written; nothing is written after it
            newest = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1] - 1
            per_fetch = []
            for _ in range(args.repeat):
                before = cpu_seconds(broker.pid)
                for _ in range(args.fetches):
                    consumer.assign([TopicPartition(topic, 0, newest)])
                    while not consumer.consume(1, 1.0):
                        pass
                    consumer.unassign()
                per_fetch.append((cpu_seconds(broker.pid) - before) / args.fetches * 1e6)
            per_fetch.sort()
            print(f"{target:>12,} | {per_fetch[len(per_fetch) // 2]:.0f} [{per_fetch[0]:.0f}-{per_fetch[-1]:.0f}]",
                  flush=True)
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
