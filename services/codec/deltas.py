"""Query-part deltas on deltas.parts: PartDeltaBatch records (column by column) and format-1 PartDelta ones.

A delta binds a query part's variables to term ids with a diff, +1 or -1 (Avro ``PLUS``/``MINUS``, names that
exist only here); the answers service reads them as :class:`PartDeltaColumns`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from services.codec.binary import (cached_string, header, optional, optional_long, read_boolean, read_current,
                                   read_long, read_map, read_string, write_long)
from services.codec.generic import record_columns, decode, encode
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
    """One PartDeltaBatch of ``(seq, diff, values, source_partition, source_offset, index, snapshot,
    event_time_ms)`` rows (diff: +1 or -1; values: the term ids of ``variables``, in their order) of the
    query's registration ``version``; ``distinct``, ``gated``, ``probed``: see PartDeltaBatch."""
    k = len(variables)
    if any(len(row[2]) != k for row in rows):
        raise CodecError(f"PartDeltaBatch of {query_id}: every delta must bind the {k} variables {list(variables)}")
    columns = list(zip(*rows))
    values = [term_id for row_values in columns[2] for term_id in row_values]
    del columns[2]
    columns[1] = [_SIGN_NAME[diff] for diff in columns[1]]
    return encode("PartDeltaBatch", {"query_id": query_id, "part": part, "variables": list(variables),
                                     "values": values, **dict(zip(_PART_DELTA_COLUMNS, columns)),
                                     "version": version, "distinct": distinct, "gated": gated, "probed": probed})


def part_delta_columns(data: bytes) -> PartDeltaColumns:
    """The deltas of a deltas.parts record (a PartDeltaBatch or one PartDelta); raises :class:`CodecError`."""
    if writer_name(data) != "PartDeltaBatch":
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


def part_deltas(data: bytes) -> list[dict[str, Any]]:
    """The deltas of a deltas.parts record (a PartDeltaBatch or one PartDelta) as PartDelta dicts, for tools
    and tests (the answers service reads :func:`part_delta_columns`); raises :class:`CodecError`."""
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
