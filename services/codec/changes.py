"""Changes to the graph on updates.encoded and updates.routed: one-change records (data format 1), Avro-array
batches (data format 2) and the packed column batches (data format 3) that carry them now.

Readers return :class:`cbgp.change.Change` (diff +1 for Avro ``ADD``, -1 for ``DEL``; the role as
``cbgp.change.ROLE_*``) and the batch writers take them: the enum names exist only here, at the Avro boundary.
(``encode_routed``/``encode_encoded`` write format-1 records from an Avro record's own fields.)
"""

from __future__ import annotations

from itertools import accumulate, repeat
from typing import Any, Sequence

from cbgp.change import ROLE_BOTH, ROLE_NAMES, ROLE_OBJECT, ROLE_SUBJECT, Change, change_of

from services.codec.binary import (check_flags, header, optional, optional_long, pack_event_times, pack_ints,
                                   read_boolean, read_bytes, read_current, read_long, read_string, unpack_ints,
                                   unpack_signs, write_bytes, write_long, write_string)
from services.codec.generic import record_columns, decode
from services.codec.registry import HEADER_LEN, CodecError, writer_name

_OP = {"ADD": b"\x00", "DEL": b"\x02"}
_ROLE = {"SUBJECT": b"\x00", "OBJECT": b"\x02", "BOTH": b"\x04"}


def encode_dictionary_entry(term_id: int, term: str) -> bytes:
    """``encode("DictionaryEntry", {"id": term_id, "term": term})`` (same bytes, ~6x faster): the workers write one
    per term an operator query makes (ingest writes DictionaryColumns)."""
    return header("DictionaryEntry") + write_long(term_id) + write_string(term)


def _read_dictionary_entry(data: bytes) -> tuple[dict[str, Any], int]:
    term_id, pos = read_long(data, HEADER_LEN)
    term, pos = read_string(data, pos)
    return {"id": term_id, "term": term}, pos


def decode_dictionary_entry(data: bytes) -> dict[str, Any]:
    """``decode("DictionaryEntry", data)`` (the same dict, ~4x faster; :func:`dictionary_entries` reads every
    dictionary record): the answers service, the gateway and the
    workers' operator queries read every term of the dictionary topic."""
    found = read_current("DictionaryEntry", data, _read_dictionary_entry)
    return found if found is not None else decode("DictionaryEntry", data)


def encode_dictionary_columns(ids: Sequence[int], terms: Sequence[str]) -> bytes:
    """One DictionaryColumns record of ``terms`` and their ``ids``: ingest writes one per dictionary partition that a
    transaction has new terms for, where one DictionaryEntry per term cost a Kafka record each."""
    data = [term.encode("utf-8") for term in terms]
    return b"".join((header("DictionaryColumns"), write_long(len(data)), write_bytes(pack_ints("q", ids)),
                     write_bytes(pack_ints("i", [len(term) for term in data])), write_bytes(b"".join(data))))


def _read_dictionary_columns(data: bytes) -> tuple[dict[str, Any], int]:
    count, pos = read_long(data, HEADER_LEN)
    record: dict[str, Any] = {"count": count}
    for field in ("ids", "lengths", "terms"):
        record[field], pos = read_bytes(data, pos)
    return record, pos


