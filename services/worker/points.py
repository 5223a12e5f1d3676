"""Where a by-centre registration applies in a routed partition's log (``WorkerCore._place``): the first record
past the seq it answers as of, found from the log's changes and ingest's Frontier marks.  No Kafka here."""

from __future__ import annotations

from typing import Iterator, NamedTuple

from services import codec
from services.worker.probes import RecordReader


def passed(seq: int, last_change: int, last_mark: int) -> bool:
    """Whether a log whose last change and last Frontier mark have these seqs holds the point of a registration
    as of ``seq``."""
    return last_change > seq or last_mark >= seq


class Tail(NamedTuple):
    """The last change and the last Frontier mark of a routed log before some offset: their seqs and the
    offsets of their records (-1 when none)."""

    change_seq: int = -1
    mark_seq: int = -1
    change_offset: int = -1
    mark_offset: int = -1

    @property
    def applied(self) -> int:
        """The seq every change up to which the partition had applied there (a mark follows its changes)."""
        return max(self.change_seq, self.mark_seq)


def log_tail(records: RecordReader, partition: int, end: int, start: int = 0) -> Tail:
    """The last change and the last Frontier mark in routed log ``partition`` in [start, end), read backwards in
    chunks from ``end``."""
    tail = Tail()
    chunk = 4  # a transaction's records end with its marks: the last few usually hold both
    floor = start
    while end > floor and (tail.change_offset < 0 or tail.mark_offset < 0):
        start = max(floor, end - chunk)
        for offset, kind, seq in log_marks(records, partition, start, end):
            if kind == "mark" and seq >= tail.mark_seq:
                tail = tail._replace(mark_seq=seq, mark_offset=offset)
            elif kind == "changes" and seq >= tail.change_seq:
                tail = tail._replace(change_seq=seq, change_offset=offset)
        end, chunk = start, min(chunk * 8, 512)
    return tail


def needed_below(tail: Tail, end: int) -> int:
    """The lowest offset a reader of the log before ``end`` (with this tail) reads: the records of its last
    change and its last mark (a checkpoint's restore checks the one, a registration's frontier is the other)."""
    found = [offset for offset in (tail.change_offset, tail.mark_offset) if offset >= 0]
    return min(found) if found else end


def log_marks(records: RecordReader, partition: int, start: int, end: int) -> Iterator[tuple[int, str, int]]:
    """Per record of routed log ``partition`` in [start, end): (offset, "mark", its Frontier seq for the
    partition) or (offset, "changes", its highest change seq); other records are left out."""
    for offset, value in records(partition, start, end):
        try:
            frontier = codec.frontier_of(value)
            if frontier is not None:
                yield offset, "mark", frontier.get(partition, -1)
                continue
            changes = codec.routed_changes(value)  # none in probes
            if changes:
                yield offset, "changes", max(change.seq for change in changes)
        except codec.CodecError:
            continue


def point_of(records: RecordReader, partition: int, seq: int, end: int, start: int = 0) -> int | None:
    """The offset of routed log ``partition`` at which a registration as of ``seq`` applies, if it is at or
    before ``end``: just after the first Frontier mark that reaches ``seq``, or at the first record with a change
    past it (ingest writes a transaction's changes before its marks, so no change at or below ``seq`` comes
    later).  That record may also hold changes at or below ``seq`` (the registry read updates.encoded
    mid-transaction, whose records are chunked): for an engine query their deltas are live deltas the release's
    gate nets into the snapshot as of ``seq``, like every gated delta up to it; a multi-centre registration takes
    them into its history (``ProbeRouting.register_at``).

    Found by bisection over ``[start, end)``: along the log, the changes' seqs and the partition's marks only
    grow (probe records, which carry neither, are stepped over), so whether a record is past the point is
    monotone.  It reads a few records at about log2(end - start) places, never the log below the point's
    neighbourhood: a registration's point is found without reading from offset 0."""
    found = None
    low, high = start, end
    while low < high:
        middle = (low + high) // 2
        first = _first_mark_or_change(records, partition, middle, high)
        if first is None:  # nothing that says where the log stands in [middle, high)
            high = middle
            continue
        offset, kind, record_seq = first
        if (kind == "mark" and record_seq >= seq) or (kind == "changes" and record_seq > seq):
            found, high = first, middle  # past the point: the first such record is this one or before it
        else:
            low = offset + 1
    if found is None:
        return None
    offset, kind, _record_seq = found
    return offset + 1 if kind == "mark" else offset


def _first_mark_or_change(records: RecordReader, partition: int, start: int, end: int) -> tuple[int, str, int] | None:
    """The first record in [start, end) that is this partition's Frontier mark or holds changes, read in
    growing windows (a probe record between them is skipped)."""
    window = 8
    while start < end:
        stop = min(end, start + window)
        for offset, kind, record_seq in log_marks(records, partition, start, stop):
            if kind == "changes" or record_seq >= 0:  # (a mark of no seq for this partition says nothing)
                return offset, kind, record_seq
        start, window = stop, window * 8
    return None
