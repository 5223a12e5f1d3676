"""Avro schemas and the single-object codec: round trips, evolution both ways, standard Avro on the wire
(checked with the Apache ``avro`` implementation, independent of fastavro), and clear errors on bad bytes."""

from __future__ import annotations

import io
import json
import struct
from pathlib import Path
from typing import Any

import avro.io
import avro.schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services import codec
from services.codec import CodecError, decode, decode_any, encode

SCHEMAS = codec.SCHEMA_DIR
NAMES = codec.record_names()
HISTORY = sorted((SCHEMAS / "history").glob("*.v*.avsc"))


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def records_of(schema: Any) -> st.SearchStrategy[Any]:
    """A hypothesis strategy for any datum of an Avro schema (JSON form), derived from the schema itself."""
    if isinstance(schema, list):
        return st.one_of([records_of(s) for s in schema])
    if isinstance(schema, str):
        return {
            "null": st.none(), "boolean": st.booleans(), "string": st.text(max_size=20),
            "bytes": st.binary(max_size=20), "int": st.integers(-(2**31), 2**31 - 1),
            "long": st.integers(-(2**63), 2**63 - 1),
        }[schema]
    kind = schema["type"]
    if kind == "record":
        return st.fixed_dictionaries({f["name"]: records_of(f["type"]) for f in schema["fields"]})
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "map":
        return st.dictionaries(st.text(max_size=8), records_of(schema["values"]), max_size=4)
    if kind == "array":
        return st.lists(records_of(schema["items"]), max_size=4)
    return records_of(kind)


def avro_read(body: bytes, writer: dict[str, Any], reader: dict[str, Any] | None = None) -> Any:
    """Decode a body with the Apache avro library (a second, independent Avro implementation)."""
    w = avro.schema.parse(json.dumps(writer))
    r = avro.schema.parse(json.dumps(reader)) if reader is not None else w
    return avro.io.DatumReader(w, r).read(avro.io.BinaryDecoder(io.BytesIO(body)))


