"""Fault injection for the fleet: a generated stream flows while services are killed with SIGKILL in
rotation, workers join and leave, and the broker is restarted; then the answers are checked against the
oracle.  Used by ``tests/fleet/test_faults.py`` (short run, CI) and ``bench/faults_run.py`` (long run).

The run, in the spirit of Kafka's ``streams_eos_test`` (rotating kill -9 while a driver produces):

- the fleet is registry + ingest + 2 workers + answers, as real processes on a private embedded broker;
- queries are registered through the registry (AdminCommand), two at the start and the rest right
  before a registry kill, so a REGISTER may be in flight when the registry dies (REGISTER is idempotent:
  a replayed command must not publish a second plan);
- the stream (``generate_patch``: ~20% deletions, duplicate inserts, deletes of absent triples) is
  published in slices, one before every fault event, so every kill hits a fleet that is processing;
- events: SIGKILL of ingest / a worker / answers / registry in rotation (each restarted at once with the
  same instance id, so its transactional id fences the dead one), a worker added (rebalance), a worker
  removed with SIGTERM (rebalance), and graceful broker restarts (stop + start on the same data dir).
  Most kills wait until the victim is ready (so they land mid-processing); every third one does not (so
  some land during start-up and restore).

Static group membership (``group.instance.id`` = the service's name) for every service that gets killed:
noida-db 0.2.3 expires a group member only when that member's own next heartbeat arrives late, so a
SIGKILLed member is never expired and the next JoinGroup waits for it forever (real Kafka removes it
after ``session.timeout.ms``; reproduction in ``bench/faults_run.py --noida-expiry``).  A restarted static
member replaces its dead self at once, which is also what a StatefulSet deployment wants.  The worker
that is added and removed mid-stream is a dynamic member (it leaves the group on SIGTERM).  For the same
reason every event waits until the consumer groups are stable with every member assigned: a rebalance that
starts while a dead member is still in the group (e.g. a worker leaving while another one was just killed)
waits for that member forever on noida-db, which Kafka would have expired.  The kills themselves still land
while records are being processed.

What is checked (:func:`check_run`), per query, on the answers topic read with read_committed:

- numbering: after deduplication by ``(query, n)`` (which ``cbgp watch`` documents: "duplicates (n already
  seen) are dropped") the numbers are exactly 1..N; records sharing an ``n`` must be identical; the
  ``cbgp-src`` idempotence keys of the kept records are all distinct (a second record for one source
  delta would be a duplicate delivered to users even after deduplication by n);
- replaying the deltas in n order never removes an absent answer, and ends at the oracle's answers
  (pyoxigraph over the final graph), which also equal ``cbgp replay``'s final answers;
- answers.current folds to the same answers; no dead letters; one plan version per query.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cbgp.inputs.formats import Update, parse_input
from services import codec
from services.answers.core import SOURCE_HEADER
from services.codec import canonical_binding, term_from_avro

from services.kafka.config import KafkaSettings
from services.kafka.client import make_producer, produce_sync, read_all
from services.kafka.broker import EmbeddedBroker, free_port
from services.commands.floor import trim
from tests.fleet_support import CBGP, EX, QUERIES, Fleet, final_answers, generate_patch, read_current, replay
from tests.oracle import OracleGraph

FAULT_QUERIES = {
    **QUERIES,
    # ground-gated product: a ground part plus a star (the ground bit toggles with deletions)
    "gated": f"SELECT ?x WHERE {{ <{EX}s1> <{EX}knows> <{EX}s2> . ?x <{EX}likes> <{EX}Jazz> }}",
    # operator queries by centre: the leaves on the routed partitions, the operators at the answers service
    # (a kill -9 of answers rebuilds them from the part deltas it had released)
    "optional": f"SELECT ?x ?n WHERE {{ ?x <{EX}type> <{EX}Person> OPTIONAL {{ ?x <{EX}name> ?n }} }}",
    "counted": (f"SELECT ?x (COUNT(?y) AS ?c) WHERE {{ ?x <{EX}knows> ?y . ?y <{EX}knows> ?z }} GROUP BY ?x "
                f"HAVING (COUNT(?y) > 1)"),
    # a whole query (variable predicates whose patterns share no end: its single owner evaluates it on
    # updates.encoded)
    "likers": f"SELECT ?x ?p WHERE {{ ?x ?p ?y . ?y ?q <{EX}Pizza> FILTER(?p != <{EX}type>) }}",
}
KILL_ROTATION = ("ingest", "worker", "answers", "registry")


DEFAULT_SERVICES = KILL_ROTATION


@dataclass
class FaultConfig:
    kills: int = 8  # SIGKILLs in total, rotating over ``services`` (two of each by default)
    services: tuple[str, ...] = DEFAULT_SERVICES
    broker_restarts: int = 1  # graceful stop + start on the same data dir
    add_remove_worker: bool = True  # one worker joins and one leaves mid-stream (two rebalances)
    lines: int = 3000
    seed: int = 5
    settle_timeout: float = 180.0  # after the last event, how long the fleet gets to converge
    # Static group membership for the killed services (needed on noida-db, see the module doc).  After a
    # broker restart noida-db never lets a static member back into its group, so runs with broker restarts
    # use dynamic members and no kills (``bench/faults_run.py --kills 0 --broker-restarts N``).
    static_members: bool = True

    @classmethod
    def from_env(cls, **defaults: object) -> "FaultConfig":
        """``CBGP_FAULT_KILLS``, ``CBGP_FAULT_BROKER_RESTARTS``, ``CBGP_FAULT_LINES``, ``CBGP_FAULT_SEED``,
        ``CBGP_FAULT_SETTLE`` (seconds), ``CBGP_FAULT_SERVICES`` (comma-separated, from
        ingest,worker,answers,registry)."""
        cfg = cls(**defaults)  # type: ignore[arg-type]
        if os.environ.get("CBGP_FAULT_SERVICES"):
            cfg.services = tuple(s.strip() for s in os.environ["CBGP_FAULT_SERVICES"].split(",") if s.strip())
            unknown = set(cfg.services) - set(KILL_ROTATION)
            if unknown:
                raise ValueError(f"CBGP_FAULT_SERVICES: unknown services {sorted(unknown)}")
        for var, name in (("CBGP_FAULT_KILLS", "kills"), ("CBGP_FAULT_BROKER_RESTARTS", "broker_restarts"),
                          ("CBGP_FAULT_LINES", "lines"), ("CBGP_FAULT_SEED", "seed")):
            if os.environ.get(var):
                setattr(cfg, name, int(os.environ[var]))
        if os.environ.get("CBGP_FAULT_SETTLE"):
            cfg.settle_timeout = float(os.environ["CBGP_FAULT_SETTLE"])
        return cfg


@dataclass
class FaultReport:
    kills: Counter = field(default_factory=Counter)
    rebalances: int = 0  # workers added or removed (each changes the group's membership)
    broker_restarts: int = 0
    registrations: int = 0
    lines: int = 0
    raw_records: int = 0
    answers: int = 0  # records on the answers topic
    duplicate_n: int = 0  # records whose (query, n) was already seen: dropped by `cbgp watch`
    duplicates_delivered: int = 0  # after deduplication by (query, n): a source delta delivered twice
    answers_lost: int = 0  # oracle answers missing from the replayed deltas
    answers_extra: int = 0  # replayed answers the oracle does not have
    seconds: float = 0.0
    survivors: dict[str, bool] = field(default_factory=dict)  # not-killed processes still alive at the end
    problems: list[str] = field(default_factory=list)

    def table(self) -> str:
        rows = [("kills (SIGKILL) per service", ", ".join(f"{k} {v}" for k, v in sorted(self.kills.items()))),
                ("kills in total", str(sum(self.kills.values()))),
                ("rebalances (worker added/removed)", str(self.rebalances)),
                ("broker restarts (graceful)", str(self.broker_restarts)),
                ("registrations through the registry", str(self.registrations)),
                ("updates published", f"{self.lines} lines in {self.raw_records} records"),
                ("answers records", str(self.answers)),
                ("records with a repeated (query, n)", str(self.duplicate_n)),
                ("answers lost", str(self.answers_lost)),
                ("answers extra", str(self.answers_extra)),
                ("duplicates delivered after dedup", str(self.duplicates_delivered)),
                ("run time", f"{self.seconds:.0f} s")]
        width = max(len(r[0]) for r in rows)
        return "\n".join(f"{a:<{width}}  {b}" for a, b in rows)


# ---------------------------------------------------------------------------------------- oracle


def unassigned(admin, group) -> dict[str, list[int]]:
    """The partitions of the topics a described consumer group consumes that no member of it owns."""
    owned: dict[str, set[int]] = {}
    for member in group.members:
        for tp in member.assignment.topic_partitions:
            owned.setdefault(tp.topic, set()).add(tp.partition)
    if not owned:
        return {}
    topics = admin.list_topics(timeout=10).topics
    return {topic: sorted(set(topics[topic].partitions) - parts) for topic, parts in owned.items()
            if topic in topics and set(topics[topic].partitions) - parts}


def oracle_answers(lines: list[str], queries: dict[str, str]) -> dict[str, Counter]:
    """pyoxigraph's answers over the graph the patch lines leave, as canonical binding JSON multisets."""
    graph = OracleGraph()
    for item in parse_input("\n".join(lines) + "\n", "patch"):
        assert isinstance(item, Update), f"the generated stream must be valid: {item}"
        graph.apply(item.op, item.s, item.p, item.o, item.g)
    out: dict[str, Counter] = {}
    for name, text in queries.items():
        out[name] = Counter({canonical_binding(dict(row)): count for row, count in graph.answers(text).items()})
    return out


