"""Whole shards from ingest's snapshot instead of updates.encoded from offset 0 (step 5 of
``docs/design/bounded-input-logs.md``).

A whole shard (a query its single owner evaluates on the total order: ``--placement single-owner``, an operator
query with a variable-predicate leaf, a derived stream) needs the graph at an offset of updates.encoded when a
query is registered late, when it restores with no checkpoint, and when a checkpoint lacks a registration.  Each
now moves ingest's snapshot to that offset, forwards or backwards, reading only the records between the two: a
worker whose reads below that are refused, as if retention had deleted them, sends byte for byte what a worker
that read the log from offset 0 sends (which ``test_operators_fleet_core`` checks against pyoxigraph).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cbgp.distributed.versioned_state import fold
from cbgp.query.plan import SINGLE_OWNER
from services import codec
from services.ingest.core import IngestProcessor, RawRecord
from services.state.shards import ShardCheckpoints
from services.state.store import Store
from services.worker.core import WorkerCore
from services.worker.shard import decode_changes
from services.worker.snapshots import FOREVER, IngestSnapshot, WholeBase
from tests.fleet_support import EX, QUERIES, generate_patch
from tests.operators_support import LATE_QUERIES, OPERATOR_QUERIES, plan_record
from tests.worker_support import SETTINGS

TOPICS = {"deltas.parts": "u.deltas.parts", "deadletter": "u.deadletter", "dictionary": "u.dictionary",
          "updates.raw": "u.updates.raw"}
EARLY = {**OPERATOR_QUERIES, "path3": QUERIES["path3"]}  # (path3: a BGP, whole under single-owner placement)
LATE = {**LATE_QUERIES, "likers": f"SELECT ?x ?p WHERE {{ ?x ?p <{EX}Pizza> FILTER(?p != <{EX}type>) }}"}


class Encoded:
    """updates.encoded as ingest writes it for a generated stream, the dictionary, and ingest's snapshot after
    each of its transactions.  Reads of the log below ``cut`` are refused, as if retention had deleted them."""

    def __init__(self, n: int, seed: int) -> None:
        ingest = IngestProcessor(SETTINGS, 4, 4)
        lines = generate_patch(n, seed=seed)
        self.log: list[list] = []
        self.terms: dict[int, str] = {}
        self.snapshots = [IngestSnapshot({}, {}, 0, 0)]
        for start in range(0, len(lines), 40):
            for out in ingest.process(RawRecord(("\n".join(lines[start:start + 40]) + "\n").encode())):
                if out.topic == "u.dictionary":
                    self.terms.update(codec.dictionary_entries(out.value))
                elif out.topic == "u.updates.encoded":
                    self.log.append(decode_changes("whole", out.value))
            self.snapshots.append(IngestSnapshot(dict(ingest.present), {}, len(self.log), ingest.seq))
        self.cut = 0

    def reader(self, kind: str, partition: int, start: int, end: int) -> list:
        assert kind == "whole"
        assert start >= self.cut or start == end, f"updates.encoded read from {start}, below {self.cut}"
        return [change for changes in self.log[start:end] for change in changes]

    def terms_of(self, ids: set[int]) -> dict[int, str]:
        return {i: self.terms[i] for i in ids if i in self.terms}

    def core(self, base: IngestSnapshot | None, checkpoints: ShardCheckpoints | None = None) -> WorkerCore:
        return WorkerCore(TOPICS, 4, 4, 4, self.reader, assemble_in_spark=False, placement=SINGLE_OWNER,
                          term_reader=self.terms_of, checkpoints=checkpoints,
                          base_source=None if base is None else lambda: base, encoded_start=lambda: self.cut)


def register(core: WorkerCore, queries: dict[str, str], offset: int, seq: int = 0) -> list:
    out = []
    for i, (name, text) in enumerate(queries.items()):
        out += core.on_plan(0, offset + i, name.encode(), codec.encode("QueryPlan", plan_record(name, text, seq)),
                            range(4))[0]
    return out


def apply(core: WorkerCore, encoded: Encoded, start: int, end: int) -> list:
    out = []
    for offset in range(start, end):
        for p in range(4):
            out += core.on_record(core.shards[("whole", p)], offset, encoded.log[offset])
    return out + core.flush_batches()


def sent(outputs: list) -> list[tuple]:
    """The records but the dictionary's (see :func:`same`)."""
    return [(o.topic, o.partition, o.key, o.value, tuple(o.headers or ())) for o in outputs
            if o.topic != "u.dictionary"]


def made_terms(outputs: list) -> dict[int, str]:
    return {entry["id"]: entry["term"] for entry in
            (codec.decode("DictionaryEntry", o.value) for o in outputs if o.topic == "u.dictionary")}


def same(encoded: Encoded, based: list, from_zero: list) -> bool:
    """Byte for byte the same records, but that a replay from a base may publish a term an operator makes (a
    COUNT's value) which the log from 0 had taught the shard as an input term (a triple since deleted had it):
    the same id and term, written again to a compacted topic."""
    made, made_from_zero = made_terms(based), made_terms(from_zero)
    again = {i: term for i, term in made.items() if i not in made_from_zero}
    return (sent(based) == sent(from_zero) and made_from_zero.items() <= made.items()
            and all(encoded.terms.get(i) == term for i, term in again.items()))


