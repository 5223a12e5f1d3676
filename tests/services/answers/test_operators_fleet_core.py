"""Operator queries through the fleet's transforms in memory: ingest -> the worker core's whole
shard under ``--placement single-owner`` (the algebra in place of the BGP engine) -> seq release -> answers core, compared per update with
pyoxigraph re-evaluating each query; registered late (snapshot, then live deltas) and restored mid-stream."""

from __future__ import annotations

from collections import Counter

from cbgp.query.plan import SINGLE_OWNER
from services import codec
from services.answers.core import AnswersCore
from services.ingest.core import IngestProcessor, RawRecord
from services.kafka.config import KafkaSettings
from services.answers.release import SeqRelease
from services.worker.core import WorkerCore
from services.worker.shard import decode_changes
from services.wire.records import query_partition
from tests.fleet_support import EX, generate_patch
from tests.operators_support import LATE_QUERIES, OPERATOR_QUERIES, oracle_deltas, plan_record

SETTINGS = KafkaSettings(topic_prefix="u.")
TOPICS = {"deltas.parts": "u.deltas.parts", "deadletter": "u.deadletter", "dictionary": "u.dictionary"}


class Stream:
    """A generated stream through ingest: updates.encoded as a log of records, and the dictionary topic."""

    def __init__(self, n: int, seed: int) -> None:
        ingest = IngestProcessor(SETTINGS, 4, 4)
        lines = generate_patch(n, seed=seed)
        self.log: list[list] = []
        self.terms: dict[int, str] = {}
        for start in range(0, len(lines), 50):
            outputs = ingest.process(RawRecord(("\n".join(lines[start:start + 50]) + "\n").encode()))
            outputs += ingest.flush() if hasattr(ingest, "flush") else []
            for out in outputs:
                if out.topic == "u.dictionary":
                    self.terms.update(codec.dictionary_entries(out.value))
                elif out.topic == "u.updates.encoded":
                    self.log.append(decode_changes("whole", out.value))
        self.lookups = 0

    def reader(self, kind: str, partition: int, start: int, end: int) -> list:
        assert kind == "whole"
        return [change for changes in self.log[start:end] for change in changes]

    def term_reader(self, ids: set[int]) -> dict[int, str]:
        self.lookups += 1
        return {i: self.terms[i] for i in ids if i in self.terms}

    def changes(self) -> list[tuple]:
        return [(c.seq, c.diff, c.s, c.p, c.o, c.g) for changes in self.log for c in changes]


def core_for(stream: Stream) -> WorkerCore:
    # (single-owner: the whole shard evaluates each query, its BGP leaves and operators; by centre, the leaves
    # run on the routed partitions and the operators at the answers service: tests/services/worker/test_distribution.py)
    return WorkerCore(TOPICS, 4, 4, 4, stream.reader, assemble_in_spark=False, placement=SINGLE_OWNER,
                      term_reader=stream.term_reader)


def register(core: WorkerCore, queries: dict[str, str], offset: int, seq: int = 0) -> list:
    out = []
    for i, (name, text) in enumerate(queries.items()):
        produced, _to_open = core.on_plan(0, offset + i, name.encode(), codec.encode("QueryPlan", plan_record(name, text, seq)),
                                          range(4))
        out += produced
    return out


def answers_of(outputs: list, terms: dict[int, str]) -> dict[str, list[dict]]:
    """The Answer records the answers service makes of ``outputs`` (worker-made terms read from them too)."""
    lookup = dict(terms)
    for out in outputs:
        if out.topic == "u.dictionary":
            lookup.update(codec.dictionary_entries(out.value))
    release = SeqRelease(4)
    for partition in range(4):
        release.restore(partition, None)
    core = AnswersCore("u.answers", "u.answers.current", "u.deadletter", "u.deltas.parts")
    got: dict[str, list[dict]] = {}
    for offset, out in enumerate(outputs):
        if out.topic != "u.deltas.parts":
            continue
        frontier = codec.frontier_of(out.value)
        released = (release.on_frontier(out.partition, frontier) if frontier is not None else
                    release.on_deltas(out.partition, offset, None, codec.part_delta_columns(out.value)))
        for _origin, columns in [(r[-2], r[-1]) for r in released]:
            for result in core.on_record(out.partition, offset, b"", None, lookup.get, columns):
                assert result.topic != "u.deadletter", codec.decode("DeadLetter", result.value)["message"]
                if result.topic == "u.answers":
                    record = codec.decode("Answer", result.value)
                    record["key"] = codec.canonical_binding(
                        {v: codec.term_from_avro(t) for v, t in record["binding"].items()})
                    got.setdefault(record["query_id"], []).append(record)
    return got


def split(answers: list[dict]) -> tuple[Counter, Counter]:
    """(snapshot bindings, live (seq, sign, binding)) of one query's answers."""
    return (Counter(a["key"] for a in answers if a["snapshot"]),
            Counter((a["seq"], a["sign"], a["key"]) for a in answers if not a["snapshot"]))


