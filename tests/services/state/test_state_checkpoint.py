"""Ingest's state checkpoint, without Kafka: the store writes a checkpoint and its data in one
batch, a checkpoint plus the tail of the logs after its positions gives exactly the state of an uninterrupted
run, and a checkpoint that cannot belong to the logs is refused.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path

import pytest

from services import codec
from services.ingest.core import IngestProcessor, RawRecord
from services.ingest.service import save_checkpoint, spill
from services.kafka.config import KafkaSettings
from services.state.checkpointing import Checkpoint, Checkpointer, unusable
from services.state.store import Store
from services.state import presence
from services.wire.sealed import seal
from tests.fleet_support import generate_patch

S = KafkaSettings(topic_prefix="u.")
ENCODED, DICTIONARY = S.topic("updates.encoded"), S.topic("dictionary")


def _records(lines: list[str], per_message: int = 25, first_offset: int = 0) -> list[RawRecord]:
    return [RawRecord(("\n".join(lines[i:i + per_message]) + "\n").encode(), {}, S.topic("updates.raw"), 0,
                      first_offset + i // per_message, 1000 + i) for i in range(0, len(lines), per_message)]


class _Logs:
    """updates.encoded and dictionary as lists: what a processor produced, in order (offset = index)."""

    def __init__(self) -> None:
        self.encoded: list[bytes] = []
        self.dictionary: dict[int, list[bytes]] = {p: [] for p in range(4)}

    def run(self, processor: IngestProcessor, records: list[RawRecord]) -> None:
        for record in records:
            for out in processor.accept(record) + processor.flush():
                if out.topic == ENCODED:
                    self.encoded.append(out.value)
                elif out.topic == DICTIONARY:
                    self.dictionary[out.partition].append(out.value)

    def ends(self) -> dict[str, dict[int, int]]:
        return {ENCODED: {0: len(self.encoded)}, DICTIONARY: {p: len(v) for p, v in self.dictionary.items()}}

    def restore_tail(self, processor: IngestProcessor, starts: dict[str, dict[int, int]]) -> None:
        for value in self.encoded[starts[ENCODED][0]:]:
            processor.restore_encoded(value)
        for partition, values in self.dictionary.items():
            for value in values[starts[DICTIONARY][partition]:]:
                processor.restore_dictionary(value)


def _rows(values: list[bytes]) -> list[tuple]:
    return [(seq, sign, s, p, o, g, refresh) for value in values
            for seq, sign, s, p, o, g, _t, _role, refresh in codec.encoded_changes(value)]


def _insert_seqs(values: list[bytes]) -> dict[tuple, int]:
    """The presence set an encoded log leaves, each quad with the seq of the insert that made it present; checks
    on the way that each delete carries that seq (``inserted_at``)."""
    present: dict[tuple, int] = {}
    for value in values:
        changes = codec.encoded_changes(value)
        for change, inserted in zip(changes, codec.inserted_at(value) or [0] * len(changes), strict=True):
            quad = (change.s, change.p, change.o, change.g)
            if change.refresh:
                assert inserted == 0
            elif change.diff > 0:
                assert inserted == 0
                present[quad] = change.seq
            else:
                assert present.pop(quad) == inserted, "a delete carries the seq of the insert it undoes"
    return present


def _tracking() -> IngestProcessor:
    processor = IngestProcessor(S, 4, 4)
    processor.track_changes = True
    return processor


def test_a_checkpoint_plus_the_tail_restores_the_state_of_an_uninterrupted_run(tmp_path: Path) -> None:
    lines = generate_patch(1500, seed=3)
    records = _records(lines)
    cut, later = len(records) // 3, 2 * len(records) // 3

    uninterrupted = IngestProcessor(S, 4, 4)
    reference = _Logs()
    reference.run(uninterrupted, records)
    assert uninterrupted.present == _insert_seqs(reference.encoded)  # each quad with its insert's seq

    live, logs = _tracking(), _Logs()
    with Store(tmp_path / "store") as store:
        logs.run(live, records[:cut])
        first = save_checkpoint(live, store, logs.ends())
        logs.run(live, records[cut:later])
        second = save_checkpoint(live, store, logs.ends())  # incremental: only what changed since the first
        assert not live.changed and not live.new_terms
        logs.run(live, records[later:later + 3])  # processed and "committed", never checkpointed: the tail
    assert first.facts["seq"] < second.facts["seq"] < live.seq

    with Store(tmp_path / "store") as store:  # a new process opens the same directory
        saved = Checkpoint.from_json(store.checkpoint())
        assert saved.positions == second.positions and saved.facts == second.facts
        restored = _tracking()
        restored.load_state(presence.load_present(store), presence.load_terms(store), saved.facts["seq"])
    logs.restore_tail(restored, saved.positions)
    assert restored.present == live.present and restored.seq == live.seq
    assert restored.published == live.published and dict(restored.known) == dict(live.known)

    # Both go on with the rest of the stream: the same encoded rows as the run that never stopped (no insert of
    # a present triple numbered again, deletes of absent triples still dropped, refreshes where they were).
    logs.run(restored, records[later + 3:])
    assert _rows(logs.encoded) == _rows(reference.encoded)
    assert restored.present == uninterrupted.present and restored.seq == uninterrupted.seq
    assert sum(len(v) for v in logs.dictionary.values()) == sum(len(v) for v in reference.dictionary.values())


def test_a_stale_checkpoint_and_a_tail_read_twice_give_the_same_state(tmp_path: Path) -> None:
    records = _records(generate_patch(600, seed=11))
    live, logs = _tracking(), _Logs()
    with Store(tmp_path / "store") as store:
        logs.run(live, records[:8])
        checkpoint = save_checkpoint(live, store, logs.ends())
        logs.run(live, records[8:])
        restored = IngestProcessor(S, 4, 4)
        restored.load_state(presence.load_present(store), presence.load_terms(store), checkpoint.facts["seq"])
    # A position below the true one (the records 2.. re-read): re-applying what the state holds changes nothing.
    early = {ENCODED: {0: max(checkpoint.positions[ENCODED][0] - 2, 0)}, DICTIONARY: {p: 0 for p in range(4)}}
    logs.restore_tail(restored, early)
    assert restored.present == live.present and restored.seq == live.seq and restored.published == live.published


def test_a_failed_checkpoint_write_leaves_the_previous_checkpoint_and_its_data(tmp_path: Path) -> None:
    with Store(tmp_path / "s") as store:
        store.commit([(b"q1", b""), (b"q2", b"")], [], {"n": 1})

        def broken():  # the process fails half-way through building the batch
            yield b"q3", b""
            raise OSError("disk gone")

        with pytest.raises(OSError):
            store.commit(broken(), [b"q1"], {"n": 2})
        assert store.checkpoint() == {"n": 1}
        assert list(store.keys(b"q")) == [b"q1", b"q2"]
        store.commit([(b"q3", b"")], [b"q1"], {"n": 3})
    with Store(tmp_path / "s") as store:
        assert store.checkpoint() == {"n": 3} and list(store.keys(b"q")) == [b"q2", b"q3"]
        store.clear()
        assert store.checkpoint() is None and list(store.keys(b"q")) == []


def test_a_checkpoint_serves_stale_and_truncated_logs_but_not_logs_it_cannot_belong_to() -> None:
    checkpoint = Checkpoint({"e": {0: 10}, "d": {0: 4, 1: 7}}, {"seq": 9})
    assert Checkpoint.from_json(checkpoint.to_json()) == checkpoint
    assert unusable(checkpoint, {"e": {0: (0, 10)}, "d": {0: (0, 4), 1: (0, 7)}}) is None  # exactly at the ends
    assert unusable(checkpoint, {"e": {0: (10, 25)}, "d": {0: (0, 9), 1: (0, 7)}}) is None  # stale, deleted below
    future = unusable(checkpoint, {"e": {0: (0, 3)}, "d": {0: (0, 4), 1: (0, 7)}})  # re-created topic
    assert future is not None and "beyond the log's end 3" in future and "e[0]" in future
    assert "partitions" in unusable(checkpoint, {"e": {0: (0, 10)}, "d": {0: (0, 4)}})
    assert "no position in x" in unusable(checkpoint, {"e": {0: (0, 10)}, "d": {0: (0, 4), 1: (0, 7)}, "x": {0: (0, 0)}})
    assert "which the restore does not read" in unusable(checkpoint, {"e": {0: (0, 10)}})
    with pytest.raises(ValueError):
        Checkpoint.from_json({"format": 99, "positions": {}})


def test_checkpoints_are_due_after_a_commit_at_most_every_interval() -> None:
    now = [100.0]
    checkpointer = Checkpointer(10, clock=lambda: now[0], spread=0)
    assert not checkpointer.due()  # nothing committed
    checkpointer.committed()
    assert not checkpointer.due()  # committed, but the last checkpoint is 0 s old
    now[0] += 10
    assert checkpointer.due()
    checkpointer.saved()
    checkpointer.committed()
    now[0] += 9.9
    assert not checkpointer.due()
    every = Checkpointer(0, clock=lambda: now[0])
    every.committed()
    assert every.due()
    every.saved(took=3.0)  # (0: after every transaction, however long the last one took)
    every.committed()
    assert every.due()
    with pytest.raises(ValueError):
        Checkpointer(-1)


def test_checkpoints_take_at_most_their_budget_of_the_time() -> None:
    """A checkpoint that took t seconds is followed by the next after max(interval, t / budget): a state that
    takes long to save is saved less often, one that is quick as often as the interval allows."""
    now = [0.0]
    checkpointer = Checkpointer(10, clock=lambda: now[0], budget=0.05, spread=0)
    checkpointer.saved(took=2.0)  # 2 s: the next waits 40 s
    checkpointer.committed()
    now[0] += 39.9
    assert not checkpointer.due()
    now[0] += 0.1
    assert checkpointer.due()
    checkpointer.saved(took=0.1)  # quick again: every 10 s
    checkpointer.committed()
    now[0] += 10
    assert checkpointer.due()
    for budget in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match="checkpoint budget"):
            Checkpointer(10, budget=budget)


def test_checkpoints_come_later_than_due_by_a_random_share_so_a_fleet_s_services_do_not_take_them_together(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each wait (the first, the interval's, the budget's) is lengthened by a random share of itself up to the
    spread (CBGP_CHECKPOINT_SPREAD_PCT, 50 by default): never sooner than due, and two services started together
    part at once."""
    now, draws = [0.0], iter([0.0, 1.0, 0.5])
    checkpointer = Checkpointer(10, clock=lambda: now[0], spread=0.5, draw=lambda: next(draws))
    checkpointer.committed()
    now[0] += 10
    assert checkpointer.due()  # first draw 0: when due
    checkpointer.saved(took=0.1)  # draw 1: 10 s and half of it
    checkpointer.committed()
    now[0] += 14.9
    assert not checkpointer.due()
    now[0] += 0.1
    assert checkpointer.due()
    checkpointer.saved(took=1.0)  # the budget's 20 s, and a quarter of it (draw 0.5 x spread 0.5)
    checkpointer.committed()
    now[0] += 24.9
    assert not checkpointer.due()
    now[0] += 0.1
    assert checkpointer.due()
    assert Checkpointer(0, clock=lambda: now[0], spread=0.5).pause == 0  # (after every transaction: no wait)
    monkeypatch.setenv("CBGP_CHECKPOINT_SPREAD_PCT", "0")
    assert Checkpointer(10).pause == 10
    monkeypatch.delenv("CBGP_CHECKPOINT_SPREAD_PCT")
    firsts = {Checkpointer(10).pause for _ in range(20)}
    assert len(firsts) > 1 and all(10 <= pause <= 15 for pause in firsts)


