"""Avro encoding of every Kafka message value, in Avro's standard *single-object encoding*.

Wire format (Avro spec, "Single-object encoding")::

    0xC3 0x01 | 8-byte little-endian CRC-64-AVRO fingerprint of the writer schema's canonical form | body

so each message names the exact schema that wrote it.  The writer registry holds the current schemas
(``schemas/*.avsc``) and every previous version (``schemas/history/<Name>.v<N>.avsc``); :func:`decode`
looks the fingerprint up and resolves the writer schema against the current reader schema, so a service
reads records written before (or after, within the evolution rules in ``schemas/README.md``) a schema
change.  Bodies are written by fastavro's ``schemaless_writer``; any Avro implementation can read them.

Per-message cost is what matters here: schemas are parsed once, the header is precomputed, and a record
written with the current schema is read without resolution.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import to_parsing_canonical_form
from fastavro.validation import ValidationError, validate

__all__ = ["CodecError", "SCHEMA_DIR", "encode", "decode", "decode_any", "fingerprint", "record_names",
           "crc64_avro", "MAGIC", "encode_routed", "encode_encoded", "decode_routed", "decode_encoded",
           "decode_part_delta", "encode_part_delta", "encode_answer", "encode_current_answer",
           "encode_routed_batch", "encode_encoded_batch", "routed_changes", "encoded_changes", "encoded_records",
           "encode_part_delta_batch", "part_deltas", "part_delta_columns", "PartDeltaColumns",
           "answer_binding", "BindingWriter", "json_string", "encode_answer_record", "encode_current_answer_record"]

MAGIC = b"\xc3\x01"
HEADER_LEN = 10
NAMESPACE = "org.cbgp"


def _schema_dir() -> Path:
    """``$CBGP_SCHEMA_DIR``, else ``schemas/`` next to the package (a checkout), else ``./schemas`` (the image's
    working directory holds them, since a non-editable install puts the package in site-packages)."""
    if os.environ.get("CBGP_SCHEMA_DIR"):
        return Path(os.environ["CBGP_SCHEMA_DIR"])
    beside = Path(__file__).resolve().parents[1] / "schemas"
    return beside if beside.is_dir() else Path.cwd() / "schemas"


SCHEMA_DIR = _schema_dir()


class CodecError(ValueError):
    """Bytes that are not a record of the expected schema, or a record that does not fit its schema."""


# ---------------------------------------------------------------------------------------- fingerprints

_EMPTY64 = 0xC15D213AA4D7A795


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY64 & -(fp & 1))
        table.append(fp)
    return table


_TABLE = _crc_table()


def crc64_avro(data: bytes) -> int:
    """The Rabin CRC-64 the Avro spec defines for schema fingerprints ("CRC-64-AVRO")."""
    fp = _EMPTY64
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp


# ---------------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class _Writer:
    name: str  # short record name, e.g. "RawUpdate"
    version: str  # "current" or "v1", "v2", ...
    parsed: dict[str, Any]
    fingerprint: bytes  # 8 bytes, little-endian


class _Registry:
    """Current schema per record name, and every known writer schema by fingerprint."""

    def __init__(self, schema_dir: Path) -> None:
        self.current: dict[str, _Writer] = {}
        self.by_fingerprint: dict[bytes, _Writer] = {}
        if not schema_dir.is_dir():
            raise CodecError(f"schema directory not found: {schema_dir} (set CBGP_SCHEMA_DIR)")
        for path in sorted(schema_dir.glob("*.avsc")):
            writer = self._load(path, "current")
            self.current[writer.name] = writer
            self.by_fingerprint[writer.fingerprint] = writer
        for path in sorted((schema_dir / "history").glob("*.v*.avsc")):
            version = path.name.split(".")[-2]
            writer = self._load(path, version)
            if writer.name not in self.current:
                raise CodecError(f"{path}: history of {writer.name}, which has no current schema")
            # An unchanged schema kept in history has the current fingerprint; the current entry wins.
            self.by_fingerprint.setdefault(writer.fingerprint, writer)

    @staticmethod
    def _load(path: Path, version: str) -> _Writer:
        try:
            raw = json.loads(path.read_text())
            parsed = parse_schema(raw)
        except Exception as exc:  # a broken schema file is a deployment error: say which file
            raise CodecError(f"{path}: invalid Avro schema: {exc}") from None
        canonical = to_parsing_canonical_form(parsed)
        fp = struct.pack("<Q", crc64_avro(canonical.encode()))
        return _Writer(parsed["name"].rsplit(".", 1)[-1], version, parsed, fp)


_registry: _Registry | None = None


def _reg() -> _Registry:
    global _registry
    if _registry is None:
        _registry = _Registry(SCHEMA_DIR)
    return _registry


def _current(record_name: str) -> _Writer:
    name = record_name.rsplit(".", 1)[-1] if record_name.startswith(NAMESPACE + ".") else record_name
    try:
        return _reg().current[name]
    except KeyError:
        raise CodecError(f"unknown record {record_name!r}; known: {', '.join(sorted(_reg().current))}") from None


def record_names() -> list[str]:
    """Short names of every current record schema."""
    return sorted(_reg().current)


def fingerprint(record_name: str) -> bytes:
    """The 8-byte (little-endian) CRC-64-AVRO fingerprint of ``record_name``'s current schema."""
    return _current(record_name).fingerprint


