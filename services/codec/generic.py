"""Generic coding: any record to and from single-object-encoded bytes through fastavro, with schema resolution.

:func:`decode` looks the writer's fingerprint up in the registry and resolves the writer schema against the
current reader schema, so a service reads records written before (or after, within the evolution rules in
``schemas/README.md``) a schema change.  Errors are :class:`CodecError` with a field-level reason.
"""

from __future__ import annotations

import struct
from io import BytesIO
from typing import Any, Sequence

from fastavro import schemaless_reader, schemaless_writer
from fastavro.validation import ValidationError, validate

from services.codec.registry import HEADER_LEN, MAGIC, CodecError, current_writer, reg, Writer

# ---------------------------------------------------------------------------------------- encode / decode


def encode(record_name: str, record: dict[str, Any]) -> bytes:
    """``record`` as single-object-encoded bytes of ``record_name``'s current schema.

    Raises :class:`CodecError` naming the record type if a field is missing or has the wrong type.
    """
    writer = current_writer(record_name)
    buf = BytesIO()
    buf.write(MAGIC)
    buf.write(writer.fingerprint)
    try:
        schemaless_writer(buf, writer.parsed, record)
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError, struct.error) as exc:
        raise CodecError(f"cannot encode {writer.name}: {_explain(writer, record, exc)}") from None
    return buf.getvalue()


def _explain(writer: Writer, record: Any, exc: Exception) -> str:
    """A field-level reason for a failed write (only on the error path: validation costs as much as writing)."""
    try:
        validate(record, writer.parsed, raise_errors=True)
    except ValidationError as verr:
        return "; ".join(
            f"{e.field or 'record'}: {e.datum!r:.60} is not {_describe(e.schema)}" for e in verr.errors
        ) or str(exc)
    except Exception:  # noqa: BLE001 - the validator itself choked on the datum: fall back to the writer's message
        pass
    return str(exc)


def _describe(schema: Any) -> str:
    """A short description of an Avro type (fastavro's own messages print whole schemas)."""
    if isinstance(schema, list):
        return " or ".join(_describe(s) for s in schema)
    if isinstance(schema, dict):
        if schema.get("type") == "enum":
            return "one of " + "/".join(schema["symbols"])
        if schema.get("type") in ("record", "error"):
            return f"a {schema['name']} record (dict)"
        return _describe(schema.get("type"))
    return f"{schema}"


def _split(data: bytes) -> tuple[Writer, BytesIO]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    if len(data) < HEADER_LEN:
        raise CodecError(f"truncated message: {len(data)} bytes, an Avro single-object header needs {HEADER_LEN}")
    if data[:2] != MAGIC:
        raise CodecError(f"not Avro single-object encoding: starts with {bytes(data[:2]).hex()}, expected c301")
    writer = reg().by_fingerprint.get(bytes(data[2:HEADER_LEN]))
    if writer is None:
        raise CodecError(f"unknown writer schema fingerprint {bytes(data[2:HEADER_LEN]).hex()} "
                         "(written by a newer or foreign schema: add it to schemas/history/)")
    return writer, BytesIO(data[HEADER_LEN:])


def _read(writer: Writer, reader: Writer, body: BytesIO, size: int) -> dict[str, Any]:
    try:
        if writer is reader:
            record = schemaless_reader(body, writer.parsed, None)
        else:
            record = schemaless_reader(body, writer.parsed, reader.parsed)
    except Exception as exc:  # fastavro raises EOFError, UnicodeDecodeError, SchemaResolutionError, IndexError...
        raise CodecError(f"corrupt {writer.name} ({writer.version}) body: {type(exc).__name__}: {exc}") from None
    if body.tell() != size:
        raise CodecError(f"corrupt {writer.name} body: {size - body.tell()} trailing bytes after the record")
    return record


def decode(record_name: str, data: bytes) -> dict[str, Any]:
    """The record in ``data``, resolved to ``record_name``'s current schema.

    Raises :class:`CodecError` if the bytes are truncated, not single-object encoded, written by an unknown
    schema, written for another record type, or do not parse.
    """
    reader = current_writer(record_name)
    writer, body = _split(data)
    if writer.name != reader.name:
        raise CodecError(f"expected {reader.name} but the message was written as {writer.name}")
    return _read(writer, reader, body, len(data) - HEADER_LEN)


def decode_any(data: bytes) -> tuple[str, dict[str, Any]]:
    """``(record_name, record)`` for bytes of any known schema (for the CLI and dead-letter inspection)."""
    writer, body = _split(data)
    return writer.name, _read(writer, reg().current[writer.name], body, len(data) - HEADER_LEN)


def record_columns(name: str, record: dict[str, Any], fields: Sequence[str]) -> list[list]:
    columns = [record[f] for f in fields]
    sizes = {len(c) for c in columns}
    if len(sizes) != 1 or 0 in sizes:
        raise CodecError(f"corrupt {name}: its arrays must have one common, non-zero length, got " +
                         ", ".join(f"{f}={len(c)}" for f, c in zip(fields, columns)))
    return columns
