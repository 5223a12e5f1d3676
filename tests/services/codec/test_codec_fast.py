"""The hot-path codecs (``codec.decode_routed`` ... ``encode_current_answer``) are exact drop-ins for the
generic fastavro path: same bytes written, same values read, the same errors for bad bytes, and records of
older schema versions still read (through the generic reader)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cbgp.change import ROLE_BOTH, ROLE_NAMES, ROLE_OBJECT, ROLE_SUBJECT, Change
from cbgp.distributed.evaluator import Ack, Probe
from services import codec
from tests.schemas.test_schemas import FAST, HISTORY, avro_write, load, records_of, single_object

SIGN = {"ADD": 1, "DEL": -1}


def current_records(name: str) -> st.SearchStrategy:
    return records_of(load(codec.SCHEMA_DIR / f"{name}.avsc"))


CHANGE_READERS = {"RoutedUpdate": codec.decode_routed, "EncodedUpdate": codec.decode_encoded}
ROLE_OF = {"SUBJECT": ROLE_SUBJECT, "OBJECT": ROLE_OBJECT, "BOTH": ROLE_BOTH}


@pytest.mark.parametrize("name", sorted(CHANGE_READERS))
@FAST
@given(drawn=st.data())
def test_changes_read_as_the_generic_reader_reads_them(name: str, drawn: st.DataObject) -> None:
    data = codec.encode(name, drawn.draw(current_records(name)))
    r = codec.decode(name, data)
    # Routed changes carry their role, encoded ones are ROLE_BOTH and may be refreshes.
    assert CHANGE_READERS[name](data) == Change(r["seq"], SIGN[r["op"]], r["s"], r["p"], r["o"], r["g"], r["event_time_ms"],
                                                ROLE_OF.get(r.get("role"), ROLE_BOTH), r.get("refresh", False))


@FAST
@given(current_records("Answer"))
def test_answers_read_as_the_generic_reader_reads_them(record: dict) -> None:
    data = codec.encode("Answer", record)
    generic = codec.decode("Answer", data)
    assert codec.decode_answer(data) == generic
    as_json = {**generic, "binding": {var: codec.sparql_json_term(term) for var, term in generic["binding"].items()}}
    assert {k: v for k, v in codec.decode_answer_json(data).items() if k != "key"} == as_json
    assert {k: v for k, v in codec.decode_answer_json(data).items() if k != "key"} == as_json  # (terms remembered)


@FAST
@given(current_records("PartDelta"))
def test_part_deltas_round_trip_through_the_fast_writer_and_reader(record: dict) -> None:
    generic = codec.encode("PartDelta", record)
    fields = {k: v for k, v in record.items() if k != "sign"}
    assert codec.encode_part_delta(**fields, diff=1 if record["sign"] == "PLUS" else -1) == generic
    assert codec.decode_part_delta(generic) == codec.decode("PartDelta", generic)


def test_answers_read_as_json_with_long_terms_and_a_bounded_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lengths of several bytes, every kind of term, and the remembered terms bounded in number and size."""
    from services.codec import answers

    monkeypatch.setattr(answers, "JSON_TERMS_KEPT", 5)
    monkeypatch.setattr(answers, "remembered_entries", {})
    terms = {"s": "<http://example.org/" + "x" * 300 + ">", "b": "_:b1", "l": '"chat"@fr',
             "t": '"' + "9" * 200 + '"^^<http://www.w3.org/2001/XMLSchema#integer>'}
    for i in range(12):
        data = codec.encode_answer("q", i, i, "+", {**terms, "i": f'"{i}"'}, False, 0)
        generic = codec.decode("Answer", data)
        want = {var: codec.sparql_json_term(term) for var, term in generic["binding"].items()}
        assert codec.decode_answer_json(data)["binding"] == want
        assert codec.decode_answer_json(data)["binding"] == want
        assert len(answers.remembered_entries) <= 5
        assert all(len(key) <= answers.JSON_TERM_BYTES_KEPT for key in answers.remembered_entries), \
            "long terms are not kept"


@FAST
@given(drawn=st.data())
def test_an_answer_read_as_json_carries_the_gateways_fold_key_of_its_binding(drawn: st.DataObject) -> None:
    from services.gateway.core import binding_key

    data = codec.encode("Answer", drawn.draw(current_records("Answer")))
    read = codec.decode_answer_json(data)
    assert read["key"] == binding_key(read["binding"])
    generic = codec.decode("Answer", data)
    assert read["binding"] == {var: codec.sparql_json_term(term) for var, term in generic["binding"].items()}


