"""Query-part deltas on deltas.parts: PartDeltaColumns records (packed columns), and the PartDeltaBatch (Avro
arrays) and single PartDelta records still read.

A delta binds a query part's variables to term ids with a diff, +1 or -1 (Avro ``PLUS``/``MINUS``, names that
exist only here); the answers service reads them as :class:`PartDeltaColumns`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from services.codec.binary import (cached_string, check_flags, header, optional, optional_long, pack_event_times,
                                   pack_ints, read_array, read_boolean, read_bytes, read_current, read_long, read_map,
                                   read_string, unpack_ints, unpack_signs, write_bytes, write_long)
from services.codec.generic import record_columns, decode
from services.codec.registry import HEADER_LEN, CodecError, writer_name

_SIGN_NAME = {1: "PLUS", -1: "MINUS"}  # the Avro Sign enum
_DIFF = {"PLUS": 1, "MINUS": -1}
_PART_DELTA_COLUMNS = ("seq", "sign", "source_partition", "source_offset", "index", "snapshot", "event_time_ms")


@dataclass(frozen=True, slots=True)
class PartDeltaColumns:
    """The deltas of one deltas.parts record, column by column (a PartDeltaBatch as written; a format-1
    PartDelta as a batch of one).  Delta i binds ``variables[j]`` to ``values[i * len(variables) + j]``."""

    query_id: str
    part: int
    variables: list[str]
    seq: list[int]
    diff: list[int]  # +1 (Avro PLUS) or -1 (MINUS)
    values: list[int]
    source_partition: list[int]
    source_offset: list[int]
    index: list[int]
    snapshot: list[bool]
    event_time_ms: list[int | None]
    version: int = 0  # the query's registration version (QueryPlan.version)
    distinct: bool = False  # rows are a DISTINCT query's underlying projections: the answers service counts them
    gated: bool = False  # a by-centre query: its registration is released once every partition is ready
    probed: bool = True  # evaluated in part by probes: released at the completed frontier (else the applied one)

    def __len__(self) -> int:
        return len(self.seq)

    def binding(self, i: int) -> dict[str, int]:
        k = len(self.variables)
        return dict(zip(self.variables, self.values[i * k:(i + 1) * k]))


def encode_part_delta_batch(query_id: str, part: int, variables: Sequence[str], rows: Sequence[tuple],
                            version: int = 0, distinct: bool = False, gated: bool = False,
                            probed: bool = True) -> bytes:
    """One PartDeltaColumns record of ``(seq, diff, values, source_partition, source_offset, index, snapshot,
    event_time_ms)`` rows (diff: +1 or -1; values: the term ids of ``variables``, in their order) of the
    query's registration ``version``; ``distinct``, ``gated``, ``probed``: see the schema."""
    k = len(variables)
    if not rows or any(len(row[2]) != k for row in rows):
        raise CodecError(f"PartDeltaColumns of {query_id}: at least one delta, each binding the {k} variables "
                         f"{list(variables)}")
    seq, diff, values, source_partition, source_offset, index, snapshot, event_time = zip(*rows)
    wrong = set(diff) - {1, -1}
    if wrong:
        raise CodecError(f"PartDeltaColumns of {query_id}: a diff is +1 or -1, not {sorted(wrong)[0]}")
    try:
        columns = (pack_ints("q", seq), pack_ints("b", diff), pack_ints("q", [v for row in values for v in row]),
                   pack_ints("i", source_partition), pack_ints("q", source_offset), pack_ints("i", index),
                   bytes(snapshot) if any(snapshot) else b"", *pack_event_times(event_time))
    except (OverflowError, TypeError) as exc:
        raise CodecError(f"PartDeltaColumns of {query_id}: {exc}") from None
    names = [write_long(k), *map(cached_string, variables)] if k else []
    return b"".join((header("PartDeltaColumns"), cached_string(query_id), write_long(part), *names, b"\x00",
                     write_long(len(seq)), *map(write_bytes, columns), write_long(version),
                     b"\x01" if distinct else b"\x00", b"\x01" if gated else b"\x00", b"\x01" if probed else b"\x00"))


def part_delta_columns(data: bytes) -> PartDeltaColumns:
    """The deltas of a deltas.parts record (PartDeltaColumns, PartDeltaBatch or one PartDelta); raises
    :class:`CodecError`."""
    name = writer_name(data)
    if name == "PartDeltaColumns":
        record = read_current(name, data, _read_packed)
        return _packed_columns(record if record is not None else decode(name, data))
    if name != "PartDeltaBatch":
        one = decode_part_delta(data)
        return PartDeltaColumns(one["query_id"], one["part"], list(one["binding"]), [one["seq"]],
                                [_DIFF[one["sign"]]], list(one["binding"].values()), [one["source_partition"]],
                                [one["source_offset"]], [one["index"]], [one["snapshot"]], [one["event_time_ms"]])
    record = decode("PartDeltaBatch", data)
    seq, symbols, src, offset, index, snapshot, event_time = record_columns("PartDeltaBatch", record, _PART_DELTA_COLUMNS)
    variables, values = record["variables"], record["values"]
    if len(values) != len(seq) * len(variables):
        raise CodecError(f"corrupt PartDeltaBatch: {len(seq)} deltas of {len(variables)} variables need "
                         f"{len(seq) * len(variables)} values, got {len(values)}")
    return PartDeltaColumns(record["query_id"], record["part"], variables, seq, [_DIFF[s] for s in symbols], values,
                            src, offset, index, snapshot, event_time, record["version"], record["distinct"],
                            record["gated"], record["probed"])


