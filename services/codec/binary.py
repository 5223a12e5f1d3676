"""Avro's binary primitives for the hot-path writers and readers (zig-zag varints, strings, unions, headers).

The fixed-layout codecs of :mod:`services.codec.changes`, :mod:`services.codec.deltas` and
:mod:`services.codec.answers` are built from these; :func:`read_current` runs a fixed-layout reader and falls back
to the generic :func:`services.codec.generic.decode` for anything not written with the current schema.
"""

from __future__ import annotations

import functools
import sys
from array import array
from typing import Sequence

from services.codec.registry import HEADER_LEN, MAGIC, CodecError, fingerprint

# ---------------------------------------------------------------------------------------- hot-path writers
#
# Fixed-layout writers: fastavro's generic writer costs ~10-20 us per small record, these ~2-3 us.  They
# produce exactly the bytes :func:`encode` produces (tests check it on random values) and follow the
# *current* schemas, so a schema change must update them (the same tests fail otherwise).  The one-change
# EncodedUpdate / RoutedUpdate records (data format 1) are now only written by tools and tests.

_VARINT_CACHE: dict[int, bytes] = {}
_VARINT_CACHE_MAX = 1 << 20


def write_long(n: int) -> bytes:
    """Avro ``long``: zig-zag, then base-128 varint (term ids repeat, so their encodings are cached)."""
    found = _VARINT_CACHE.get(n)
    if found is not None:
        return found
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    data = bytes(out)
    if len(_VARINT_CACHE) < _VARINT_CACHE_MAX:
        _VARINT_CACHE[n] = data
    return data


def write_string(text: str) -> bytes:
    data = text.encode("utf-8")
    return write_long(len(data)) + data


def optional_long(n: int | None) -> bytes:
    return b"\x00" if n is None else b"\x02" + write_long(n)


@functools.cache
def header(record_name: str) -> bytes:
    return MAGIC + fingerprint(record_name)


# ---------------------------------------------------------------------------------------- hot-path readers
#
# The same idea for reading: a record written with the *current* schema has a fixed layout, read here
# field by field (~4x faster than fastavro's generic reader).  Anything else -- an older writer schema,
# or bytes that are not a current record -- goes through :func:`decode`, which resolves or reports it, so
# these are exact drop-ins.  tests/services/codec/test_codec_fast.py checks them against :func:`decode` on random records.


def read_long(data: bytes, pos: int) -> tuple[int, int]:
    """Avro ``long`` at ``pos``: ``(value, next pos)``; IndexError when the bytes end inside it."""
    byte = data[pos]
    pos += 1
    z = byte & 0x7F
    shift = 7
    while byte & 0x80:
        byte = data[pos]
        pos += 1
        z |= (byte & 0x7F) << shift
        shift += 7
    return (z >> 1) ^ -(z & 1), pos


def read_string(data: bytes, pos: int) -> tuple[str, int]:
    size, pos = read_long(data, pos)
    end = pos + size
    if size < 0 or end > len(data):
        raise IndexError("string runs past the end")
    return data[pos:end].decode("utf-8"), end


def optional(data: bytes, pos: int, read=read_long):  # noqa: ANN001, ANN201 - read_long or read_string
    """A ``["null", T]`` union: ``(None or the T that ``read`` reads, next pos)``."""
    branch, pos = read_long(data, pos)
    if branch == 0:
        return None, pos
    if branch != 1:
        raise IndexError(f"union branch {branch}")
    return read(data, pos)


def read_map(data: bytes, pos: int, read):  # noqa: ANN001, ANN201 - read_long or a record reader
    """An Avro map with string keys: ``({key: the value ``read`` reads}, next pos)``.  Blocks may carry their
    byte size (a negative count: legal Avro, not what our writers produce); a hostile count ends at the data's end,
    since every entry reads at least one byte."""
    found = {}
    while True:
        count, pos = _block(data, pos)
        if count == 0:
            return found, pos
        for _ in range(count):
            key, pos = read_string(data, pos)
            found[key], pos = read(data, pos)