def dictionary_entries(data: bytes) -> list[tuple[int, str]]:
    """The ``(id, term)`` pairs of a dictionary record, DictionaryColumns or one DictionaryEntry; raises
    :class:`CodecError` (one line: what is wrong) for anything else."""
    name = "DictionaryColumns"
    if writer_name(data) != name:
        entry = decode_dictionary_entry(data)
        return [(entry["id"], entry["term"])]
    record = read_current(name, data, _read_dictionary_columns)
    if record is None:
        record = decode(name, data)
    n, blob = record["count"], record["terms"]
    if n < 1:
        raise CodecError(f"corrupt {name}: count {n}, at least 1 term expected")
    ids = unpack_ints("q", record["ids"], n, name, "ids")
    lengths = unpack_ints("i", record["lengths"], n, name, "lengths")
    if min(ids) < 1:
        raise CodecError(f"corrupt {name}: term id {min(ids)}, ids are at least 1")
    if min(lengths) < 1:
        raise CodecError(f"corrupt {name}: a term length of {min(lengths)}, at least 1 expected")
    ends = list(accumulate(lengths))
    if ends[-1] != len(blob):
        raise CodecError(f"corrupt {name}: the lengths add up to {ends[-1]} bytes, the terms hold {len(blob)}")
    starts = [0, *ends[:-1]]
    if blob.isascii():  # (one decode, then slices: bytes and characters coincide)
        text = blob.decode("ascii")
        return [(term_id, text[start:end]) for term_id, start, end in zip(ids, starts, ends)]
    try:
        return [(term_id, blob[start:end].decode("utf-8")) for term_id, start, end in zip(ids, starts, ends)]
    except UnicodeDecodeError as exc:
        raise CodecError(f"corrupt {name}: a term is not UTF-8 ({exc.reason})") from None


def encode_routed(seq: int, op: str, s: int, p: int, o: int, g: int, event_time_ms: int | None, role: str) -> bytes:
    """``encode("RoutedUpdate", {...})`` for the data path (same bytes, ~5x faster)."""
    return b"".join((header("RoutedUpdate"), write_long(seq), _OP[op], write_long(s), write_long(p), write_long(o),
                     write_long(g), optional_long(event_time_ms), _ROLE[role]))


def encode_encoded(seq: int, op: str, s: int, p: int, o: int, g: int, event_time_ms: int | None,
                   topic: str, partition: int, offset: int, refresh: bool = False) -> bytes:
    """``encode("EncodedUpdate", {...})`` for the data path (same bytes, ~5x faster)."""
    return b"".join((header("EncodedUpdate"), write_long(seq), _OP[op], write_long(s), write_long(p), write_long(o),
                     write_long(g), optional_long(event_time_ms), write_string(topic), write_long(partition), write_long(offset),
                     b"\x01" if refresh else b"\x00"))


_SIGN_OF_OP = (1, -1)  # Op enum index -> +1 (ADD) / -1 (DEL)
_ROLE_OF_NAME = {name: role for role, name in ROLE_NAMES.items()}
_ROLE_OF_INDEX = tuple(_ROLE_OF_NAME[name] for name in ("SUBJECT", "OBJECT", "BOTH"))  # the Role enum's symbol order


def _op_diff(data: bytes, pos: int) -> tuple[int, int]:
    index, pos = read_long(data, pos)
    if not 0 <= index < 2:
        raise IndexError(f"Op index {index}")
    return _SIGN_OF_OP[index], pos


def _read_change(data: bytes) -> tuple[tuple, int]:
    """The fields RoutedUpdate and EncodedUpdate start with: ``(seq, sign, s, p, o, g, event_time_ms)``."""
    pos = HEADER_LEN
    seq, pos = read_long(data, pos)
    diff, pos = _op_diff(data, pos)
    s, pos = read_long(data, pos)
    p, pos = read_long(data, pos)
    o, pos = read_long(data, pos)
    g, pos = read_long(data, pos)
    event_time_ms, pos = optional(data, pos)
    return (seq, diff, s, p, o, g, event_time_ms), pos


def _read_routed(data: bytes) -> tuple[Change, int]:
    change, pos = _read_change(data)
    role, pos = read_long(data, pos)
    if not 0 <= role < 3:
        raise IndexError(f"Role index {role}")
    return Change(*change, _ROLE_OF_INDEX[role]), pos


