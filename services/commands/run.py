"""``make run``: the whole product on one machine, with live answers on the terminal.

How it works: docs/design/internals.md, services.commands.run.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, TextIO

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from services.codec import CodecError, decode, encoded_changes, term_from_avro
from services.commands.trimmer import Trimmer
from services.kafka.broker import EmbeddedBroker
from services.kafka.run_env import plain_setting, write_run_env
from services.kafka.config import KafkaSettings, add_kafka_flags
from services.kafka.doorbell import DOORBELL_DIR_ENV, fresh_doorbell_dir
from services.kafka.client import end_offsets
from services.kafka.topics import ensure_topics
from services.kafka.broker import EMBEDDED_REBALANCE_TIMEOUT_MS, free_port
from services.runtime.gc_tuning import tune_gc
from services.runtime.life import Stopper
from services.runtime.supervise import ChildProcess, cbgp_command, http_ok

__all__ = ["LiveView", "main", "service_plan"]

DEMO_DIR = Path(__file__).with_name("demo")
SERVICE_ORDER = ("ingest", "registry", "worker", "answers")


def available_commands() -> set[str]:
    """The ``cbgp`` command names this installation has (services land independently)."""
    from services.commands.main import add_fleet_commands

    parser = argparse.ArgumentParser()
    return set(add_fleet_commands(parser.add_subparsers()))


def service_plan(commands: set[str], workers: int, run_dir: Path,
                 spark: bool = True) -> list[tuple[str, list[str], dict[str, int]]]:
    """``[(child name, cbgp args, ports)]`` for the services that exist, in start order."""
    plan: list[tuple[str, list[str], dict[str, int]]] = []
    # Every port is chosen here (not "0 = any") so that make run can print them all.
    if "ingest" in commands:
        ports = {"metrics": free_port()}
        plan.append(("ingest", ["ingest", "--instance-id", "i1", "--metrics-port", str(ports["metrics"]),
                                "--state-dir", str(run_dir / "ingest-state")], ports))
    if "registry" in commands:
        ports = {"web": free_port(), "metrics": free_port()}
        plan.append(("registry", ["registry", "--web-port", str(ports["web"]), "--metrics-port", str(ports["metrics"]),
                                  "--state-dir", str(run_dir / "state")], ports))
    if "worker" in commands:
        for i in range(workers):
            ports = {"metrics": free_port()}
            plan.append((f"worker-{i}", ["worker", "--worker-id", f"w{i}", "--metrics-port", str(ports["metrics"]),
                                         "--state-dir", str(run_dir / "worker-state")], ports))
    if "answers" in commands:
        ports = {"metrics": free_port()}
        plan.append(("answers", ["answers", "--instance-id", "a1", "--metrics-port", str(ports["metrics"]),
                                 "--state-dir", str(run_dir / "answers-state")], ports))
    if "background" in commands:  # SERVICE views (the demo's endpoint is started by run, see BackgroundDemo)
        ports = {"metrics": free_port()}
        plan.append(("background", ["background", "--metrics-port", str(ports["metrics"])], ports))
    if "gateway" in commands:  # the console, SEPA WebSocket, SSE and SPARQL protocol (a token generated for the run)
        ports = {"console": free_port(), "metrics": free_port()}
        plan.append(("gateway", ["gateway", "--host", "127.0.0.1", "--port", str(ports["console"]), "--metrics-port",
                                 str(ports["metrics"]), "--token-out", str(run_dir / "gateway.token")], ports))
    if "spark-job" in commands and spark:
        # windows and multi-part assembly for the queries that need them, compaction every 30 s; started
        # first because its JVM takes longest to come up
        plan.insert(0, ("spark-job", ["spark-job", "--state-dir", str(run_dir / "spark"), "--compact-interval",
                                      "30"], {}))
    return plan


def _gateway_token(path: Path, timeout: float = 60.0) -> str:
    """The admin token the gateway generated for this run (it writes it as it starts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            token = path.read_text().strip()
        except OSError:
            token = ""
        if token:
            return token
        time.sleep(0.1)
    return ""


def port_lines(bootstrap: str, plan: list[tuple[str, list[str], dict[str, int]]], spark_status_path: Path) -> str:
    """Where everything listens, one line per service, for make run's start-up output."""
    lines = [f"run: ports: broker {bootstrap}"]
    for name, _argv, ports in plan:
        where = []
        if "web" in ports:
            where.append(f"queries http://127.0.0.1:{ports['web']}/queries")
        if "console" in ports:
            where.append(f"console http://127.0.0.1:{ports['console']}/ (SEPA ws /subscribe, SSE, /update, /query)")
        if "metrics" in ports:
            where.append(f"metrics http://127.0.0.1:{ports['metrics']}/metrics (/healthz /readyz)")
        if name == "spark-job":
            where.append(f"no port; query status in {spark_status_path}")
        lines.append(f"run: ports: {name}: {', '.join(where) or 'none'}")
    return "\n".join(lines) + "\n"


class Clock:
    """Stream time for event-time windows when nothing else is flowing: every second one record on
    updates.raw (the clock triple moves on), so windowed answers expire in the demo as time passes."""

    SUBJECT, PREDICATE = "<urn:cbgp:demo:clock>", "<urn:cbgp:demo:now>"

    def __init__(self, settings: KafkaSettings) -> None:
        from services.kafka.client import make_producer

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
        self.producer = None  # destroyed now, before the broker stops (else it logs the disconnection)


def _term(term: dict[str, Any]) -> str:
    """A term as N-Triples writes it (``<iri>``, ``"Bob"@en``, ``"5"^^<...#integer>``, ``_:b``)."""
    try:
        return term_from_avro(term)
    except Exception:  # noqa: BLE001 - a term the canonical form refuses is still shown, marked
        return f"?{term.get('value')!r}"


def spark_status(path: Path | None) -> dict[str, Any] | None:
    """The Spark job's ``status.json`` (see spark.job.JobStatus), or None if there is none (yet)."""
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _spark_summary(status: dict[str, Any] | None) -> tuple[str, list[str]]:
    """(``windows running, assembly failed x3, ...``, problem lines) for the view."""
    if status is None:
        return "", []
    parts, problems = [], []
    for duty, q in sorted((status.get("queries") or {}).items()):
        state = q.get("state", "?")
        if q.get("failures"):
            parts.append(f"{duty} {state} (failed {q['failures']}x)")
        else:
            parts.append(f"{duty} {state}")
        if state == "failed":
            problems.append(f"spark {duty} query failed ({q.get('failures', 0)}x, restarting): {q.get('error')}")
    if status.get("error"):
        problems.append(f"spark job: {status['error']}")
    return ", ".join(parts), problems


class LiveView:
    """Follows ``answers`` and ``updates.encoded`` and draws the view: on a terminal a frame redrawn in place
    when something in it changed; otherwise (a log file, a pipe) a one-line summary at most every
    ``summary_every`` seconds when something changed, plus one line at once for each child that died and each
    Spark query that fails.

    Idle it costs next to nothing: its inputs are read by a :class:`services.runtime.life.Fetcher`, which stops
    fetching once every partition reported its end (the embedded broker answers an empty fetch at once, so a
    consumer left assigned spins), and the view only listens again after a pause.  Busy, it reads answers at most
    about four times a second, each time all that came meanwhile (one read per answers transaction cost the
    view a fetch turn each).  Of ``updates.encoded`` it
    reads only the newest records, when it draws: the whole log is the stream itself, which the view would
    otherwise fetch a second time beside the fleet."""

    IDLE_PAUSE_S = 0.25
    TAIL_RECORDS = 64  # of updates.encoded, read back from its end (with commit markers: about half are records)
    TAIL_EVERY_S = 0.5  # at most this often

    def __init__(self, settings: KafkaSettings, out: TextIO, keep: int = 3, *,
                 spark_status_path: Path | None = None, summary_every: float = 15.0) -> None:
        from services.kafka.fetch import Fetcher

        self.settings = settings
        self.out = out
        self.keep = keep
        self.tty = out.isatty()
        self.summary_every = summary_every
        self.spark_status_path = spark_status_path
        self.counts: dict[str, int] = {}
        self.total = 0
        # Records are decoded when drawn, not when read (the view must cost little beside the fleet it shows):
        # answers are counted by their key (the query id), the last `keep` of each query kept undecoded; graph
        # changes are the highest seq of the newest encoded records (seqs number the changes, refreshes aside).
        self._raw_last: dict[str, deque[bytes]] = {}
        self._encoded_tail: deque[bytes] = deque(maxlen=self.TAIL_RECORDS)
        self._changes = 0
        self._prev = (0, 0, time.monotonic())  # changes, answers, time of the last drawn frame / summary
        self._drawn = 0
        self._frame_key: Any = None
        self._summary_at = time.monotonic()
        self._summary_key: Any = None
        self._summary_counts: dict[str, int] = {}
        self._reported: set[str] = set()
        self.answers_topic, self.encoded_topic = settings.topic("answers"), settings.topic("updates.encoded")
        # From where each log starts now: a view, not a restore (retention may have cut answers: 7 days).
        positions = {(self.answers_topic, p): low
                     for p, (low, _high) in end_offsets(settings, self.answers_topic).items()}
        self.fetcher = Fetcher(settings, "run-view", 5000)
        self.fetcher.set_positions(positions)
        self.tail = Fetcher(settings, "run-view-tail", self.TAIL_RECORDS, check_log_start=False)
        self._tail_next, self._tail_high, self._tail_at = 0, -1, 0.0

    def pump(self, seconds: float) -> None:
        """Consume answers and updates for ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            msgs = self.fetcher.take() or self.fetcher.wait(min(0.2, left))
            if not msgs:
                self.fetcher.park()
                time.sleep(min(self.IDLE_PAUSE_S, max(0.0, deadline - time.monotonic())))
                continue
            for msg in msgs:
                self.consume(msg)
            if len(msgs) < self.fetcher.max_records:  # caught up: the view waits a moment and reads a fuller batch
                time.sleep(min(self.IDLE_PAUSE_S, max(0.0, deadline - time.monotonic())))

    def consume(self, msg: Any) -> None:
        if msg.error() is not None:
            if msg.error().code() != KafkaError._PARTITION_EOF:
                self.out.write(f"run: view: {msg.error()}\n")
            return
        if msg.value() is None:
            return
        key = msg.key()
        if key:
            query = key.decode("utf-8", "replace")
        else:  # (not the answers service's: it keys by query id)
            try:
                query = decode("Answer", msg.value())["query_id"]
            except CodecError:
                return
        self.counts[query] = self.counts.get(query, 0) + 1
        self.total += 1
        kept = self._raw_last.get(query)
        if kept is None:
            kept = self._raw_last[query] = deque(maxlen=self.keep)
        kept.append(msg.value())

    def _read_tail(self) -> None:
        """The newest records of updates.encoded into ``_encoded_tail`` (at most every TAIL_EVERY_S, and only
        when its end moved)."""
        now = time.monotonic()
        if now < self._tail_at:
            return
        self._tail_at = now + self.TAIL_EVERY_S
        try:
            low, high = self.tail.consumer.get_watermark_offsets(TopicPartition(self.encoded_topic, 0), timeout=2,
                                                                 cached=False)
        except KafkaException:
            return
        if high == self._tail_high:
            return
        self.tail.set_positions({(self.encoded_topic, 0): max(low, high - self.TAIL_RECORDS, self._tail_next)})
        while time.monotonic() < now + 2.0:
            msgs = self.tail.take() or self.tail.wait(0.2)
            if not msgs:  # at its end (a transaction still open ends it early: read again once it commits)
                self._tail_high = high
                break
            for msg in msgs:
                if msg.error() is None and msg.value() is not None:
                    self._encoded_tail.append(msg.value())
                    self._tail_next = msg.offset() + 1
        self.tail.park()

    @property
    def changes(self) -> int:
        """Graph changes so far: the highest seq of a change (not a refresh) in the newest encoded records."""
        self._read_tail()
        while self._encoded_tail:
            try:
                seqs = [change.seq for change in encoded_changes(self._encoded_tail.pop()) if not change.refresh]
            except (CodecError, ValueError, IndexError):
                continue
            if seqs:
                self._changes = max(self._changes, max(seqs))
                self._encoded_tail.clear()
        return self._changes

    @property
    def last(self) -> dict[str, list[str]]:
        """The last ``keep`` deltas of each query, as lines (decoded now)."""
        lines: dict[str, list[str]] = {}
        for query, values in self._raw_last.items():
            shown = lines[query] = []
            for value in values:
                try:
                    answer = decode("Answer", value)
                except CodecError:
                    shown.append("(an undecodable answer)")
                    continue
                binding = " ".join(f"?{k}={_term(v)}" for k, v in sorted(answer["binding"].items()))
                shown.append(f"{answer['sign']} #{answer['n']} {binding}")
        return lines

    def _rates(self) -> tuple[float, float]:
        changes, total, then = self._prev
        now = time.monotonic()
        span = max(now - then, 1e-6)
        self._prev = (self.changes, self.total, now)
        return (self.changes - changes) / span, (self.total - total) / span

    def draw(self, children: list[ChildProcess], elapsed: float) -> None:
        alive = sum(c.alive() for c in children)
        dead = [f"{c.name} exited ({c.proc.returncode if c.proc else '?'}; log {c.log_path})"
                for c in children if not c.alive()]
        status = spark_status(self.spark_status_path)
        job = next((c for c in children if c.name == "spark-job"), None)
        if status is not None and job is not None and status.get("pid") != job.pid:
            status = None  # not this run's job (yet)
        spark, problems = _spark_summary(status)
        if self.tty:
            self._draw_frame(children, elapsed, alive, dead, spark, problems)
        else:
            self._write_lines(children, elapsed, alive, dead, spark, problems)
        self.out.flush()

    def _draw_frame(self, children: list[ChildProcess], elapsed: float, alive: int, dead: list[str], spark: str,
                    problems: list[str]) -> None:
        key = (self.changes, self.total, alive, tuple(dead), spark, tuple(problems))
        if key == self._frame_key and self._drawn:
            return  # nothing changed: no redraw (the elapsed time alone is not news)
        self._frame_key = key
        rate_in, rate_out = self._rates()
        lines = [f"cbgp run  {elapsed:5.0f} s   updates in: {self.changes:,} changes ({rate_in:,.0f}/s)   "
                 f"answers out: {self.total:,} ({rate_out:,.0f}/s)   children: {alive}/{len(children)} alive"]
        if spark:
            lines.append(f"  spark: {spark}")
        lines += [f"  !! {d}" for d in dead + problems]
        last = self.last
        for query in sorted(self.counts):
            lines.append(f"  {query}: {self.counts[query]:,} deltas")
            lines += [f"      {delta[:160]}" for delta in last[query]]
        if self._drawn:
            self.out.write(f"\x1b[{self._drawn}F\x1b[J")  # redraw in place
        self.out.write("\n".join(lines) + "\n")
        self._drawn = len(lines)

    def _write_lines(self, children: list[ChildProcess], elapsed: float, alive: int, dead: list[str], spark: str,
                     problems: list[str]) -> None:
        for problem in dead + problems:  # news at once, each once
            if problem not in self._reported:
                self._reported.add(problem)
                self.out.write(f"run: !! {problem}\n")
        self._reported &= set(dead + problems)  # a problem that clears and comes back is news again
        key = (self.changes, self.total, alive, spark, tuple(sorted(self.counts.items())))
        now = time.monotonic()
        if key == self._summary_key or now - self._summary_at < self.summary_every:
            return
        self._summary_key, self._summary_at = key, now
        rate_in, rate_out = self._rates()
        queries = ", ".join(f"{q} {n:,}" for q, n in sorted(self.counts.items()))
        self.out.write(f"cbgp run {elapsed:.0f} s: updates in {self.changes:,} changes ({rate_in:,.0f}/s), answers out "
                       f"{self.total:,} ({rate_out:,.0f}/s), children {alive}/{len(children)} alive"
                       + (f", spark: {spark}" if spark else "") + (f"; deltas per query: {queries}" if queries else "")
                       + "\n")
        last = self.last
        for query, count in sorted(self.counts.items()):  # the newest delta of each query that moved
            if self._summary_counts.get(query) != count:
                self.out.write(f"  {query}: {last[query][-1][:160]}\n")
        self._summary_counts = dict(self.counts)

    def close(self) -> None:
        self.fetcher.close()
        self.tail.close()


class BackgroundDemo:
    """The demo's SPARQL endpoint for ``service_*`` queries: follower counts of the demo users, one of which
    changes every few seconds (so the SERVICE query's answers change while the stream is quiet)."""

    PLACEHOLDER = "<urn:cbgp:demo:endpoint>"
    GRAPH, PREDICATE = "urn:cbgp:demo:background", "urn:cbgp:demo:followers"
    USER = "http://www.ins.cwi.nl/sib/user/u{}"
    USERS, EVERY_SECONDS = 50, 4.0

    def __init__(self, err: TextIO) -> None:
        from cbgp.background.endpoint import start_endpoint

        self.endpoint = start_endpoint("auto")
        data = " ".join(f"<{self.USER.format(i)}> <{self.PREDICATE}> {(i * 37) % 500} ." for i in range(self.USERS))
        self.endpoint.update(f"INSERT DATA {{ GRAPH <{self.GRAPH}> {{ {data} }} }}")  # read-only over HTTP
        self.changes, self.err = 0, err
        self.next_at = time.monotonic() + self.EVERY_SECONDS
        err.write(f"run: background data on a {self.endpoint.kind} endpoint at {self.endpoint.query_url}\n")

    def text(self, sparql: str) -> str:
        return sparql.replace(self.PLACEHOLDER, f"<{self.endpoint.query_url}>")

    def tick(self) -> None:
        if time.monotonic() < self.next_at:
            return
        self.next_at += self.EVERY_SECONDS
        self.changes += 1
        user = f"<{self.USER.format((self.changes * 7) % self.USERS)}>"
        try:
            self.endpoint.update(f"DELETE {{ GRAPH <{self.GRAPH}> {{ {user} <{self.PREDICATE}> ?n }} }} "
                               f"INSERT {{ GRAPH <{self.GRAPH}> {{ {user} <{self.PREDICATE}> {1000 + self.changes} }} }} "
                               f"WHERE {{ GRAPH <{self.GRAPH}> {{ {user} <{self.PREDICATE}> ?n }} }}")
        except Exception as exc:  # noqa: BLE001 - the demo goes on without changes
            self.err.write(f"run: background demo: could not change a count: {exc}\n")

    def close(self) -> None:
        self.endpoint.stop()


def _register_and_publish(settings: KafkaSettings, registry: tuple[ChildProcess, dict[str, int]] | None,
                          err: TextIO, background: BackgroundDemo | None) -> None:
    from services.client.errors import UserError
    from services.client.requests import admin_request, format_status
    from services.client.publish import publish_file

    if registry is not None:
        child, ports = registry
        child.wait_until(lambda: http_ok(f"http://127.0.0.1:{ports['metrics']}/readyz"), timeout=90)
        for path in sorted((DEMO_DIR / "queries").glob("*.rq")):
            sparql, options = path.read_text(encoding="utf-8"), {}
            if path.stem.startswith("service_"):
                if background is None:
                    continue  # no background service in this installation
                sparql, options = background.text(sparql), {"service.refresh_ms": "5000"}
            try:
                status = admin_request(settings, {"command": "REGISTER", "query_id": path.stem,
                                                  "sparql": sparql, "options": options}, wait=30)
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
    background: BackgroundDemo | None = None
    trimmer: Trimmer | None = None
    summary: dict[str, Any] = {"queries": {}, "children": {}, "broker_pid": None}
    env_file: Path | None = None
    bell_dir: Path | None = None
    try:
        # Step 1: the broker.
        if external:
            settings = KafkaSettings.from_args(args)
            err.write(f"run: using the broker at {settings.bootstrap_servers}\n")
        else:
            shutil.rmtree(run_dir / "broker", ignore_errors=True)  # fresh each run: old topics would replay
            for state in ("ingest-state", "worker-state", "answers-state"):  # checkpoints of those topics
                shutil.rmtree(run_dir / state, ignore_errors=True)
            broker = EmbeddedBroker(run_dir / "broker").start()
            summary["broker_pid"] = broker.pid
            os.environ["CBGP_BOOTSTRAP_SERVERS"] = broker.bootstrap
            os.environ.setdefault("CBGP_REBALANCE_TIMEOUT_MS", str(EMBEDDED_REBALANCE_TIMEOUT_MS))
            settings = KafkaSettings.from_args(args)
            err.write(f"run: embedded broker at {broker.bootstrap} (pid {broker.pid}, data {broker.data_dir})\n")
        # Step 2: topics with explicit partition counts (services also check this on start).
        created = ensure_topics(settings)
        err.write(f"run: {len(created)} topic(s) created with prefix {settings.topic_prefix!r}\n")
        # Step 3: the services, with a checkpoint key of this run's unless one is given (services that checkpoint
        # refuse to start without one).
        os.environ.setdefault("CBGP_CHECKPOINT_SECRET", secrets.token_hex(32))  # (the trimmer reads checkpoints too)
        env = {**os.environ, **settings.to_env()}
        if DOORBELL_DIR_ENV not in env:  # every service here shares this host: wake-ups by doorbell
            bell_dir = fresh_doorbell_dir(run_dir / "doorbell")
            env[DOORBELL_DIR_ENV] = str(bell_dir)
        if args.no_spark:
            env["CBGP_ASSEMBLY"] = "worker"  # nobody else would multiply multi-part queries
        registry = None
        spark_status_path = run_dir / "spark" / "status.json"
        spark_status_path.unlink(missing_ok=True)  # the last run's
        (run_dir / "gateway.token").unlink(missing_ok=True)  # (this run's gateway writes a new one)
        plan = service_plan(available_commands(), args.workers, run_dir, spark=not args.no_spark)
        if not args.no_demo and any(name == "background" for name, _argv, _ports in plan):
            # The demo's endpoint first: the registry, the background service and the gateway call only the
            # endpoints they are told about (CBGP_SERVICE_ALLOW).
            background = BackgroundDemo(err)
            env["CBGP_SERVICE_ALLOW"] = ",".join(filter(None, [env.get("CBGP_SERVICE_ALLOW"),
                                                               background.endpoint.query_url]))
        for name, argv, ports in plan:
            child = ChildProcess(name, cbgp_command(*argv), env=env, log_path=run_dir / "logs" / f"{name}.log").start()
            children.append(child)
            if name == "registry":
                registry = (child, ports)
        err.write("run: started " + ", ".join(f"{c.name} (pid {c.pid})" for c in children)
                  + f"; logs in {run_dir / 'logs'}\n")
        err.write(port_lines(settings.bootstrap_servers, plan, spark_status_path))
        local = {"CBGP_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "CBGP_TOPIC_PREFIX": settings.topic_prefix,
                 "CBGP_REBALANCE_TIMEOUT_MS": env.get("CBGP_REBALANCE_TIMEOUT_MS", "")}
        if plain_setting(DOORBELL_DIR_ENV, env[DOORBELL_DIR_ENV]):  # (in the run file: cbgp publish rings too)
            local[DOORBELL_DIR_ENV] = env[DOORBELL_DIR_ENV]
        for name, _argv, ports in plan:
            if "console" in ports:
                local["CBGP_GATEWAY_URL"] = f"http://127.0.0.1:{ports['console']}"
                token = _gateway_token(run_dir / "gateway.token")
                local["CBGP_GATEWAY_TOKEN"] = token
                err.write(f"run: console: open http://127.0.0.1:{ports['console']}/#token={token} in a browser (the "
                          "gateway needs this token; it is also CBGP_GATEWAY_TOKEN in the run file)\n")
        env_file = write_run_env(run_dir, {k: v for k, v in local.items() if v})
        err.write(f"run: cbgp commands find this fleet through {env_file} (e.g. .venv/bin/cbgp list)\n")
        # Step 4: the demo (with an endpoint for the SERVICE query when the background service runs).
        if not args.no_demo and not stop.stopping:
            _register_and_publish(settings, registry, err, background)
        # Step 5: the live view, until asked to stop; the embedded broker's internal logs trimmed meanwhile.
        if broker is not None and args.trim_interval > 0:
            trimmer = Trimmer(settings, args.trim_interval, run_dir / "logs" / "trimmer.log").start()
        view = LiveView(settings, err, spark_status_path=None if args.no_spark else spark_status_path)
        clock = Clock(settings) if not args.no_demo else None
        started = time.monotonic()
        while not stop.stopping and (args.duration is None or time.monotonic() - started < args.duration):
            if clock is not None:
                clock.tick()
            if background is not None:
                background.tick()
            view.pump(1.0)
            view.draw(children, time.monotonic() - started)
        if clock is not None:
            clock.close()
        last = view.last  # (decoded once: thousands of queries)
        summary["queries"] = {q: {"answers": n, "last": last.get(q, [])} for q, n in view.counts.items()}
        return 0
    except Exception as exc:  # noqa: BLE001 - one readable line, then the same orderly shutdown
        err.write(f"run: error: {type(exc).__name__}: {exc}\n")
        return 1
    finally:
        # Step 6: children (SIGTERM, then SIGKILL after the grace period), then the broker last.
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the shutdown short
        if trimmer is not None:
            trimmer.close()
        if view is not None:
            view.close()
        for child in children:
            child.signal(signal.SIGTERM)
        for child in children:
            summary["children"][child.name] = {"pid": child.pid, "exit": child.stop(grace=args.grace)}
        if background is not None:
            background.close()
        if env_file is not None:
            env_file.unlink(missing_ok=True)
        if bell_dir is not None:
            shutil.rmtree(bell_dir, ignore_errors=True)
        (run_dir / "gateway.token").unlink(missing_ok=True)
        if broker is not None:
            broker.stop()
        err.write("run: stopped " + ", ".join(f"{n} ({c['exit']})" for n, c in summary["children"].items())
                  + (" and the broker" if broker is not None else "") + "\n")
        summary_path = run_dir / "summary.json"
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
        if args.json:
            out.write(json.dumps(summary) + "\n")
            out.flush()
        else:
            err.write(f"run: what each query answered and how each process ended: {summary_path}\n")


def main(argv: list[str] | None = None) -> int:
    tune_gc()  # (as every cbgp process)
    parser = argparse.ArgumentParser(prog="python -m services.commands.run", description=__doc__.split("\n")[0])
    add_kafka_flags(parser)
    parser.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds (default: Ctrl-C)")
    parser.add_argument("--no-demo", action="store_true", help="start the fleet only (no queries, no data)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--no-spark", action="store_true",
                        help="no Spark job: workers multiply multi-part queries, windowed queries get no answers")
    parser.add_argument("--run-dir", default=".run", help="broker data, logs and state (default .run)")
    parser.add_argument("--grace", type=float, default=10.0, metavar="S",
                        help="seconds a child gets to exit after SIGTERM before SIGKILL (default 10)")
    parser.add_argument("--trim-interval", type=float, default=os.environ.get("CBGP_TRIM_INTERVAL", "10"),
                        metavar="S", help="with the embedded broker, delete what the fleet no longer needs of its "
                        "internal logs every S seconds (services.commands.trimmer; default $CBGP_TRIM_INTERVAL or 10; "
                        "0: never)")
    parser.add_argument("--json", action="store_true",
                        help="also print the run's summary (RUN_DIR/summary.json) as one JSON line on stdout")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
