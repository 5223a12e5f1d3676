"""Ingest's snapshot in Kafka is a *base* (``docs/design/bounded-input-logs.md`` step 2): the graph as of
its seq, each present quad with the seq of the insert that made it present, and where each partition of
updates.routed stood, so a worker can start a routed partition's state from it and move it along that partition's
log instead of reading the log from offset 0.

On the embedded broker: ingest checkpoints after every transaction; once it has processed a first part of a stream
(deletes, re-inserts, deletes of absent triples, duplicates), its last snapshot is read; then the rest goes in.
The snapshot's presence set equals the one the encoded log leaves at its seq, insert seqs included; in every routed
partition, the changes below the recorded end are exactly those up to that seq, each delete carries the seq of the
insert it undoes, and the partition's graph moved back from its end to the recorded offset (the deletes undone with
those seqs) is the snapshot's quads routed there, with their roles and insert seqs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cbgp.change import routes
from services import codec
from services.kafka.client import read_all
from services.kafka.topics import ensure_topics
from services.state import presence
from tests.fixtures.broker import fresh_settings
from tests.fleet_support import Fleet, generate_patch, ingest_snapshot_at_end, publish_patch, wait_for

N = 4


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_ingests_snapshot_holds_each_quads_insert_seq_and_where_each_routed_partition_stood(
        kafka_broker, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    settings = fresh_settings(kafka_broker, partitions=N)
    ensure_topics(settings)
    lines = generate_patch(1600, seed=23, subjects=12)  # small: many deletes and re-inserts of the same triples
    encoded_topic = settings.topic("updates.encoded")

    def snapshot_at_end() -> tuple | None:
        saved = ingest_snapshot_at_end(settings)
        return presence.load_snapshot(saved.blob) if saved is not None else None

    with Fleet(settings, tmp_path / "logs") as fleet:
        fleet.start("ingest", "ingest", "--instance-id", "i1", "--checkpoint-interval", "0",
                    "--state-dir", str(tmp_path / "state"))
        publish_patch(settings, lines[:1000])
        record, present, _terms = wait_for(
            lambda: (lambda found: found if found and found[0]["facts"]["seq"] > 0 else None)(snapshot_at_end()),
            90.0, "ingest's snapshot of the first part")
        seq = record["facts"]["seq"]
        publish_patch(settings, lines[1000:])
        wait_for(lambda: (lambda found: found and found[0]["facts"]["seq"] > seq)(snapshot_at_end()), 90.0,
                 "the rest processed")

    expected: dict[tuple, int] = {}
    for message in read_all(settings, encoded_topic):
        for change in codec.encoded_changes(message.value()):
            if change.refresh or change.seq > seq:
                continue
            quad = (change.s, change.p, change.o, change.g)
            if change.diff > 0:
                expected[quad] = change.seq
            else:
                del expected[quad]
    assert expected and present == expected, "the snapshot: the graph at its seq, each quad with its insert's seq"

    ends = {int(p): end for p, end in record["facts"]["routed_ends"].items()}
    assert sorted(ends) == list(range(N))
    by_partition: dict[int, list] = {p: [] for p in range(N)}
    for message in read_all(settings, settings.topic("updates.routed")):
        by_partition[message.partition()].append(message)
    later = 0
    for p in range(N):
        graph: dict[tuple, int] = {}  # (quad, role) -> insert seq, moved forwards along the partition's log
        above: list[tuple] = []  # the changes above the recorded end, with the insert seq each delete undoes
        for message in by_partition[p]:
            changes = codec.routed_changes(message.value())
            inserted = codec.inserted_at(message.value()) or [0] * len(changes)  # (empty: no delete in it)
            assert len(inserted) == len(changes), "every batch with a delete says what its deletes undo"
            for change, insert in zip(changes, inserted):
                below = message.offset() < ends[p]
                assert below == (change.seq <= seq), (p, message.offset(), ends[p], change.seq, seq)
                key = (change.s, change.p, change.o, change.g, change.role)
                if change.diff > 0:
                    assert insert == 0
                    graph[key] = change.seq
                else:
                    assert graph.pop(key) == insert, "a delete carries the seq of the insert it undoes"
                if not below:
                    above.append((key, change.diff, insert))
                    later += 1
        for key, diff, insert in reversed(above):  # ... and backwards, from the end to the snapshot's offset
            if diff > 0:
                del graph[key]
            else:
                graph[key] = insert
        routed_here = {(*quad, role): insert for quad, insert in present.items()
                       for partition, role in routes(quad[0], quad[2], N) if partition == p}
        assert graph == routed_here, f"partition {p}: the snapshot filtered by routes() is its graph at {ends[p]}"
    assert later > 0, "changes after the snapshot went above the recorded ends"