# PartDeltaColumns: each column one bytes field of fixed-width little-endian integers (as the packed change
# columns of services.codec.changes), read here field by field; fastavro reads an Avro array value by value
# (PartDeltaBatch: 2.3 us a delta of three variables, most of the answers service's decoding).
_PACKED_COLUMNS = ("seq", "diff", "values", "source_partition", "source_offset", "index", "snapshot", "event_time_ms",
                   "event_time_null")


def _read_packed(data: bytes) -> tuple[dict[str, Any], int]:
    query_id, pos = read_string(data, HEADER_LEN)
    part, pos = read_long(data, pos)
    variables, pos = read_array(data, pos, read_string)  # (a hostile count ends at the data's end)
    count, pos = read_long(data, pos)
    record: dict[str, Any] = {"query_id": query_id, "part": part, "variables": variables, "count": count}
    for field in _PACKED_COLUMNS:
        record[field], pos = read_bytes(data, pos)
    record["version"], pos = read_long(data, pos)
    for flag in ("distinct", "gated", "probed"):
        record[flag], pos = read_boolean(data, pos)
    return record, pos


def _packed_columns(r: dict[str, Any]) -> PartDeltaColumns:
    """The columns of a PartDeltaColumns record's fields, each checked against the count."""
    name, n, variables = "PartDeltaColumns", r["count"], r["variables"]
    if n < 1:
        raise CodecError(f"corrupt {name}: count {n}, at least 1 delta expected")
    times: list[int | None] = unpack_ints("q", r["event_time_ms"], n, name, "event_time_ms").tolist()
    if r["event_time_null"]:
        nulls = check_flags(r["event_time_null"], n, name, "event_time_null")
        times = [None if null else t for t, null in zip(times, nulls)]
    snapshot = [flag == 1 for flag in check_flags(r["snapshot"], n, name, "snapshot")] if r["snapshot"] else [False] * n
    return PartDeltaColumns(
        r["query_id"], r["part"], variables, unpack_ints("q", r["seq"], n, name, "seq").tolist(),
        unpack_signs(r["diff"], n, name, "diff").tolist(),
        unpack_ints("q", r["values"], n * len(variables), name, "values").tolist(),
        unpack_ints("i", r["source_partition"], n, name, "source_partition").tolist(),
        unpack_ints("q", r["source_offset"], n, name, "source_offset").tolist(),
        unpack_ints("i", r["index"], n, name, "index").tolist(), snapshot, times, r["version"], r["distinct"],
        r["gated"], r["probed"])


def part_deltas(data: bytes) -> list[dict[str, Any]]:
    """The deltas of a deltas.parts record (PartDeltaColumns, PartDeltaBatch or one PartDelta) as PartDelta dicts,
    for tools and tests (the answers service reads :func:`part_delta_columns`); raises :class:`CodecError`."""
    cols = part_delta_columns(data)
    return [{"query_id": cols.query_id, "part": cols.part, "seq": cols.seq[i], "sign": _SIGN_NAME[cols.diff[i]],
             "binding": cols.binding(i), "source_partition": cols.source_partition[i],
             "source_offset": cols.source_offset[i], "index": cols.index[i], "snapshot": cols.snapshot[i],
             "event_time_ms": cols.event_time_ms[i]} for i in range(len(cols))]


def _read_part_delta(data: bytes) -> tuple[dict, int]:
    pos = HEADER_LEN
    query_id, pos = read_string(data, pos)
    part, pos = read_long(data, pos)
    seq, pos = read_long(data, pos)
    branch, pos = read_long(data, pos)
    if not 0 <= branch < 2:
        raise IndexError(f"Sign index {branch}")
    binding, pos = read_map(data, pos, read_long)
    source_partition, pos = read_long(data, pos)
    source_offset, pos = read_long(data, pos)
    index, pos = read_long(data, pos)
    snapshot, pos = read_boolean(data, pos)
    event_time_ms, pos = optional(data, pos)
    return {"query_id": query_id, "part": part, "seq": seq, "sign": ("PLUS", "MINUS")[branch], "binding": binding,
            "source_partition": source_partition, "source_offset": source_offset, "index": index,
            "snapshot": snapshot, "event_time_ms": event_time_ms}, pos


def decode_part_delta(data: bytes) -> dict[str, Any]:
    """``decode("PartDelta", data)``, fast for records of the current schema."""
    found = read_current("PartDelta", data, _read_part_delta)
    return found if found is not None else decode("PartDelta", data)


def encode_part_delta(query_id: str, part: int, seq: int, diff: int, binding: Mapping[str, int],
                      source_partition: int, source_offset: int, index: int, snapshot: bool,
                      event_time_ms: int | None) -> bytes:
    """``encode("PartDelta", {...})`` for the data path (same bytes; ``diff`` +1 is PLUS, -1 MINUS)."""
    items = [write_long(len(binding))] if binding else []
    for var, term_id in binding.items():
        items.append(cached_string(var))
        items.append(write_long(term_id))
    return b"".join((header("PartDelta"), cached_string(query_id), write_long(part), write_long(seq),
                     b"\x00" if diff > 0 else b"\x02", *items, b"\x00", write_long(source_partition),
                     write_long(source_offset), write_long(index), b"\x01" if snapshot else b"\x00",
                     optional_long(event_time_ms)))
