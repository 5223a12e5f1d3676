"""Where a restore takes a shard's checkpoint from (``services.state.shards.ShardCheckpoints``): the instance's
disk or Kafka, the newer; the disk's alone when it is at the committed offset.  No broker: the remote is a fake
with the ``CheckpointLog`` interface."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.state.shards import ShardCheckpoints, dump_shard
from services.state.store import Store


@dataclass
class Saved:
    blob: bytes
    position: int


class FakeRemote:
    def __init__(self) -> None:
        self.saved: dict[tuple[str, int], Saved] = {}
        self.queued: list[tuple[str, int, bytes, int]] = []
        self.reads = 0

    def get(self, kind: str, partition: int) -> Saved | None:
        self.reads += 1
        return self.saved.get((kind, partition))

    def queue(self, shards) -> int:  # type: ignore[no-untyped-def]
        self.queued.extend(shards)
        return len(shards)

    def take(self) -> list:
        taken, self.queued = self.queued, []
        return taken

    def owns(self, output: object) -> bool:
        return isinstance(output, tuple)

    def committed(self) -> None:
        for kind, partition, blob, position in self.take():
            self.saved[(kind, partition)] = Saved(blob, position)

    def close(self) -> None:
        pass


def blob(position: int) -> bytes:
    return dump_shard({"position": position, "engine": f"state@{position}"})


def test_the_newer_checkpoint_wins_and_the_disks_at_the_committed_offset_is_taken_without_asking_kafka(
        tmp_path: Path) -> None:
    remote = FakeRemote()
    with Store(tmp_path / "s") as store:
        checkpoints = ShardCheckpoints(store, remote)
        assert checkpoints.get("routed", 0, committed=0) is None
        assert checkpoints.put([("routed", 0, blob(10), 10)]) == 1
        records = checkpoints.outputs()
        assert len(records) == 1 and checkpoints.only_checkpoints(records)
        checkpoints.committed()  # (the transaction that carried them)

        reads = remote.reads
        got = checkpoints.get("routed", 0, committed=10)
        assert (got["position"], got["from"]) == (10, "store") and remote.reads == reads

        remote.saved[("routed", 0)] = Saved(blob(30), 30)  # another instance checkpointed it later
        got = checkpoints.get("routed", 0, committed=40)
        assert (got["position"], got["from"]) == (30, "kafka")

    with Store(tmp_path / "lost") as empty:  # a new disk: Kafka's alone
        got = ShardCheckpoints(empty, remote).get("routed", 0, committed=40)
        assert (got["position"], got["from"]) == (30, "kafka")
    remote.saved[("routed", 0)] = Saved(blob(5), 5)  # older than the disk's: the disk's
    with Store(tmp_path / "s") as store:
        got = ShardCheckpoints(store, remote).get("routed", 0, committed=40)
        assert (got["position"], got["from"]) == (10, "store")


def test_a_transaction_of_checkpoint_records_alone_is_told_apart() -> None:
    checkpoints = ShardCheckpoints(None, FakeRemote())
    assert checkpoints.only_checkpoints([("routed", 0, b"", 1)]) and checkpoints.only_checkpoints([])
    assert not checkpoints.only_checkpoints([("routed", 0, b"", 1), "an answer"])
    assert not ShardCheckpoints(None, None).only_checkpoints([])


def test_each_checkpoint_sets_its_kinds_size_and_time_metrics() -> None:
    from prometheus_client import REGISTRY

    checkpoints = ShardCheckpoints(None, FakeRemote())
    checkpoints.put([("deltas", 0, b"x" * 100, 3), ("deltas", 1, b"y" * 20, 4)])
    assert REGISTRY.get_sample_value("cbgp_checkpoint_bytes", {"kind": "deltas"}) == 120
    assert REGISTRY.get_sample_value("cbgp_checkpoint_last_timestamp_seconds", {"kind": "deltas"}) > 1.7e9
