"""``make run``: the whole product on one machine, with live answers on the terminal.

Steps, in order (each one needs the previous):

1. the broker: without ``--bootstrap-servers`` / ``CBGP_BOOTSTRAP_SERVERS``, an :class:`EmbeddedBroker` with a
   fresh data dir under ``<run-dir>/broker``; otherwise the given broker (only the services are started);
2. the topics, with explicit partition counts (:func:`ensure_topics`);
3. the services, one child process each, in their own process groups (``cbgp ingest``, ``cbgp registry``,
   ``--workers`` x ``cbgp worker``, ``cbgp answers``, ``cbgp spark-job`` in local mode for windows, multi-part
   assembly and compaction: whichever commands this installation has);
4. unless ``--no-demo``: register the example queries (``services/demo/queries/*.rq``) and publish the demo
   stream (``services/demo/updates.rdfp``);
5. a live view on stderr, refreshed every second: per query its answer count and last deltas, updates/s in
   (``updates.encoded``) and answers/s out (``answers``), and any child that died; with the demo, also a
   clock record on updates.raw every second, so windows move;
6. on Ctrl-C, SIGTERM or after ``--duration``: SIGTERM to every child, SIGKILL to any still alive after the
   grace period, then the broker last.  A JSON summary (answers per query, child exit codes and pids) is
   printed on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from services.codec import CodecError, decode
from services.kafka import EmbeddedBroker, KafkaSettings, add_kafka_flags, end_offsets, ensure_topics, make_consumer
from services.kafka.broker import EMBEDDED_REBALANCE_TIMEOUT_MS, free_port
from services.runtime import Stopper
from services.supervise import ChildProcess, cbgp_command, http_ok

__all__ = ["LiveView", "main", "service_plan"]

DEMO_DIR = Path(__file__).with_name("demo")
SERVICE_ORDER = ("ingest", "registry", "worker", "answers")


def available_commands() -> set[str]:
    """The ``cbgp`` command names this installation has (services land independently)."""
    from services.cli import _add_fleet_commands

    parser = argparse.ArgumentParser()
    return set(_add_fleet_commands(parser.add_subparsers()))


def service_plan(commands: set[str], workers: int, run_dir: Path,
                 spark: bool = True) -> list[tuple[str, list[str], dict[str, int]]]:
    """``[(child name, cbgp args, ports)]`` for the services that exist, in start order."""
    plan: list[tuple[str, list[str], dict[str, int]]] = []
    if "ingest" in commands:
        plan.append(("ingest", ["ingest", "--instance-id", "i1", "--metrics-port", "0"], {}))
    if "registry" in commands:
        ports = {"web": free_port(), "metrics": free_port()}
        plan.append(("registry", ["registry", "--web-port", str(ports["web"]), "--metrics-port", str(ports["metrics"]),
                                  "--state-dir", str(run_dir / "state")], ports))
    if "worker" in commands:
        for i in range(workers):
            plan.append((f"worker-{i}", ["worker", "--worker-id", f"w{i}", "--metrics-port", "0"], {}))
    if "answers" in commands:
        plan.append(("answers", ["answers", "--instance-id", "a1", "--metrics-port", "0"], {}))
    if "spark-job" in commands and spark:
        # windows and multi-part assembly for the queries that need them, compaction every 30 s; started
        # first because its JVM takes longest to come up
        plan.insert(0, ("spark-job", ["spark-job", "--state-dir", str(run_dir / "spark"), "--compact-interval",
                                      "30"], {}))
    return plan


class Clock:
    """Stream time for event-time windows when nothing else is flowing: every second one record on
    updates.raw (the clock triple moves on), so windowed answers expire in the demo as time passes."""

    SUBJECT, PREDICATE = "<urn:cbgp:demo:clock>", "<urn:cbgp:demo:now>"

    def __init__(self, settings: KafkaSettings) -> None:
        from services.kafka import make_producer

        self.producer = make_producer(settings)
        self.topic = settings.topic("updates.raw")
        self.ticks = 0
        self.next_at = time.monotonic()

    def tick(self) -> None:
        if time.monotonic() < self.next_at:
            return
        self.next_at += 1.0
        old = f"D {self.SUBJECT} {self.PREDICATE} \"{self.ticks}\" .\n" if self.ticks else ""
        self.ticks += 1
        self.producer.produce(self.topic, (old + f"A {self.SUBJECT} {self.PREDICATE} \"{self.ticks}\" .\n").encode())
        self.producer.poll(0)

    def close(self) -> None:
        self.producer.flush(5)


def _short(term: dict[str, Any]) -> str:
    """A compact term for the terminal: the IRI's last segment, a quoted lexical form, or _:label."""
    value = term["value"]
    if term["type"] == "uri":
        return value.rstrip("/").rsplit("/", 1)[-1].rsplit("#", 1)[-1]
    if term["type"] == "bnode":
        return "_:" + value
    return json.dumps(value[:30], ensure_ascii=False)


