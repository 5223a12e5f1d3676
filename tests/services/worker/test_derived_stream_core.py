"""Derived streams through the fleet's transforms in memory, the loop closed: ingest -> the
worker core (whole shards) -> the CONSTRUCT's triple deltas as updates.raw records -> ingest again -> a BGP query
reading ``GRAPH <iri>``.  pyoxigraph is the oracle: the derived graph equals the CONSTRUCT of the base graph as
of the last input record the owner applied (checked after every round trip, with the derived records lagging
behind the base ones), the reader's deltas per seq equal its re-evaluation over the total order, and after
unregistering the derived graph is retracted.  Registered late (snapshot), restored mid-stream (nothing re-sent), from offset 0 or from its shard's checkpoint."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyoxigraph as ox

from cbgp.query.plan import SINGLE_OWNER
from cbgp.terms import DEFAULT_GRAPH_ID
from services import codec
from services.ingest.core import IngestProcessor, RawRecord
from services.kafka.config import KafkaSettings
from services.wire.records import query_partition
from services.state.store import Store
from services.state.shards import ShardCheckpoints
from services.worker.core import WorkerCore
from services.worker.shard import decode_changes
from services.worker.outputs import DERIVED_HEADER
from tests.derived_support import ADULTS, DERIVED, READER, construct, expected_reader, per_seq_deltas, plan_of, quad
from tests.fleet_support import generate_patch
from tests.services.answers.test_operators_fleet_core import answers_of, split

SETTINGS = KafkaSettings(topic_prefix="u.")
TOPICS = {"deltas.parts": "u.deltas.parts", "deadletter": "u.deadletter", "dictionary": "u.dictionary",
          "updates.raw": "u.updates.raw"}


class Loop:
    """Ingest and updates.encoded as a log; the worker core's raw outputs go back into ingest."""

    def __init__(self) -> None:
        self.ingest = IngestProcessor(SETTINGS, 4, 4)
        self.log: list[list] = []
        self.terms: dict[int, str] = {}
        self.base = ox.Store()  # the default graph, as ingest changed it
        self.changes: list[tuple] = []  # every effective change in seq order, terms decoded
        self.outputs: list = []  # what the worker produced for deltas.parts and the dictionary
        self.raw_written: list = []  # every updates.raw record the worker produced
        self.core: WorkerCore | None = None
        self.read = 0  # log records the restores read

    def reader(self, kind: str, partition: int, start: int, end: int) -> list:
        self.read += len(self.log[start:end])
        return [change for changes in self.log[start:end] for change in changes]

    def term_reader(self, ids: set[int]) -> dict[int, str]:
        return {i: self.terms[i] for i in ids if i in self.terms}

    def new_core(self, checkpoints: ShardCheckpoints | None = None) -> WorkerCore:
        return WorkerCore(TOPICS, 4, 4, 4, self.reader, assemble_in_spark=False, placement=SINGLE_OWNER,
                          term_reader=self.term_reader, checkpoints=checkpoints)

    def feed(self, value: bytes, headers: dict[str, bytes] | None = None) -> list:
        """One updates.raw record through ingest, its encoded records through the worker; returns the worker's
        updates.raw outputs (not fed back yet)."""
        start = len(self.log)
        for out in self.ingest.process(RawRecord(value, headers or {})):
            assert out.topic != "u.deadletter", codec.decode("DeadLetter", out.value)["message"]
            if out.topic == "u.dictionary":
                self.terms.update(codec.dictionary_entries(out.value))
            elif out.topic == "u.updates.encoded":
                self.log.append(decode_changes("whole", out.value))
        raw = []
        for offset in range(start, len(self.log)):
            for seq, sign, s, p, o, g, _t, _role, _refresh in self.log[offset]:
                terms = (self.terms[s], self.terms[p], self.terms[o], None if g == DEFAULT_GRAPH_ID else self.terms[g])
                self.changes.append((seq, sign, *terms))
                if terms[3] is None:
                    (self.base.add if sign > 0 else self.base.remove)(quad(*terms))
            raw += self.work(self.core.on_record(self.core.shards[("whole", p)], offset, self.log[offset])
                             for p in range(4))
        return raw

    def work(self, produced) -> list:  # noqa: ANN001 - iterables of output lists
        raw = []
        for outs in produced:
            for out in outs:
                (raw if out.topic == "u.updates.raw" else self.outputs).append(out)
        for out in self.core.flush_batches():
            (raw if out.topic == "u.updates.raw" else self.outputs).append(out)
        self.raw_written += raw
        return raw

    def feed_raw(self, raw: list) -> None:
        """The worker's updates.raw records through ingest (they feed no derived stream in turn)."""
        for out in raw:
            assert dict(out.headers)[DERIVED_HEADER].startswith(b"adults@")
            assert not self.feed(out.value, dict(out.headers)), "the derived stream fed itself"

    def derived(self) -> set[tuple[str, str, str]]:
        gid = self.ingest.dictionary.encode(DERIVED)
        return {(self.terms[s], self.terms[p], self.terms[o]) for s, p, o, g in self.ingest.present if g == gid}