def schema(record_name: str) -> dict[str, Any]:
    """The parsed current schema of ``record_name`` (fastavro form)."""
    return _current(record_name).parsed


# ---------------------------------------------------------------------------------------- encode / decode


def encode(record_name: str, record: dict[str, Any]) -> bytes:
    """``record`` as single-object-encoded bytes of ``record_name``'s current schema.

    Raises :class:`CodecError` naming the record type if a field is missing or has the wrong type.
    """
    writer = _current(record_name)
    buf = BytesIO()
    buf.write(MAGIC)
    buf.write(writer.fingerprint)
    try:
        schemaless_writer(buf, writer.parsed, record)
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError, struct.error) as exc:
        raise CodecError(f"cannot encode {writer.name}: {_explain(writer, record, exc)}") from None
    return buf.getvalue()


def _explain(writer: _Writer, record: Any, exc: Exception) -> str:
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


def _split(data: bytes) -> tuple[_Writer, BytesIO]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise CodecError(f"expected bytes, got {type(data).__name__}")
    if len(data) < HEADER_LEN:
        raise CodecError(f"truncated message: {len(data)} bytes, an Avro single-object header needs {HEADER_LEN}")
    if data[:2] != MAGIC:
        raise CodecError(f"not Avro single-object encoding: starts with {bytes(data[:2]).hex()}, expected c301")
    writer = _reg().by_fingerprint.get(bytes(data[2:HEADER_LEN]))
    if writer is None:
        raise CodecError(f"unknown writer schema fingerprint {bytes(data[2:HEADER_LEN]).hex()} "
                         "(written by a newer or foreign schema: add it to schemas/history/)")
    return writer, BytesIO(data[HEADER_LEN:])


def _read(writer: _Writer, reader: _Writer, body: BytesIO, size: int) -> dict[str, Any]:
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
    reader = _current(record_name)
    writer, body = _split(data)
    if writer.name != reader.name:
        raise CodecError(f"expected {reader.name} but the message was written as {writer.name}")
    return _read(writer, reader, body, len(data) - HEADER_LEN)


def decode_any(data: bytes) -> tuple[str, dict[str, Any]]:
    """``(record_name, record)`` for bytes of any known schema (for the CLI and dead-letter inspection)."""
    writer, body = _split(data)
    return writer.name, _read(writer, _reg().current[writer.name], body, len(data) - HEADER_LEN)


# ---------------------------------------------------------------------------------------- hot-path writers
#
# Fixed-layout writers: fastavro's generic writer costs ~10-20 us per small record, these ~2-3 us.  They
# produce exactly the bytes :func:`encode` produces (tests check it on random values) and follow the
# *current* schemas, so a schema change must update them (the same tests fail otherwise).  The one-change
# EncodedUpdate / RoutedUpdate records (data format 1) are now only written by tools and tests.

_VARINT_CACHE: dict[int, bytes] = {}
_VARINT_CACHE_MAX = 1 << 20


def _long(n: int) -> bytes:
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


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    return _long(len(data)) + data


_OP = {"ADD": b"\x00", "DEL": b"\x02"}
_ROLE = {"SUBJECT": b"\x00", "OBJECT": b"\x02", "BOTH": b"\x04"}


def _optional_long(n: int | None) -> bytes:
    return b"\x00" if n is None else b"\x02" + _long(n)


@functools.cache
def _header(record_name: str) -> bytes:
    return MAGIC + fingerprint(record_name)


def encode_routed(seq: int, op: str, s: int, p: int, o: int, g: int, event_time_ms: int | None, role: str) -> bytes:
    """``encode("RoutedUpdate", {...})`` for the data path (same bytes, ~5x faster)."""
    return b"".join((_header("RoutedUpdate"), _long(seq), _OP[op], _long(s), _long(p), _long(o),
                     _long(g), _optional_long(event_time_ms), _ROLE[role]))