def test_an_answer_whose_binding_repeats_a_variable_has_no_key_and_its_last_term() -> None:
    from services.codec.binary import header, write_long, write_string

    entries = [codec.answer_binding({"x": term})[1:-1] for term in ("<urn:a>", "<urn:b>")]  # (count 1 ... end 0)
    data = b"".join((header("Answer"), write_string("q"), write_long(1), write_long(1), write_string("+"),
                     write_long(2), *entries, b"\x00", b"\x00", write_long(0), write_long(0)))
    read = codec.decode_answer_json(data)
    assert read["binding"] == {"x": {"type": "uri", "value": "urn:b"}} and read["key"] is None
    assert codec.decode("Answer", data)["binding"]["x"]["value"] == "urn:b"  # as the generic reader reads it


@pytest.mark.parametrize("reader", ["RoutedUpdate", "EncodedUpdate", "PartDelta", "DictionaryEntry", "Answer",
                                    "Answer:json"])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_bad_bytes_fail_as_in_the_generic_reader(reader: str, data: st.DataObject) -> None:
    """Truncated, padded, bit-flipped or foreign records: the fast reader raises exactly when decode() does."""
    fast = {**CHANGE_READERS, "PartDelta": codec.decode_part_delta, "DictionaryEntry": codec.decode_dictionary_entry,
            "Answer": codec.decode_answer, "Answer:json": codec.decode_answer_json}[reader]
    name = reader.split(":")[0]
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
       st.integers(0, 2**62), st.integers(-(2**31), 2**31 - 1))
def test_answers_are_written_as_the_generic_writer_writes_them(query_id, n, seq, sign, terms, snapshot, at,
                                                               version) -> None:
    binding = {var: codec.term_to_avro(term) for var, term in terms.items()}
    assert codec.encode_answer(query_id, n, seq, sign, terms, snapshot, at, version) == codec.encode("Answer", {
        "query_id": query_id, "n": n, "seq": seq, "sign": sign, "binding": binding, "snapshot": snapshot,
        "produced_at_ms": at, "version": version})
    data = codec.encode_answer(query_id, n, seq, sign, terms, snapshot, at, version)
    assert codec.decode_answer(data) == codec.decode("Answer", data)
    assert codec.encode_current_answer(query_id, terms, n, seq, version) == codec.encode("CurrentAnswer", {
        "query_id": query_id, "binding": binding, "multiplicity": n, "last_n": seq, "version": version})
    assert codec.canonical_binding(terms) == json.dumps(terms, sort_keys=True, separators=(",", ":"),
                                                        ensure_ascii=False)


# -- change batches (data format 3, and 2 still read): what ingest writes on updates.encoded / updates.routed

LONGS = st.integers(-(1 << 63), (1 << 63) - 1)
EVENT_TIMES = st.none() | st.integers(0, 1 << 45)
ROUTED_ROWS = st.lists(st.tuples(LONGS, st.sampled_from([1, -1]), LONGS, LONGS, LONGS, LONGS, EVENT_TIMES,
                                 st.sampled_from([ROLE_SUBJECT, ROLE_OBJECT, ROLE_BOTH])), min_size=1, max_size=40)
ENCODED_ROWS = st.lists(st.tuples(LONGS, st.sampled_from([1, -1]), LONGS, LONGS, LONGS, LONGS, EVENT_TIMES,
                                  st.integers(0, (1 << 31) - 1), LONGS, st.booleans()), min_size=1, max_size=40)


@FAST
@given(st.integers(-2**63, 2**63 - 1), st.text(max_size=40))
def test_dictionary_entries_are_written_as_the_generic_writer_writes_them(term_id: int, term: str) -> None:
    data = codec.encode_dictionary_entry(term_id, term)
    assert data == codec.encode("DictionaryEntry", {"id": term_id, "term": term})
    assert codec.decode("DictionaryEntry", data) == codec.decode_dictionary_entry(data) == {"id": term_id, "term": term}


TERMS = st.lists(st.tuples(st.integers(1, 2**63 - 1), st.text(min_size=1, max_size=30)), min_size=1, max_size=20)


@FAST
@given(TERMS)
def test_dictionary_columns_read_back_as_written_and_as_the_generic_reader_reads_them(
        terms: list[tuple[int, str]]) -> None:
    data = codec.encode_dictionary_columns(*zip(*terms))
    assert codec.dictionary_entries(data) == terms
    generic = codec.decode("DictionaryColumns", data)  # plain Avro
    assert generic["count"] == len(terms) and generic["terms"] == "".join(t for _i, t in terms).encode()
    single = codec.encode_dictionary_entry(*terms[0])
    assert codec.dictionary_entries(single) == terms[:1]  # the records before data format 5 read alike


def dictionary_columns(ids: tuple[int, ...], lengths: tuple[int, ...], terms: bytes, count: int | None = None) -> bytes:
    """A DictionaryColumns record written field by field (so that a test can make any field wrong)."""
    return codec.encode("DictionaryColumns", {
        "count": len(ids) if count is None else count,
        "ids": b"".join(i.to_bytes(8, "little", signed=True) for i in ids),
        "lengths": b"".join(n.to_bytes(4, "little", signed=True) for n in lengths), "terms": terms})


