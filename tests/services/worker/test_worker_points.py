"""Where a by-centre registration applies in a routed log (``services.worker.points.point_of``), found by
bisection: on random logs of ingest's transactions (changes in chunks, then this partition's Frontier mark), with
probe records and other partitions' marks between them, it is the offset a scan from offset 0 finds, for every
seq and every end, and it reads far fewer records than the scan."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cbgp.change import ROLE_BOTH, Change
from services import codec
from services.worker.points import log_marks, point_of

PARTITION = 1


def scanned(records, seq: int, end: int) -> int | None:  # noqa: ANN001
    """The definition, record by record from offset 0 (another partition's mark, of seq -1 here, says nothing)."""
    for offset, kind, record_seq in log_marks(records, PARTITION, 0, end):
        if kind == "mark" and record_seq >= max(seq, 0):
            return offset + 1
        if kind == "changes" and record_seq > seq:
            return offset
    return None


@st.composite
def routed_logs(draw: st.DrawFn) -> list[bytes]:
    log: list[bytes] = []
    seq = 0
    for _ in range(draw(st.integers(0, 25))):
        changes = draw(st.integers(0, 6))  # (a transaction may route nothing here: its mark comes all the same)
        for chunk in range(0, changes, 2):
            rows = [Change(seq + i + 1, 1, 7, 8, 9 + seq + i, 0, None, ROLE_BOTH) for i in range(min(2, changes - chunk))]
            seq += len(rows)
            log.append(codec.encode_routed_batch(rows))
        seq += draw(st.integers(0, 3))  # changes routed to other partitions
        for _ in range(draw(st.integers(0, 2))):  # a worker's probes, or another partition's mark
            log.append(draw(st.sampled_from([codec.encode_probe_batch(), codec.encode_frontier({0: seq})])))
        log.append(codec.encode_frontier({PARTITION: seq}))
    return log


@settings(max_examples=300, deadline=None)
@given(routed_logs(), st.integers(-1, 120), st.data())
def test_the_bisection_finds_the_point_a_scan_from_offset_0_finds(log: list[bytes], seq: int,
                                                                   data: st.DataObject) -> None:
    end = data.draw(st.integers(0, len(log)))

    def records(partition: int, start: int, stop: int | None) -> list[tuple[int, bytes]]:
        assert partition == PARTITION
        return list(enumerate(log[start:stop], start))

    assert point_of(records, PARTITION, seq, end) == scanned(records, seq, end)


def test_the_bisection_reads_a_few_records_at_a_few_places() -> None:
    log = []
    for seq in range(1, 20_001):
        log.append(codec.encode_routed_batch([Change(seq, 1, 7, 8, seq, 0, None, ROLE_BOTH)]))
        log.append(codec.encode_frontier({PARTITION: seq}))
    read = []

    def records(partition: int, start: int, stop: int | None) -> list[tuple[int, bytes]]:
        read.append((start, stop))
        return list(enumerate(log[start:stop], start))

    assert point_of(records, PARTITION, 15_000, len(log)) == 2 * 15_000 - 1 + 1  # just after the mark of 15,000
    assert sum(stop - start for start, stop in read) < 400, read