def encode_encoded(seq: int, op: str, s: int, p: int, o: int, g: int, event_time_ms: int | None,
                   topic: str, partition: int, offset: int, refresh: bool = False) -> bytes:
    """``encode("EncodedUpdate", {...})`` for the data path (same bytes, ~5x faster)."""
    return b"".join((_header("EncodedUpdate"), _long(seq), _OP[op], _long(s), _long(p), _long(o),
                     _long(g), _optional_long(event_time_ms), _string(topic), _long(partition), _long(offset),
                     b"\x01" if refresh else b"\x00"))


# ---------------------------------------------------------------- SparqlTerm records and answer keys
# Answers carry terms as Avro SparqlTerm records; inside the fleet a term is its canonical N-Triples string
# (cbgp.terms), which is RDF term identity.  The answers service and the compaction job must agree on these
# conversions and on the answers.current key byte for byte, so both use the functions below.


def sparql_json_term(term: Mapping[str, Any]) -> dict[str, str]:
    """The SPARQL 1.1 Query Results JSON term of an Avro ``SparqlTerm`` (its ``lang`` is ``xml:lang`` there)."""
    obj = {"type": term["type"], "value": term["value"]}
    if term.get("lang"):
        obj["xml:lang"] = term["lang"]
    elif term.get("datatype"):
        obj["datatype"] = term["datatype"]
    return obj


def term_from_avro(term: Mapping[str, Any]) -> str:
    """Canonical term string of an Avro ``SparqlTerm`` {type, value, datatype, lang}."""
    from cbgp.terms import from_sparql_json

    return from_sparql_json(sparql_json_term(term))


def term_to_avro(term: str) -> dict[str, Any]:
    """Avro ``SparqlTerm`` of a canonical term string."""
    from cbgp.terms import to_sparql_json

    obj = to_sparql_json(term)
    return {"type": obj["type"], "value": obj["value"], "datatype": obj.get("datatype"), "lang": obj.get("xml:lang")}


def canonical_binding(terms: Mapping[str, str]) -> str:
    """``{var: canonical term}`` as canonical JSON: equal strings exactly for equal solution mappings.

    The same string as ``json.dumps(terms, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``,
    built from cached per-string encodings (this runs once per answer)."""
    return "{" + ",".join(json_string(var) + ":" + json_string(terms[var]) for var in sorted(terms)) + "}"


@functools.lru_cache(maxsize=1 << 18)
def json_string(text: str) -> str:
    """A string as a JSON string literal, as :func:`canonical_binding` writes it (cached)."""
    return json.dumps(text, ensure_ascii=False)


def current_key(query_id: str, binding_json: str) -> bytes:
    """The answers.current key: canonical JSON ``["<query_id>", {binding}]`` (unambiguous, parseable)."""
    return ("[" + json_string(query_id) + "," + binding_json + "]").encode("utf-8")


# ---------------------------------------------------------------------------------------- hot-path readers
#
# The same idea for reading: a record written with the *current* schema has a fixed layout, read here
# field by field (~4x faster than fastavro's generic reader).  Anything else -- an older writer schema,
# or bytes that are not a current record -- goes through :func:`decode`, which resolves or reports it, so
# these are exact drop-ins.  tests/test_codec_fast.py checks them against :func:`decode` on random records.


def _varint(data: bytes, pos: int) -> tuple[int, int]:
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


def _text(data: bytes, pos: int) -> tuple[str, int]:
    size, pos = _varint(data, pos)
    end = pos + size
    if size < 0 or end > len(data):
        raise IndexError("string runs past the end")
    return data[pos:end].decode("utf-8"), end


_SIGN_OF_OP = (1, -1)  # Op enum index -> +1 (ADD) / -1 (DEL)
_ROLE_NAMES = ("SUBJECT", "OBJECT", "BOTH")


def _op_sign(data: bytes, pos: int) -> tuple[int, int]:
    index, pos = _varint(data, pos)
    if not 0 <= index < 2:
        raise IndexError(f"Op index {index}")
    return _SIGN_OF_OP[index], pos


def _optional(data: bytes, pos: int) -> tuple[int | None, int]:
    branch, pos = _varint(data, pos)
    if branch == 0:
        return None, pos
    if branch != 1:
        raise IndexError(f"union branch {branch}")
    return _varint(data, pos)