@pytest.mark.parametrize("record, error", [
    (dictionary_columns((), (), b""), "count 0, at least 1 term"),
    (dictionary_columns((5, 6), (3,), b"<a><b>"), "lengths holds 4 bytes, not 2 items of 4"),
    (dictionary_columns((5,), (3,), b"<a>", count=2), "ids holds 8 bytes, not 2 items of 8"),
    (dictionary_columns((0,), (3,), b"<a>"), "term id 0, ids are at least 1"),
    (dictionary_columns((5, 6), (3, 0), b"<a>"), "a term length of 0"),
    (dictionary_columns((5, 6), (3, -3), b"<a>"), "a term length of -3"),
    (dictionary_columns((5, 6), (3, 4), b"<a><b>"), "the lengths add up to 7 bytes, the terms hold 6"),
    (dictionary_columns((5,), (3,), b"<\xff>"), "a term is not UTF-8"),
])
def test_dictionary_columns_of_the_wrong_length_or_range_are_refused(record: bytes, error: str) -> None:
    with pytest.raises(codec.CodecError, match=f"corrupt DictionaryColumns: {error}"):
        codec.dictionary_entries(record)


@FAST
@given(TERMS, st.data())
def test_damaged_dictionary_columns_raise_codec_errors_only(terms: list[tuple[int, str]],
                                                           drawn: st.DataObject) -> None:
    """Any byte changed, cut or added: the reader returns terms or raises CodecError, nothing else."""
    try:
        codec.dictionary_entries(damaged(codec.encode_dictionary_columns(*zip(*terms)), drawn))
    except codec.CodecError:
        pass


def routed_batch_v2(changes: list[Change], inserted_at: list[int] = ()) -> bytes:
    """The same changes as ingest wrote them in data format 2 (Avro arrays), before the packed columns."""
    seq, diff, s, p, o, g, event_time, role, _refresh = zip(*changes)
    return codec.encode("RoutedBatch", {"seq": seq, "op": [OP[x] for x in diff], "s": s, "p": p, "o": o, "g": g,
                                        "event_time_ms": event_time, "role": [ROLE_NAMES[r] for r in role],
                                        "inserted_at": inserted_at})


def encoded_batch_v2(changes: list[Change], sources: list[tuple[int, int]], topic: str) -> bytes:
    seq, diff, s, p, o, g, event_time, _role, refresh = zip(*changes)
    partition, offset = zip(*sources)
    return codec.encode("EncodedBatch", {"seq": seq, "op": [OP[x] for x in diff], "s": s, "p": p, "o": o, "g": g,
                                         "event_time_ms": event_time, "source_topic": topic,
                                         "source_partition": partition, "source_offset": offset, "refresh": refresh})


OP = {1: "ADD", -1: "DEL"}


@FAST
@given(ROUTED_ROWS)
def test_routed_batches_read_back_as_written_and_as_format_2_reads(rows: list[tuple]) -> None:
    changes = [Change(*row) for row in rows]
    data = codec.encode_routed_batch(changes)
    assert codec.routed_changes(data) == changes == codec.routed_changes(routed_batch_v2(changes))
    assert all(type(change) is Change for change in codec.routed_changes(data))
    record = codec.decode("RoutedColumns", data)  # the generic reader agrees: it is plain Avro
    assert record["count"] == len(rows) and record["role"] == bytes(row[7] for row in rows)
    assert record["s"] == b"".join(row[2].to_bytes(8, "little", signed=True) for row in rows)


@FAST
@given(ENCODED_ROWS)
def test_encoded_batches_read_back_as_written_and_as_format_2_reads(rows: list[tuple]) -> None:
    changes = [Change(*row[:7], ROLE_BOTH, row[9]) for row in rows]
    sources = [(row[7], row[8]) for row in rows]
    data = codec.encode_encoded_batch(changes, sources, "t.updates.raw")
    v2 = encoded_batch_v2(changes, sources, "t.updates.raw")
    assert codec.encoded_changes(data) == changes == codec.encoded_changes(v2)
    assert all(type(change.refresh) is bool for change in codec.encoded_changes(data))
    assert codec.encoded_records(data) == codec.encoded_records(v2) == [
        {"seq": seq, "op": "ADD" if sign > 0 else "DEL", "s": s, "p": p, "o": o, "g": g, "event_time_ms": t,
         "source": {"topic": "t.updates.raw", "partition": partition, "offset": offset}, "refresh": refresh}
        for seq, sign, s, p, o, g, t, partition, offset, refresh in rows]
    assert [list(column) for column in codec.encoded_columns(data)] == [
        list(column) for column in codec.encoded_columns(v2)] == [list(column) for column in zip(*rows)][:7]


