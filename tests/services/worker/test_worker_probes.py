"""A multi-centre registration replays the graph as of its seq, not the history that led there.

Once the routed logs are cut below a floor, a partition that applies a registration (late, or again after a
restore) can only move a base (ingest's snapshot) to the registration's point: it knows the graph there, each
quad with the seq of its insert, not the inserts and deletes that came and went.  Every partition, and every
owner of one, must then replay that same history, or the delta rule counts a pair twice (a triple present in
``[5, 8)`` at one partition and never at the other).  So what a registration sends is a function of its seq
alone: here two logs that agree on the graph as of that seq and on everything after it, one with the
deletions that led there and one without, make the same probes, acks and deltas under the same keys; and a
restore from offset 0 rebuilds the evaluator a live registration built.
"""

from __future__ import annotations

from cbgp.terms import iri, stable_term_id
from services import codec
from services.worker.core import WorkerCore
from services.worker.shard import decode_changes
from services.worker.points import log_marks, point_of
from tests.fleet_support import EX, QUERIES, generate_patch
from tests.worker_support import N, TOPICS, InMemoryWorker, ingest_logs

UNREAD = 987_654_321  # a predicate id no query reads


def graph_as_of(logs: dict, upto: int) -> dict[tuple[int, int, int, int], int]:
    """Each quad present at seq ``upto`` -> the seq of its insert."""
    present: dict[tuple[int, int, int, int], int] = {}
    for value in logs[("whole", 0)]:
        for change in decode_changes("whole", value):
            if change.seq <= upto and not change.refresh:
                if change.diff > 0:
                    present[change[2:6]] = change.seq
                else:
                    present.pop(change[2:6], None)
    return present


def compacted(logs: dict, upto: int) -> dict:
    """The logs with their changes up to seq ``upto`` made an insert-only history of the graph then: the
    inserts of the quads present at ``upto`` are kept, every other change up to it becomes an insert of a quad
    no query reads, at its seq (every record keeps its offset, its seqs and so its frontier)."""
    kept = set(graph_as_of(logs, upto).values())
    out = {key: list(values) for key, values in logs.items()}
    for p in range(N):
        records = out[("routed", p)]
        for offset, value in enumerate(records):
            changes = codec.routed_changes(value)
            if changes:
                records[offset] = codec.encode_routed_batch(
                    [c if c.seq > upto or c.seq in kept else c._replace(diff=1, s=c.seq, p=UNREAD, o=c.seq)
                     for c in changes])
    return out


class Worker(InMemoryWorker):
    """A WorkerCore holding every routed partition of ``logs``.  With a ``base`` (ingest's snapshot) and ``cut``,
    the routed logs below the cut are refused, as if retention had deleted them."""

    def __init__(self, logs: dict, base: tuple | None = None, cut: dict[int, int] | None = None,
                 log_read_changes: int = 0) -> None:
        super().__init__(logs, cut)
        self.loads = 0  # times the base (ingest's snapshot) was loaded
        self.core = WorkerCore(TOPICS, N, N, N, self.reader, assemble_in_spark=False, record_reader=self.records,
                               base_source=None if base is None else lambda: self._load(base),
                               log_start=lambda partition: self.cut.get(partition, 0))
        self.core.bases.log_read_changes = log_read_changes  # (0: every registration starts from the base)

    def _load(self, base: tuple) -> tuple:
        self.loads += 1
        return base

    def register(self, offset: int, name: str, seq: int) -> list:
        plan = {"query_id": name, "sparql": QUERIES[name], "options": {}, "plan_json": "{}", "projected": [],
                "registered_at_seq": 0, "registered_at_change_seq": seq, "version": 1}
        return self.flush(self.core.on_plan(0, offset, name.encode(), codec.encode("QueryPlan", plan), range(N))[0])

    def open(self, positions: dict[int, int], metadata: str | None = None) -> list:
        return self.flush([o for p in range(N) for o in self.core.open_shard("routed", p, positions.get(p, 0),
                                                                               metadata)])

    def run(self, ends: dict[int, int]) -> list:
        """Every routed shard's log up to ``ends`` (partition -> offset), in turns of a few records, as a worker
        alternates between its partitions; the probes it sends are read in later turns."""
        out: list = []
        moved = True
        while moved:
            moved = False
            turn: list = []
            for p in range(N):
                shard = self.core.shards[("routed", p)]
                log = self.logs[("routed", p)]
                for offset in range(shard.position, min(ends.get(p, len(log)), shard.position + 8)):
                    turn += self.core.on_routed(shard, offset, log[offset], None)[0]
                    moved = True
            out += self.flush(turn)
        return out