def register(loop: Loop, core: WorkerCore, offset: int, query_id: str, record: dict) -> list:
    produced, _to_open = core.on_plan(0, offset, query_id.encode(), codec.encode("QueryPlan", record), range(4))
    return produced


def test_a_construct_feeds_a_named_graph_equal_to_its_construct_of_the_base_graph_and_a_reader_sees_it() -> None:
    lines = generate_patch(1500, seed=23)
    chunks = [("\n".join(lines[i:i + 40]) + "\n").encode() for i in range(0, len(lines), 40)]
    late, restart = len(chunks) // 4, len(chunks) * 2 // 3
    loop = Loop()
    loop.core = loop.new_core()
    loop.outputs += register(loop, loop.core, 0, "reader", plan_of("reader", READER))
    for p in range(4):
        loop.outputs += loop.core.open_shard("whole", p, 0, None)
    pending: list = []
    expected_at: list[set] = []  # the CONSTRUCT of the base graph after each base record
    fed_upto: int | None = None  # the last base record whose derived records ingest has applied
    checks = 0
    for i, chunk in enumerate(chunks):
        if i == late:  # registered mid-stream: its snapshot is the first derived record
            record = plan_of("adults", ADULTS, seq=len(loop.log), stream=DERIVED)
            snapshot = loop.work([register(loop, loop.core, 1, "adults", record)])
            assert snapshot and all(o.value.startswith(b"A ") for o in snapshot)
            loop.feed_raw(snapshot)
            fed_upto = i - 1
        if i == restart:  # kill -9 after a commit: a new life restores every shard, owes nothing
            loop.feed_raw(pending)
            pending, fed_upto = [], i - 1
            metadata, position = loop.core.metadata(), len(loop.log)
            written = len(loop.raw_written)
            loop.core = loop.new_core()
            register(loop, loop.core, 0, "reader", plan_of("reader", READER))
            register(loop, loop.core, 1, "adults", plan_of("adults", ADULTS, stream=DERIVED))
            loop.core.plan_positions = [2, 0, 0, 0]
            restored = [loop.core.open_shard("whole", p, position, metadata) for p in range(4)]
            assert loop.work(restored) == [] and len(loop.raw_written) == written, "a restore re-sent triples"
            assert not [o for outs in restored for o in outs if o.topic == "u.deltas.parts"]
        pending += loop.feed(chunk)
        expected_at.append(construct(loop.base))
        # the derived records lag behind the base ones: the graph is the CONSTRUCT as of an earlier record
        assert loop.derived() == (expected_at[fed_upto] if fed_upto is not None else set()), f"record {i}"
        if i < late:
            assert not pending
        if i % 3 == 2 and i >= late:
            loop.feed_raw(pending)
            pending, fed_upto = [], i
            assert loop.derived() == expected_at[i], f"derived graph differs from the CONSTRUCT after record {i}"
            checks += 1
    loop.feed_raw(pending)
    assert loop.derived() == construct(loop.base) and len(construct(loop.base)) > 5
    assert checks > 8
    assert expected_reader(loop.base), "the reader must have answers over base + derived"
    seq_before_drop = loop.changes[-1][0]

    # unregistered: the owner (it holds routed partition query_partition(adults)) retracts the derived graph
    assert query_partition("adults", 4) in range(4)
    drop = loop.work([loop.core.on_plan(0, 2, b"adults", None, range(4))[0]])
    assert [o.value for o in drop] == [f"DROP SILENT GRAPH {DERIVED}".encode()]
    loop.feed(drop[0].value, dict(drop[0].headers))
    assert loop.derived() == set()
    assert not loop.work([loop.core.on_record(loop.core.shards[("whole", p)], len(loop.log) - 1, [])
                          for p in range(4)])

    got = answers_of(loop.outputs, loop.terms)
    snap, live = split(got["reader"])
    assert snap == Counter()
    expected, final = per_seq_deltas(loop.changes, READER)
    assert live == expected, "the reader's deltas per seq differ from pyoxigraph over the total order"
    assert final == Counter(), "after the retraction the reader reads an empty graph"
    assert sum(n for (seq, _sign, _k), n in live.items() if seq <= seq_before_drop) > 20
    before: Counter = Counter()
    for a in got["reader"]:
        if a["seq"] <= seq_before_drop:
            before[a["key"]] += 1 if a["sign"] == "+" else -1
    assert +before == expected_reader(loop.base), "before the retraction: base + its CONSTRUCT"
    # the CONSTRUCT's own answers are the triples it wrote: '+'/'-' rows per triple, a set
    adults = got["adults"]
    assert adults and all(a["snapshot"] for a in adults[:1])