@FAST
@given(current_records("RoutedUpdate"), current_records("EncodedUpdate"))
def test_single_change_records_of_format_1_still_read(routed: dict, encoded: dict) -> None:
    """Logs written before the batches (one RoutedUpdate / EncodedUpdate per change) read as one-change batches."""
    assert codec.routed_changes(codec.encode("RoutedUpdate", routed)) == [
        (routed["seq"], SIGN[routed["op"]], routed["s"], routed["p"], routed["o"], routed["g"],
         routed["event_time_ms"], ROLE_OF[routed["role"]], False)]
    data = codec.encode("EncodedUpdate", encoded)
    assert codec.encoded_records(data) == [codec.decode("EncodedUpdate", data)]
    assert codec.encoded_changes(data) == [codec.decode_encoded(data)]


def test_batches_with_unequal_columns_or_of_the_wrong_kind_are_refused() -> None:
    ragged = codec.encode("RoutedBatch", {"seq": [1, 2], "op": ["ADD"], "s": [1, 2], "p": [1, 2], "o": [1, 2],
                                          "g": [0, 0], "event_time_ms": [None, None], "role": ["BOTH", "BOTH"]})
    with pytest.raises(codec.CodecError, match=r"corrupt RoutedBatch: .*seq=2, op=1"):
        codec.routed_changes(ragged)
    empty = codec.encode("RoutedBatch", {name: [] for name in ("seq", "op", "s", "p", "o", "g", "event_time_ms",
                                                               "role")})
    with pytest.raises(codec.CodecError, match="non-zero length"):
        codec.routed_changes(empty)
    routed = codec.encode_routed_batch([Change(1, 1, 2, 3, 4, 0, None, ROLE_BOTH)])
    with pytest.raises(codec.CodecError, match="expected EncodedUpdate but the message was written as RoutedColumns"):
        codec.encoded_changes(routed)
    with pytest.raises(codec.CodecError, match="truncated"):
        codec.routed_changes(routed[:5])


PACKED_FIELDS = {"count": 2, "seq": (1, 2), "diff": (1, -1), "s": (5, 6), "p": (7, 7), "o": (8, 9), "g": (0, 0),
                 "event_time_ms": (10, 0), "event_time_null": (0, 1), "role": (1, 3), "inserted_at": ()}


def packed_routed(**fields: object) -> bytes:
    """A RoutedColumns record written field by field (so that a test can make any field wrong)."""
    wide = {"seq", "s", "p", "o", "g", "event_time_ms", "inserted_at"}
    values = {**PACKED_FIELDS, **fields}
    record = {name: value if isinstance(value, (int, bytes)) else
              b"".join(x.to_bytes(8 if name in wide else 1, "little", signed=True) for x in value)
              for name, value in values.items()}
    return codec.encode("RoutedColumns", record)


def test_packed_columns_read_as_written_field_by_field() -> None:
    assert codec.routed_changes(packed_routed()) == [Change(1, 1, 5, 7, 8, 0, 10, ROLE_SUBJECT),
                                                     Change(2, -1, 6, 7, 9, 0, None, ROLE_BOTH)]


@pytest.mark.parametrize("fields, error", [
    ({"count": 0, **{name: () for name in PACKED_FIELDS if name != "count"}}, "count 0, at least 1"),
    ({"count": 3}, "seq holds 16 bytes, not 3 items of 8"),
    ({"count": 1 << 60}, "seq holds 16 bytes"),
    ({"s": (5,)}, "s holds 8 bytes, not 2 items of 8"),
    ({"diff": (1, 0)}, "diff must be 2 bytes, each one of \\[1, 255\\]"),
    ({"diff": (1,)}, "diff must be 2 bytes"),
    ({"role": (1, 4)}, "role must be 2 bytes, each one of \\[1, 2, 3\\]"),
    ({"event_time_null": (0, 2)}, "event_time_null must be 2 bytes"),
    ({"inserted_at": (0,)}, "inserted_at holds 8 bytes, not 2"),
])
def test_packed_columns_of_the_wrong_length_or_range_are_refused(fields: dict, error: str) -> None:
    data = packed_routed(**fields)
    with pytest.raises(codec.CodecError, match=f"corrupt RoutedColumns: {error}"):
        codec.routed_changes(data)
        codec.inserted_at(data)


def damaged(record: bytes, drawn: st.DataObject) -> bytes:
    """``record`` with one byte after its header changed, or cut there, or bytes added there."""
    data = bytearray(record)
    at = drawn.draw(st.integers(codec.HEADER_LEN, len(data) - 1))
    damage = drawn.draw(st.sampled_from(["flip", "cut", "add"]))
    if damage == "flip":
        data[at] ^= drawn.draw(st.integers(1, 255))
    elif damage == "cut":
        del data[at:]
    else:
        data[at:at] = drawn.draw(st.binary(min_size=1, max_size=9))
    return bytes(data)