def _fast(record_name: str, data: bytes, read):  # noqa: ANN001, ANN202 - internal dispatch
    """``read(data)`` when ``data`` is a current-schema ``record_name``; else None (use the generic path)."""
    if data[:HEADER_LEN] != _header(record_name):
        return None
    try:
        value, end = read(data)
    except (IndexError, UnicodeDecodeError):
        return None  # let decode() produce its precise message
    return value if end == len(data) else None


def _read_change(data: bytes) -> tuple[tuple, int]:
    """The fields RoutedUpdate and EncodedUpdate start with: ``(seq, sign, s, p, o, g, event_time_ms)``."""
    pos = HEADER_LEN
    seq, pos = _varint(data, pos)
    sign, pos = _op_sign(data, pos)
    s, pos = _varint(data, pos)
    p, pos = _varint(data, pos)
    o, pos = _varint(data, pos)
    g, pos = _varint(data, pos)
    event_time_ms, pos = _optional(data, pos)
    return (seq, sign, s, p, o, g, event_time_ms), pos


def _read_routed(data: bytes) -> tuple[tuple, int]:
    change, pos = _read_change(data)
    role, pos = _varint(data, pos)
    if not 0 <= role < 3:
        raise IndexError(f"Role index {role}")
    return (*change, _ROLE_NAMES[role]), pos


def decode_routed(data: bytes) -> tuple[int, int, int, int, int, int, int | None, str]:
    """A RoutedUpdate as ``(seq, sign, s, p, o, g, event_time_ms, role)`` (sign +1 ADD, -1 DEL)."""
    found = _fast("RoutedUpdate", data, _read_routed)
    if found is not None:
        return found
    r = decode("RoutedUpdate", data)
    return (r["seq"], 1 if r["op"] == "ADD" else -1, r["s"], r["p"], r["o"], r["g"], r["event_time_ms"], r["role"])


def _read_encoded(data: bytes) -> tuple[tuple, int]:
    change, pos = _read_change(data)
    _topic, pos = _text(data, pos)
    _partition, pos = _varint(data, pos)
    _offset, pos = _varint(data, pos)
    refresh = data[pos]
    if refresh > 1:
        raise IndexError(f"boolean byte {refresh}")
    return (*change, bool(refresh)), pos + 1


def decode_encoded(data: bytes) -> tuple[int, int, int, int, int, int, int | None, bool]:
    """An EncodedUpdate as ``(seq, sign, s, p, o, g, event_time_ms, refresh)`` (its source is not needed
    on the data path: :func:`decode` returns it)."""
    found = _fast("EncodedUpdate", data, _read_encoded)
    if found is not None:
        return found
    r = decode("EncodedUpdate", data)
    return (r["seq"], 1 if r["op"] == "ADD" else -1, r["s"], r["p"], r["o"], r["g"], r["event_time_ms"],
            r["refresh"])


# ---------------------------------------------------------------------------------------- change batches
#
# updates.encoded and updates.routed carry EncodedBatch / RoutedBatch records (data format 2): many changes
# per Kafka record, column by column, so consuming, decoding and storing cost per batch, not per change
# (fastavro reads the arrays in C).  Readers also take the one-change records of format 1 (EncodedUpdate,
# RoutedUpdate) still in old logs, so the logs need no migration.

_OP_NAME = {1: "ADD", -1: "DEL"}
_SIGN = {"ADD": 1, "DEL": -1}


def encode_routed_batch(rows: Sequence[tuple]) -> bytes:
    """One RoutedBatch of ``(seq, sign, s, p, o, g, event_time_ms, role)`` rows (role: SUBJECT/OBJECT/BOTH)."""
    seq, sign, s, p, o, g, event_time, role = zip(*rows)
    return encode("RoutedBatch", {"seq": seq, "op": [_OP_NAME[x] for x in sign], "s": s, "p": p, "o": o, "g": g,
                                  "event_time_ms": event_time, "role": role})


def encode_encoded_batch(rows: Sequence[tuple], source_topic: str) -> bytes:
    """One EncodedBatch of ``(seq, sign, s, p, o, g, event_time_ms, source partition, source offset, refresh)``
    rows whose raw updates were read from ``source_topic``."""
    seq, sign, s, p, o, g, event_time, partition, offset, refresh = zip(*rows)
    return encode("EncodedBatch", {"seq": seq, "op": [_OP_NAME[x] for x in sign], "s": s, "p": p, "o": o, "g": g,
                                   "event_time_ms": event_time, "source_topic": source_topic,
                                   "source_partition": partition, "source_offset": offset, "refresh": refresh})