def decode_routed(data: bytes) -> Change:
    """A RoutedUpdate as a :class:`Change`."""
    found = read_current("RoutedUpdate", data, _read_routed)
    if found is not None:
        return found
    r = decode("RoutedUpdate", data)
    return Change(r["seq"], 1 if r["op"] == "ADD" else -1, r["s"], r["p"], r["o"], r["g"], r["event_time_ms"],
                  _ROLE_OF_NAME[r["role"]])


def _read_encoded(data: bytes) -> tuple[tuple, int]:
    change, pos = _read_change(data)
    _topic, pos = read_string(data, pos)
    _partition, pos = read_long(data, pos)
    _offset, pos = read_long(data, pos)
    refresh, pos = read_boolean(data, pos)
    return Change(*change, ROLE_BOTH, refresh), pos


def decode_encoded(data: bytes) -> Change:
    """An EncodedUpdate as a :class:`Change` (its source is not needed on the data path: :func:`decode`
    returns it)."""
    found = read_current("EncodedUpdate", data, _read_encoded)
    if found is not None:
        return found
    r = decode("EncodedUpdate", data)
    return Change(r["seq"], 1 if r["op"] == "ADD" else -1, r["s"], r["p"], r["o"], r["g"], r["event_time_ms"],
                  ROLE_BOTH, r["refresh"])


# ---------------------------------------------------------------------------------------- change batches
#
# updates.encoded and updates.routed carry many changes per Kafka record, column by column, so consuming,
# decoding and storing cost per batch, not per change: EncodedColumns / RoutedColumns (data format 3, packed
# columns: see the end of this module) are written, and readers also take the Avro-array batches of format 2
# (EncodedBatch / RoutedBatch) and the one-change records of format 1 (EncodedUpdate, RoutedUpdate) still in old
# logs, so the logs need no migration.

_OP_NAME = {1: "ADD", -1: "DEL"}
_SIGN = {"ADD": 1, "DEL": -1}


def encode_routed_batch(changes: Sequence[Change], roles: Sequence[int] | None = None,
                        inserted_at: Sequence[int] = ()) -> bytes:
    """One RoutedColumns record of ``changes`` with ``roles``, each one's role at the partition it goes to (default:
    the changes' own; ingest passes them beside its one Change object per change); ``inserted_at``: per change, a
    delete's insert seq, 0 for an insert (see the schema; empty: no delete)."""
    seq, diff, s, p, o, g, event_time, own, _refresh = zip(*changes)
    return b"".join((header("RoutedColumns"), write_long(len(seq)), *map(write_bytes, (
        pack_ints("q", seq), pack_ints("b", diff), *(pack_ints("q", column) for column in (s, p, o, g)),
        *pack_event_times(event_time), bytes(roles or own), pack_ints("q", inserted_at)))))


def encode_encoded_batch(changes: Sequence[Change], sources: Sequence[tuple[int, int]], source_topic: str,
                         inserted_at: Sequence[int] = ()) -> bytes:
    """One EncodedColumns record of ``changes`` whose raw updates were read from ``source_topic`` at ``sources``
    (``(partition, offset)`` per change); ``inserted_at`` as in :func:`encode_routed_batch`."""
    seq, diff, s, p, o, g, event_time, _role, refresh = zip(*changes)
    partition, offset = zip(*sources)
    return b"".join((header("EncodedColumns"), write_long(len(seq)), *map(write_bytes, (
        pack_ints("q", seq), pack_ints("b", diff), *(pack_ints("q", column) for column in (s, p, o, g)),
        *pack_event_times(event_time), source_topic.encode("utf-8"), pack_ints("i", partition), pack_ints("q", offset),
        bytes(refresh) if any(refresh) else b"", pack_ints("q", inserted_at)))))


