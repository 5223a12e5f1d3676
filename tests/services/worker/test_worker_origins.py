"""Each deltas.parts record is timed from the updates behind its own deltas.

The answers service times an answer from its deltas.parts record's origin header (the produce time of the raw
update behind it), and so does ``cbgp_answer_latency_seconds``.  A worker's transaction holds the deltas of
several queries, made by updates of different ages (a cycle's deltas come turns after their update, with its
probes); each query's record must carry the earliest origin of its own live deltas, not of the whole turn.
"""

from __future__ import annotations

from services import codec
from services.wire.records import ORIGIN_HEADER
from services.worker.core import WorkerCore
from tests.fleet_support import QUERIES, generate_patch
from tests.worker_support import N, TOPICS, InMemoryWorker, ingest_logs


def routed_logs(lines: list[str]) -> tuple[dict, dict[tuple[int, int], int]]:
    """updates.routed as ingest writes it for ``lines`` (25 a raw record), and (partition, offset) -> the produce
    time given to the raw record each routed record came from (1,000 ms apart)."""
    sources: dict[tuple[int, int], int] = {}
    logs = ingest_logs(lines, 25, sources=sources)
    return logs, {at: 1_000_000 + 1_000 * number for at, number in sources.items()}


class Worker(InMemoryWorker):
    def __init__(self, logs: dict) -> None:
        super().__init__(logs)
        self.core = WorkerCore(TOPICS, N, N, N, self.reader, assemble_in_spark=False, record_reader=self.records)

    def register(self, offset: int, name: str) -> None:
        plan = {"query_id": name, "sparql": QUERIES[name], "options": {}, "plan_json": "{}", "projected": [],
                "registered_at_seq": 0, "registered_at_change_seq": 0, "version": 1}
        self.flush(self.core.on_plan(0, offset, name.encode(), codec.encode("QueryPlan", plan), range(N))[0])


def header_origin(output) -> int | None:
    values = [int(value) for key, value in output.headers or [] if key == ORIGIN_HEADER]
    return values[0] if values else None


def test_each_query_record_carries_the_earliest_origin_of_its_own_deltas() -> None:
    logs, origins = routed_logs(generate_patch(900, seed=5, subjects=12))
    seq_origin = {change.seq: origins[(p, offset)] for (kind, p), values in logs.items() if kind == "routed"
                  for offset, value in enumerate(values) for change in codec.routed_changes(value) or []}
    worker = Worker(logs)
    worker.flush([o for p in range(N) for o in worker.core.open_shard("routed", p, 0, None)])
    for offset, name in enumerate(("star", "path", "path3", "triangle")):
        worker.register(offset, name)
    checked, mixed_turns = 0, 0
    moved = True
    while moved:  # turns of a few records per partition; the probes sent are read in later turns
        moved = False
        turn: list = []
        for p in range(N):
            shard = worker.core.shards[("routed", p)]
            log = worker.logs[("routed", p)]
            for offset in range(shard.position, min(len(log), shard.position + 6)):
                turn += worker.core.on_routed(shard, offset, log[offset], origins.get((p, offset)))[0]
                moved = True
        records = [o for o in worker.flush(turn) if o.topic == TOPICS["deltas.parts"]]
        seen = set()
        for output in records:
            if codec.writer_name(output.value) not in ("PartDeltaColumns", "PartDelta"):
                continue  # Frontier and ProbeReady marks
            deltas = codec.part_delta_columns(output.value)
            live = [seq for seq, snapshot in zip(deltas.seq, deltas.snapshot) if not snapshot]
            expected = min((seq_origin[seq] for seq in live), default=None)
            assert header_origin(output) == expected, (deltas.query_id, live[:5])
            checked += 1
            seen.add(expected)
        mixed_turns += len(seen) > 1
    assert checked > 40, "deltas of every kind were timed"
    assert mixed_turns > 0, "some transaction held deltas of updates of different ages"