def avro_write(record: Any, writer: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    avro.io.DatumWriter(avro.schema.parse(json.dumps(writer))).write(record, avro.io.BinaryEncoder(out))
    return out.getvalue()


def single_object(schema_json: dict[str, Any], body: bytes) -> bytes:
    """Frame a body as the Avro spec's single-object encoding, fingerprint computed by the avro library."""
    return codec.MAGIC + avro.schema.parse(json.dumps(schema_json)).fingerprint("CRC-64-AVRO") + body


FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------------ the schema files


def test_catalogue_of_records_is_complete() -> None:
    assert NAMES == sorted(["RawUpdate", "EncodedUpdate", "RoutedUpdate", "EncodedBatch", "RoutedBatch",
                            "EncodedColumns", "RoutedColumns",
                            "DictionaryEntry", "DictionaryColumns", "AdminCommand",
                            "QueryStatus", "QueryPlan", "PartDelta", "PartDeltaBatch", "PartDeltaColumns", "SparqlTerm", "Answer", "CurrentAnswer",
                            "DeadLetter", "Frontier", "ProbeBatch", "ProbeColumns", "ProbeReady"])


@pytest.mark.parametrize("path", sorted(SCHEMAS.glob("*.avsc")), ids=lambda p: p.stem)
def test_each_file_is_one_documented_org_cbgp_record_named_like_the_file(path: Path) -> None:
    schema = load(path)
    assert schema["type"] == "record" and schema["namespace"] == "org.cbgp" and schema["name"] == path.stem
    assert schema["doc"].strip()
    avro.schema.parse(path.read_text())  # also valid for the Apache implementation


@pytest.mark.parametrize("name", ["Answer", "CurrentAnswer"])
def test_inlined_sparql_term_is_identical_to_its_own_schema(name: str) -> None:
    binding = next(f for f in load(SCHEMAS / f"{name}.avsc")["fields"] if f["name"] == "binding")
    assert binding["type"]["values"] == load(SCHEMAS / "SparqlTerm.avsc")


@pytest.mark.parametrize("path", HISTORY, ids=lambda p: p.name)
def test_history_versions_are_compatible_both_ways_with_the_current_schema(path: Path) -> None:
    old = avro.schema.parse(path.read_text())
    new = avro.schema.parse((SCHEMAS / f"{path.name.split('.')[0]}.avsc").read_text())
    checker = ReaderWriterCompatibilityChecker()
    assert checker.get_compatibility(new, old).compatibility is SchemaCompatibilityType.compatible
    assert checker.get_compatibility(old, new).compatibility is SchemaCompatibilityType.compatible


# ------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("name", NAMES)
def test_every_record_round_trips_and_is_standard_avro(name: str) -> None:
    schema_json = load(SCHEMAS / f"{name}.avsc")

    @FAST
    @given(records_of(schema_json))
    def check(record: dict[str, Any]) -> None:
        data = encode(name, record)
        assert decode(name, data) == record
        assert decode_any(data) == (name, record)
        # The header is the spec's single-object header, fingerprint as the Apache library computes it...
        assert data[:10] == single_object(schema_json, b"")
        # ...and the Apache library reads fastavro's body, and writes bodies the codec reads.
        assert avro_read(data[10:], schema_json) == record
        assert decode(name, single_object(schema_json, avro_write(record, schema_json))) == record

    check()


def test_fingerprint_is_crc64_avro_of_the_canonical_form() -> None:
    # Test vector from the Avro spec's implementations: the fingerprint of the schema "null".
    assert struct.pack("<Q", codec.crc64_avro(b'"null"')) == avro.schema.parse('"null"').fingerprint("CRC-64-AVRO")


# ------------------------------------------------------------------------------------ evolution


@pytest.mark.parametrize("path", HISTORY, ids=lambda p: p.name)
def test_records_written_by_the_old_version_are_read_with_defaults(path: Path) -> None:
    name = path.name.split(".")[0]
    old_json, new_json = load(path), load(SCHEMAS / f"{name}.avsc")
    added = {f["name"] for f in new_json["fields"]} - {f["name"] for f in old_json["fields"]}
    assert added, "a history version must differ from the current schema"
    old = parse_schema(old_json)

    @FAST
    @given(records_of(old_json))
    def check(record: dict[str, Any]) -> None:
        body = io.BytesIO()
        schemaless_writer(body, old, record)
        read = decode(name, single_object(old_json, body.getvalue()))
        defaults = {f["name"]: f["default"] for f in new_json["fields"] if f["name"] in added}
        assert read == {**record, **defaults}

    check()


@pytest.mark.parametrize("path", HISTORY, ids=lambda p: p.name)
def test_a_reader_of_the_old_version_reads_new_records(path: Path) -> None:
    name = path.name.split(".")[0]
    old_json, new_json = load(path), load(SCHEMAS / f"{name}.avsc")
    kept = {f["name"] for f in old_json["fields"]}

    @FAST
    @given(records_of(new_json))
    def check(record: dict[str, Any]) -> None:
        body = encode(name, record)[10:]
        expected = {k: v for k, v in record.items() if k in kept}
        assert schemaless_reader(io.BytesIO(body), parse_schema(new_json), parse_schema(old_json)) == expected
        assert avro_read(body, new_json, old_json) == expected

    check()


# ------------------------------------------------------------------------------------ bad bytes and records

RAW = {"op": "ADD", "s": "<http://x/s>", "p": "<http://x/p>", "o": '"o"', "g": None, "event_time_ms": 7}


@pytest.mark.parametrize("data, message", [
    (b"", "truncated message: 0 bytes"),
    (b"\xc3\x01\x00", "truncated message: 3 bytes"),
    (b'{"op": "ADD"}xxxxx', "not Avro single-object encoding"),
    (b"\xc3\x01" + b"\xff" * 8 + b"\x00", "unknown writer schema fingerprint ffffffffffffffff"),
])
def test_bad_headers_are_codec_errors(data: bytes, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        decode("RawUpdate", data)


def test_truncated_body_and_trailing_bytes_and_wrong_record_type_are_codec_errors() -> None:
    data = encode("RawUpdate", RAW)
    with pytest.raises(CodecError, match="corrupt RawUpdate"):
        decode("RawUpdate", data[:-4])
    with pytest.raises(CodecError, match="1 trailing bytes"):
        decode("RawUpdate", data + b"\x00")
    with pytest.raises(CodecError, match="expected DictionaryEntry but the message was written as RawUpdate"):
        decode("DictionaryEntry", data)
    with pytest.raises(CodecError, match="unknown record 'Nope'"):
        decode("Nope", data)


@FAST
@given(st.data())
def test_any_corruption_is_either_decoded_or_a_codec_error(data: st.DataObject) -> None:
    good = bytearray(encode("RawUpdate", RAW))
    i = data.draw(st.integers(0, len(good) - 1))
    good[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(good)))
    try:
        decode("RawUpdate", bytes(good[:cut]))
    except CodecError as exc:
        assert "\n" not in str(exc)


def test_records_that_do_not_fit_the_schema_name_the_field() -> None:
    with pytest.raises(CodecError, match=r"RawUpdate\.op: 'PUT' is not one of ADD/DEL"):
        encode("RawUpdate", {**RAW, "op": "PUT"})
    with pytest.raises(CodecError, match=r"EncodedUpdate\.s: 'x' is not long"):
        encode("EncodedUpdate", {"seq": 1, "op": "ADD", "s": "x", "p": 1, "o": 1, "g": 0,
                                 "source": {"topic": "t", "partition": 0, "offset": 0}})
    with pytest.raises(CodecError, match=r"RawUpdate\.s: None is not string"):
        encode("RawUpdate", {"op": "ADD"})
