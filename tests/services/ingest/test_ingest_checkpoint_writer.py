"""Ingest's checkpoints are written in a background thread (services.ingest.checkpoint) while the service goes on:
what is written, to the store and as the snapshot, is the state when the checkpoint was taken, whatever the
service did meanwhile; the store then restores that state; a failing store is reported, not raised, and the
snapshot is still made."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from services.ingest.checkpoint import Capture, CheckpointWriter
from services.ingest.core import IngestProcessor, RawRecord
from services.kafka.config import KafkaSettings
from services.state import presence
from services.state.checkpointing import Checkpoint
from services.state.store import Store, StoreError
from tests.fleet_support import generate_patch

S = KafkaSettings(topic_prefix="w.")


def _feed(processor: IngestProcessor, lines: list[str], offset: int) -> None:
    for i in range(0, len(lines), 50):
        record = RawRecord(("\n".join(lines[i:i + 50]) + "\n").encode(), {}, S.topic("updates.raw"), 0,
                           offset + i // 50, 1000)
        processor.accept(record)
        processor.flush()


def _capture(processor: IngestProcessor) -> Capture:
    record = Checkpoint({S.topic("updates.encoded"): {0: processor.seq}}, {"seq": processor.seq}, 0)
    capture = Capture(record, processor.seq)
    capture.changed, capture.new_terms = processor.take_changes()
    capture.present, capture.published = dict(processor.present), set(processor.published)
    return capture


class _HeldStore(Store):
    """A store whose commit waits until the test lets it go (the service goes on meanwhile)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.go = threading.Event()

    def commit(self, puts, deletes, checkpoint) -> None:  # type: ignore[no-untyped-def, override]
        assert self.go.wait(10)
        super().commit(puts, deletes, checkpoint)


def test_what_is_written_is_the_state_when_the_checkpoint_was_taken(tmp_path: Path) -> None:
    lines = generate_patch(1200, seed=7, subjects=15)
    processor = IngestProcessor(S, 4, 4)
    processor.track_changes = True
    _feed(processor, lines[:600], 0)
    taken, seq_then = dict(processor.present), processor.seq
    terms_then = {term_id: processor.dictionary.decode(term_id) for term_id in processor.published}
    store = _HeldStore(tmp_path / "store")
    writer = CheckpointWriter()
    try:
        writer.start(_capture(processor), store, processor.dictionary.decode)
        assert writer.busy() and writer.done() is None  # still writing: the service goes on
        _feed(processor, lines[600:], 12)  # deletes, re-inserts and new terms while the write waits
        assert processor.present != taken
        store.go.set()
        written = writer.done(wait=True)
        assert written is not None and written.store_error is None and not writer.busy()
        assert written.blob is not None
        record, present, terms = presence.load_snapshot(written.blob)  # type: ignore[misc]
        assert present == taken and dict(terms) == terms_then and record["facts"]["seq"] == seq_then
        assert presence.load_present(store) == taken and store.checkpoint()["facts"]["seq"] == seq_then
        assert dict(presence.load_terms(store)) == terms_then
    finally:
        writer.close()
        store.close()


def test_a_failing_store_is_reported_and_the_snapshot_still_made(tmp_path: Path) -> None:
    class Broken(Store):
        def commit(self, puts, deletes, checkpoint) -> None:  # type: ignore[no-untyped-def, override]
            raise StoreError("disk full")

    processor = IngestProcessor(S, 4, 4)
    processor.track_changes = True
    _feed(processor, generate_patch(200, seed=3), 0)
    store = Broken(tmp_path / "broken")
    writer = CheckpointWriter()
    try:
        writer.start(_capture(processor), store, processor.dictionary.decode)
        written = writer.done(wait=True)
        assert written is not None and "disk full" in str(written.store_error)
        assert written.blob is not None and presence.load_snapshot(written.blob)[1] == processor.present  # type: ignore[index]
        with pytest.raises(AssertionError, match="one checkpoint at a time"):
            writer.start(_capture(processor), None, processor.dictionary.decode)
            writer.start(_capture(processor), None, processor.dictionary.decode)
    finally:
        writer.close()
        store.close()