@FAST
@given(ROUTED_ROWS, st.data())
def test_damaged_packed_records_raise_codec_errors_only(rows: list[tuple], drawn: st.DataObject) -> None:
    """Any byte changed, cut or added: the reader returns changes or raises CodecError, nothing else."""
    data = damaged(codec.encode_routed_batch([Change(*row) for row in rows], None, [0] * len(rows)), drawn)
    for reader in (codec.routed_changes, codec.inserted_at):
        try:
            reader(data)
        except codec.CodecError:
            pass


INTS = st.integers(-(1 << 31), (1 << 31) - 1)
VARIABLES = st.lists(st.text(min_size=1, max_size=4), max_size=4, unique=True)


@st.composite
def part_delta_rows(draw: st.DrawFn) -> tuple[list[str], list[tuple]]:
    """Variables, and deltas binding each of them (the layout of a PartDeltaBatch)."""
    variables = draw(VARIABLES)
    values = st.tuples(*[LONGS] * len(variables))
    rows = draw(st.lists(st.tuples(LONGS, st.sampled_from([1, -1]), values,
                                   st.integers(-(1 << 31), (1 << 31) - 1), LONGS, st.integers(0, (1 << 31) - 1),
                                   st.booleans(), EVENT_TIMES), min_size=1, max_size=30))
    return variables, rows


def part_delta_batch_v3(variables: list[str], rows: list[tuple], **flags: object) -> bytes:
    """The same deltas as workers wrote them before the packed columns: a PartDeltaBatch of Avro arrays."""
    seq, diff, values, partition, offset, index, snapshot, event_time = (list(c) for c in zip(*rows))
    return codec.encode("PartDeltaBatch", {
        "query_id": "q1", "part": -1, "variables": variables, "values": [v for row in values for v in row],
        "seq": seq, "sign": ["PLUS" if d > 0 else "MINUS" for d in diff], "source_partition": partition,
        "source_offset": offset, "index": index, "snapshot": snapshot, "event_time_ms": event_time, **flags})


@FAST
@given(part_delta_rows(), current_records("PartDelta"), st.booleans(), st.booleans(), st.booleans(), INTS)
def test_part_delta_columns_read_back_as_the_avro_arrays_and_single_part_deltas_they_replaced(
        batch: tuple[list[str], list[tuple]], single: dict, distinct: bool, gated: bool, probed: bool,
        version: int) -> None:
    variables, rows = batch
    flags = {"version": version, "distinct": distinct, "gated": gated, "probed": probed}
    data = codec.encode_part_delta_batch("q1", -1, variables, rows, **flags)
    fields = ("seq", "sign", "binding", "source_partition", "source_offset", "index", "snapshot", "event_time_ms")
    assert codec.part_deltas(data) == [
        {"query_id": "q1", "part": -1, **dict(zip(fields, row)), "binding": dict(zip(variables, row[2])),
         "sign": "PLUS" if row[1] > 0 else "MINUS"} for row in rows]
    columns = codec.part_delta_columns(data)
    assert columns.diff == [row[1] for row in rows]
    assert columns == codec.part_delta_columns(part_delta_batch_v3(variables, rows, **flags))  # old logs read alike
    generic = codec.decode("PartDeltaColumns", data)  # plain Avro: the generic reader agrees
    assert (generic["count"], generic["variables"], generic["version"]) == (len(rows), variables, version)
    assert codec.part_deltas(codec.encode("PartDelta", single)) == [single]
    with pytest.raises(codec.CodecError, match="expected PartDelta but the message was written as PartDeltaColumns"):
        codec.decode("PartDelta", data)  # what the Spark assembly relies on to skip answer batches


def test_part_delta_batches_whose_values_do_not_fit_their_variables_are_refused() -> None:
    with pytest.raises(codec.CodecError, match="each binding the 2 variables"):
        codec.encode_part_delta_batch("q", -1, ["x", "y"], [(1, 1, (5,), 0, 0, 0, False, None)])
    with pytest.raises(codec.CodecError, match="a diff is \\+1 or -1, not 0"):
        codec.encode_part_delta_batch("q", -1, ["x"], [(1, 0, (5,), 0, 0, 0, False, None)])
    with pytest.raises(codec.CodecError, match="PartDeltaColumns of q: "):
        codec.encode_part_delta_batch("q", -1, ["x"], [(1, 1, (5,), 1 << 40, 0, 0, False, None)])
    short = codec.encode("PartDeltaBatch", {
        "query_id": "q", "part": -1, "variables": ["x", "y"], "values": [5, 6, 7], "seq": [1, 2],
        "sign": ["PLUS", "PLUS"], "source_partition": [0, 0], "source_offset": [0, 0], "index": [0, 1],
        "snapshot": [False, False], "event_time_ms": [None, None]})
    with pytest.raises(codec.CodecError, match="2 deltas of 2 variables need 4 values, got 3"):
        codec.part_delta_columns(short)


