"""Workers and an answers service whose queries are registered, replaced and unregistered again and again hold what
their current queries need, not something of every registration they ever read (a query per SEPA subscription, a
script that replaces its query every minute): the containers reachable from their cores stop growing."""

from __future__ import annotations

import gc

from services import codec
from services.answers.core import AnswersCore
from services.answers.release import SeqRelease
from services.ingest.core import IngestProcessor, RawRecord
from services.kafka.config import KafkaSettings
from services.wire.records import query_partition
from services.worker.core import WorkerCore
from services.worker.shard import decode_changes
from tests.churn_support import held

EX = "http://ex.org/"
K, L, N = (f"<{EX}{name}>" for name in ("knows", "likes", "name"))
SHAPES = [
    f"SELECT ?x ?n WHERE {{ ?x {N} ?n . ?x {L} ?y }}",  # a star
    f"SELECT * WHERE {{ ?a {K} ?b . ?b {K} ?c . ?c {L} ?d }}",  # a multi-centre path, joined by probes
    f"SELECT ?x (COUNT(?y) AS ?c) WHERE {{ ?x {L} ?y }} GROUP BY ?x",  # operators
    f"SELECT * WHERE {{ <{EX}u1> {K}+ ?y }}",  # a property path's closure
    f"SELECT * WHERE {{ ?x {L} ?y . ?z {N} ?w }}",  # a product of two parts
]
SETTINGS = KafkaSettings(topic_prefix="c.")
TOPICS = {name: SETTINGS.topic(name) for name in ("deltas.parts", "deadletter", "updates.routed", "dictionary")}
NODES = 6


def data(n: int) -> list[str]:
    """Round ``n``'s triples: a few knows, likes and names over a handful of nodes, the same every few rounds."""
    u = [f"<{EX}u{(n + i) % NODES}>" for i in range(3)]
    return [f"{u[0]} {K} {u[1]} .", f"{u[1]} {L} <{EX}p{n % 3}> .", f'{u[2]} {N} "n{n % 4}" .']


