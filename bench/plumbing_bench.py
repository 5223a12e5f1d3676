"""What one turn of a data-path service's loop costs in Kafka plumbing alone, on the embedded broker.

    .venv/bin/python bench/plumbing_bench.py [--turns 500] [--repeat 3] [--producer KEY=VALUE ...] [--unparked]

Two measurements against one noida-db broker, each over ``--turns`` turns after 20 to warm up:

- **a transaction** as ``services.runtime.life.commit_transaction`` makes one (a producer made by
  ``services.kafka.client.make_producer``: begin, 4 records of 200 bytes, the input offsets of one group, flush,
  commit);
- **an idle fetch turn** of ``services.kafka.fetch.Fetcher`` on 2 caught-up partitions (resume, one fetch to
  the partitions' ends, park), with its idle pause set to 1 ms.

``--producer linger.ms=0`` (repeatable) sets a librdkafka property of the producer; ``--unparked`` keeps an
assigned consumer of 2 caught-up partitions that is never parked during the transactions (what the services'
inputs avoid: on this broker it fetches in a tight loop).

Per turn: the wall time, the process's CPU (the calling thread and librdkafka's threads), the calling thread's
alone, and the broker's.  Paced, the fleet turns its loop once per transaction and in between idles: these
figures times the turns per second (``cbgp_transaction_step_seconds_count``) are its plumbing's share of the CPU
(docs/benchmarks.md).  The last line is one JSON object (``--repeat N``: medians and ranges).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["CBGP_IDLE_PAUSE_MS"] = os.environ["CBGP_IDLE_PAUSE_MAX_MS"] = "1"  # (read when fetch is imported)

import psutil  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from services.kafka.broker import EmbeddedBroker  # noqa: E402
from services.kafka.client import make_producer  # noqa: E402
from services.kafka.config import KafkaSettings  # noqa: E402
from services.kafka.fetch import Fetcher  # noqa: E402


def cost(turn: Callable[[int], None], turns: int, broker: psutil.Process) -> dict[str, float]:
    """Milliseconds per turn: wall, process CPU, calling thread CPU, broker CPU."""
    for i in range(20):
        turn(i)
    b0, r0 = broker.cpu_times(), resource.getrusage(resource.RUSAGE_SELF)
    t0, m0 = time.perf_counter(), time.thread_time()
    for i in range(20, 20 + turns):
        turn(i)
    m1, t1 = time.thread_time(), time.perf_counter()
    b1, r1 = broker.cpu_times(), resource.getrusage(resource.RUSAGE_SELF)
    per = 1000 / turns
    return {"wall_ms": round((t1 - t0) * per, 3),
            "process_cpu_ms": round((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) * per, 3),
            "calling_thread_cpu_ms": round((m1 - m0) * per, 3),
            "broker_cpu_ms": round((b1.user + b1.system - b0.user - b0.system) * per, 3)}


def one_run(turns: int, producer_settings: dict[str, str], unparked: bool) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="cbgp-plumbing-") as tmp, EmbeddedBroker(tmp) as broker_proc:
        settings: KafkaSettings = broker_proc.settings()
        broker = psutil.Process(broker_proc.pid)
        admin = AdminClient(settings.admin_config())
        for future in admin.create_topics([NewTopic("in", 1), NewTopic("out", 4), NewTopic("idle", 2)]).values():
            future.result(30)
        seed = Producer({"bootstrap.servers": settings.bootstrap_servers})
        seed.produce("in", b"x")
        seed.flush(30)
        # A consumer that never joins its group (as a worker's whole-shard committers): its metadata is the
        # group's, and it fetches nothing (an assigned one fetches in a tight loop on this broker).
        member = Consumer(settings.consumer_config("plumbing-bench"))
        metadata = member.consumer_group_metadata()
        producer = make_producer(settings, transactional_id="plumbing-bench",
                                 **{key.replace(".", "_"): value for key, value in producer_settings.items()})
        busy = Fetcher(settings, "plumbing-bench.busy", 500, check_log_start=False) if unparked else None
        if busy is not None:
            busy.set_positions({("idle", 0): 0, ("idle", 1): 0})  # assigned, and never read: never parked

        def transaction(i: int) -> None:
            producer.begin_transaction()
            for _ in range(4):
                producer.produce("out", b"x" * 200)
            producer.send_offsets_to_transaction([TopicPartition("in", 0, i)], metadata, 10)
            producer.flush(10)
            producer.commit_transaction(10)

        result = {"transaction": cost(transaction, turns, broker)}
        if busy is not None:
            busy.close()
        # (made only now: an assigned consumer not yet parked fetches in a tight loop, and would be counted above)
        fetcher = Fetcher(settings, "plumbing-bench.fetch", 500, check_log_start=False)
        fetcher.set_positions({("idle", 0): 0, ("idle", 1): 0})

        def idle_turn(_i: int) -> None:
            if fetcher.poll():
                raise RuntimeError("the idle partitions held a record")

        result["idle_fetch_turn"] = cost(idle_turn, turns, broker)
        fetcher.close()
        member.close()
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--producer", action="append", default=[], metavar="KEY=VALUE",
                        help="a librdkafka property of the transactional producer (repeatable)")
    parser.add_argument("--unparked", action="store_true",
                        help="an assigned consumer that is never parked runs beside the transactions")
    args = parser.parse_args()
    producer_settings = {}
    for item in args.producer:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--producer {item!r}: expected KEY=VALUE")
        producer_settings[key] = value
    runs = []
    for n in range(args.repeat):
        runs.append(one_run(args.turns, producer_settings, args.unparked))
        print(f"run {n + 1}/{args.repeat}: " + "; ".join(
            f"{name}: wall {r['wall_ms']:.2f} ms, CPU {r['process_cpu_ms']:.2f} ms (calling thread "
            f"{r['calling_thread_cpu_ms']:.2f}), broker {r['broker_cpu_ms']:.2f} ms"
            for name, r in runs[-1].items()), flush=True)
    summary = {name: {key: {"median": statistics.median(run[name][key] for run in runs),
                            "range": [min(run[name][key] for run in runs), max(run[name][key] for run in runs)]}
                      for key in runs[0][name]} for name in runs[0]}
    print(json.dumps({"turns": args.turns, "repeat": args.repeat, "producer": producer_settings,
                      "unparked": args.unparked, "summary": summary, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