# ---------------------------------------------------------------------------------------- topic readers


def read_answer_records(settings: KafkaSettings,
                        earlier: dict[str, list[dict]] | None = None) -> dict[str, list[dict]]:
    """Every Answer per query in log order, with ``key`` (canonical binding), ``src`` (idempotence key) and ``pos``
    (partition, offset); with the records an ``earlier`` call read, before records were deleted, as well."""
    out: dict[str, list[dict]] = {}
    for msg in read_all(settings, settings.topic("answers"), timeout=60):
        record = codec.decode("Answer", msg.value())
        record["key"] = canonical_binding({v: term_from_avro(t) for v, t in record["binding"].items()})
        headers = dict(msg.headers() or ())
        record["src"] = (headers.get(SOURCE_HEADER) or b"").decode()
        record["pos"] = (msg.partition(), msg.offset())
        out.setdefault(record["query_id"], []).append(record)
    for query, records in (earlier or {}).items():
        merged = {r["pos"]: r for r in records} | {r["pos"]: r for r in out.get(query, [])}
        out[query] = [merged[pos] for pos in sorted(merged)]
    return out


def dedupe_by_n(records: list[dict]) -> tuple[list[dict], list[str]]:
    """Keep the first record of every n (what ``cbgp watch`` does); problems if a repeat differs."""
    kept: dict[int, dict] = {}
    problems = []
    for r in records:
        first = kept.setdefault(r["n"], r)
        if first is not r and (first["sign"], first["key"], first["src"]) != (r["sign"], r["key"], r["src"]):
            problems.append(f"n={r['n']} delivered twice with different content")
    return [kept[n] for n in sorted(kept)], problems