class Fleet:
    """Ingest, two workers (one routed partition each, each reading queries.plans at its own pace) and the answers
    service's release and core, in memory: each record goes where the services would send it."""

    def __init__(self) -> None:
        self.ingest = IngestProcessor(SETTINGS, 2, 2)
        self.terms: dict[int, str] = {}
        self.routed: dict[int, list[bytes | None]] = {0: [], 1: []}
        self.encoded: list[bytes] = []
        self.workers = [WorkerCore(TOPICS, 2, 1, 2, self._changes, assemble_in_spark=False,
                                   record_reader=self._records, term_reader=self._terms) for _ in (0, 1)]
        for partition, worker in enumerate(self.workers):
            worker.open_shard("routed", partition, 0, None)
        self.cursors = {0: 0, 1: 0}  # of updates.routed, per worker
        self.plan_log: list[tuple[bytes, bytes | None]] = []  # queries.plans: (key, value)
        self.plans_seen = [0, 0]  # of queries.plans, per worker
        self.answers = AnswersCore("answers", "answers.current", "deadletter", TOPICS["deltas.parts"])
        self.release = SeqRelease(2, self.answers.text_of, self.terms, self.answers.class_of)
        self.plans_read = {0: 0}
        self.release.plans_read = self.plans_read  # (as the service does: what it read of queries.plans)
        for partition in (0, 1):
            self.release.restore(partition, None)
        self.parts: dict[int, list[bytes]] = {0: [], 1: []}  # deltas.parts, read by the answers service in pump
        self.ends = {0: 0, 1: 0}  # of deltas.parts: read so far
        self.round = 0

    def _changes(self, kind: str, partition: int, start: int, end: int | None) -> list:
        log = self.routed[partition] if kind == "routed" else self.encoded
        return [c for v in log[start:end] if v is not None for c in decode_changes(kind, v)]

    def _records(self, partition: int, start: int, end: int | None) -> list[tuple[int, bytes]]:
        return [(off, v) for off, v in enumerate(self.routed[partition][start:end], start) if v is not None]

    def _terms(self, ids):  # noqa: ANN001, ANN202
        return {i: self.terms[i] for i in ids if i in self.terms}

    def publish(self, lines: list[str], op: str = "A") -> None:
        raw = "".join(f"{op} {line}\n" for line in lines).encode()
        self.send(self.ingest.process(RawRecord(raw, offset=self.round)))
        self.round += 1

    def send(self, outputs: list) -> None:
        written = set()
        for out in outputs:
            assert out.topic != TOPICS["deadletter"], codec.decode("DeadLetter", out.value)["message"]
            if out.topic == TOPICS["dictionary"]:
                self.terms.update(codec.dictionary_entries(out.value))
            elif out.topic == TOPICS["updates.routed"]:
                self.routed[out.partition].append(out.value)
                written.add(out.partition)
            elif out.topic == SETTINGS.topic("updates.encoded"):
                self.encoded.append(out.value)
            elif out.topic == TOPICS["deltas.parts"]:
                self.parts[out.partition].append(out.value)
        for partition in written:  # a transaction's commit marker
            self.routed[partition].append(None)

    def plan(self, query_id: str, version: int | None, text: str = "", readers: tuple[int, ...] = (0, 1)) -> None:
        """A queries.plans record, read at once by the answers service and by the workers ``readers``."""
        value = None if version is None else codec.encode("QueryPlan", {
            "query_id": query_id, "sparql": text, "options": {}, "plan_json": "{}", "projected": [],
            "registered_at_seq": len(self.encoded), "version": version,
            "registered_at_change_seq": self.ingest.seq})
        offset = len(self.plan_log)
        self.plan_log.append((query_id.encode(), value))
        self.answers.on_plan(query_id, version)
        if version is not None:
            self.answers.note_registration(query_id, version, text, None)
        self.release.note_plan(query_id, version, query_partition(query_id, 2), 0, offset)
        self.plans_read[0] = offset + 1
        self.read_plans(readers)

    def read_plans(self, readers: tuple[int, ...] = (0, 1)) -> None:
        for p in readers:
            worker, start = self.workers[p], self.plans_seen[p]
            out, to_open = worker.on_plans([(0, offset, key, value) for offset, (key, value)
                                            in enumerate(self.plan_log[start:], start)], [p])
            assert to_open == []
            self.plans_seen[p] = len(self.plan_log)
            self.send(out + worker.flush_batches())

    def pump(self, partitions: tuple[int, ...] = (0, 1), answers: bool = True) -> None:
        """The workers of ``partitions`` read their logs to their ends, a transaction at a time (probes
        included), then (``answers``) the answers service reads deltas.parts."""
        while any(self.cursors[p] < len(self.routed[p]) for p in partitions):
            for p in partitions:
                worker, shard = self.workers[p], self.workers[p].shards[("routed", p)]
                while self.cursors[p] < len(self.routed[p]):
                    value = self.routed[p][self.cursors[p]]
                    if value is not None:
                        self.send(worker.on_routed(shard, self.cursors[p], value, None)[0])
                    self.cursors[p] += 1
                self.send(worker.flush_batches())
        if not answers:
            return
        for partition, log in self.parts.items():
            for offset in range(self.ends[partition], len(log)):
                for released in self.release.on_record(partition, offset, log[offset]):
                    for result in self.answers.on_record(partition, offset, b"", None, self.terms.get, released[-1]):
                        assert result.topic != "deadletter", codec.decode("DeadLetter", result.value)["message"]
            self.ends[partition] = len(log)
        self.answers.settle()
        self.release.held_terms.collect()  # (as the service does once a batch's answers are decoded)
        for partition, end in self.ends.items():
            self.release.commit_position(partition, end)

    def churn(self, rounds: int, start: int) -> None:
        for n in range(start, start + rounds):
            text = SHAPES[n % len(SHAPES)]
            self.plan(f"q{n}", 1, text)  # a new query each time ...
            self.plan("replaced", n + 1, text)  # ... one registered again with a new version each time ...
            # ... and one unregistered at once, by then applied by one worker only; the other reads queries.plans
            # later, and its probes before the plan (they wait for it) or after the unregistration (they die).
            early = n % 2
            self.plan(f"brief{n}", 1, SHAPES[(n + 1) % len(SHAPES)], readers=(early,))
            self.publish(data(n))
            self.pump((early,), answers=False)
            if n % 4 < 2:
                self.pump((1 - early,))
                self.plan(f"brief{n}", None, readers=(early,))
                self.read_plans((1 - early,))
            else:  # (and the answers service reads the early one's ready mark after the unregistration)
                self.plan(f"brief{n}", None)
            self.pump()
            self.publish(data(n - 2), "D")  # (the graph stays as small as it was)
            self.pump()
            self.plan(f"q{n}", None)
            self.pump()
        gc.collect()


def test_registering_and_unregistering_again_and_again_leaves_nothing_behind(monkeypatch) -> None:
    from services.answers import release
    from services.worker import probes

    monkeypatch.setattr(probes, "FLOOR_SECONDS", 0.0)  # (versions no probe can read are let go at each record)
    monkeypatch.setattr(release, "RELEASED_KEYS_KEPT", 20)  # (a bounded memory of released keys: full here)
    fleet = Fleet()
    fleet.plan("stays", 1, SHAPES[1])

    # (Per query id unregistered, the workers and the answers service remember its last version, to drop what
    # is still in flight of that registration: an integer each, not counted.)
    def workers_side() -> int:
        return sum(held(worker) - len(worker.ended) for worker in fleet.workers)

    def answers_side() -> int:
        return held((fleet.release, fleet.answers)) - len(fleet.release.ended) - len(fleet.answers.ended)

    fleet.churn(4 * len(SHAPES), 0)
    assert fleet.release.partitions[0].opened and fleet.release.partitions[1].opened  # (registrations opened)
    workers, answers = workers_side(), answers_side()
    fleet.churn(20 * len(SHAPES), 4 * len(SHAPES))
    assert workers_side() <= workers + 10, "a worker keeps something of each registration it read"
    assert answers_side() <= answers + 10, "the answers service keeps something of each registration it read"
    assert not any(fleet.release.gates_waiting().values()) and fleet.release.held() == 0  # (none of an ended one)