def _writer_name(data: bytes) -> str | None:
    if not isinstance(data, (bytes, bytearray)) or len(data) < HEADER_LEN:
        return None
    writer = _reg().by_fingerprint.get(bytes(data[2:HEADER_LEN])) if data[:2] == MAGIC else None
    return writer.name if writer is not None else None


def _columns(name: str, record: dict[str, Any], fields: Sequence[str]) -> list[list]:
    columns = [record[f] for f in fields]
    sizes = {len(c) for c in columns}
    if len(sizes) != 1 or 0 in sizes:
        raise CodecError(f"corrupt {name}: its arrays must have one common, non-zero length, got " +
                         ", ".join(f"{f}={len(c)}" for f, c in zip(fields, columns)))
    return columns


def routed_changes(data: bytes) -> list[tuple[int, int, int, int, int, int, int | None, str]]:
    """The changes of an updates.routed record (a RoutedBatch, or a format-1 RoutedUpdate) as
    ``(seq, sign, s, p, o, g, event_time_ms, role)`` tuples (none for a Frontier mark or a ProbeBatch); raises
    :class:`CodecError`."""
    if _writer_name(data) in ("Frontier", "ProbeBatch"):
        return []
    return _changes(data, "RoutedBatch", decode_routed, "role")


def encoded_changes(data: bytes) -> list[tuple[int, int, int, int, int, int, int | None, bool]]:
    """The changes of an updates.encoded record (an EncodedBatch, or a format-1 EncodedUpdate) as
    ``(seq, sign, s, p, o, g, event_time_ms, refresh)`` tuples; raises :class:`CodecError`."""
    return _changes(data, "EncodedBatch", decode_encoded, "refresh")


def _changes(data: bytes, batch: str, read_single: Callable[[bytes], tuple], last: str) -> list[tuple]:
    if _writer_name(data) != batch:
        return [read_single(data)]
    seq, op, s, p, o, g, event_time, extra = _columns(batch, decode(batch, data), (
        "seq", "op", "s", "p", "o", "g", "event_time_ms", last))
    return list(zip(seq, map(_SIGN.__getitem__, op), s, p, o, g, event_time, extra))


def encoded_records(data: bytes) -> list[dict[str, Any]]:
    """The changes of an updates.encoded record as EncodedUpdate dicts (with ``source``), for tools, tests
    and restores that want every field; raises :class:`CodecError`."""
    if _writer_name(data) != "EncodedBatch":
        return [decode("EncodedUpdate", data)]
    record = decode("EncodedBatch", data)
    fields = ("seq", "op", "s", "p", "o", "g", "event_time_ms", "source_partition", "source_offset", "refresh")
    topic = record["source_topic"]
    return [{"seq": seq, "op": op, "s": s, "p": p, "o": o, "g": g, "event_time_ms": t,
             "source": {"topic": topic, "partition": partition, "offset": offset}, "refresh": refresh}
            for seq, op, s, p, o, g, t, partition, offset, refresh in zip(*_columns("EncodedBatch", record, fields))]


_PART_DELTA_COLUMNS = ("seq", "sign", "source_partition", "source_offset", "index", "snapshot", "event_time_ms")


@dataclass(frozen=True, slots=True)
class PartDeltaColumns:
    """The deltas of one deltas.parts record, column by column (a PartDeltaBatch as written; a format-1
    PartDelta as a batch of one).  Delta i binds ``variables[j]`` to ``values[i * len(variables) + j]``."""

    query_id: str
    part: int
    variables: list[str]
    seq: list[int]
    sign: list[str]
    values: list[int]
    source_partition: list[int]
    source_offset: list[int]
    index: list[int]
    snapshot: list[bool]
    event_time_ms: list[int | None]
    version: int = 0  # the query's registration version (QueryPlan.version)
    distinct: bool = False  # rows are a DISTINCT query's underlying projections: the answers service counts them
    gated: bool = False  # a probe-evaluated query: its registration is released once every partition is ready

    def __len__(self) -> int:
        return len(self.seq)

    def binding(self, i: int) -> dict[str, int]:
        k = len(self.variables)
        return dict(zip(self.variables, self.values[i * k:(i + 1) * k]))


