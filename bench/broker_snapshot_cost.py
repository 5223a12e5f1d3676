"""What the embedded broker (noida-db 0.2.3) costs per second of writes, by how much data it holds.

    .venv/bin/python bench/broker_snapshot_cost.py [--stored 0,50000,200000,400000]

noida-db rewrites its whole state as one JSON file about once a second while data changes, so its CPU for
the same trickle of writes grows with everything it stores.  For each stored count (60-byte records), this
tops the topic up, waits for the broker to go quiet, then produces 200 records/s for 5 s and prints the
broker's CPU over those 5 s and the size of its snapshot.  A Kafka broker appends to segment files
instead: its cost follows the bytes written, not the bytes stored.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from services.kafka.broker import EmbeddedBroker
from services.kafka.topics import ensure_topics
from services.kafka.client import make_producer  # noqa: E402

TRICKLE_SECONDS = 5.0
TRICKLE_RATE = 200  # records/s


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def one_partition_broker(prefix: str, linger_ms: int) -> Iterator[tuple]:
    """An embedded broker on a temporary directory with the catalogue's topics of one partition: (broker, its
    settings, a producer lingering ``linger_ms``, the topic measured, the broker's data directory)."""
    with tempfile.TemporaryDirectory(prefix=f"broker-{prefix}-") as tmp, EmbeddedBroker(Path(tmp) / "broker") as broker:
        settings = broker.settings(topic_prefix=f"{prefix}.", partitions=1)
        ensure_topics(settings)
        yield broker, settings, make_producer(settings, linger_ms=linger_ms), settings.topic("updates.encoded"), \
            Path(tmp) / "broker"


def produce(producer, topic: str, count: int) -> None:
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, b"x" * 60, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stored", default="0,50000,200000,400000", help="stored record counts to measure at")
    args = parser.parse_args(argv)
    print(f"{'stored records':>14} | {'snapshot MB':>11} | broker CPU for {TRICKLE_RATE} records/s (cores)")
    with one_partition_broker("cost", 5) as (broker, _settings, producer, topic, data_dir):
        stored = 0
        for target in (int(n) for n in args.stored.split(",")):
            print(f"  storing {target:,} records ...", file=sys.stderr, flush=True)
            produce(producer, topic, max(0, target - stored))
            stored = max(stored, target)
            time.sleep(3.0)  # the snapshot of the top-up is written
            before = cpu_seconds(broker.pid)
            batch = TRICKLE_RATE // 10
            for _ in range(int(TRICKLE_SECONDS * 10)):
                produce(producer, topic, batch)
                time.sleep(0.1)
            stored += int(TRICKLE_SECONDS * TRICKLE_RATE)
            used = cpu_seconds(broker.pid) - before
            size = sum(f.stat().st_size for f in data_dir.rglob("*.json")) / 1e6
            print(f"{target:>14,} | {size:>11.0f} | {used / TRICKLE_SECONDS:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
