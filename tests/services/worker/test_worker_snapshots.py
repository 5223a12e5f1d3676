"""A routed partition's graph before a registration's point, moved from a base (ingest's snapshot) instead of
read from offset 0 (``services.worker.snapshots``): forwards or backwards along the log, it is
the graph the log from 0 gives, each quad with the seq of its insert, and it reads only the records between the
base and the point."""

from __future__ import annotations

import random

import pytest

from cbgp.distributed.versioned_state import fold
from services import codec
from services.worker.snapshots import FOREVER, IngestSnapshot, RoutedBase
from tests.fleet_support import generate_patch
from tests.worker_support import N, ingest_logs


def logs_and_snapshots(lines: list[str]) -> tuple[dict[int, list[bytes]], list]:
    """The routed logs, and ingest's snapshot before and after each raw record (a transaction): (presence,
    routed ends)."""
    snapshots: list = [IngestSnapshot({}, {p: 0 for p in range(N)}, 0, 0)]
    logs = ingest_logs(lines, per_record=30, snapshots=snapshots)
    return {p: logs[("routed", p)] for p in range(N)}, snapshots


def from_zero(log: list[bytes], point: int) -> dict:
    graph: dict = {}
    for value in log[:point]:
        fold(graph, codec.routed_changes(value), FOREVER)
    return {quad: (change.seq, change.role) for quad, change in graph.items()}


@pytest.mark.parametrize("seed", range(4))
def test_a_base_moved_to_a_point_is_the_graph_the_log_from_0_gives(seed: int) -> None:
    rng = random.Random(seed)
    logs, snapshots = logs_and_snapshots(generate_patch(1500, seed=seed))
    backwards = forwards = 0
    for _ in range(60):
        present, ends, _encoded, _seq = rng.choice(snapshots)
        p = rng.randrange(N)
        point = rng.randrange(len(logs[p]) + 1)
        base = RoutedBase.of(present, ends, p, N)
        low, high = min(base.offset, point), max(base.offset, point)

        def records(partition: int, start: int, end: int | None) -> list:
            assert partition == p and low <= start and end is not None and end <= high, (start, end, low, high)
            return list(enumerate(logs[p][start:end], start))

        graph, known = base.before(records, point)
        assert known
        assert {quad: (change.seq, change.role) for quad, change in graph.items()} == from_zero(logs[p], point)
        backwards += base.offset > point
        forwards += base.offset < point
    assert backwards and forwards


def test_a_base_without_insert_seqs_serves_a_snapshot_but_no_history() -> None:
    """An older ingest's snapshot (insert seqs unknown), or a delete from before ingest kept the seq of the insert
    it undoes, moved backwards over: the graph is right, and it says its insert seqs are not all known."""
    logs, snapshots = logs_and_snapshots(generate_patch(600, seed=3))
    present, ends, _encoded, _seq = snapshots[len(snapshots) // 2]

    def records(partition: int, start: int, end: int | None) -> list:
        return list(enumerate(logs[partition][start:end], start))

    older = RoutedBase.of(dict.fromkeys(present, -1), ends, 1, N)  # (an ingest snapshot of format 1)
    graph, known = older.before(records, len(logs[1]))
    assert not known and set(graph) == set(from_zero(logs[1], len(logs[1])))

    last = RoutedBase.of(*snapshots[-1][:2], 1, N)
    assert last.before(records, ends[1])[1], "every delete says which insert it undoes"
    stripped = {1: [codec.encode_routed_batch(codec.routed_changes(value)) if codec.routed_changes(value) else value
                    for value in logs[1]]}  # (records written before inserted_at)
    graph, known = last.before(lambda _p, start, end: list(enumerate(stripped[1][start:end], start)), ends[1])
    assert not known and set(graph) == set(from_zero(logs[1], ends[1]))