def fold(records: list[dict]) -> tuple[Counter, list[str]]:
    """Replay deltas in n order; a '-' of an absent answer is a contract violation."""
    current: Counter = Counter()
    problems = []
    for r in records:
        if r["sign"] == "+":
            current[r["key"]] += 1
        else:
            if current[r["key"]] <= 0:
                problems.append(f"n={r['n']}: '-' of an absent answer {r['key']}")
            current[r["key"]] -= 1
    return +current, problems


# ---------------------------------------------------------------------------------------- the run


class FaultRun:
    """One fault run on ``broker`` (private to the run: it gets restarted)."""

    def __init__(self, broker: EmbeddedBroker, settings: KafkaSettings, tmp: Path, cfg: FaultConfig,
                 log: Callable[[str], None] = lambda _s: None) -> None:
        self.broker, self.settings, self.tmp, self.cfg, self.log = broker, settings, tmp, cfg, log
        self.rng = random.Random(cfg.seed)
        self.fleet = Fleet(settings, tmp / "logs")
        self.report = FaultReport()
        self.workers: list[str] = []  # static members: killed and restarted
        self.dynamic_workers: list[str] = []  # dynamic members: added and removed (rebalances)
        self.next_worker = 0
        self.log_offset: dict[str, int] = {}
        self.web_port = self.registry_metrics = 0
        self.killed: set[str] = set()  # names whose first process was killed (not expected to survive)
        self.first_pids: dict[str, int] = {}
        self.dead: dict[str, str] = {}  # never-killed processes found dead at the end: exit code, log tail
        self.pending_queries = list(FAULT_QUERIES)
        self.registered: list[str] = []
        self.request_ids: list[str] = []
        self.lines = generate_patch(cfg.lines, seed=cfg.seed)
        self.producer = None
        self.early_replies: dict[str, dict] = {}  # replies and dead letters read before a deletion below the floor
        self.early_dead = 0
        self.early_answers: dict[str, list[dict]] = {}
        # checkpoints every second, so that restarts restore from them (and the tail after them) as well
        self.state_flags = ["--state-dir", str(self.tmp / "state"), "--checkpoint-interval", "1"]

    # -- services

    def start(self, name: str, static: bool | None = None) -> None:
        """Start (or restart) service ``name`` as a real process; ``static``: fixed group.instance.id."""
        metrics_port = "0"
        if name == "registry":
            self.web_port, self.registry_metrics = free_port(), free_port()
            metrics_port = str(self.registry_metrics)
            args = ["registry", "--web-port", str(self.web_port), "--state-dir", str(self.tmp / "registry-state")]
        elif name == "ingest":
            args = ["ingest", "--instance-id", "i1", *self.state_flags]
        elif name == "answers":
            args = ["answers", "--instance-id", "a1", *self.state_flags]
        else:
            args = ["worker", "--worker-id", name, *self.state_flags]
        env = {**os.environ, **self.settings.to_env(), "PYTHONUNBUFFERED": "1"}
        if self.cfg.static_members if static is None else static:
            env["CBGP_KAFKA_GROUP_INSTANCE_ID"] = f"{self.settings.topic_prefix}{name}"  # librdkafka consumers
            env["CONSUMER_GROUP_INSTANCE_ID"] = f"{self.settings.topic_prefix}{name}"  # faust (registry)
        log_path = self.fleet.logs / f"{name}.log"
        self.log_offset[name] = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log:
            proc = subprocess.Popen([CBGP, *args[:1], "--metrics-port", metrics_port, *args[1:]], env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.fleet.procs[name] = proc
        self.first_pids.setdefault(name, proc.pid)

    def wait_ready(self, name: str, timeout: float = 60.0) -> None:
        """Until the current process of ``name`` says it is ready (/readyz, or the registry's web view)."""
        deadline = time.monotonic() + timeout
        log_path = self.fleet.logs / f"{name}.log"
        while time.monotonic() < deadline:
            try:
                if name == "registry":
                    url = f"http://127.0.0.1:{self.registry_metrics}/readyz"  # table recovered and reconciled
                else:
                    with open(log_path, "rb") as f:
                        f.seek(self.log_offset[name])
                        found = re.search(rb"event=started metrics_port=(\d+)", f.read())
                    if not found:
                        raise OSError("not started")
                    url = f"http://127.0.0.1:{int(found.group(1))}/readyz"
                urllib.request.urlopen(url, timeout=2).read()
                return
            except OSError:
                time.sleep(0.2)
        self.log(f"{name} not ready after {timeout:.0f}s")

    def wait_groups_stable(self, timeout: float = 60.0) -> None:
        """Until ingest, workers and answers groups are Stable with the expected members, all assigned."""
        from confluent_kafka.admin import AdminClient

        want = {"ingest": 1, "answers": 1, "workers": len(self.workers) + len(self.dynamic_workers)}
        admin = AdminClient(self.settings.admin_config())
        deadline = time.monotonic() + timeout
        state: dict = {}
        while time.monotonic() < deadline:
            state = self.group_state(admin)
            if "error" in state:  # the broker may be restarting: ask again
                time.sleep(0.5)
                continue
            if "workers unassigned" not in state and all(
                    name == "STABLE" and len(sizes) == want[g] and all(sizes) for g, (name, sizes) in state.items()):
                return
            time.sleep(0.3)
        self.log(f"groups not stable after {timeout:.0f}s: {state}")

    def group_state(self, admin) -> dict:
        """Each data-path group's state and its members' partition counts, and the workers' unowned partitions."""
        groups = {f"{self.settings.topic_prefix}{g}": g for g in ("ingest", "answers", "workers")}
        try:
            described = {groups[gid]: f.result(10) for gid, f in admin.describe_consumer_groups(list(groups)).items()}
        except Exception as exc:  # noqa: BLE001 - reported, not raised: callers ask again or only log it
            return {"error": str(exc)}
        state: dict = {g: (d.state.name, [len(m.assignment.topic_partitions) for m in d.members])
                       for g, d in described.items()}
        orphans = unassigned(admin, described["workers"])
        if orphans:
            state["workers unassigned"] = orphans
        return state

    def wait_assigned(self, name: str, timeout: float = 60.0) -> None:
        """Until the current process of worker ``name`` has taken partitions from a finished rebalance.  A worker
        stopped before that leaves its group in the middle of a rebalance, and noida-db 0.2.3 then completes
        the rebalance with the leaver's share and starts no new one: its partitions would have no owner
        (Kafka starts another rebalance)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.fleet.logs / f"{name}.log", "rb") as f:
                f.seek(self.log_offset[name])
                if re.search(rb"event=assigned partitions=\d", f.read()):
                    return
            time.sleep(0.2)
        self.log(f"{name} took no partitions in {timeout:.0f}s")

    def add_worker(self, static: bool | None = None) -> str:
        name = f"w{self.next_worker}"
        self.next_worker += 1
        (self.dynamic_workers if static is False else self.workers).append(name)
        self.start(name, static)
        return name

    def kill(self, service: str) -> None:
        name = self.rng.choice(self.workers) if service == "worker" else service
        if self.report.kills[service] % 3 != 2:
            self.wait_ready(name)  # mid-processing; every third kill may hit start-up or restore instead
        proc = self.fleet.procs[name]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self.killed.add(name)
        self.report.kills[service] += 1
        self.log(f"kill -9 {name} (pid {proc.pid})")
        self.start(name)

    # -- inputs

    def admin(self, kind: str, query_id: str, sparql: str | None = None) -> None:
        request_id = f"{kind.lower()}-{query_id}-{len(self.request_ids)}"
        self.request_ids.append(request_id)
        produce_sync(make_producer(self.settings), self.settings.topic("admin"), codec.encode("AdminCommand", {
            "command": kind, "query_id": query_id, "sparql": sparql, "options": {}, "request_id": request_id}))

    def register_next(self) -> None:
        """The next unregistered query, or (all done) a retry of a registered one, which must be a no-op."""
        if self.pending_queries:
            name = self.pending_queries.pop(0)
            self.registered.append(name)
        else:
            name = self.rng.choice(self.registered)
        self.admin("REGISTER", name, FAULT_QUERIES[name])
        self.report.registrations += 1
        self.log(f"register {name}")

    def publish(self, lines: list[str], per_message: int = 25) -> None:
        topic = self.settings.topic("updates.raw")
        for i in range(0, len(lines), per_message):
            self.producer.produce(topic, ("\n".join(lines[i:i + per_message]) + "\n").encode(), partition=0)
            self.producer.poll(0)
            self.report.raw_records += 1
        assert self.producer.flush(60) == 0, "the broker did not acknowledge the published updates"
        self.report.lines += len(lines)

    # -- schedule

    def events(self) -> list[str]:
        services = self.cfg.services
        events = [services[i % len(services)] for i in range(self.cfg.kills)]
        extra = ["broker"] * self.cfg.broker_restarts + (["add", "remove"] if self.cfg.add_remove_worker else [])
        for i, event in enumerate(extra):  # spread evenly, "add" before "remove"
            events.insert(round((i + 1) * len(events) / (len(extra) + 1)) + i, event)
        return events

    def run(self) -> FaultReport:
        started = time.monotonic()
        self.producer = make_producer(self.settings)
        events = self.events()
        slices = len(events) + 1
        size = -(-len(self.lines) // slices)
        chunks = [self.lines[i * size:(i + 1) * size] for i in range(slices)]
        with self.fleet:
            for name in ("registry", "ingest", "answers"):
                self.start(name)
            for _ in range(2):
                self.add_worker()
            self.register_next()
            self.register_next()
            # Without registry kills, the other registrations are spread over the run (late registrations
            # take a snapshot while the fleet is being killed); with them, each registry kill brings one.
            spread = [] if "registry" in self.cfg.services else \
                [round((k + 1) * len(events) / (len(self.pending_queries) + 1)) for k in range(len(self.pending_queries))]
            for i, event in enumerate(events):
                if i in spread:
                    self.register_next()
                self.publish(chunks[i])
                if event == "broker":
                    # Restart while the slice is being processed, so that transactions are open when the
                    # broker stops (and the fleet's groups are still settling from the previous event).
                    time.sleep(self.rng.uniform(0.05, 0.4))
                else:
                    time.sleep(self.rng.uniform(0.5, 2.0))  # let the fleet get into the slice
                    self.wait_groups_stable()
                self.log(f"event {i + 1}/{len(events)}: {event}")
                if event == "registry":
                    self.register_next()
                    time.sleep(self.rng.uniform(0.0, 1.5))  # may kill before, during or after the command
                    self.kill("registry")
                elif event in ("ingest", "answers", "worker"):
                    self.kill(event)
                elif event == "add":
                    self.log(f"add worker {self.add_worker(static=False)}")
                    self.report.rebalances += 1
                elif event == "remove":
                    self.wait_assigned(self.dynamic_workers[0])
                    name = self.dynamic_workers.pop(0)
                    code = self.fleet.stop(name)
                    self.log(f"remove worker {name} (SIGTERM, exit {code})")
                    if code != 0:
                        self.report.problems.append(f"worker {name} exited {code} on SIGTERM")
                    self.report.rebalances += 1
                elif event == "broker":
                    self.broker.restart()
                    self.report.broker_restarts += 1
                    self.log("broker restarted")
            self.publish(chunks[-1])
            while self.pending_queries:
                self.register_next()
            self.settle()
            self.report.survivors = {name: proc.poll() is None and proc.pid == self.first_pids[name]
                                     for name, proc in self.fleet.procs.items() if name not in self.killed}
            # what check() reports of a process found dead (the fleet's processes are gone by then)
            self.dead = {name: f"exit {proc.poll()}; its log ends: {self.log_tail(name)}"
                         for name, proc in self.fleet.procs.items() if proc.poll() is not None}
        self.report.seconds = time.monotonic() - started
        return self.report

    def run_below_floor(self, lose_disks: tuple[str, ...] = (), late: tuple[str, ...] = ()) -> dict[str, dict[str, int]]:
        """The retention run: every query registered, the first half of the stream published and answered,
        checkpoints taken (every second), then every record below ``cbgp topics floor`` deleted as retention
        would (``AdminClient.delete_records``), every data-path service (ingest, the workers, answers) killed -9
        at once and started again, the second half published.  Returns the floor it deleted below (topic ->
        partition -> offset, only where it deleted something).  The registry's replies and the dead letters
        are read before the deletion: their topics' floor is their end.  ``lose_disks``: the services
        (``ingest``, ``worker``, ``answers``) whose local checkpoint stores are deleted while they are down, as if
        they came back on other machines.  ``late``: queries registered only once the services are back (their
        state comes from ingest's snapshot moved to their point or position, the logs below the floor being gone)."""
        started = time.monotonic()
        self.producer = make_producer(self.settings)
        half = len(self.lines) // 2
        deleted: dict[str, dict[str, int]] = {}
        with self.fleet:
            for name in ("registry", "ingest", "answers"):
                self.start(name)
            for _ in range(2):
                self.add_worker()
            self.pending_queries = [name for name in self.pending_queries if name not in late]
            while self.pending_queries:
                self.register_next()
            quarter = half // 2  # (in two parts, so two of ingest's transactions at least: a routed log's last
            self.publish(self.lines[:quarter])  # changes are then above its first records)
            self.settle_on(self.lines[:quarter])
            self.publish(self.lines[quarter:half])
            self.settle_on(self.lines[:half])
            time.sleep(3.0)  # a checkpoint every second, idle ones too
            self.early_replies = self.replies()
            self.early_answers = read_answer_records(self.settings)  # (the floor lets the checkpointed ones go)
            self.early_dead = len(read_all(self.settings, self.settings.topic("deadletter"), timeout=30))
            deleted = trim(self.settings)  # (what `cbgp topics trim` does)
            self.log(f"deleted below the floor: {deleted}")
            names = ["ingest", "answers", *self.workers]
            for name in names:  # all at once: none restores while another still runs
                os.kill(self.fleet.procs[name].pid, signal.SIGKILL)
            for name in names:
                self.fleet.procs[name].wait(10)
                self.killed.add(name)
                self.report.kills["worker" if name in self.workers else name] += 1
            self.log(f"kill -9 {', '.join(names)}")
            for service in lose_disks:
                for store in (self.tmp / "state").glob(f"*{service}-*"):
                    shutil.rmtree(store)
                    self.log(f"lost the disk of {store.name}")
            for name in names:
                self.start(name)
            self.pending_queries = list(late)
            while self.pending_queries:
                self.register_next()
            self.publish(self.lines[half:])
            self.settle()
            self.report.survivors = {"registry": self.fleet.procs["registry"].poll() is None}
        self.report.seconds = time.monotonic() - started
        return deleted

    def replies(self) -> dict[str, dict]:
        """The registry's replies on queries.status, by request id."""
        statuses = [codec.decode("QueryStatus", m.value())
                    for m in read_all(self.settings, self.settings.topic("queries.status"), timeout=30)]
        return {s["request_id"]: s for s in statuses}

    def log_tail(self, name: str, lines: int = 12) -> str:
        """The last lines of a fleet process's log, for a problem report (CI keeps only pytest's output)."""
        try:
            text = (self.fleet.logs / f"{name}.log").read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"<no log: {exc}>"
        return "\n".join(text[-lines:])

    def settle(self) -> None:
        self.settle_on(self.lines)

    def settle_on(self, lines: list[str]) -> None:
        """Wait until every query's replayed answers equal the oracle's over ``lines`` (or the timeout), then
        a little longer so that late duplicates, if any, are on the topic when it is checked."""
        expected = oracle_answers(lines, FAULT_QUERIES)
        deadline = time.monotonic() + self.cfg.settle_timeout
        while time.monotonic() < deadline:
            got = read_answer_records(self.settings, self.early_answers)
            if all(fold(dedupe_by_n(got.get(q, []))[0])[0] == expected[q] for q in self.registered):
                break
            time.sleep(1.0)
        else:
            self.explain_unsettled(expected)
        time.sleep(2.0)

    def explain_unsettled(self, expected: dict[str, Counter]) -> None:
        """What a run that did not converge looked like at the deadline: which queries lag, the groups, and how
        each live service's log ends (CI keeps only pytest's output, not the fleet's logs)."""
        from confluent_kafka.admin import AdminClient

        got = read_answer_records(self.settings, self.early_answers)
        held = {q: fold(dedupe_by_n(got.get(q, []))[0])[0] for q in self.registered}
        lagging = {q: f"{sum(held[q].values())}/{sum(expected[q].values())}" for q in held if held[q] != expected[q]}
        self.log(f"not settled after {self.cfg.settle_timeout:.0f}s; answers held/expected: {lagging}")
        self.log(f"groups: {self.group_state(AdminClient(self.settings.admin_config()))}")
        for name, proc in self.fleet.procs.items():
            if proc.poll() is not None:
                self.log(f"{name} exited {proc.poll()}")
            else:
                tail = [line[:300] for line in self.log_tail(name, 200).splitlines() if "rdkafka" not in line][-8:]
                self.log(f"{name} log ends:\n" + "\n".join(tail) + self.progress_metrics(name))

    def progress_metrics(self, name: str) -> str:
        """The metrics of service ``name`` that say where a stream stopped: frontiers, held deltas, registrations
        and probes waiting, input lag."""
        try:
            with open(self.fleet.logs / f"{name}.log", "rb") as f:
                f.seek(self.log_offset[name])
                ports = re.findall(rb"event=started metrics_port=(\d+)", f.read())
            if not ports:
                return ""
            text = urllib.request.urlopen(f"http://127.0.0.1:{int(ports[-1])}/metrics", timeout=2).read().decode()
        except OSError as exc:
            return f"\n(no metrics: {exc})"
        wanted = ("cbgp_held_deltas", "cbgp_frontier_seq", "cbgp_release_frontier_seq", "cbgp_gates_waiting",
                  "cbgp_probes_waiting", "cbgp_consumer_lag")
        return "".join(f"\n{line}" for line in text.splitlines() if line.startswith(wanted))

    # -- checks

    def check(self) -> FaultReport:
        """Compare the topics with the oracle and ``cbgp replay``; problems go to ``report.problems``."""
        report, problems = self.report, self.report.problems
        expected = oracle_answers(self.lines, FAULT_QUERIES)
        replayed = replay(self.tmp, self.lines, FAULT_QUERIES)
        got = read_answer_records(self.settings, self.early_answers)
        current = read_current(self.settings)
        for query in FAULT_QUERIES:
            if final_answers(replayed[query]) != expected[query]:
                problems.append(f"{query}: cbgp replay and pyoxigraph disagree (test harness bug)")
            records = got.get(query, [])
            report.answers += len(records)
            kept, dup_problems = dedupe_by_n(records)
            report.duplicate_n += len(records) - len(kept)
            problems += [f"{query}: {p}" for p in dup_problems]
            numbers = [r["n"] for r in kept]
            if numbers != list(range(1, len(kept) + 1)):
                missing = sorted(set(range(1, max(numbers, default=0) + 1)) - set(numbers))
                problems.append(f"{query}: numbering has gaps: missing n {missing[:10]}")
            srcs = Counter(r["src"] for r in kept)
            repeated = {s: c for s, c in srcs.items() if c > 1}
            if "" in srcs:
                problems.append(f"{query}: {srcs['']} answers without a {SOURCE_HEADER} header")
            report.duplicates_delivered += sum(c - 1 for c in repeated.values())
            if repeated:
                problems.append(f"{query}: source deltas delivered more than once: {list(repeated)[:5]}")
            answers, fold_problems = fold(kept)
            problems += [f"{query}: {p}" for p in fold_problems[:5]]
            lost, extra = expected[query] - answers, answers - expected[query]
            report.answers_lost += sum(lost.values())
            report.answers_extra += sum(extra.values())
            if lost or extra:
                problems.append(f"{query}: answers differ from the oracle: lost {list(lost)[:3]}, "
                                f"extra {list(extra)[:3]}")
            if current.get(query, Counter()) != expected[query]:
                problems.append(f"{query}: answers.current differs from the oracle")
            if not expected[query]:
                problems.append(f"{query}: the oracle has no answers (the stream does not exercise it)")
        dead = read_all(self.settings, self.settings.topic("deadletter"), timeout=30)
        if dead or self.early_dead:
            problems.append(f"{len(dead) + self.early_dead} dead letters"
                            + (f", first: {codec.decode('DeadLetter', dead[0].value())}" if dead else ""))
        versions = Counter()
        for msg in read_all(self.settings, self.settings.topic("queries.plans"), timeout=30):
            if msg.value() is not None:
                plan = codec.decode("QueryPlan", msg.value())
                versions[(plan["query_id"], plan["version"])] += 1
        for query in FAULT_QUERIES:
            if versions.get((query, 1), 0) < 1 or any(v > 1 for q, v in versions if q == query):
                problems.append(f"{query}: plan versions on queries.plans: "
                                f"{sorted(k for k in versions if k[0] == query)} (want version 1 only)")
        replies = {**self.early_replies, **self.replies()}  # (a run below the floor deleted the early ones)
        for request_id in self.request_ids:
            reply = replies.get(request_id)
            if reply is None:
                problems.append(f"no registry reply to {request_id}")
            elif reply["status"] != "ACCEPTED":
                problems.append(f"{request_id}: {reply['status']}: {reply['message']}")
        for name, alive in report.survivors.items():
            if not alive:
                problems.append(f"{name} (never killed) did not survive the run with its first PID "
                                f"({self.dead.get(name, 'no record')})")
        for name in sorted(self.killed & set(self.dead)):
            problems.append(f"{name}, restarted after its kill, died ({self.dead[name]})")
        return report


def answers_json(report: FaultReport) -> str:
    data = {k: v for k, v in report.__dict__.items() if k not in ("problems",)}
    data["kills"] = dict(report.kills)
    return json.dumps(data, indent=2, sort_keys=True)