DELTA_FIELDS = {"query_id": "q", "part": -1, "variables": ["x", "y"], "count": 2, "seq": (1, 2), "diff": (1, -1),
                "values": (5, 6, 7, 8), "source_partition": (0, -1), "source_offset": (10, 11), "index": (0, 1),
                "snapshot": (), "event_time_ms": (10, 0), "event_time_null": (0, 1), "version": 3,
                "distinct": False, "gated": True, "probed": False}


def packed_deltas(**fields: object) -> bytes:
    """A PartDeltaColumns record written field by field (so that a test can make any field wrong)."""
    widths = {"seq": 8, "values": 8, "source_offset": 8, "event_time_ms": 8, "source_partition": 4, "index": 4}
    record = {name: b"".join(x.to_bytes(widths.get(name, 1), "little", signed=True) for x in value)
              if isinstance(value, tuple) else value for name, value in {**DELTA_FIELDS, **fields}.items()}
    return codec.encode("PartDeltaColumns", record)


def test_packed_deltas_read_as_written_field_by_field() -> None:
    columns = codec.part_delta_columns(packed_deltas())
    assert (columns.seq, columns.diff, columns.values, columns.source_partition, columns.source_offset,
            columns.index, columns.snapshot, columns.event_time_ms) == (
        [1, 2], [1, -1], [5, 6, 7, 8], [0, -1], [10, 11], [0, 1], [False, False], [10, None])
    assert (columns.version, columns.distinct, columns.gated, columns.probed) == (3, False, True, False)


@pytest.mark.parametrize("fields, error", [
    ({"count": 0, **{name: () for name in ("seq", "diff", "values", "source_partition", "source_offset", "index",
                                           "event_time_ms", "event_time_null")}}, "count 0, at least 1"),
    ({"count": 3}, "holds 16 bytes, not 3 items of 8"),
    ({"count": 1 << 60}, "holds 16 bytes"),
    ({"values": (5, 6, 7)}, "values holds 24 bytes, not 4 items of 8"),
    ({"variables": ["x"]}, "values holds 32 bytes, not 2 items of 8"),
    ({"diff": (1, 0)}, "diff must be 2 bytes, each one of \\[1, 255\\]"),
    ({"source_partition": (0,)}, "source_partition holds 4 bytes, not 2 items of 4"),
    ({"index": (0, 1, 2)}, "index holds 12 bytes, not 2 items of 4"),
    ({"snapshot": (0, 2)}, "snapshot must be 2 bytes, each one of \\[0, 1\\]"),
    ({"snapshot": (1,)}, "snapshot must be 2 bytes"),
    ({"event_time_null": (0, 2)}, "event_time_null must be 2 bytes"),
])
def test_packed_deltas_of_the_wrong_length_or_range_are_refused(fields: dict, error: str) -> None:
    with pytest.raises(codec.CodecError, match=f"corrupt PartDeltaColumns: .*{error}"):
        codec.part_delta_columns(packed_deltas(**fields))


@FAST
@given(part_delta_rows(), st.data())
def test_damaged_packed_deltas_raise_codec_errors_only(batch: tuple[list[str], list[tuple]],
                                                      drawn: st.DataObject) -> None:
    """Any byte changed, cut or added: the reader returns deltas or raises CodecError, nothing else."""
    variables, rows = batch
    try:
        codec.part_delta_columns(damaged(codec.encode_part_delta_batch("q1", -1, variables, rows), drawn))
    except codec.CodecError:
        pass


@FAST
@given(part_delta_rows())
def test_the_answers_service_writes_the_bytes_and_keys_of_the_generic_encoders(
        batch: tuple[list[str], list[tuple]]) -> None:
    """AnswersCore builds Answer and CurrentAnswer records from cached term encodings: each must equal
    ``encode("Answer" | "CurrentAnswer")`` of the decoded delta, and each key ``current_key``."""
    from services.answers.core import AnswersCore

    variables, rows = batch
    terms = {term_id: f"<http://example.org/{term_id}>" if term_id % 3 else f'"lit {term_id}"@en'
             for row in rows for term_id in row[2]}
    rows = [(seq, 1, *rest) for seq, _diff, *rest in rows]  # additions only: multiplicities stay positive
    # increasing idempotence keys: a source's deltas come in (seq, offset, index) order, seqs from 1
    rows = [(i + 1, row[1], row[2], row[3], i, i, *row[6:]) for i, row in enumerate(rows)]
    core = AnswersCore("a", "c", "d", "parts")
    out = core.on_record(1, 0, codec.encode_part_delta_batch("q", -1, variables, rows), 123, terms.get)
    answers = [o for o in out if o.topic == "a"]
    assert len(answers) == len(rows)
    for n, (answer, row) in enumerate(zip(answers, rows), start=1):
        record = codec.decode("Answer", answer.value)
        binding = {var: codec.term_to_avro(terms[term_id]) for var, term_id in zip(variables, row[2])}
        assert record == {"query_id": "q", "n": n, "seq": row[0], "sign": "+", "binding": binding,
                          "snapshot": row[6], "produced_at_ms": record["produced_at_ms"], "version": 0}
    for current in (o for o in out if o.topic == "c" and o.value is not None):
        record = codec.decode("CurrentAnswer", current.value)
        text = {var: codec.term_from_avro(t) for var, t in record["binding"].items()}
        assert current.key == codec.current_key("q", codec.canonical_binding(text))


