"""The answers service's commit metadata stays small however many registrations it has opened: a Kafka broker keeps
at most ``offset.metadata.max.bytes`` of it (4096 by default) and refuses the transaction's offsets beyond.  A
restore still knows every opened gate: those under the lowest registration not opened yet, from queries.plans."""

from __future__ import annotations

from services.answers.release import SeqRelease
from services.codec import PartDeltaColumns

ROUTED = 4
KAFKA_METADATA_LIMIT = 4096  # offset.metadata.max.bytes, the broker's default


def _release(plans: list[tuple[str, int, int, bool]], read: int, partition: int = 0) -> SeqRelease:
    """A release told of ``plans`` ((query, version, queries.plans offset, gated), all of deltas.parts
    ``partition``, plans partition 0) and of queries.plans read up to ``read``."""
    release = SeqRelease(ROUTED, lambda _q, _v: "SELECT * WHERE { ?x <http://e/k> ?y }", {11: "<http://e/a>"},
                         lambda _q, _v: "simple var-centric star")
    release.plans_read = {0: read}
    for query_id, version, offset, gated in plans:
        release.note_plan(query_id, version, partition, 0, offset, gated)
    return release


def _delta(query_id: str, seq: int, version: int = 1) -> PartDeltaColumns:
    return PartDeltaColumns(query_id, -1, ["x"], [seq], [1], [11], [0], [seq], [0], [False], [None], version,
                            False, True, False)


def _open(release: SeqRelease, query_id: str, offset: int, version: int = 1, as_of: int = 5) -> int:
    """Every routed partition marks ``query_id`` ready (deltas.parts offsets from ``offset``); the next offset."""
    for routed in range(ROUTED):
        release.on_ready(0, offset, query_id, version, routed, as_of)
        offset += 1
    return offset


def _released(release: SeqRelease, query_id: str, seq: int, offset: int, version: int = 1) -> bool:
    """Whether a delta of ``query_id`` at ``seq`` goes out once every routed partition has passed it (it is held
    for ever in a gate when the release thinks its registration is not open)."""
    out = release.on_deltas(0, offset, None, _delta(query_id, seq, version))
    out += release.on_frontier(0, {p: seq for p in range(ROUTED)})
    return any(cols.query_id == query_id for _o, _origin, cols in out)


def test_the_metadata_of_thousands_of_opened_registrations_fits_a_kafka_broker_and_restores_them_all() -> None:
    queries = [f"query-{i:05d}" for i in range(3000)]
    plans = [(q, 1, offset, True) for offset, q in enumerate(queries)]
    release = _release(plans, read=len(plans))
    release.restore(0, None)
    offset = 0
    for q in queries:
        offset = _open(release, q, offset)
    release.on_frontier(0, {p: 10 for p in range(ROUTED)})
    assert len(release.partitions[0].opened) == len(queries)
    _position, metadata = release.commit_position(0, offset)
    assert len(metadata) < 200 < KAFKA_METADATA_LIMIT, metadata

    # Another instance (or a new life) reads the same plans and restores from that commit: all open.
    again = _release(plans, read=len(plans))
    again.restore(0, metadata)
    assert set(again.partitions[0].opened) == {(q, 1) for q in queries}
    assert _released(again, queries[1234], 20, offset)
    # A release that was not told of the plans (the metadata alone) would have held it in a gate.
    blind = _release([], read=len(plans))
    blind.restore(0, metadata)
    assert not _released(blind, queries[1234], 20, offset)


def test_a_registration_not_opened_yet_keeps_the_ones_above_it_named_until_it_opens() -> None:
    plans = [("slow", 1, 0, True), ("windowed", 1, 1, False)] + [(f"q{i}", 1, 2 + i, True) for i in range(5)]
    release = _release(plans, read=len(plans))
    release.restore(0, None)
    offset = 0
    for i in range(5):
        offset = _open(release, f"q{i}", offset)
    release.on_frontier(0, {p: 10 for p in range(ROUTED)})
    _position, metadata = release.commit_position(0, offset)
    again = _release(plans, read=len(plans))
    again.restore(0, metadata)
    opened = again.partitions[0].opened
    assert set(opened) == {(f"q{i}", 1) for i in range(5)}, "named: above the one still shut"
    assert all(as_of == 5 for as_of in opened.values()), "named ones keep their as_of"
    assert not _released(again, "slow", 20, offset), "still gated: its registration is not open"

    # Once it opens, the metadata names none of them: every one is below the next registration to read.
    offset = _open(release, "slow", offset)
    release.on_frontier(0, {p: 11 for p in range(ROUTED)})
    _position, metadata = release.commit_position(0, offset)
    assert '"opened"' not in metadata, metadata
    again = _release(plans, read=len(plans))
    again.restore(0, metadata)
    assert set(again.partitions[0].opened) == {("slow", 1)} | {(f"q{i}", 1) for i in range(5)}
    assert ("windowed", 1) not in again.partitions[0].opened, "a query the workers do not gate is not opened"


def test_a_registration_read_after_the_commit_is_gated_after_a_restore() -> None:
    release = _release([("a", 1, 0, True)], read=1)
    release.restore(0, None)
    offset = _open(release, "a", 0)
    release.on_frontier(0, {p: 10 for p in range(ROUTED)})
    _position, metadata = release.commit_position(0, offset)
    # queries.plans holds one more registration now, and a re-registration of "a" (version 2).
    later = [("a", 2, 2, True), ("b", 1, 1, True)]
    again = _release(later, read=3)
    again.restore(0, metadata)
    assert not again.partitions[0].opened
    assert not _released(again, "b", 20, offset), "b registered after the commit: its gate is shut"
    assert not _released(again, "a", 21, offset + 1, version=2), "a's new registration too"
    # The old registration's deltas read again are an ended stream's: dropped, not held (they would pin the commit).
    assert again.on_deltas(0, offset + 2, None, _delta("a", 22, version=1)) == []
    assert again.commit_position(0, offset + 3)[0] == offset, "only b's and a@2's held deltas pin it"


def test_an_unregistered_registration_is_neither_named_nor_held() -> None:
    release = _release([("a", 1, 0, True), ("b", 1, 1, True)], read=2)
    release.restore(0, None)
    offset = _open(release, "b", _open(release, "a", 0))
    release.note_plan("a", None, 0, 0, 2, ended=1)
    release.plans_read[0] = 3
    release.on_frontier(0, {p: 10 for p in range(ROUTED)})
    _position, metadata = release.commit_position(0, offset)
    assert '"opened"' not in metadata, metadata
    again = _release([("b", 1, 1, True)], read=3)
    again.note_plan("a", None, 0, 0, 2, ended=1)
    again.restore(0, metadata)
    assert again.on_deltas(0, offset, None, _delta("a", 20)) == []
    assert _released(again, "b", 21, offset + 1)


def test_metadata_that_names_every_opened_registration_still_restores() -> None:
    """Commit metadata written before the plans' order was used names every opened gate."""
    metadata = '{"frontiers":{"0":10,"1":10,"2":10,"3":10},"end":40,"opened":[["a",1,5],["b",1,7]]}'
    release = _release([("a", 1, 0, True), ("b", 1, 1, True)], read=2)
    release.restore(0, metadata)
    assert release.partitions[0].opened == {("a", 1): 5, ("b", 1): 7}
    assert _released(release, "b", 20, 40)
    _position, metadata = release.commit_position(0, 41)
    assert '"opened"' not in metadata, "both are below the next registration to read"