def test_operator_queries_in_the_whole_shard_equal_pyoxigraph_per_update_also_late_and_restored() -> None:
    stream = Stream(1500, seed=5)
    half = len(stream.log) // 2
    half_seq = max(c.seq for changes in stream.log[:half] for c in changes)
    deltas, final, snapshot = oracle_deltas(stream.changes(), stream.terms, OPERATOR_QUERIES, LATE_QUERIES, half_seq)

    # first life: the queries registered before any data, the first half applied
    core = core_for(stream)
    outputs = register(core, OPERATOR_QUERIES, 0)
    outputs += core.open_shard("whole", 0, 0, None)  # owner of every query here (one routed partition would do)
    for p in range(1, 4):
        outputs += core.open_shard("whole", p, 0, None)
    for offset in range(half):
        for p in range(4):
            outputs += core.on_record(core.shards[("whole", p)], offset, stream.log[offset])
    # registered mid-stream: a snapshot over the first half
    outputs += register(core, LATE_QUERIES, len(OPERATOR_QUERIES), half_seq)
    outputs += core.flush_batches()
    metadata = core.metadata()

    # second life: restored at the committed offset (kill -9), nothing owed, the second half applied
    core = core_for(stream)
    register(core, {**OPERATOR_QUERIES, **LATE_QUERIES}, 0)
    core.plan_positions = [len(OPERATOR_QUERIES) + len(LATE_QUERIES)] + [0] * 3
    restored = []
    for p in range(4):
        restored += core.open_shard("whole", p, half, metadata)
    restored += core.flush_batches()
    assert not [o for o in restored if o.topic == "u.deltas.parts"], "a restore re-emitted answers it owed no more"
    for offset in range(half, len(stream.log)):
        for p in range(4):
            outputs += core.on_record(core.shards[("whole", p)], offset, stream.log[offset])
    outputs += core.flush_batches()

    got = answers_of(outputs, stream.terms)
    assert stream.lookups > 0
    for name in OPERATOR_QUERIES:
        snap, live = split(got[name])
        assert snap == Counter(), f"{name}: nothing before the data"
        expected = Counter({(seq, sign, key): n for (q, seq, sign, key), n in deltas.items() if q == name})
        assert live == expected, f"{name}: per-update deltas differ from pyoxigraph"
        assert sum(live.values()) > 20, f"{name}: the stream must exercise the query"
    for name in LATE_QUERIES:
        snap, live = split(got[name])
        assert snap == snapshot[name], f"{name}: snapshot differs from pyoxigraph at seq {half_seq}"
        expected = Counter({(seq, sign, key): n for (q, seq, sign, key), n in deltas.items() if q == name})
        assert live == expected, f"{name}: live deltas differ from pyoxigraph"
        assert live, f"{name}: the second half must change it"
    for name, answers in got.items():
        current: Counter = Counter()
        for a in answers:
            current[a["key"]] += 1 if a["sign"] == "+" else -1
            assert current[a["key"]] >= 0, f"{name}: '-' of an absent answer (n={a['n']})"
        assert +current == final[name], f"{name}: final answers differ"
        assert [a["n"] for a in answers] == list(range(1, len(answers) + 1))


def test_unregistering_an_operator_query_frees_its_state_and_keeps_the_others() -> None:
    stream = Stream(400, seed=9)
    core = core_for(stream)
    register(core, OPERATOR_QUERIES, 0)
    for p in range(4):
        core.open_shard("whole", p, 0, None)
    for offset, changes in enumerate(stream.log):
        for p in range(4):
            core.on_record(core.shards[("whole", p)], offset, changes)
    held = core.state_by_query()
    assert all(held[name] > 0 for name in OPERATOR_QUERIES), held
    core.on_plan(0, 99, b"named", None, range(4))
    assert "named" not in core.state_by_query() and core.state_by_query()["adults"] == held["adults"]
    assert not any("named" in shard.engine.operators for shard in core.shards.values())


def test_a_worker_frees_the_values_its_aggregates_let_go_once_published() -> None:
    """Single owner: a GROUP_CONCAT and a SUM over groups that change all along.  Every value is published on
    the dictionary topic before the delta that names it, and the worker keeps only its groups' current values
    (it kept one term per change, and the record of having published it)."""
    stream = Stream(1500, seed=3)
    core = core_for(stream)
    queries = {"concat": f"SELECT ?x (GROUP_CONCAT(STR(?y)) AS ?all) (SUM(?a) AS ?s) WHERE {{ ?x <{EX}knows> ?y "
                         f"OPTIONAL {{ ?y <{EX}age> ?a }} }} GROUP BY ?x"}
    register(core, queries, 0)
    for p in range(4):
        core.open_shard("whole", p, 0, None)
    published: set[int] = set()
    values = 0
    for offset, changes in enumerate(stream.log):
        out = []
        for p in range(4):
            out += core.on_record(core.shards[("whole", p)], offset, changes)
        out += core.flush_batches()
        for o in out:
            if o.topic == "u.dictionary":
                published.update(term_id for term_id, _term in codec.dictionary_entries(o.value))
            elif o.topic == "u.deltas.parts" and codec.frontier_of(o.value) is None:
                deltas = codec.part_delta_columns(o.value)
                computed = [v for v in deltas.values if v not in stream.terms]
                assert set(computed) <= published, "a value named before it was published"
                values += len(computed)
    dictionary = core.shards[("whole", query_partition("concat", 4))].engine.dictionary
    assert values > 500, "the stream must change the groups all along"
    # at most a GROUP_CONCAT and a SUM per subject (40) held; published and remembered: those, and the STR of
    # each subject (kept: made from data) and the query's constants
    assert dictionary.held() <= 2 * 40 and len(core.outputs.published_terms) <= 3 * 40 + 10
