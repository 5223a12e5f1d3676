"""The long fault-injection run (``tests/fleet/test_faults.py`` is the short one), and what a broker SIGKILL loses.

    .venv/bin/python bench/faults_run.py                      # 30 kills, 6000 updates
    .venv/bin/python bench/faults_run.py --kills 0 --broker-restarts 6
    .venv/bin/python bench/faults_run.py --kills 12 --lines 3000 --services ingest,worker,answers,registry
    .venv/bin/python bench/faults_run.py --broker-sigkill     # what noida-db loses on SIGKILL (documentation)
    .venv/bin/python bench/faults_run.py --noida-expiry       # noida-db never expires a SIGKILLed group member

Prints the results table (kills per service, rebalances, broker restarts, answers lost, duplicates
delivered after deduplication) and every problem found; exits 1 if there is one.  Everything runs on a
private embedded broker in a temporary directory (``--keep`` keeps it, with the services' logs).
"""

from __future__ import annotations

import secrets
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("CBGP_CHECKPOINT_SECRET", secrets.token_hex(32))  # (services that checkpoint need one)

from services.kafka.broker import EmbeddedBroker  # noqa: E402
from services.kafka.topics import ensure_topics  # noqa: E402
from tests.fault_support import (FAULT_QUERIES, KILL_ROTATION, FaultConfig, FaultRun, dedupe_by_n, fold,  # noqa: E402
                                 oracle_answers, read_answer_records)
from tests.fixtures.broker import fresh_settings  # noqa: E402


def long_run(args: argparse.Namespace, tmp: Path) -> int:
    if args.kills and args.broker_restarts:
        print("run kills and broker restarts separately: killed services need static group membership on "
              "noida-db 0.2.3, and after a broker restart it does not let a static member back into its group")
        return 2
    cfg = FaultConfig(kills=args.kills, broker_restarts=args.broker_restarts, lines=args.lines, seed=args.seed,
                      services=tuple(args.services.split(",")), settle_timeout=args.settle,
                      static_members=args.kills > 0)
    with EmbeddedBroker(tmp / "broker") as broker:
        settings = fresh_settings(broker)
        ensure_topics(settings)
        run = FaultRun(broker, settings, tmp, cfg, log=lambda s: print(time.strftime("%H:%M:%S"), s, flush=True))
        report = run.run()
        run.check()
    print()
    print(report.table())
    for problem in report.problems:
        print("PROBLEM:", problem)
    return 1 if report.problems else 0


def broker_sigkill(args: argparse.Namespace, tmp: Path) -> int:
    """Fleet without faults of its own; the broker is SIGKILLed right after the stream is acknowledged, then
    restarted.  Reports which acknowledged raw records and which answers survived, and whether the answers
    that survived are still the oracle's answers over the raw records that survived."""
    cfg = FaultConfig(kills=0, broker_restarts=0, add_remove_worker=False, lines=args.lines, seed=args.seed,
                      static_members=False)
    with EmbeddedBroker(tmp / "broker") as broker:
        settings = fresh_settings(broker)
        ensure_topics(settings)
        run = FaultRun(broker, settings, tmp, cfg, log=lambda s: print(time.strftime("%H:%M:%S"), s, flush=True))
        from services.kafka.client import end_offsets, make_producer, read_all

        with run.fleet:
            run.producer = make_producer(settings)
            for name in ("registry", "ingest", "answers"):
                run.start(name)
            run.add_worker()
            for _ in FAULT_QUERIES:
                run.register_next()
            half = len(run.lines) // 2
            run.publish(run.lines[:half])
            run.settle_on(run.lines[:half])
            before = {t: sum(hi for _lo, hi in end_offsets(settings, settings.topic(t)).values())
                      for t in ("updates.raw", "updates.encoded", "answers")}
            run.publish(run.lines[half:])  # acknowledged (acks=all) ...
            time.sleep(args.delay)
            broker.kill()  # ... then the broker dies before its next snapshot
            broker.start()  # on the same data dir: what its last snapshot held
            survived = {t: sum(hi for _lo, hi in end_offsets(settings, settings.topic(t)).values())
                        for t in ("updates.raw", "updates.encoded", "answers")}
            raw = [m.value().decode() for m in read_all(settings, settings.topic("updates.raw"), timeout=30)]
            lines = [line for chunk in raw for line in chunk.splitlines() if line]
            run.settle_on(lines)
            expected = oracle_answers(lines, FAULT_QUERIES)
            got = read_answer_records(settings)
            ok = all(fold(dedupe_by_n(got.get(q, []))[0])[0] == expected[q] for q in FAULT_QUERIES)
            print(f"raw records: {before['updates.raw']} before the second half, {run.report.raw_records} "
                  f"acknowledged in total, {survived['updates.raw']} after the SIGKILL + restart "
                  f"({run.report.raw_records - survived['updates.raw']} acknowledged records lost)")
            print(f"updates.encoded end: {before['updates.encoded']} before, {survived['updates.encoded']} after restart")
            print(f"answers end: {before['answers']} before, {survived['answers']} after restart")
            print(f"answers over the surviving raw records equal the oracle's: {ok}")
    return 0


