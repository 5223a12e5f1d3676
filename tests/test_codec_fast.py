"""The hot-path codecs (``codec.decode_routed`` ... ``encode_current_answer``) are exact drop-ins for the
generic fastavro path: same bytes written, same values read, the same errors for bad bytes, and records of
older schema versions still read (through the generic reader)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services import codec
from tests.test_schemas import FAST, HISTORY, avro_write, load, records_of, single_object

SIGN = {"ADD": 1, "DEL": -1}


def current_records(name: str) -> st.SearchStrategy:
    return records_of(load(codec.SCHEMA_DIR / f"{name}.avsc"))


# The last field of each fast reader's tuple: RoutedUpdate's role, EncodedUpdate's refresh flag.
CHANGE_READERS = {"RoutedUpdate": (codec.decode_routed, "role"), "EncodedUpdate": (codec.decode_encoded, "refresh")}


@pytest.mark.parametrize("name", sorted(CHANGE_READERS))
@FAST
@given(drawn=st.data())
def test_changes_read_as_the_generic_reader_reads_them(name: str, drawn: st.DataObject) -> None:
    read, last = CHANGE_READERS[name]
    data = codec.encode(name, drawn.draw(current_records(name)))
    r = codec.decode(name, data)
    assert read(data) == (r["seq"], SIGN[r["op"]], r["s"], r["p"], r["o"], r["g"], r["event_time_ms"], r[last])


@FAST
@given(current_records("PartDelta"))
def test_part_deltas_round_trip_through_the_fast_writer_and_reader(record: dict) -> None:
    generic = codec.encode("PartDelta", record)
    assert codec.encode_part_delta(**record) == generic
    assert codec.decode_part_delta(generic) == codec.decode("PartDelta", generic)


@pytest.mark.parametrize("name", ["RoutedUpdate", "EncodedUpdate", "PartDelta"])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_bad_bytes_fail_as_in_the_generic_reader(name: str, data: st.DataObject) -> None:
    """Truncated, padded, bit-flipped or foreign records: the fast reader raises exactly when decode() does."""
    fast = {**{n: reader for n, (reader, _last) in CHANGE_READERS.items()}, "PartDelta": codec.decode_part_delta}[name]
    good = codec.encode(name, data.draw(current_records(name)))
    variants = [good[:cut] for cut in range(len(good))] + [good + b"\x00", codec.encode("DeadLetter", {
        "service": "x", "source_topic": "t", "partition": 0, "offset": 0, "reason": "r", "message": "m",
        "line": None, "original": b"", "at_ms": 0})]
    variants += [good[:i] + bytes([good[i] ^ 0xFF]) + good[i + 1:] for i in range(codec.HEADER_LEN, len(good))]
    for bad in variants:
        try:
            codec.decode(name, bad)
            generic_ok = True
        except codec.CodecError:
            generic_ok = False
        if generic_ok:
            fast(bad)  # must not raise either
        else:
            with pytest.raises(codec.CodecError):
                fast(bad)


@pytest.mark.parametrize("path", [p for p in HISTORY if p.name.split(".")[0] in ("EncodedUpdate", "PartDelta")],
                         ids=lambda p: p.name)
@FAST
@given(drawn=st.data())
def test_records_of_older_schema_versions_still_read(path, drawn: st.DataObject) -> None:  # noqa: ANN001
    old = load(path)
    data = single_object(old, avro_write(drawn.draw(records_of(old)), old))
    name = path.name.split(".")[0]
    if name == "EncodedUpdate":
        r = codec.decode(name, data)
        assert codec.decode_encoded(data)[:6] == (r["seq"], SIGN[r["op"]], r["s"], r["p"], r["o"], r["g"])
    else:
        assert codec.decode_part_delta(data) == codec.decode(name, data)


TERMS = ["<http://example.org/a>", "<http://ex.org/ü>", "_:b0", '"plain"', '"chat"@fr', '"é\\"x"@en-GB',
         '"42"^^<http://www.w3.org/2001/XMLSchema#integer>', '""', '"line\\nbreak"']


@FAST
@given(st.text(min_size=1, max_size=12), st.integers(0, 2**62), st.integers(0, 2**62), st.sampled_from("+-"),
       st.dictionaries(st.text(min_size=1, max_size=6), st.sampled_from(TERMS), max_size=4), st.booleans(),
       st.integers(0, 2**62))
def test_answers_are_written_as_the_generic_writer_writes_them(query_id, n, seq, sign, terms, snapshot, at) -> None:
    binding = {var: codec.term_to_avro(term) for var, term in terms.items()}
    assert codec.encode_answer(query_id, n, seq, sign, terms, snapshot, at) == codec.encode("Answer", {
        "query_id": query_id, "n": n, "seq": seq, "sign": sign, "binding": binding, "snapshot": snapshot,
        "produced_at_ms": at})
    assert codec.encode_current_answer(query_id, terms, n, seq) == codec.encode("CurrentAnswer", {
        "query_id": query_id, "binding": binding, "multiplicity": n, "last_n": seq})
    assert codec.canonical_binding(terms) == json.dumps(terms, sort_keys=True, separators=(",", ":"),
                                                        ensure_ascii=False)