class LiveView:
    """Follows ``answers`` and ``updates.encoded`` and draws the one-second view."""

    def __init__(self, settings: KafkaSettings, out: TextIO, keep: int = 3) -> None:
        self.settings = settings
        self.out = out
        self.keep = keep
        self.tty = out.isatty()
        self.counts: dict[str, int] = {}
        self.last: dict[str, list[str]] = {}
        self.total = 0
        self._prev_total = 0
        self._prev_in = 0
        self._prev_t = time.monotonic()
        self._drawn = 0
        topic = settings.topic("answers")
        self.consumer = make_consumer(settings, "cbgp-run-view", fetch_wait_max_ms=100)
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in end_offsets(settings, topic)])

    def pump(self, seconds: float) -> None:
        """Consume answers for ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            msg = self.consumer.poll(min(0.2, max(0.01, deadline - time.monotonic())))
            if msg is None or msg.value() is None:
                continue
            if msg.error() is not None:
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    self.out.write(f"run: answers: {msg.error()}\n")
                continue
            try:
                answer = decode("Answer", msg.value())
            except CodecError:
                continue
            query = answer["query_id"]
            self.counts[query] = self.counts.get(query, 0) + 1
            self.total += 1
            binding = " ".join(f"?{k}={_short(v)}" for k, v in sorted(answer["binding"].items()))
            self.last.setdefault(query, []).append(f"{answer['sign']} #{answer['n']} {binding}")
            del self.last[query][:-self.keep]

    def draw(self, children: list[ChildProcess], elapsed: float) -> None:
        now = time.monotonic()
        try:
            encoded = end_offsets(self.settings, self.settings.topic("updates.encoded"), timeout=2).get(0, (0, 0))[1]
        except Exception:  # noqa: BLE001 - a slow broker must not stop the view
            encoded = self._prev_in
        span = max(now - self._prev_t, 1e-6)
        rate_in, rate_out = (encoded - self._prev_in) / span, (self.total - self._prev_total) / span
        self._prev_in, self._prev_total, self._prev_t = encoded, self.total, now
        dead = [f"{c.name} exited ({c.proc.returncode}; log {c.log_path})" for c in children if not c.alive()]
        lines = [f"cbgp run  {elapsed:5.0f} s   updates in: {encoded:,} ({rate_in:,.0f}/s)   "
                 f"answers out: {self.total:,} ({rate_out:,.0f}/s)   children: {sum(c.alive() for c in children)}"
                 f"/{len(children)} alive"]
        lines += [f"  !! {d}" for d in dead]
        for query in sorted(self.counts):
            lines.append(f"  {query}: {self.counts[query]:,} deltas")
            lines += [f"      {delta[:110]}" for delta in self.last[query]]
        if self.tty and self._drawn:
            self.out.write(f"\x1b[{self._drawn}F\x1b[J")  # redraw in place
        self.out.write("\n".join(lines) + "\n")
        self.out.flush()
        self._drawn = len(lines) if self.tty else 0

    def close(self) -> None:
        self.consumer.close()


def _register_and_publish(settings: KafkaSettings, registry: tuple[ChildProcess, dict[str, int]] | None,
                          err: TextIO) -> None:
    from services.usercli import UserError, admin_request, format_status, publish_file

    if registry is not None:
        child, ports = registry
        child.wait_until(lambda: http_ok(f"http://127.0.0.1:{ports['metrics']}/readyz"), timeout=90)
        for path in sorted((DEMO_DIR / "queries").glob("*.rq")):
            try:
                status = admin_request(settings, {"command": "REGISTER", "query_id": path.stem,
                                                  "sparql": path.read_text(encoding="utf-8")}, wait=30)
                err.write(f"run: register {path.stem}: {format_status(status)}\n")
            except UserError as exc:
                err.write(f"run: register {path.stem}: {exc}\n")
    else:
        err.write("run: no registry service in this installation: example queries not registered\n")
    publish_file(settings, str(DEMO_DIR / "updates.rdfp"), "patch", chunk_bytes=16 * 1024, out=err)


def run(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """The orchestrator (module docstring); returns the exit code."""
    stop = Stopper()  # SIGTERM and Ctrl-C run the same ordered shutdown
    run_dir = Path(args.run_dir).resolve()
    external = bool(args.bootstrap_servers or os.environ.get("CBGP_BOOTSTRAP_SERVERS"))
    broker: EmbeddedBroker | None = None
    children: list[ChildProcess] = []
    view: LiveView | None = None
    summary: dict[str, Any] = {"queries": {}, "children": {}, "broker_pid": None}
    try:
        # Step 1: the broker.
        if external:
            settings = KafkaSettings.from_args(args)
            err.write(f"run: using the broker at {settings.bootstrap_servers}\n")
        else:
            shutil.rmtree(run_dir / "broker", ignore_errors=True)  # fresh each run: old topics would replay
            broker = EmbeddedBroker(run_dir / "broker").start()
            summary["broker_pid"] = broker.pid
            os.environ["CBGP_BOOTSTRAP_SERVERS"] = broker.bootstrap
            os.environ.setdefault("CBGP_REBALANCE_TIMEOUT_MS", str(EMBEDDED_REBALANCE_TIMEOUT_MS))
            settings = KafkaSettings.from_args(args)
            err.write(f"run: embedded broker at {broker.bootstrap} (pid {broker.pid}, data {broker.data_dir})\n")
        # Step 2: topics with explicit partition counts (services also check this on start).
        created = ensure_topics(settings)
        err.write(f"run: {len(created)} topic(s) created with prefix {settings.topic_prefix!r}\n")
        # Step 3: the services.
        env = {**os.environ, **settings.to_env()}
        if args.no_spark:
            env["CBGP_ASSEMBLY"] = "worker"  # nobody else would multiply multi-part queries
        registry = None
        for name, argv, ports in service_plan(available_commands(), args.workers, run_dir, spark=not args.no_spark):
            child = ChildProcess(name, cbgp_command(*argv), env=env, log_path=run_dir / "logs" / f"{name}.log").start()
            children.append(child)
            if name == "registry":
                registry = (child, ports)
        err.write("run: started " + ", ".join(f"{c.name} (pid {c.pid})" for c in children)
                  + f"; logs in {run_dir / 'logs'}\n")
        # Step 4: the demo.
        if not args.no_demo and not stop.stopping:
            _register_and_publish(settings, registry, err)
        # Step 5: the live view, until asked to stop.
        view = LiveView(settings, err)
        clock = Clock(settings) if not args.no_demo else None
        started = time.monotonic()
        while not stop.stopping and (args.duration is None or time.monotonic() - started < args.duration):
            if clock is not None:
                clock.tick()
            view.pump(1.0)
            view.draw(children, time.monotonic() - started)
        if clock is not None:
            clock.close()
        summary["queries"] = {q: {"answers": n, "last": view.last[q]} for q, n in view.counts.items()}
        return 0
    except Exception as exc:  # noqa: BLE001 - one readable line, then the same orderly shutdown
        err.write(f"run: error: {type(exc).__name__}: {exc}\n")
        return 1
    finally:
        # Step 6: children (SIGTERM, then SIGKILL after the grace period), then the broker last.
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the shutdown short
        if view is not None:
            view.close()
        for child in children:
            child.signal(signal.SIGTERM)
        for child in children:
            summary["children"][child.name] = {"pid": child.pid, "exit": child.stop(grace=args.grace)}
        if broker is not None:
            broker.stop()
        err.write("run: stopped " + ", ".join(f"{n} ({c['exit']})" for n, c in summary["children"].items())
                  + (" and the broker" if broker is not None else "") + "\n")
        out.write(json.dumps(summary) + "\n")
        out.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.run", description=__doc__.split("\n")[0])
    add_kafka_flags(parser)
    parser.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds (default: Ctrl-C)")
    parser.add_argument("--no-demo", action="store_true", help="start the fleet only (no queries, no data)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--no-spark", action="store_true",
                        help="no Spark job: workers multiply multi-part queries, windowed queries get no answers")
    parser.add_argument("--run-dir", default=".run", help="broker data, logs and state (default .run)")
    parser.add_argument("--grace", type=float, default=10.0, metavar="S",
                        help="seconds a child gets to exit after SIGTERM before SIGKILL (default 10)")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