def sent(outputs: list) -> list[tuple]:
    return [(o.topic, o.partition, o.key, o.value) for o in outputs]


def registered_late(logs: dict, seq: int, ahead: int, names: tuple[str, ...] = ("path3",),
                    worker: Worker | None = None) -> tuple[Worker, list, list]:
    """A worker that reads its logs ``ahead`` records past the middle, then the plans of ``names`` as of
    ``seq``, then the rest: (the worker, what the registrations sent, what the rest sent)."""
    worker = worker or Worker({key: list(values) for key, values in logs.items()})
    worker.open({})
    worker.run({p: len(logs[("routed", p)]) // 2 + ahead for p in range(N)})
    at_plan = [o for offset, name in enumerate(names) for o in worker.register(offset, name, seq)]
    return worker, at_plan, worker.run({})


def test_a_registration_sends_what_the_graph_as_of_its_seq_determines() -> None:
    logs = ingest_logs(generate_patch(1600, seed=21))
    seqs = [c.seq for value in logs[("whole", 0)] for c in decode_changes("whole", value)]
    seq = seqs[len(seqs) // 2] + 7  # (mid-record: the point's record holds changes on both sides of it)
    read = {stable_term_id(iri(f"{EX}{name}")) for name in ("knows", "likes")}  # (path3's predicates)
    assert any(c.seq <= seq and c.diff < 0 and c.p in read for value in logs[("whole", 0)]
               for c in decode_changes("whole", value)), "the history up to the registration has deletions"
    same = compacted(logs, seq)
    for ahead in (0, 5):  # the plan read at the point, or after the worker passed it
        worker, at_plan, rest = registered_late(logs, seq, ahead)
        _twin, at_plan_same, rest_same = registered_late(same, seq, ahead)
        assert any(o.topic == TOPICS["updates.routed"] for o in at_plan + rest), "probes crossed partitions"
        assert any(o.topic == TOPICS["deltas.parts"] for o in at_plan + rest)
        assert sent(at_plan) == sent(at_plan_same), ahead
        assert sent(rest) == sent(rest_same), ahead
    # A restore from offset 0 applies the registration at its point of the replayed log with the same history,
    # and ends with the evaluator the live registration left (stores, probes held or waiting, live counts).
    positions = {p: shard.position for (_kind, p), shard in worker.core.shards.items()}
    restored = Worker({key: list(values) for key, values in worker.logs.items()})
    restored.register(0, "path3", seq)
    assert [o for o in restored.open(positions, worker.core.metadata()) if o.topic == TOPICS["deltas.parts"]
            and codec.probe_ready_of(o.value) is None and codec.frontier_of(o.value) is None] == [], "silently"
    for p in range(N):
        live, again = worker.core.shards[("routed", p)].evaluator, restored.core.shards[("routed", p)].evaluator
        assert again.queries.keys() == live.queries.keys() == {"path3@1"}
        stores = [[{end: store.table for end, store in ends.items()} for ends in state.stores]
                  for state in (live.queries["path3@1"], again.queries["path3@1"])]
        assert stores[0] == stores[1], p
        assert sorted(again.held) == sorted(live.held) and again.unknown == live.unknown
        assert dict(again.live.counts) == dict(live.live.counts)
        assert again.applied == live.applied


def test_a_registration_from_a_base_sends_what_one_from_offset_0_sends() -> None:
    """Ingest's snapshot, taken before or after the registration's point, moved to the point: the registration
    reads no routed record below the lower of the two (but for the last Frontier mark before the point) and
    sends byte for byte what one that read its logs from offset 0 sends -- stars and single-centre paths (the
    engine's snapshot), a multi-centre path (its history), a product with a multi-centre part."""
    snapshots: list = []
    logs = ingest_logs(generate_patch(1600, seed=23), snapshots=snapshots)
    seqs = [c.seq for value in logs[("whole", 0)] for c in decode_changes("whole", value)]
    seq = seqs[len(seqs) // 2] + 5
    names = ("path3", "star", "fof", "names")

    def full(partition: int, start: int, end: int | None) -> list:
        return list(enumerate(logs[("routed", partition)][start:end], start))

    points = {p: point_of(full, p, seq, len(logs[("routed", p)])) for p in range(N)}
    for ahead in (0, 5):
        _zero, at_plan, rest = registered_late(logs, seq, ahead, names)
        assert any(o.topic == TOPICS["updates.routed"] for o in at_plan + rest)
        for base in (snapshots[len(snapshots) // 4], snapshots[-1]):  # below every point, above every point
            ends = base.routed_ends
            cut = {p: min(ends[p], max(offset for offset, kind, _seq in log_marks(full, p, 0, points[p])
                                       if kind == "mark")) for p in range(N)}
            assert any(cut[p] > 0 for p in range(N))
            based = Worker({key: list(values) for key, values in logs.items()}, base, cut)
            _based, at_plan_based, rest_based = registered_late(logs, seq, ahead, names, based)
            assert sent(at_plan_based) == sent(at_plan), (ahead, ends)
            assert sent(rest_based) == sent(rest), (ahead, ends)


def test_an_early_registration_reads_its_whole_log_instead_of_loading_ingests_snapshot() -> None:
    """With few changes before its seq (below ``log_read_changes``) and its logs still whole, a registration reads
    them from the routed logs: ingest's snapshot, the whole graph however early the point, is not loaded; and it
    sends byte for byte what one from the snapshot sends.  With a log cut below the point it still needs the
    snapshot, and loads it."""
    snapshots: list = []
    logs = ingest_logs(generate_patch(1600, seed=23), snapshots=snapshots)
    seqs = [c.seq for value in logs[("whole", 0)] for c in decode_changes("whole", value)]
    seq = seqs[len(seqs) // 8]
    names = ("path3", "star", "fof", "names")
    base = snapshots[-1]  # (past every point: moving it back to the points reads the logs after them)
    copy = {key: list(values) for key, values in logs.items()}
    from_base = Worker(copy, base, {}, log_read_changes=0)
    _w, at_plan, rest = registered_late(logs, seq, 0, names, from_base)
    assert from_base.loads == 1
    early = Worker({key: list(values) for key, values in logs.items()}, base, {}, log_read_changes=seq)
    _w, at_plan_early, rest_early = registered_late(logs, seq, 0, names, early)
    assert early.loads == 0, "the snapshot was not needed"
    assert sent(at_plan_early) == sent(at_plan) and sent(rest_early) == sent(rest)
    assert any(o.topic == TOPICS["deltas.parts"] for o in at_plan + rest)
    cut = Worker({key: list(values) for key, values in logs.items()}, base, {0: 1}, log_read_changes=seq)
    _w, at_plan_cut, rest_cut = registered_late(logs, seq, 0, names, cut)
    assert cut.loads == 1, "a trimmed log needs the snapshot"
    assert sent(at_plan_cut) == sent(at_plan) and sent(rest_cut) == sent(rest)
