"""Helpers for the fleet's end-to-end tests and benchmark: a generated stream, the fleet as real processes,
and readers that turn the output topics into comparable multisets."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import shutil
import sys
import tempfile
import time
import warnings
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable

from cbgp.query.plan import decompose
from cbgp.terms import from_sparql_json
from confluent_kafka import KafkaException

from services import codec
from services.codec import canonical_binding, term_from_avro
from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets, make_producer, produce_sync, read_all
from services.wire.registrations import read_query, read_registration
from services.wire.records import query_partition

ROOT = Path(__file__).resolve().parents[1]
CBGP = str(ROOT / ".venv" / "bin" / "cbgp")
EX = "http://example.org/"


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """``predicate()``'s first truthy value, polled every 0.1 s; TimeoutError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"{what} not reached in {timeout} s")


def ingest_snapshot_at_end(settings: KafkaSettings, seq: int = 0) -> Any:
    """Ingest's last snapshot in Kafka (a ``CheckpointLog`` record) if it reflects every record of updates.encoded,
    which is not empty, and every change up to ``seq``; else None (for ``wait_for``).  "Every record" alone
    is only what ingest has committed so far: a caller that published N changes passes ``seq=N``."""
    from services.state import presence
    from services.kafka.checkpoint_log import CheckpointLog

    remote = CheckpointLog(settings, {"ingest": settings.topic("checkpoints.ingest")}, "test")
    try:
        saved = remote.get("ingest", 0)
    finally:
        remote.close()
    high = end_offsets(settings, settings.topic("updates.encoded"))[0][1]
    if saved is None or saved.position != high or high == 0:
        return None
    if seq == 0:
        return saved
    loaded = presence.load_snapshot(saved.blob)
    return saved if loaded is not None and loaded[0]["facts"]["seq"] >= seq else None

QUERIES = {
    # single star: by centre value over updates.routed
    "star": f"SELECT ?x WHERE {{ ?x <{EX}type> <{EX}Person> . ?x <{EX}likes> <{EX}Pizza> }}",
    # 2-hop path, a single-centre component: by the value of ?b
    "path": f"SELECT ?a ?b ?c WHERE {{ ?a <{EX}knows> ?b . ?b <{EX}knows> ?c }}",
    # product of two stars: single owner, on updates.encoded
    "product": f"SELECT ?x ?y WHERE {{ ?x <{EX}type> <{EX}Robot> . ?y <{EX}likes> <{EX}Tea> }}",
    # DISTINCT projection of a star with an attribute variable: by centre, DISTINCT applied by answers
    "names": f"SELECT DISTINCT ?n WHERE {{ ?x <{EX}name> ?n . ?x <{EX}type> <{EX}Person> }}",
    # DISTINCT of a 2-hop path without its centre: rows of several partitions coincide
    "fof": f"SELECT DISTINCT ?a WHERE {{ ?a <{EX}knows> ?b . ?b <{EX}likes> <{EX}Jazz> }}",
    # multi-centre components: each star at its centre value's partition, joined by probes between partitions
    "path3": f"SELECT ?a ?d WHERE {{ ?a <{EX}knows> ?b . ?b <{EX}knows> ?c . ?c <{EX}likes> ?d }}",
    "triangle": f"SELECT * WHERE {{ ?a <{EX}knows> ?b . ?b <{EX}knows> ?c . ?c <{EX}knows> ?a }}",
}


def generate_patch(n: int, seed: int = 7, subjects: int = 40, graphs: int = 0) -> list[str]:
    """``n`` RDF Patch lines: ~20% deletions (some of absent triples), duplicate inserts, literals; with
    ``graphs``, most triples whose object is an IRI go to one of that many named graphs (quads)."""
    rng = random.Random(seed)
    present: list[str] = []
    lines: list[str] = []

    def new() -> str:
        triple = _triple(rng, subjects)
        if graphs and triple.endswith(">") and rng.random() < 0.8:
            triple += f" <{EX}g{rng.randrange(graphs)}>"
        return triple

    for _ in range(n):
        r = rng.random()
        if r < 0.2 and present:
            triple = present.pop(rng.randrange(len(present))) if rng.random() < 0.8 else new()
            lines.append(f"D {triple} .")
        elif r < 0.27 and present:
            lines.append(f"A {rng.choice(present)} .")  # duplicate insert: no effect
        else:
            triple = new()
            present.append(triple)
            lines.append(f"A {triple} .")
    return lines