PROBES = st.lists(st.builds(
    Probe, st.just(3), st.sampled_from(["q@1", "q@2", "path3@7"]), LONGS, st.sampled_from([1, -1]),
    st.tuples(LONGS, LONGS, LONGS, LONGS), INTS, INTS, st.lists(LONGS, max_size=6).map(tuple), INTS, st.booleans(),
    LONGS, st.sampled_from([0, 0, 0, 1, 7, 63])),
    max_size=40)
ACKS = st.lists(st.builds(Ack, st.just(3), st.sampled_from(["q@1", "other@1"]), LONGS, INTS, st.booleans()),
                max_size=40)


def probe_batch_v3(probes, acks, registered=(), floors=(), segments=None) -> bytes:  # noqa: ANN001
    """The same probes as workers wrote them before the packed columns: a ProbeBatch of Avro arrays."""
    index: dict[str, int] = {}
    probe_query = [index.setdefault(p.query, len(index)) for p in probes]
    ack_query = [index.setdefault(a.query, len(index)) for a in acks]
    return codec.encode("ProbeBatch", {
        "queries": list(index), "probe_query": probe_query, "probe_seq": [p.seq for p in probes],
        "probe_sign": [p.diff for p in probes], "probe_triple": [t for p in probes for t in p.triple],
        "probe_pattern": [p.pattern for p in probes], "probe_step": [p.step for p in probes],
        "probe_width": [len(p.binding) for p in probes], "probe_binding": [t for p in probes for t in p.binding],
        "probe_origin": [p.origin for p in probes], "probe_snapshot": [p.snapshot for p in probes],
        "probe_born_ms": [p.born_ms for p in probes], "ack_query": ack_query, "ack_seq": [a.seq for a in acks],
        "ack_delta": [a.delta for a in acks], "ack_snapshot": [a.snapshot for a in acks],
        "registered": [{"query": q, "as_of": as_of} for q, as_of in registered],
        "floors": [{"partition": p, "floor": f, "queries": list(qs)} for p, f, qs in floors],
        "segments": None if segments is None else [
            {"sender": g[0], "cause": g[1], "chunk": g[2], "acks": g[3], "probes": g[4]} for g in segments],
        "segment_query": None if segments is None or any(len(g) < 6 for g in segments) else [g[5] for g in segments],
        "probe_route": [p.route for p in probes] if any(p.route for p in probes) else None})


@FAST
@given(PROBES, ACKS, st.lists(st.tuples(st.sampled_from(["q@1", "r@2"]), LONGS), max_size=3))
def test_probe_batches_carry_probes_and_acks_column_by_column_unchanged(probes, acks, registered) -> None:
    """Probes are written column by column (one query table, flattened triples and bindings, packed): every
    probe and ack reads back as it was written, in order, whatever its binding's width and route, and as it
    reads from a record of the Avro arrays written before."""
    data = codec.encode_probe_batch(probes, acks, registered, [(1, 5, ["q@1"])])
    record = codec.probe_batch_of(data)
    assert [Probe(3, *item) for item in record["probes"]] == probes
    assert [Ack(3, *item) for item in record["acks"]] == acks
    assert [(r["query"], r["as_of"]) for r in record["registered"]] == registered
    assert record["floors"] == [{"partition": 1, "floor": 5, "queries": ["q@1"]}]
    assert codec.probe_batch_of(probe_batch_v3(probes, acks, registered, [(1, 5, ["q@1"])])) == record
    assert codec.routed_changes(data) == []


