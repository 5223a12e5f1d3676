"""A worker restores its shards from their checkpoints plus the log after them, in memory: the logs
are ingest's own records, the store is RocksDB in a temporary directory.

- after a restart at a committed offset past the checkpoint, the shards replay only the log after it and make
  byte for byte the outputs a restore from offset 0 makes, for every query class the engine keeps, and for
  multi-centre queries (the evaluator, its probes waiting and its live counts) -- the probes a shard's log
  holds are the ones this worker made for its other shards;
- a checkpoint saved with other queries than the plans now name is adopted all the same: what the plans dropped
  is freed, what they added is caught up, and the outputs are those of a restore from offset 0;
- a checkpoint that cannot belong (past the committed offset, another log) is not used.
"""

from __future__ import annotations

from pathlib import Path

from services import codec
from services.state.store import Store
from services.state.shards import ShardCheckpoints, load_shard
from services.worker.core import WorkerCore
from services.worker.shard import decode_changes
from services.worker.checkpoint import usable
from tests.fleet_support import QUERIES, generate_patch
from tests.worker_support import N, TOPICS, InMemoryWorker, ingest_logs


class Worker(InMemoryWorker):
    """A WorkerCore over ``logs`` that counts the records its restores read; the probes it writes to routed
    partitions are appended to their logs (it holds them all)."""

    def __init__(self, logs: dict, checkpoints: ShardCheckpoints | None) -> None:
        super().__init__(logs)
        self.core = WorkerCore(TOPICS, N, N, N, self.reader, assemble_in_spark=False, checkpoints=checkpoints,
                               record_reader=self.records)
        for i, (name, text) in enumerate(sorted(QUERIES.items())):
            plan = {"query_id": name, "sparql": text, "options": {}, "plan_json": "{}", "projected": [],
                    "registered_at_seq": 0, "version": 1}
            self.core.on_plan(i % N, i, name.encode(), codec.encode("QueryPlan", plan), range(N))

    def plan(self, offset: int, name: str, text: str | None, version: int = 1) -> list:
        """Apply a queries.plans record (partition 0) of a query registered once data has arrived (None: its
        unregistration); its outputs."""
        value = None if text is None else codec.encode("QueryPlan", {
            "query_id": name, "sparql": text, "options": {}, "plan_json": "{}", "projected": [],
            "registered_at_seq": len(self.logs[("whole", 0)]) // 2, "version": version})
        return self.core.on_plan(0, offset, name.encode(), value, range(N))[0]

    def shards(self) -> list[tuple[str, int]]:
        return [("routed", p) for p in range(N)] + [("whole", p) for p in range(N)]

    def open(self, positions: dict[tuple[str, int], int], metadata: str | None) -> list:
        return [o for key in self.shards() for o in self.core.open_shard(*key, positions.get(key, 0), metadata)]

    def run(self, upto: float) -> list:
        """Apply every shard's log up to the fraction ``upto`` of it; the outputs, one transaction's worth."""
        out = []
        for kind, partition in self.shards():
            shard = self.core.shards[(kind, partition)]
            log = self.logs[(kind, partition if kind == "routed" else 0)]
            for offset in range(shard.position, int(len(log) * upto)):
                frontier = codec.frontier_of(log[offset]) if kind == "routed" else None
                if frontier is not None:
                    out += self.core.on_frontier(shard, offset, frontier)
                elif kind == "routed":
                    out += self.core.on_routed(shard, offset, log[offset], None)[0]
                else:
                    out += self.core.on_record(shard, offset, decode_changes(kind, log[offset]))
        return self.flush(out)


def keyed(outputs: list) -> set[tuple]:
    """The answer deltas of ``outputs`` with their idempotence keys (what the answers service takes once)."""
    found = set()
    for o in outputs:
        if (o.topic != TOPICS["deltas.parts"] or codec.frontier_of(o.value) is not None
                or codec.probe_ready_of(o.value) is not None):
            continue
        batch = codec.part_delta_columns(o.value)
        for i in range(len(batch)):
            found.add((batch.query_id, batch.version, batch.part, batch.source_partition[i], batch.source_offset[i],
                       batch.index[i], batch.seq[i], batch.diff[i], tuple(sorted(batch.binding(i).items()))))
    return found


def without_ready(values: list[tuple]) -> list[tuple]:
    return [v for v in values if v[0] != TOPICS["deltas.parts"] or codec.probe_ready_of(v[3]) is None]


def copied(logs: dict) -> dict:
    return {key: list(values) for key, values in logs.items()}


def values(outputs: list) -> list[tuple]:
    return [(o.topic, o.partition, o.key, o.value) for o in outputs]


def test_a_restart_replays_only_the_log_after_each_checkpoint_and_makes_the_same_outputs(tmp_path: Path) -> None:
    logs = ingest_logs(generate_patch(2400, seed=11))
    store = Store(tmp_path / "worker")
    checkpoints = ShardCheckpoints(store)
    first = Worker(logs, checkpoints)
    first.open({}, None)
    first.run(0.5)
    assert any(info.uses_probes for info in first.core.plans.values())
    saved = checkpoints.put(first.core.checkpoint_blobs(first.shards()))  # once the transaction committed
    assert saved == len(first.shards())
    assert first.core.checkpoint_blobs(first.shards()) == [], "a shard that did not move is not saved again"
    first.run(0.75)  # committed later, without a checkpoint (the interval had not passed)
    committed = {key: shard.position for key, shard in first.core.shards.items()}
    metadata = first.core.metadata()

    from_checkpoint = Worker(copied(logs), checkpoints)
    restored = from_checkpoint.open(committed, metadata)
    from_zero = Worker(copied(logs), None)
    assert values(restored) == values(from_zero.open(committed, metadata)) == []  # nothing owed
    assert from_checkpoint.read < from_zero.read / 2, (from_checkpoint.read, from_zero.read)
    live = from_checkpoint.run(1.0)
    # (a restore from offset 0 sends again the ProbeReady marks of the registrations its log holds, which the
    # answers service reads once; the checkpoint knows they were sent)
    assert live and without_ready(values(live)) == without_ready(values(from_zero.run(1.0)))
    probed = [shard.evaluator for shard in from_checkpoint.core.shards.values() if shard.evaluator is not None]
    assert probed and all(evaluator.queries for evaluator in probed)
    assert any(o.topic == TOPICS["updates.routed"] for o in live), "probes crossed partitions after the restore"
    store.close()


# Between a checkpoint and a crash: one query unregistered, one replaced by a new version, three registered (a
# multi-centre one, a star and a whole query).
PLAN_CHANGES = [("triangle", None, 1), ("path", QUERIES["path"], 2), ("late_path3", QUERIES["path3"], 1),
                ("late_star", QUERIES["star"], 1), ("late_product", QUERIES["product"], 1)]


def test_a_checkpoint_of_other_queries_is_adopted_and_the_difference_caught_up(tmp_path: Path) -> None:
    """A checkpoint saved before the plans changed still serves: the restore frees what was dropped and gives the
    new registrations their state (a by-centre one at its point of the log, as when it was first read, so what
    it sends again carries the keys sent then; a whole one silently).  From then on the outputs are those of a
    restore from offset 0."""
    logs = ingest_logs(generate_patch(2400, seed=5))
    store = Store(tmp_path / "worker")
    checkpoints = ShardCheckpoints(store)
    first = Worker(logs, checkpoints)
    first.open({}, None)
    sent = first.run(0.5)
    checkpoints.put(first.core.checkpoint_blobs(first.shards()))
    for offset, (name, text, version) in enumerate(PLAN_CHANGES, 100):
        sent += first.plan(offset, name, text, version)
    sent += first.run(0.75)
    committed = {key: shard.position for key, shard in first.core.shards.items()}
    metadata = first.core.metadata()

    def restored(saved: ShardCheckpoints | None) -> tuple[Worker, list]:
        worker = Worker(copied(logs), saved)
        for offset, (name, text, version) in enumerate(PLAN_CHANGES, 100):
            assert worker.plan(offset, name, text, version) == []  # (no shard open yet)
        return worker, worker.flush(worker.open(committed, metadata))

    from_checkpoint, again = restored(checkpoints)
    from_zero, nothing = restored(None)
    assert keyed(nothing) == set() and keyed(again), "the by-centre registrations were applied again at their point"
    assert keyed(again) <= keyed(sent), "with the keys of what was sent then"
    for key in from_checkpoint.shards():
        assert from_checkpoint.core.shards[key].versions == from_zero.core.shards[key].versions, key
    probed = {name for shard in from_checkpoint.core.shards.values() if shard.evaluator is not None
              for name in shard.evaluator.queries}
    assert "late_path3@1" in probed and not any(name.startswith("triangle@") for name in probed)
    live = from_checkpoint.run(1.0)
    assert keyed(live) and keyed(live) == keyed(from_zero.run(1.0))
    store.close()


def test_a_checkpoint_that_cannot_belong_is_not_used(tmp_path: Path) -> None:
    logs = ingest_logs(generate_patch(600, seed=3))
    worker = Worker(logs, None)
    worker.open({}, None)
    worker.run(0.5)
    shard = worker.core.shards[("routed", 0)]
    # a position just after a record of changes (not a Frontier mark), as a checkpoint taken there records it
    position = max(p for p in range(1, shard.position + 1) if worker.reader("routed", 0, p - 1, p))
    last = worker.reader("routed", 0, position - 1, position)[-1]
    good = {"position": position, "last_seq": last.seq, "last_change": last}
    assert usable(good, shard, worker.reader) is None
    assert "past the committed offset" in usable({**good, "position": shard.position + 1}, shard, worker.reader)
    other = last._replace(o=last.o + 1)  # another log, with the same offsets and seqs
    assert "not " + str(other) in usable({**good, "last_change": other}, shard, worker.reader)
    assert usable(None, shard, worker.reader) == "no checkpoint"


def test_an_operator_shard_is_checkpointed_and_one_pickle_refuses_is_skipped_once(tmp_path: Path, caplog) -> None:  # noqa: ANN001
    """An operator query's engine (its operator tree) pickles into the checkpoint like any other.  A shard whose
    engine holds something pickle cannot serialise is restored from offset 0, and its checkpoint is not tried
    (nor logged) again until its queries change."""
    worker = Worker(ingest_logs(generate_patch(300, seed=5)), None)
    plan = {"query_id": "counted", "sparql": "SELECT ?x (COUNT(?y) AS ?n) WHERE { ?x <http://example.org/knows> ?y } "
            "GROUP BY ?x", "options": {}, "plan_json": '{"placement": "single-owner"}', "projected": [],
            "registered_at_seq": 0, "version": 1}
    worker.core.on_plan(0, 99, b"counted", codec.encode("QueryPlan", plan), range(N))
    worker.open({}, None)
    owner = next(key for key in worker.shards() if key[0] == "whole" and "counted" in worker.core.shards[key].versions)
    blobs = {(kind, p): blob for kind, p, blob, *_position in worker.core.checkpoint_blobs(worker.shards())}
    assert owner in blobs, "the operator query's shard is checkpointed"
    assert load_shard(blobs[owner])["engine"].operators, "with its operator tree"

    refusing = Worker(ingest_logs(generate_patch(300, seed=5)), None)
    refusing.core.on_plan(0, 99, b"counted", codec.encode("QueryPlan", plan), range(N))
    refusing.open({}, None)
    refusing.core.shards[owner].engine.hook = lambda: None  # (pickle refuses a lambda)
    with caplog.at_level("WARNING"):
        first = refusing.core.checkpoint_blobs(refusing.shards())
        again = refusing.core.checkpoint_blobs(refusing.shards())
    assert owner not in {(kind, p) for kind, p, *_checkpoint in first} and again == []
    assert sum("shard-checkpoint-skipped" in r.getMessage() for r in caplog.records) == 1