def inserted_at(data: bytes) -> list[int]:
    """Per change of a change batch (format 2 or 3), the seq of the insert a delete undoes (0 for an
    insert, -1 unknown); empty for a record with no delete, one written before ingest kept them, or of another
    kind.  Raises :class:`CodecError`."""
    name = writer_name(data)
    if name in _PACKED:
        columns = _packed(name, data)
        return list(unpack_ints("q", columns["inserted_at"], columns["count"], name, "inserted_at", optional=True))
    if name not in ("RoutedBatch", "EncodedBatch"):
        return []
    record = decode(name, data)
    seqs = record["inserted_at"]
    if seqs and len(seqs) != len(record["seq"]):
        raise CodecError(f"corrupt {name}: {len(seqs)} inserted_at for {len(record['seq'])} changes")
    return list(seqs)


def routed_changes(data: bytes) -> list[Change]:
    """The changes of an updates.routed record (RoutedColumns, RoutedBatch or a format-1 RoutedUpdate), each with its
    role (none for a Frontier mark or probes); raises :class:`CodecError`."""
    name = writer_name(data)
    if name == "RoutedColumns":
        r = _packed(name, data)
        n = r["count"]
        return list(map(change_of, zip(*_change_columns(r, name), _roles(r["role"], n), repeat(False))))
    if name in ("Frontier", "ProbeBatch", "ProbeColumns"):
        return []
    if name != "RoutedBatch":
        return [decode_routed(data)]
    seq, op, s, p, o, g, event_time, role = record_columns("RoutedBatch", decode("RoutedBatch", data), (
        "seq", "op", "s", "p", "o", "g", "event_time_ms", "role"))
    return list(map(change_of, zip(seq, map(_SIGN.__getitem__, op), s, p, o, g, event_time,
                                   map(_ROLE_OF_NAME.__getitem__, role), repeat(False))))


def encoded_changes(data: bytes) -> list[Change]:
    """The changes of an updates.encoded record (EncodedColumns, EncodedBatch or a format-1 EncodedUpdate), refreshes
    included (role ``ROLE_BOTH``); raises :class:`CodecError`."""
    name = writer_name(data)
    if name == "EncodedColumns":
        r = _packed(name, data)
        return list(map(change_of, zip(*_change_columns(r, name), repeat(ROLE_BOTH), _refresh(r, name))))
    if name != "EncodedBatch":
        return [decode_encoded(data)]
    seq, op, s, p, o, g, event_time, refresh = record_columns("EncodedBatch", decode("EncodedBatch", data), (
        "seq", "op", "s", "p", "o", "g", "event_time_ms", "refresh"))
    return list(map(change_of, zip(seq, map(_SIGN.__getitem__, op), s, p, o, g, event_time, repeat(ROLE_BOTH),
                                   refresh)))


def encoded_columns(data: bytes) -> tuple[list, ...] | None:
    """A change batch's ``(seq, diff, s, p, o, g, event_time_ms)`` columns, for vectorised readers (the Spark
    job's windows); None for a record of another kind; raises :class:`CodecError` on a corrupt batch."""
    name = writer_name(data)
    if name == "EncodedColumns":
        return _change_columns(_packed(name, data), name)
    if name != "EncodedBatch":
        return None
    seq, op, s, p, o, g, event_time = record_columns("EncodedBatch", decode("EncodedBatch", data), (
        "seq", "op", "s", "p", "o", "g", "event_time_ms"))
    return seq, [_SIGN[x] for x in op], s, p, o, g, event_time