def read_array(data: bytes, pos: int, read):  # noqa: ANN001, ANN201 - read_string, read_long, ...
    """An Avro array: ``([each item ``read`` reads], next pos)``, its blocks read as :func:`read_map` reads them."""
    found = []
    while True:
        count, pos = _block(data, pos)
        if count == 0:
            return found, pos
        for _ in range(count):
            item, pos = read(data, pos)
            found.append(item)


def _block(data: bytes, pos: int) -> tuple[int, int]:
    """The item count of the Avro block at ``pos`` (a negative count is followed by the block's byte size)."""
    count, pos = read_long(data, pos)
    if count < 0:
        count = -count
        _size, pos = read_long(data, pos)
    return count, pos


def read_bytes(data: bytes, pos: int) -> tuple[bytes, int]:
    """An Avro ``bytes`` value at ``pos`` (a packed column); IndexError when it runs past the end."""
    size, pos = read_long(data, pos)
    end = pos + size
    if size < 0 or end > len(data):
        raise IndexError("bytes run past the end")
    return data[pos:end], end


def read_boolean(data: bytes, pos: int) -> tuple[bool, int]:
    byte = data[pos]
    if byte > 1:
        raise IndexError(f"boolean byte {byte}")
    return byte == 1, pos + 1


def read_current(record_name: str, data: bytes, read):  # noqa: ANN001, ANN202 - internal dispatch
    """``read(data)`` when ``data`` is a current-schema ``record_name``; else None (use the generic path)."""
    if data[:HEADER_LEN] != header(record_name):
        return None
    try:
        value, end = read(data)
    except (IndexError, UnicodeDecodeError):
        return None  # let decode() produce its precise message
    return value if end == len(data) else None


@functools.lru_cache(maxsize=1 << 16)
def cached_string(text: str) -> bytes:
    """:func:`write_string` for query ids and variable names, which repeat on every record."""
    return write_string(text)


# ---------------------------------------------------------------------------------------- packed columns
#
# Columns of fixed-width little-endian integers in one Avro ``bytes`` field (data format 3): one copy a column,
# where fastavro reads and writes an Avro array value by value.  ``code`` is an ``array`` type code: "q" 64-bit,
# "i" 32-bit, "b" 8-bit, all signed.

_LITTLE_ENDIAN = sys.byteorder == "little"


def pack_ints(code: str, values: Sequence[int]) -> bytes:
    packed = array(code, values)
    if not _LITTLE_ENDIAN:
        packed.byteswap()
    return packed.tobytes()


def write_bytes(data: bytes) -> bytes:
    """An Avro ``bytes`` value: its length, then the bytes (a packed column)."""
    return write_long(len(data)) + data


def pack_event_times(times: Sequence[int | None]) -> tuple[bytes, bytes]:
    """The ``event_time_ms`` and ``event_time_null`` columns of optional event times (the second empty when
    every item has one)."""
    if None not in times:
        return pack_ints("q", times), b""
    return pack_ints("q", [0 if t is None else t for t in times]), bytes(t is None for t in times)


def unpack_ints(code: str, data: bytes, count: int, name: str, field: str, optional: bool = False) -> array:
    """``count`` integers of type ``code`` (empty when ``optional`` and the column is); :class:`CodecError`
    naming the record and the field when the column holds another number of them."""
    packed = array(code)
    if not (optional and not data) and len(data) != count * packed.itemsize:
        raise CodecError(f"corrupt {name}: {field} holds {len(data)} bytes, not {count} items of {packed.itemsize}")
    packed.frombytes(data)
    if not _LITTLE_ENDIAN:
        packed.byteswap()
    return packed


def check_flags(data: bytes, count: int, name: str, field: str, allowed: bytes = b"\x00\x01") -> bytes:
    """A column of ``count`` single bytes, each one of ``allowed`` (by default 0 or 1: a flag)."""
    if len(data) != count or data.translate(None, allowed):
        raise CodecError(f"corrupt {name}: {field} must be {count} bytes, each one of {list(allowed)}")
    return data


def unpack_signs(data: bytes, count: int, name: str, field: str) -> array:
    """A column of ``count`` signed bytes, each 1 (an insert) or -1 (a delete)."""
    return array("b", check_flags(data, count, name, field, b"\x01\xff"))