NOIDA_EXPIRY = r'''
import os, sys, time
from services.kafka.client import make_consumer
from services.kafka.config import KafkaSettings
s = KafkaSettings(bootstrap_servers=sys.argv[1], topic_prefix=sys.argv[2], partitions=4,
                  rebalance_timeout_ms=int(sys.argv[3]))
c = make_consumer(s, "g1", [s.topic("updates.routed")])
while not c.assignment():
    c.poll(0.1)
os._exit(9)  # like kill -9: no LeaveGroup, no more heartbeats
'''


def noida_expiry(args: argparse.Namespace, tmp: Path) -> int:
    """A group member that dies without leaving is never expired by noida-db 0.2.3 (Kafka: session.timeout.ms)."""
    from services.kafka.client import make_consumer

    with EmbeddedBroker(tmp / "broker") as broker:
        settings = fresh_settings(broker)
        ensure_topics(settings)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-c", NOIDA_EXPIRY, broker.bootstrap, settings.topic_prefix,
                        str(settings.rebalance_timeout_ms)], env=env,
                       check=False, timeout=60)
        consumer = make_consumer(settings, "g1", [settings.topic("updates.routed")])
        started = time.monotonic()
        while time.monotonic() - started < args.wait and not consumer.assignment():
            consumer.poll(0.2)
        waited = time.monotonic() - started
        if consumer.assignment():
            print(f"the new member got partitions after {waited:.1f} s (session.timeout.ms = 6 s): expiry works")
            return 0
        print(f"the new member got no partitions in {waited:.0f} s: the dead member (session.timeout.ms = 6 s) "
              "was never expired; the group stays in PreparingRebalance")
        return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--broker-restarts", type=int, default=0, help="graceful restarts (use with --kills 0)")
    parser.add_argument("--lines", type=int, default=6000)
    parser.add_argument("--seed", type=int, default=5, help="5: every query has answers at the end")
    parser.add_argument("--services", default=",".join(FaultConfig().services),
                        help=f"services to kill, in rotation (any of {','.join(KILL_ROTATION)})")
    parser.add_argument("--settle", type=float, default=300.0, help="seconds the fleet gets to converge")
    parser.add_argument("--broker-sigkill", action="store_true", help="document what a broker SIGKILL loses")
    parser.add_argument("--delay", type=float, default=0.05, help="--broker-sigkill: seconds between ack and kill")
    parser.add_argument("--noida-expiry", action="store_true", help="show the broker's member-expiry defect")
    parser.add_argument("--wait", type=float, default=60.0, help="--noida-expiry: how long to wait")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, broker data)")
    args = parser.parse_args()
    os.environ.setdefault("CBGP_ASSEMBLY", "worker")  # no Spark job in these runs: workers assemble products
    tmp = Path(tempfile.mkdtemp(prefix="cbgp-faults-"))
    try:
        if args.noida_expiry:
            return noida_expiry(args, tmp)
        if args.broker_sigkill:
            return broker_sigkill(args, tmp)
        return long_run(args, tmp)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