def test_a_store_in_use_elsewhere_turns_checkpoints_off_with_one_line_instead_of_failing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from services.runtime import recovery
    from services.state.store import StoreLocked

    with Store(tmp_path / "ingest-i1"):
        with pytest.raises(StoreLocked, match="give each instance its own --state-dir or --instance-id"):
            Store(tmp_path / "ingest-i1")
        with caplog.at_level(logging.WARNING, logger="cbgp.state"):
            assert recovery.open_store(tmp_path, "ingest-i1") is None  # the service restores from its logs
    lines = [r.getMessage() for r in caplog.records if "checkpoints-off" in r.getMessage()]
    assert len(lines) == 1 and "in use by another process" in lines[0]
    assert recovery.open_store("", "ingest-i1") is None  # --state-dir '': off
    opened = recovery.open_store(tmp_path, "ingest-i1")
    assert opened is not None
    opened.close()


def test_ingests_snapshot_for_kafka_round_trips_its_state_and_refuses_another_format() -> None:
    import pickle
    from array import array

    present = {(1, 2, 3, 0): 4, (2 ** 62, 5, 6, 7): 2 ** 40, (9, 9, 9, 9): 1}  # quad -> the seq of its insert
    terms = [(1, "<http://example.org/a>"), (5, '"five"@en')]
    blob = presence.snapshot(present, terms, {"format": 1, "positions": {}})
    assert presence.load_snapshot(blob) == ({"format": 1, "positions": {}}, present, terms)
    assert len(blob) < 40 * len(present) + 400  # 40 bytes a quad, not a pickled dict of tuples
    assert presence.load_snapshot(presence.snapshot({}, [], {})) == ({}, {}, [])
    # a snapshot of the format before insert seqs were kept: its quads, their seqs unknown
    packed = array("q", [q for quad in present for q in quad])
    packed.byteswap()
    older = pickle.dumps({"format": 1, "checkpoint": {}, "present": packed.tobytes(), "terms": terms})
    assert presence.load_snapshot(older) is None  # unsealed: never unpickled (services.wire.sealed)
    assert presence.load_snapshot(seal(older)) == ({}, dict.fromkeys(present, presence.UNKNOWN_SEQ), terms)
    # and of the format that interleaved each quad with its seq and pickled the terms as one list
    interleaved = array("q", [n for quad, seq in present.items() for n in (*quad, seq)])
    interleaved.byteswap()
    second = seal(pickle.dumps({"format": 2, "checkpoint": {}, "present": interleaved.tobytes(), "terms": terms}))
    assert presence.load_snapshot(second) == ({}, present, terms)
    assert presence.load_snapshot(seal(pickle.dumps({"format": 0}))) is None
    assert presence.load_snapshot(b"not a pickle") is None
    # its record alone, for readers of where it stands (`cbgp topics floor`), refused the same way
    assert presence.snapshot_record(blob) == {"format": 1, "positions": {}}
    assert presence.snapshot_record(seal(older)) == {}
    for refused in (older, seal(pickle.dumps({"format": 0})), b"not a pickle", seal(pickle.dumps([1]))):
        assert presence.snapshot_record(refused) is None