def encode_part_delta_batch(query_id: str, part: int, variables: Sequence[str], rows: Sequence[tuple],
                            version: int = 0, distinct: bool = False, gated: bool = False) -> bytes:
    """One PartDeltaBatch of ``(seq, sign, values, source_partition, source_offset, index, snapshot,
    event_time_ms)`` rows (sign: PLUS/MINUS; values: the term ids of ``variables``, in their order) of the
    query's registration ``version``; ``distinct``, ``gated``: see PartDeltaBatch."""
    k = len(variables)
    if any(len(row[2]) != k for row in rows):
        raise CodecError(f"PartDeltaBatch of {query_id}: every delta must bind the {k} variables {list(variables)}")
    columns = list(zip(*rows))
    values = [term_id for row_values in columns[2] for term_id in row_values]
    del columns[2]
    return encode("PartDeltaBatch", {"query_id": query_id, "part": part, "variables": list(variables),
                                     "values": values, **dict(zip(_PART_DELTA_COLUMNS, columns)),
                                     "version": version, "distinct": distinct, "gated": gated})


def part_delta_columns(data: bytes) -> PartDeltaColumns:
    """The deltas of a deltas.parts record (a PartDeltaBatch or one PartDelta); raises :class:`CodecError`."""
    if _writer_name(data) != "PartDeltaBatch":
        one = decode_part_delta(data)
        return PartDeltaColumns(one["query_id"], one["part"], list(one["binding"]), [one["seq"]], [one["sign"]],
                                list(one["binding"].values()), [one["source_partition"]], [one["source_offset"]],
                                [one["index"]], [one["snapshot"]], [one["event_time_ms"]])
    record = decode("PartDeltaBatch", data)
    seq, sign, src, offset, index, snapshot, event_time = _columns("PartDeltaBatch", record, _PART_DELTA_COLUMNS)
    variables, values = record["variables"], record["values"]
    if len(values) != len(seq) * len(variables):
        raise CodecError(f"corrupt PartDeltaBatch: {len(seq)} deltas of {len(variables)} variables need "
                         f"{len(seq) * len(variables)} values, got {len(values)}")
    return PartDeltaColumns(record["query_id"], record["part"], variables, seq, sign, values, src, offset, index,
                            snapshot, event_time, record["version"], record["distinct"], record["gated"])


def encode_frontier(frontiers: Mapping[int, int]) -> bytes:
    """One Frontier record: routed partition -> the highest seq it has completed (see schemas/Frontier.avsc)."""
    partitions = sorted(frontiers)
    return encode("Frontier", {"partition": partitions, "seq": [frontiers[p] for p in partitions]})


def frontier_of(data: bytes) -> dict[int, int] | None:
    """The frontiers of a Frontier record, or None when ``data`` is another record (cheap: the header only)."""
    if _writer_name(data) != "Frontier":
        return None
    record = decode("Frontier", data)
    if len(record["partition"]) != len(record["seq"]):
        raise CodecError("corrupt Frontier: partition and seq arrays differ in length")
    return dict(zip(record["partition"], record["seq"]))


_PROBE_COLUMNS = ("probe_query", "probe_seq", "probe_sign", "probe_pattern", "probe_step", "probe_width",
                  "probe_origin", "probe_snapshot", "probe_born_ms")
_ACK_COLUMNS = ("ack_query", "ack_seq", "ack_delta", "ack_snapshot")


def encode_probe_batch(probes: Sequence[Any] = (), acks: Sequence[Any] = (),
                       registered: Sequence[tuple[str, int]] = (), floors: Sequence[tuple[int, int, list[str]]] = ()
                       ) -> bytes:
    """One ProbeBatch record (schemas/ProbeBatch.avsc) of ``cbgp.distributed`` probes and acks (written column
    by column), ``(query, as_of)`` registrations and ``(partition, floor, queries)`` floors."""
    index: dict[str, int] = {}
    probe_query = [index.setdefault(p.query, len(index)) for p in probes]
    ack_query = [index.setdefault(a.query, len(index)) for a in acks]
    return encode("ProbeBatch", {
        "queries": list(index), "probe_query": probe_query,
        "probe_seq": [p.seq for p in probes], "probe_sign": [p.sign for p in probes],
        "probe_triple": [term for p in probes for term in p.triple],
        "probe_pattern": [p.pattern for p in probes], "probe_step": [p.step for p in probes],
        "probe_width": [len(p.binding) for p in probes],
        "probe_binding": [term for p in probes for term in p.binding],
        "probe_origin": [p.origin for p in probes], "probe_snapshot": [p.snapshot for p in probes],
        "probe_born_ms": [p.born_ms for p in probes],
        "ack_query": ack_query, "ack_seq": [a.seq for a in acks], "ack_delta": [a.delta for a in acks],
        "ack_snapshot": [a.snapshot for a in acks],
        "registered": [{"query": q, "as_of": as_of} for q, as_of in registered],
        "floors": [{"partition": p, "floor": f, "queries": list(qs)} for p, f, qs in floors]})