def test_a_next_owner_retracts_a_stream_whose_end_its_previous_owner_did_not_commit() -> None:
    loop = Loop()
    loop.core = loop.new_core()
    register(loop, loop.core, 0, "adults", plan_of("adults", ADULTS, stream=DERIVED))
    metadata = loop.core.metadata()  # committed with the plan applied
    owner = query_partition("adults", 4)
    # a life that reads the tombstone while not owning the partition: nothing to write
    produced, _ = loop.core.on_plan(0, 1, b"adults", None, [p for p in range(4) if p != owner])
    assert produced == []
    # the next owner of that routed partition, restored from the committed metadata (before the tombstone)
    core = loop.new_core()
    register(loop, core, 0, "adults", plan_of("adults", ADULTS, stream=DERIVED))
    core.on_plan(0, 1, b"adults", None, [])
    core.plan_positions = [2, 0, 0, 0]
    opened = core.open_shard("routed", owner, 0, metadata)
    assert [o.value for o in opened] == [f"DROP SILENT GRAPH {DERIVED}".encode()]
    assert core.owner_of_output(opened[0]) == owner
    # ... and not once the tombstone was committed, nor by another partition
    assert core.open_shard("routed", owner, 0, core.metadata()) == []
    assert core.open_shard("routed", (owner + 1) % 4, 0, metadata) == []


def test_a_shard_feeding_a_derived_stream_restores_from_its_checkpoint(tmp_path: Path) -> None:
    """The whole shard that owns a CONSTRUCT with ``stream=`` is checkpointed like any other (its output
    state is its engine's); killed after a later commit, it restores from the checkpoint plus the log after it,
    sends nothing again, and goes on writing the derived graph exactly (pyoxigraph's CONSTRUCT and the reader's
    re-evaluation per seq)."""
    lines = generate_patch(1500, seed=29)
    chunks = [("\n".join(lines[i:i + 40]) + "\n").encode() for i in range(0, len(lines), 40)]
    checkpoint_at, restart = len(chunks) // 2, len(chunks) * 3 // 4
    checkpoints = ShardCheckpoints(Store(tmp_path / "worker"))
    loop = Loop()

    def new_life() -> None:
        loop.core = loop.new_core(checkpoints)
        loop.outputs.extend(register(loop, loop.core, 0, "reader", plan_of("reader", READER)))
        loop.outputs.extend(register(loop, loop.core, 1, "adults", plan_of("adults", ADULTS, stream=DERIVED)))

    new_life()
    for p in range(4):
        loop.outputs += loop.core.open_shard("whole", p, 0, None)
    owner = ("whole", query_partition("adults", 4))
    pending: list = []
    for i, chunk in enumerate(chunks):
        if i == checkpoint_at:  # after a committed transaction
            loop.feed_raw(pending)
            pending = []
            saved = loop.core.checkpoint_blobs([("whole", p) for p in range(4)])
            assert owner in {(kind, p) for kind, p, *_checkpoint in saved}, "the stream's shard is checkpointed"
            checkpoints.put(saved)
        if i == restart:  # kill -9 after a later commit, without a checkpoint since
            loop.feed_raw(pending)
            pending = []
            metadata, position, written = loop.core.metadata(), len(loop.log), len(loop.raw_written)
            new_life()
            loop.core.plan_positions = [2, 0, 0, 0]
            loop.read = 0
            restored = [loop.core.open_shard("whole", p, position, metadata) for p in range(4)]
            assert loop.work(restored) == [] and len(loop.raw_written) == written, "a restore re-sent triples"
            assert loop.read <= 4 * (position - checkpoint_at), "the shards replayed more than the log after it"
        pending += loop.feed(chunk)
    loop.feed_raw(pending)
    assert loop.derived() == construct(loop.base) and len(construct(loop.base)) > 5
    _snap, live = split(answers_of(loop.outputs, loop.terms)["reader"])
    expected, _final = per_seq_deltas(loop.changes, READER)
    assert live == expected, "the reader's deltas per seq differ from pyoxigraph over the total order"
