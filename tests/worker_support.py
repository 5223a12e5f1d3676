"""A worker over in-memory logs, for the tests of the worker core: ingest's own records for a patch, and a
``WorkerCore`` reading them, whose probes join the routed logs they are sent to (it holds every partition)."""

from __future__ import annotations

from services.ingest.core import IngestProcessor, RawRecord
from services.kafka.config import KafkaSettings
from services.worker.shard import decode_changes
from services.worker.snapshots import IngestSnapshot

SETTINGS = KafkaSettings(topic_prefix="u.")
TOPICS = {"deltas.parts": "u.deltas.parts", "deadletter": "u.deadletter", "updates.routed": "u.updates.routed"}
N = 4


def ingest_logs(lines: list[str], per_record: int = 40, snapshots: list | None = None,
                sources: dict[tuple[int, int], int] | None = None) -> dict[tuple[str, int], list[bytes]]:
    """updates.routed per partition and updates.encoded (``("whole", 0)``) as ingest writes them for ``lines``,
    ``per_record`` lines a raw record; ``snapshots``: appended after each raw record, ingest's snapshot then
    (an ``IngestSnapshot``: presence with insert seqs, routed end offsets, updates.encoded offset, seq);
    ``sources``: filled with (routed partition, offset) -> the number of the raw record it came from."""
    ingest = IngestProcessor(SETTINGS, N, N)
    logs: dict[tuple[str, int], list[bytes]] = {("whole", 0): [], **{("routed", p): [] for p in range(N)}}
    for number, start in enumerate(range(0, len(lines), per_record)):
        for out in ingest.process(RawRecord(("\n".join(lines[start:start + per_record]) + "\n").encode())):
            if out.topic == "u.updates.routed":
                if sources is not None:
                    sources[(out.partition, len(logs[("routed", out.partition)]))] = number
                logs[("routed", out.partition)].append(out.value)
            elif out.topic == "u.updates.encoded":
                logs[("whole", 0)].append(out.value)
        if snapshots is not None:
            snapshots.append(IngestSnapshot(dict(ingest.present), {p: len(logs[("routed", p)]) for p in range(N)},
                                            len(logs[("whole", 0)]), ingest.seq))
    return logs


class InMemoryWorker:
    """The logs side of a test worker (a subclass makes ``self.core``): reads count the records they return
    (``read``), and with ``cut`` (routed partition -> offset) the routed records below it are refused, as if
    retention had deleted them."""

    def __init__(self, logs: dict, cut: dict[int, int] | None = None) -> None:
        self.logs = logs
        self.cut = cut or {}
        self.read = 0

    def reader(self, kind: str, partition: int, start: int, end: int) -> list:
        refused = kind == "routed" and start < self.cut.get(partition, 0) and start != end
        assert not refused, f"routed {partition} read from {start}"
        records = self.logs[(kind, partition if kind == "routed" else 0)][start:end]
        self.read += len(records)
        return [change for value in records for change in decode_changes(kind, value)]

    def records(self, partition: int, start: int, end: int | None) -> list:
        assert start >= self.cut.get(partition, 0) or start == end, f"routed {partition} read from {start}"
        records = self.logs[("routed", partition)][start:end]
        self.read += len(records)
        return list(enumerate(records, start))

    def flush(self, out: list) -> list:
        """``out`` and what the core batched, as one transaction: the probes it sends join their logs."""
        out = out + self.core.flush_batches()  # type: ignore[attr-defined]
        for o in out:
            if o.topic == TOPICS["updates.routed"]:
                self.logs[("routed", o.partition)].append(o.value)
        return out