def probe_batch_of(data: bytes) -> dict[str, Any] | None:
    """A ProbeBatch record decoded, or None when ``data`` is another record (cheap: the header only).
    ``probes`` are ``(query, seq, sign, triple, pattern, step, binding, origin, snapshot, born_ms)`` tuples
    (the fields of ``cbgp.distributed.Probe`` after ``dest``) and ``acks``
    ``(query, seq, delta, snapshot)`` tuples, in their order."""
    if _writer_name(data) != "ProbeBatch":
        return None
    record = decode("ProbeBatch", data)
    queries = record["queries"]
    query, seq, sign, pattern, step, width, origin, snapshot, born = [record[f] for f in _PROBE_COLUMNS]
    triples, bindings = record["probe_triple"], record["probe_binding"]
    n = len(seq)
    if any(len(record[f]) != n for f in _PROBE_COLUMNS) or len(triples) != 4 * n or len(bindings) != sum(width) \
            or any(len(record[f]) != len(record["ack_seq"]) for f in _ACK_COLUMNS) \
            or any(not 0 <= q < len(queries) for q in query + record["ack_query"]):
        raise CodecError(f"corrupt ProbeBatch: {n} probes need {n} items in every probe_* array, {4 * n} "
                         f"probe_triple values and the sum of probe_width binding values; query indices must "
                         f"name one of the {len(queries)} queries")
    probes = []
    start = 0
    for i in range(n):
        end = start + width[i]
        probes.append((queries[query[i]], seq[i], sign[i], tuple(triples[4 * i:4 * i + 4]), pattern[i], step[i],
                       tuple(bindings[start:end]), origin[i], snapshot[i], born[i]))
        start = end
    acks = [(queries[q], s, d, snap) for q, s, d, snap in zip(*[record[f] for f in _ACK_COLUMNS])]
    return {"probes": probes, "acks": acks, "registered": record["registered"], "floors": record["floors"]}


def encode_probe_ready(query_id: str, version: int, partition: int, as_of: int) -> bytes:
    return encode("ProbeReady", {"query_id": query_id, "version": version, "partition": partition, "as_of": as_of})


def probe_ready_of(data: bytes | None) -> dict[str, Any] | None:
    """A ProbeReady record decoded, or None when ``data`` is another record."""
    if data is None or _writer_name(data) != "ProbeReady":
        return None
    return decode("ProbeReady", data)


def part_deltas(data: bytes) -> list[dict[str, Any]]:
    """The deltas of a deltas.parts record (a PartDeltaBatch or one PartDelta) as PartDelta dicts, for tools
    and tests (the answers service reads :func:`part_delta_columns`); raises :class:`CodecError`."""
    cols = part_delta_columns(data)
    return [{"query_id": cols.query_id, "part": cols.part, "seq": cols.seq[i], "sign": cols.sign[i],
             "binding": cols.binding(i), "source_partition": cols.source_partition[i],
             "source_offset": cols.source_offset[i], "index": cols.index[i], "snapshot": cols.snapshot[i],
             "event_time_ms": cols.event_time_ms[i]} for i in range(len(cols))]


def _read_part_delta(data: bytes) -> tuple[dict, int]:
    pos = HEADER_LEN
    query_id, pos = _text(data, pos)
    part, pos = _varint(data, pos)
    seq, pos = _varint(data, pos)
    sign, pos = _varint(data, pos)
    if not 0 <= sign < 2:
        raise IndexError(f"Sign index {sign}")
    binding: dict[str, int] = {}
    while True:
        count, pos = _varint(data, pos)
        if count == 0:
            break
        if count < 0:  # a block with its byte size (legal Avro, not what our writers produce)
            count = -count
            _size, pos = _varint(data, pos)
        for _ in range(count):
            var, pos = _text(data, pos)
            binding[var], pos = _varint(data, pos)
    source_partition, pos = _varint(data, pos)
    source_offset, pos = _varint(data, pos)
    index, pos = _varint(data, pos)
    snapshot = data[pos]
    if snapshot > 1:
        raise IndexError(f"boolean byte {snapshot}")
    event_time_ms, pos = _optional(data, pos + 1)
    return {"query_id": query_id, "part": part, "seq": seq, "sign": ("PLUS", "MINUS")[sign], "binding": binding,
            "source_partition": source_partition, "source_offset": source_offset, "index": index,
            "snapshot": bool(snapshot), "event_time_ms": event_time_ms}, pos


def decode_part_delta(data: bytes) -> dict[str, Any]:
    """``decode("PartDelta", data)``, fast for records of the current schema."""
    found = _fast("PartDelta", data, _read_part_delta)
    return found if found is not None else decode("PartDelta", data)