def _triple(rng: random.Random, subjects: int) -> str:
    s = f"<{EX}s{rng.randrange(subjects)}>"
    kind = rng.randrange(5)
    if kind == 0:
        return f"{s} <{EX}knows> <{EX}s{rng.randrange(subjects)}>"
    if kind == 1:
        return f"{s} <{EX}type> <{EX}{rng.choice(['Person', 'Robot', 'Cat'])}>"
    if kind == 2:
        return f"{s} <{EX}likes> <{EX}{rng.choice(['Pizza', 'Tea', 'Jazz'])}>"
    if kind == 3:
        return f'{s} <{EX}name> "name {rng.randrange(12)}"@en'
    return f'{s} <{EX}age> "{rng.randrange(90)}"^^<http://www.w3.org/2001/XMLSchema#integer>'


def replay(tmp: Path, lines: list[str], queries: dict[str, str]) -> dict[str, list[tuple[str, str]]]:
    """``cbgp replay``'s deltas per query, as (sign, canonical binding) in order."""
    patch = tmp / "stream.rdfp"
    patch.write_text("\n".join(lines) + "\n")
    args = [CBGP, "replay", "--patch", str(patch)]
    for name, text in queries.items():
        path = tmp / f"{name}.rq"
        path.write_text(text)
        args += ["--query", f"{name}={path}"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True)
    out: dict[str, list[tuple[str, str]]] = {name: [] for name in queries}
    for line in done.stdout.splitlines():
        d = json.loads(line)
        binding = {var: from_sparql_json(term) for var, term in d["binding"].items()}
        out[d["query"]].append((d["sign"], canonical_binding(binding)))
    return out


def final_answers(deltas: Iterable[tuple[str, str]]) -> Counter:
    current: Counter = Counter()
    for sign, binding in deltas:
        current[binding] += 1 if sign == "+" else -1
    return +current


# ------------------------------------------------------------------------------------------ Kafka side


