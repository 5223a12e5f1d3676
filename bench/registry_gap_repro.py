"""Admin commands sent while the registry restarts after SIGKILL (static group membership, embedded broker):
is every command answered exactly once?

    .venv/bin/python bench/registry_gap_repro.py [--runs 6] [--delays 0.2,0.5,0.8,1.2]

Each run starts a broker and a registry, registers four queries, kills the registry with SIGKILL a moment
after the fourth command, sends two more commands while a new registry starts (same group.instance.id, as
the fault tests and a StatefulSet do), waits, and counts the replies on queries.status per request id.
Before the registry's admin-offset guard (services/registry_faust.admin_gap), faust sometimes skipped one
of the two and delivered the other twice: the skipped command was never answered.  Prints one line per run
and, last, a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services import codec  # noqa: E402
from services.kafka.topics import ensure_topics
from services.kafka.client import make_producer, produce_sync, read_all  # noqa: E402
from services.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from tests.fleet_support import QUERIES, Fleet  # noqa: E402


def run_once(delay: float, wait: float) -> Counter:
    tmp = Path(tempfile.mkdtemp(prefix="registry-gap-"))
    with EmbeddedBroker(tmp / "broker") as broker:
        settings = broker.settings(topic_prefix="gap.", partitions=4)
        ensure_topics(settings)
        producer = make_producer(settings)

        def admin(name: str, request_id: str) -> None:
            produce_sync(producer, settings.topic("admin"), codec.encode("AdminCommand", {
                "command": "REGISTER", "query_id": name, "sparql": QUERIES[name], "options": {},
                "request_id": request_id}))

        os.environ["CBGP_KAFKA_GROUP_INSTANCE_ID"] = os.environ["CONSUMER_GROUP_INSTANCE_ID"] = "gap.registry"
        with Fleet(settings, tmp / "logs") as fleet:
            def start() -> None:
                fleet.start("registry", "registry", "--web-port", str(free_port()), "--state-dir", str(tmp / "s"))
            start()
            names = list(QUERIES)
            for i, name in enumerate(names[:4]):
                admin(name, f"{name}-{i}")
            time.sleep(delay)
            proc = fleet.procs.pop("registry")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            start()
            admin(names[1], "retry-a")  # two commands while the new registry starts
            admin(names[0], "retry-b")
            time.sleep(wait)
        replies = Counter(codec.decode("QueryStatus", m.value())["request_id"]
                          for m in read_all(settings, settings.topic("queries.status"), timeout=10))
    return Counter({rid: replies.get(rid, 0) for rid in [f"{n}-{i}" for i, n in enumerate(names[:4])] +
                    ["retry-a", "retry-b"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--delays", default="0.2,0.5,0.8,1.2", help="seconds from the 4th command to the kill")
    parser.add_argument("--wait", type=float, default=20.0, help="seconds to wait for replies after the restart")
    args = parser.parse_args()
    delays = [float(d) for d in args.delays.split(",")]
    lost = twice = 0
    for run in range(args.runs):
        delay = delays[run % len(delays)]
        replies = run_once(delay, args.wait)
        missing = sorted(r for r, n in replies.items() if n == 0)
        repeated = sorted(r for r, n in replies.items() if n > 1)
        lost += len(missing)
        twice += len(repeated)
        print(f"run {run + 1}: kill {delay:.1f}s after the 4th command: unanswered {missing or '-'}, "
              f"answered twice {repeated or '-'}", flush=True)
    print(json.dumps({"runs": args.runs, "unanswered": lost, "answered_twice": twice}))


if __name__ == "__main__":
    main()