def encoded_records(data: bytes) -> list[dict[str, Any]]:
    """The changes of an updates.encoded record as EncodedUpdate dicts (with ``source``), for tools, tests
    and restores that want every field; raises :class:`CodecError`."""
    name = writer_name(data)
    if name == "EncodedColumns":
        r = _packed(name, data)
        n, topic = r["count"], r["source_topic"]
        return [{"seq": seq, "op": _OP_NAME[diff], "s": s, "p": p, "o": o, "g": g, "event_time_ms": t,
                 "source": {"topic": topic, "partition": partition, "offset": offset}, "refresh": refresh}
                for seq, diff, s, p, o, g, t, partition, offset, refresh in zip(
                    *_change_columns(r, name), unpack_ints("i", r["source_partition"], n, name, "source_partition"),
                    unpack_ints("q", r["source_offset"], n, name, "source_offset"), _refresh(r, name))]
    if name != "EncodedBatch":
        return [decode("EncodedUpdate", data)]
    record = decode("EncodedBatch", data)
    fields = ("seq", "op", "s", "p", "o", "g", "event_time_ms", "source_partition", "source_offset", "refresh")
    topic = record["source_topic"]
    return [{"seq": seq, "op": op, "s": s, "p": p, "o": o, "g": g, "event_time_ms": t,
             "source": {"topic": topic, "partition": partition, "offset": offset}, "refresh": refresh}
            for seq, op, s, p, o, g, t, partition, offset, refresh in zip(*record_columns("EncodedBatch", record, fields))]


# ---------------------------------------------------------------------------------------- packed columns
#
# Data format 3: RoutedColumns and EncodedColumns carry each column as one bytes field of fixed-width
# little-endian integers.  fastavro reads and writes an array of longs value by value (about 0.5 us each, ten
# columns a change), where these are one copy a column; the Avro record around them still names its schema.

_PACKED = ("RoutedColumns", "EncodedColumns")
_BLOBS = {"RoutedColumns": ("seq", "diff", "s", "p", "o", "g", "event_time_ms", "event_time_null", "role",
                            "inserted_at"),
          "EncodedColumns": ("seq", "diff", "s", "p", "o", "g", "event_time_ms", "event_time_null", "source_topic",
                             "source_partition", "source_offset", "refresh", "inserted_at")}


def _packed(name: str, data: bytes) -> dict[str, Any]:
    """A packed record's fields (bytes, the count, and the source topic as text); a current record is read
    field by field, an older version through the generic reader."""
    if data[:HEADER_LEN] != header(name):
        record = decode(name, data)
    else:
        try:
            count, pos = read_long(data, HEADER_LEN)
            record = {"count": count}
            for field in _BLOBS[name]:
                record[field], pos = read_bytes(data, pos)
        except IndexError:
            raise CodecError(f"corrupt {name}: truncated") from None
        if pos != len(data):
            raise CodecError(f"corrupt {name} body: {len(data) - pos} trailing bytes after the record")
        if "source_topic" in record:
            try:
                record["source_topic"] = record["source_topic"].decode("utf-8")
            except UnicodeDecodeError:
                raise CodecError(f"corrupt {name}: source_topic is not UTF-8") from None
    if record["count"] < 1:
        raise CodecError(f"corrupt {name}: count {record['count']}, at least 1 change expected")
    return record


def _change_columns(r: dict[str, Any], name: str) -> tuple[Sequence, ...]:
    """``(seq, diff, s, p, o, g, event_time_ms)`` of a packed record, validated."""
    n = r["count"]
    columns = [unpack_ints("q", r["seq"], n, name, "seq"),
               unpack_signs(r["diff"], n, name, "diff")]
    columns.extend(unpack_ints("q", r[field], n, name, field) for field in ("s", "p", "o", "g"))
    times: Sequence[int | None] = unpack_ints("q", r["event_time_ms"], n, name, "event_time_ms")
    if r["event_time_null"]:
        nulls = check_flags(r["event_time_null"], n, name, "event_time_null")
        times = [None if null else t for t, null in zip(times, nulls)]
    columns.append(times)
    return tuple(columns)


def _roles(data: bytes, count: int) -> bytes:
    return check_flags(data, count, "RoutedColumns", "role", bytes((ROLE_SUBJECT, ROLE_OBJECT, ROLE_BOTH)))


def _refresh(r: dict[str, Any], name: str) -> Any:
    if not r["refresh"]:
        return repeat(False)
    return map(bool, check_flags(r["refresh"], r["count"], name, "refresh"))