def metric_total(url: str, metric: str) -> float:
    """The sum of ``metric`` over all its label sets (or its one unlabelled sample) at ``url`` (0 if absent)."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return sum(float(v) for v in re.findall(rf"^{metric}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))


def publish_patch(settings: KafkaSettings, lines: list[str], per_message: int = 50) -> None:
    producer = make_producer(settings)
    topic = settings.topic("updates.raw")
    for i in range(0, len(lines), per_message):
        producer.produce(topic, ("\n".join(lines[i:i + per_message]) + "\n").encode(), partition=0)
        producer.poll(0)
    producer.flush(30)


def publish_plan(settings: KafkaSettings, query_id: str, sparql: str, version: int = 1, seq: int | None = None,
                 options: dict[str, str] | None = None) -> None:
    """A QueryPlan as the registry would publish it (for tests that bypass the registry): registered at the
    current end of updates.encoded unless ``seq`` says otherwise."""
    if seq is None:
        try:
            seq = end_offsets(settings, settings.topic("updates.encoded")).get(0, (0, 0))[1]
        except KafkaException:  # not created yet: nothing was ingested
            seq = 0
    plain, window = read_registration(sparql, options or {})
    parsed, operators = read_query(plain, window)
    if parsed is None:  # an operator query, as the registry describes it
        from services.registry.core import operator_columns, operator_placement, operator_plan

        plan_json, projected = operator_plan(operators, operator_placement(operators, False)), \
            operator_columns(operators)
    else:
        plan = decompose(parsed)
        plan_json, projected = plan.to_json(), list(plan.query.projected)
    record = {"query_id": query_id, "sparql": sparql, "options": options or {}, "plan_json": json.dumps(plan_json),
              "projected": projected, "registered_at_seq": seq, "version": version}
    partition = query_partition(query_id, settings.partitions)
    produce_sync(make_producer(settings), settings.topic("queries.plans"), codec.encode("QueryPlan", record),
                 query_id.encode(), partition=partition)


def unpublish_plan(settings: KafkaSettings, query_id: str) -> None:
    produce_sync(make_producer(settings), settings.topic("queries.plans"), None, query_id.encode(),
                 partition=query_partition(query_id, settings.partitions))


def read_answers(settings: KafkaSettings) -> dict[str, list[dict]]:
    """Every Answer per query, in n order, with its binding canonicalised under ``"key"``."""
    out: dict[str, list[dict]] = {}
    for msg in read_all(settings, settings.topic("answers"), timeout=30):
        record = codec.decode("Answer", msg.value())
        record["key"] = canonical_binding({v: term_from_avro(t) for v, t in record["binding"].items()})
        out.setdefault(record["query_id"], []).append(record)
    for records in out.values():
        records.sort(key=lambda r: r["n"])
    return out


def read_current(settings: KafkaSettings) -> dict[str, Counter]:
    """answers.current folded (last record per key wins, tombstones delete): query -> binding multiset."""
    latest: dict[bytes, bytes | None] = {}
    for msg in read_all(settings, settings.topic("answers.current"), timeout=30):
        latest[msg.key()] = msg.value()
    out: dict[str, Counter] = {}
    for value in latest.values():
        if value is None:
            continue
        record = codec.decode("CurrentAnswer", value)
        key = canonical_binding({v: term_from_avro(t) for v, t in record["binding"].items()})
        out.setdefault(record["query_id"], Counter())[key] = record["multiplicity"]
    return out


def wait_answers(settings: KafkaSettings, counts: dict[str, int], timeout: float = 90.0) -> dict[str, list[dict]]:
    """Poll the answers topic until every query has at least its expected number of answers."""
    deadline = time.monotonic() + timeout
    while True:
        got = read_answers(settings)
        if all(len(got.get(q, [])) >= n for q, n in counts.items()):
            return got
        if time.monotonic() > deadline:
            have = {q: len(got.get(q, [])) for q in counts}
            raise TimeoutError(f"answers incomplete after {timeout}s: have {have}, want {counts}")
        time.sleep(0.5)


class Fleet:
    """Services as real processes (``cbgp <service> ...``), stopped by PID with SIGTERM at the end."""

    def __init__(self, settings: KafkaSettings, logs: Path) -> None:
        self.settings = settings
        self.logs = logs
        self.procs: dict[str, subprocess.Popen] = {}
        logs.mkdir(parents=True, exist_ok=True)
        # The services ring each other as under `cbgp run` (a short path: a test's own is too long for a socket).
        self.doorbell = Path(tempfile.mkdtemp(prefix="cbgp-bell-"))

    def start(self, name: str, service: str, *args: str) -> subprocess.Popen:
        # A stop's grace and its last resort (services.runtime.life.Stopper) end within stop()'s 30 s.
        env = {"CBGP_STOP_GRACE_SECONDS": "10", "CBGP_DOORBELL_DIR": str(self.doorbell), **os.environ,
               **self.settings.to_env(), "PYTHONUNBUFFERED": "1"}
        log = open(self.logs / f"{name}.log", "ab")
        proc = subprocess.Popen([CBGP, service, "--metrics-port", "0", *args], env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def stop(self, name: str, timeout: float = 30.0) -> int:
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                return proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
                return -9
        return proc.returncode

    def stop_cleanly(self, name: str) -> None:
        """Stop ``name``; it must exit with code 0, or through the stop's documented last resort (a client call
        that blocked holding the interpreter: librdkafka leaving a group mid-rebalance), whose stack dump is
        shown as a warning: bounded, but worth reading."""
        code = self.stop(name)
        text = self.log_text(name)
        if code == 1 and "most recent call first" in text:
            warnings.warn(f"{name} stopped through the last resort; its log ends:\n{text[-6000:]}", stacklevel=2)
            return
        assert code == 0, f"{name} did not exit cleanly on SIGTERM (exit code {code})"

    def log_text(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def metrics_url(self, name: str, timeout: float = 30.0) -> str:
        """The /metrics URL of process ``name`` (it logs its port once started)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(r"event=started metrics_port=(\d+)", self.log_text(name))
            if found:
                return f"http://127.0.0.1:{found.group(1)}/metrics"
            time.sleep(0.2)
        raise TimeoutError(f"{name} did not log its metrics port")

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc: object) -> None:
        for name in list(self.procs):
            self.stop(name)
        shutil.rmtree(self.doorbell, ignore_errors=True)
        if exc[0] is not None:
            for path in sorted(self.logs.glob("*.log")):
                tail = path.read_text(errors="replace").splitlines()[-15:]
                print(f"--- {path.name}\n" + "\n".join(tail), file=sys.stderr)