def test_with_the_state_on_disk_ingest_writes_the_same_logs_and_restores_by_opening_the_store(tmp_path: Path) -> None:
    """The state on disk (``--state-on-disk``): presence set and published terms in the store, memory holding only
    what changed since the last checkpoint.  The encoded rows and dictionary entries equal the in-memory run's
    (set semantics, refreshes, term publication), across checkpoints and a restore that loads nothing and reads
    the tail; SPARQL Update requests (whose WHERE reads the whole graph) too; a term cache smaller than the
    terms (evictions) changes nothing."""
    from services.state.ondisk import DiskPresence

    lines = generate_patch(3000, seed=17)  # inserts, deletes of present and absent triples, duplicates
    update = ('DELETE { ?s ?p ?o } INSERT { ?s <http://example.org/seen> "yes" } WHERE { ?s ?p ?o '
              'FILTER(?p = <http://example.org/knows>) }')
    records = _records(lines)
    cut = len(records) // 2
    sparql = RawRecord(update.encode(), {"cbgp-format": b"application/sparql-update"}, S.topic("updates.raw"), 0, 999,
                       5000)

    uninterrupted, reference = IngestProcessor(S, 4, 4), _Logs()
    reference.run(uninterrupted, records[:cut] + [sparql] + records[cut:])

    logs = _Logs()
    with Store(tmp_path / "store") as store:
        live = IngestProcessor(S, 4, 4)
        live.use_disk(store, 0, 0)
        live.disk_terms.cache = 50  # far fewer than the terms: the cache is cleared again and again
        logs.run(live, records[: cut // 2])
        save_checkpoint(live, store, logs.ends())
        assert isinstance(live.present, DiskPresence) and not live.present.overlay  # in the store now
        logs.run(live, records[cut // 2: cut])
        checkpoint = save_checkpoint(live, store, logs.ends())
        logs.run(live, [sparql] + records[cut: cut + 5])  # committed, never checkpointed: the tail

    with Store(tmp_path / "store") as store:  # a new life: nothing loaded, the tail read
        saved = Checkpoint.from_json(store.checkpoint())
        restored = IngestProcessor(S, 4, 4)
        restored.use_disk(store, saved.facts["present"], saved.facts["terms"])
        restored.seq = saved.facts["seq"]
        assert not restored.present.overlay and not restored.known
        logs.restore_tail(restored, saved.positions)
        logs.run(restored, records[cut + 5:])
        assert restored.present.overlay
        spill(restored, store, logs.ends(), limit=1)  # what a long tail's restore does as it reads
        assert not restored.present.overlay
        spilled = Checkpoint.from_json(store.checkpoint())
        assert spilled.positions == logs.ends() and spilled.facts["present"] == len(uninterrupted.present)
        assert {quad: restored.present.get(quad) for quad in restored.present} == uninterrupted.present
        assert len(restored.present) == len(uninterrupted.present)
        assert restored.seq == uninterrupted.seq
        assert set(restored.published) == uninterrupted.published
    assert 0 < checkpoint.facts["present"] and 0 < checkpoint.facts["terms"]
    assert any(row[3] == uninterrupted.known["<http://example.org/seen>"] for row in _rows(reference.encoded))
    assert _rows(logs.encoded) == _rows(reference.encoded)
    assert sorted(v for values in logs.dictionary.values() for v in values) == sorted(
        v for values in reference.dictionary.values() for v in values)


def test_a_snapshot_written_in_slices_pauses_between_them_and_is_the_same_blob() -> None:
    """A background writer gives the interpreter's lock back between slices (services.ingest.checkpoint): the
    pause comes every SLICE quads, and the blob is byte for byte the one written in one go."""
    present = {(i, 2, i + 1, 0): i + 1 for i in range(3 * presence.SLICE + 7)}
    terms = [(i, f"<http://example.org/{i}>") for i in range(presence.SLICE + 1)]
    pauses = []
    blob = presence.snapshot(present, iter(terms), {"seq": 9}, pause=lambda: pauses.append(1))
    assert len(pauses) == 4  # (four slices of quads)
    assert blob == presence.snapshot(present, terms, {"seq": 9})
    assert presence.load_snapshot(blob) == ({"seq": 9}, present, terms)


def test_a_snapshots_terms_are_pickled_once_and_hold_exactly_the_published_set(monkeypatch) -> None:  # noqa: ANN001
    """Ingest's snapshots reuse the terms the last one packed: across updates each term is decoded once, the
    chunks stay few and bounded, a snapshot loads exactly the published terms, and a set that lost terms (a
    restore to an older state) is packed again from nothing."""
    monkeypatch.setattr(presence, "TERM_CHUNK", 64)
    names = {i: f"<http://example.org/{i}>" for i in range(1000)}
    decoded: list[int] = []

    def decode(term_id: int) -> str:
        decoded.append(term_id)
        return names[term_id]

    many = presence.TermChunks((i, names[i]) for i in range(200))  # more than a chunk at once: split
    assert [len(pickle.loads(chunk)) for chunk in many.chunks] == [64, 64, 64, 8]
    chunks, published = presence.TermChunks(), set()
    for step in range(1, 40):
        published |= set(range(step * step % 997, step * step % 997 + step))  # (overlapping growth)
        chunks.update(set(published), decode)
        assert chunks.ids == published and len(decoded) == len(published)  # each term decoded once
        assert len(chunks.chunks) <= 2 * len(published) // 64 + 8
        assert all(len(pickle.loads(chunk)) <= 64 for chunk in chunks.chunks)
        _, _, terms = presence.load_snapshot(presence.snapshot({}, chunks, {}))  # type: ignore[misc]
        assert sorted(terms) == sorted((i, names[i]) for i in published)
    smaller = set(list(published)[: len(published) // 2])
    chunks.update(smaller, decode)
    _, _, terms = presence.load_snapshot(presence.snapshot({}, chunks, {}))  # type: ignore[misc]
    assert sorted(terms) == sorted((i, names[i]) for i in smaller) and chunks.ids == smaller