def test_probe_batch_segments_read_back_and_must_cover_its_columns() -> None:
    """Segments (sender, cause, chunk, acks, probes, query) divide the columns into what each step made; a record
    without them (written before segments) reads as None; segments that do not add up are refused."""
    probes = [Probe(0, "q@1", 5, 1, (1, 2, 3, 0), 0, 1, (7, 8), 0, False)] * 3
    acks = [Ack(0, "q@1", 5, -1, False)] * 2
    segments = [(1, 40, 0, 1, 2, "q@1"), (1, 41, 0, 1, 0, "q@1"), (2, -1, 0, 0, 1, "q@1")]
    unnamed = [segment[:5] for segment in segments]  # as written before segments were per query
    for encode in (codec.encode_probe_batch, probe_batch_v3):
        assert codec.probe_batch_of(encode(probes, acks, segments=segments))["segments"] == segments
        assert codec.probe_batch_of(encode(probes, acks, segments=unnamed))["segments"] == \
            [(*segment, None) for segment in unnamed]
        assert codec.probe_batch_of(encode(probes, acks))["segments"] is None
        with pytest.raises(codec.CodecError, match="segments count 2 acks"):
            codec.probe_batch_of(encode(probes, acks, segments=[(1, 40, 0, 2, 2)]))


def test_a_probe_batch_whose_columns_disagree_is_refused() -> None:
    probe = Probe(0, "q@1", 5, 1, (1, 2, 3, 0), 0, 1, (7, 8), 0, False)
    record = codec.decode("ProbeBatch", probe_batch_v3([probe], []))
    record["probe_binding"] = [7]  # one value short of probe_width's 2
    with pytest.raises(codec.CodecError, match="corrupt ProbeBatch"):
        codec.probe_batch_of(codec.encode("ProbeBatch", record))
    good = codec.decode("ProbeColumns", codec.encode_probe_batch([probe], [Ack(0, "q@1", 5, -1, False)]))
    for field, value, error in [("probe_binding", good["probe_binding"][:8], "probe_binding holds 8 bytes, not 2"),
                                ("probes", 2, "probe_query holds 4 bytes, not 2"),
                                ("probe_sign", b"\x02", "probe_sign must be 1 bytes"),
                                ("probe_snapshot", b"\x07", "probe_snapshot must be 1 bytes"),
                                ("ack_query", b"\x05\x00\x00\x00", "query indices must name one of the 1"),
                                ("probe_width", b"\xff\xff\xff\xff", "a negative probe_width"),
                                ("acks", -1, "1 probes, -1 acks"),
                                ("probe_route", b"\x00", "probe_route holds 1 bytes")]:
        with pytest.raises(codec.CodecError, match=f"corrupt ProbeColumns: {error}"):
            codec.probe_batch_of(codec.encode("ProbeColumns", {**good, field: value}))


@FAST
@given(PROBES, ACKS, st.data())
def test_damaged_probe_records_raise_codec_errors_only(probes, acks, drawn: st.DataObject) -> None:  # noqa: ANN001
    data = bytearray(codec.encode_probe_batch(probes, acks, segments=[(0, 1, 0, len(acks), len(probes), "q@1")]))
    at = drawn.draw(st.integers(codec.HEADER_LEN, len(data) - 1))
    data[at] ^= drawn.draw(st.integers(1, 255))
    try:
        codec.probe_batch_of(bytes(data))
    except codec.CodecError:
        pass


def test_routed_batches_take_the_roles_beside_the_changes() -> None:
    """Ingest keeps one Change per change and the role of each routed copy beside it."""
    changes = [Change(1, 1, 2, 3, 4, 0), Change(2, -1, 5, 3, 2, 0, 7)]
    data = codec.encode_routed_batch(changes, [ROLE_SUBJECT, ROLE_OBJECT])
    assert codec.routed_changes(data) == [changes[0]._replace(role=ROLE_SUBJECT),
                                          changes[1]._replace(role=ROLE_OBJECT)]


def test_change_batches_say_what_each_delete_undoes_and_older_ones_say_nothing() -> None:
    """``inserted_at``: per change, the seq of the insert a delete undoes (0 for an insert), in both logs; a batch
    written without it (an older ingest) reads as empty, not as zeros; a column of another length is corrupt."""
    changes = [Change(3, 1, 2, 3, 4, 0), Change(4, -1, 5, 3, 2, 0, 7)]
    routed = codec.encode_routed_batch(changes, None, [0, 1])
    encoded = codec.encode_encoded_batch(changes, [(0, 5), (0, 6)], "t.updates.raw", [0, 1])
    assert codec.inserted_at(routed) == codec.inserted_at(encoded) == [0, 1]
    assert codec.routed_changes(routed) == changes and codec.encoded_changes(encoded) == changes
    assert codec.inserted_at(codec.encode_routed_batch(changes)) == []
    assert codec.inserted_at(codec.encode_frontier({0: 4})) == []
    assert codec.inserted_at(routed_batch_v2(changes, [0, 1])) == [0, 1]
    assert codec.inserted_at(routed_batch_v2(changes)) == []
    with pytest.raises(codec.CodecError, match="corrupt RoutedColumns"):
        codec.inserted_at(codec.encode_routed_batch(changes, None, [0]))
    with pytest.raises(codec.CodecError, match="corrupt RoutedBatch"):
        codec.inserted_at(routed_batch_v2(changes, [0]))