def first_life(encoded: Encoded, base: IngestSnapshot | None, half: int, seq: int,
               checkpoints: ShardCheckpoints | None = None) -> tuple[list, str, list]:
    """The early queries from offset 0, a checkpoint at a quarter (with ``checkpoints``), the late ones registered
    at ``half``: (what it sent, the commit metadata before the late ones, what they sent)."""
    core = encoded.core(base, checkpoints)
    out = register(core, EARLY, 0)
    for p in range(4):
        out += core.open_shard("whole", p, 0, None)
    out += apply(core, encoded, 0, half // 2)
    if checkpoints is not None:
        assert checkpoints.put(core.checkpoint_blobs([("whole", p) for p in range(4)])) == 4
    out += apply(core, encoded, half // 2, half)
    metadata = core.metadata()
    late = register(core, LATE, len(EARLY), seq) + core.flush_batches()
    return out, metadata, late + apply(core, encoded, half, len(encoded.log))


def second_life(encoded: Encoded, base: IngestSnapshot | None, half: int, metadata: str,
                checkpoints: ShardCheckpoints | None = None) -> list:
    """Restored at ``half`` with every query, owing the late ones' snapshots (``metadata``), then the rest."""
    core = encoded.core(base, checkpoints)
    register(core, {**EARLY, **LATE}, 0)
    core.plan_positions = [len(EARLY) + len(LATE)] + [0] * 3
    out = []
    for p in range(4):
        out += core.open_shard("whole", p, half, metadata)
    return out + core.flush_batches() + apply(core, encoded, half, len(encoded.log))


@pytest.mark.parametrize("seed", range(3))
def test_a_whole_base_moved_to_an_offset_is_the_graph_the_log_from_0_gives(seed: int) -> None:
    rng = random.Random(seed)
    encoded = Encoded(1500, seed)
    backwards = forwards = 0
    for _ in range(40):
        snapshot = rng.choice(encoded.snapshots)
        point = rng.randrange(len(encoded.log) + 1)
        base = WholeBase.of(snapshot)
        encoded.cut = min(base.offset, point)
        moved, last_seq, last = base.at(lambda start, end: encoded.reader("whole", 0, start, end), point)
        encoded.cut = 0
        below = encoded.reader("whole", 0, 0, point)
        truth = fold({}, below, FOREVER)
        assert sorted(change[2:6] for change in moved) == sorted(truth)
        assert all(change.diff == 1 for change in moved)
        assert last_seq == max((change.seq for change in below), default=0)  # (as a replay from 0 leaves it)
        assert last is None or last == below[-1]
        backwards += base.offset > point
        forwards += base.offset < point
    assert backwards and forwards


@pytest.mark.parametrize("where", ["below", "above"])
def test_whole_shards_from_a_base_send_what_they_send_from_offset_0(where: str, tmp_path: Path) -> None:
    """Late registrations in live whole shards, a restore with no checkpoint that owes their snapshots, and a
    restore from a checkpoint that lacks them: with ingest's snapshot taken below or above those offsets, and
    every read below the lower of the two refused, the outputs equal those made from offset 0."""
    encoded = Encoded(1600, seed=5)
    half = len(encoded.log) // 2
    seq = max(c.seq for changes in encoded.log[:half] for c in changes)
    base = encoded.snapshots[len(encoded.snapshots) // 6 if where == "below" else -1]
    assert (base.encoded_offset < half // 2) if where == "below" else (base.encoded_offset == len(encoded.log))

    early, metadata, late = first_life(encoded, None, half, seq)
    assert any(o.topic == "u.deltas.parts" for o in late)
    encoded.cut = min(base.encoded_offset, half)
    early_based, metadata_based, late_based = first_life(encoded, base, half, seq)
    assert metadata_based == metadata
    assert same(encoded, early_based, early) and same(encoded, late_based, late)

    # restored with no checkpoint at `half`, the late registrations' snapshots owed
    encoded.cut = 0
    restored = second_life(encoded, None, half, metadata)
    assert any(o.topic == "u.deltas.parts" for o in restored)
    encoded.cut = min(base.encoded_offset, half)
    assert same(encoded, second_life(encoded, base, half, metadata), restored)

    # restored from a checkpoint taken at a quarter, before the late registrations: they are caught up from the
    # base moved to the checkpoint's position
    store = Store(tmp_path / "worker")
    try:
        checkpoints = ShardCheckpoints(store)
        encoded.cut = 0
        first_life(encoded, None, half, seq, checkpoints)
        from_checkpoint = second_life(encoded, None, half, metadata, checkpoints)
        assert same(encoded, from_checkpoint, restored)
        encoded.cut = min(base.encoded_offset, half // 2)
        assert same(encoded, second_life(encoded, base, half, metadata, checkpoints), restored)
    finally:
        store.close()