@functools.lru_cache(maxsize=1 << 16)
def _cached_string(text: str) -> bytes:
    """:func:`_string` for query ids and variable names, which repeat on every record."""
    return _string(text)


def encode_part_delta(query_id: str, part: int, seq: int, sign: str, binding: Mapping[str, int],
                      source_partition: int, source_offset: int, index: int, snapshot: bool,
                      event_time_ms: int | None) -> bytes:
    """``encode("PartDelta", {...})`` for the data path (same bytes)."""
    items = [_long(len(binding))] if binding else []
    for var, term_id in binding.items():
        items.append(_cached_string(var))
        items.append(_long(term_id))
    return b"".join((_header("PartDelta"), _cached_string(query_id), _long(part), _long(seq),
                     b"\x00" if sign == "PLUS" else b"\x02", *items, b"\x00", _long(source_partition),
                     _long(source_offset), _long(index), b"\x01" if snapshot else b"\x00",
                     _optional_long(event_time_ms)))


_TERM_TYPE = {"uri": b"\x00", "literal": b"\x02", "bnode": b"\x04"}


@functools.lru_cache(maxsize=1 << 18)
def _sparql_term(term: str) -> bytes:
    """The Avro SparqlTerm body of a canonical term string (cached: answers repeat terms)."""
    avro = term_to_avro(term)
    return b"".join((_TERM_TYPE[avro["type"]], _string(avro["value"]),
                     b"\x00" if avro["datatype"] is None else b"\x02" + _string(avro["datatype"]),
                     b"\x00" if avro["lang"] is None else b"\x02" + _string(avro["lang"])))


def _binding_map(terms: Mapping[str, str]) -> list[bytes]:
    items = [_long(len(terms))] if terms else []
    for var, term in terms.items():
        items.append(_cached_string(var))
        items.append(_sparql_term(term))
    items.append(b"\x00")
    return items


def answer_binding(terms: Mapping[str, str]) -> bytes:
    """The Avro ``binding`` map ``{var: SparqlTerm}`` of an Answer or CurrentAnswer, in ``terms``' order."""
    return b"".join(_binding_map(terms))


class BindingWriter:
    """:func:`answer_binding` over fixed variables from cached term bodies, for the answers service, which
    writes each binding twice (Answer and CurrentAnswer) and sees the same terms again and again."""

    term_body = staticmethod(_sparql_term)  # a term's SparqlTerm body (cached)

    def __init__(self, variables: Sequence[str]) -> None:
        self._prefix = _long(len(variables)) if variables else b""
        self._keys = [_cached_string(var) for var in variables]

    def write(self, bodies: Sequence[bytes]) -> bytes:
        """The map binding variable j to the term whose body is ``bodies[j]``."""
        return self._prefix + b"".join([key + body for key, body in zip(self._keys, bodies)]) + b"\x00"


def encode_answer_record(query_id: str, n: int, seq: int, sign: str, binding: bytes, snapshot: bool,
                         produced_at_ms: int, version: int = 0) -> bytes:
    """An Answer whose binding map is already encoded (:func:`answer_binding`, :class:`BindingWriter`)."""
    return b"".join((_header("Answer"), _cached_string(query_id), _long(n), _long(seq), _cached_string(sign),
                     binding, b"\x01" if snapshot else b"\x00", _long(produced_at_ms), _long(version)))


def encode_current_answer_record(query_id: str, binding: bytes, multiplicity: int, last_n: int,
                                 version: int = 0) -> bytes:
    """A CurrentAnswer whose binding map is already encoded."""
    return b"".join((_header("CurrentAnswer"), _cached_string(query_id), binding, _long(multiplicity),
                     _long(last_n), _long(version)))


def encode_answer(query_id: str, n: int, seq: int, sign: str, terms: Mapping[str, str], snapshot: bool,
                  produced_at_ms: int, version: int = 0) -> bytes:
    """``encode("Answer", {..., "binding": {var: term_to_avro(term)}})`` for the data path (same bytes)."""
    return encode_answer_record(query_id, n, seq, sign, answer_binding(terms), snapshot, produced_at_ms, version)


def encode_current_answer(query_id: str, terms: Mapping[str, str], multiplicity: int, last_n: int,
                          version: int = 0) -> bytes:
    """``encode("CurrentAnswer", {..., "binding": {var: term_to_avro(term)}})`` (same bytes)."""
    return encode_current_answer_record(query_id, answer_binding(terms), multiplicity, last_n, version)
