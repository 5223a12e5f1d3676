"""Answer semantics at the wire: SparqlTerm conversions, the canonical binding and answers.current key, and the
fixed-layout Answer / CurrentAnswer writers.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, Mapping, Sequence

from services.codec.binary import (cached_string, header, optional, read_array, read_boolean, read_current, read_long,
                                   read_map, read_string, write_long, write_string)
from services.codec.generic import decode
from services.codec.registry import HEADER_LEN

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


_TERM_TYPE = {"uri": b"\x00", "literal": b"\x02", "bnode": b"\x04"}


@functools.lru_cache(maxsize=1 << 18)
def _sparql_term(term: str) -> bytes:
    """The Avro SparqlTerm body of a canonical term string (cached: answers repeat terms)."""
    avro = term_to_avro(term)
    return b"".join((_TERM_TYPE[avro["type"]], write_string(avro["value"]),
                     b"\x00" if avro["datatype"] is None else b"\x02" + write_string(avro["datatype"]),
                     b"\x00" if avro["lang"] is None else b"\x02" + write_string(avro["lang"])))


def _binding_map(terms: Mapping[str, str]) -> list[bytes]:
    items = [write_long(len(terms))] if terms else []
    for var, term in terms.items():
        items.append(cached_string(var))
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
        self._prefix = write_long(len(variables)) if variables else b""
        self._keys = [cached_string(var) for var in variables]

    def write(self, bodies: Sequence[bytes]) -> bytes:
        """The map binding variable j to the term whose body is ``bodies[j]``."""
        return self._prefix + b"".join([key + body for key, body in zip(self._keys, bodies)]) + b"\x00"


def encode_answer_record(query_id: str, n: int, seq: int, sign: str, binding: bytes, snapshot: bool,
                         produced_at_ms: int, version: int = 0) -> bytes:
    """An Answer whose binding map is already encoded (:func:`answer_binding`, :class:`BindingWriter`)."""
    return b"".join((header("Answer"), cached_string(query_id), write_long(n), write_long(seq), cached_string(sign),
                     binding, b"\x01" if snapshot else b"\x00", write_long(produced_at_ms), write_long(version)))


def encode_current_answer_record(query_id: str, binding: bytes, multiplicity: int, last_n: int,
                                 version: int = 0) -> bytes:
    """A CurrentAnswer whose binding map is already encoded."""
    return b"".join((header("CurrentAnswer"), cached_string(query_id), binding, write_long(multiplicity),
                     write_long(last_n), write_long(version)))


def encode_answer(query_id: str, n: int, seq: int, sign: str, terms: Mapping[str, str], snapshot: bool,
                  produced_at_ms: int, version: int = 0) -> bytes:
    """``encode("Answer", {..., "binding": {var: term_to_avro(term)}})`` for the data path (same bytes)."""
    return encode_answer_record(query_id, n, seq, sign, answer_binding(terms), snapshot, produced_at_ms, version)


def encode_current_answer(query_id: str, terms: Mapping[str, str], multiplicity: int, last_n: int,
                          version: int = 0) -> bytes:
    """``encode("CurrentAnswer", {..., "binding": {var: term_to_avro(term)}})`` (same bytes)."""
    return encode_current_answer_record(query_id, answer_binding(terms), multiplicity, last_n, version)


# ---------------------------------------------------------------- the fixed-layout Answer reader

_TERM_TYPES = ("uri", "literal", "bnode")  # the TermType enum's symbols


def _read_term(data: bytes, pos: int) -> tuple[dict[str, Any], int]:
    index, pos = read_long(data, pos)
    if not 0 <= index < len(_TERM_TYPES):
        raise IndexError(f"TermType index {index}")
    value, pos = read_string(data, pos)
    datatype, pos = optional(data, pos, read_string)
    lang, pos = optional(data, pos, read_string)
    return {"type": _TERM_TYPES[index], "value": value, "datatype": datatype, "lang": lang}, pos


def _read_answer(data: bytes, read_term: Callable = _read_term) -> tuple[dict[str, Any], int]:
    query_id, pos = read_string(data, HEADER_LEN)
    n, pos = read_long(data, pos)
    seq, pos = read_long(data, pos)
    sign, pos = read_string(data, pos)
    binding, pos = read_map(data, pos, read_term)
    snapshot, pos = read_boolean(data, pos)
    produced_at_ms, pos = read_long(data, pos)
    version, pos = read_long(data, pos)
    return {"query_id": query_id, "n": n, "seq": seq, "sign": sign, "binding": binding, "snapshot": snapshot,
            "produced_at_ms": produced_at_ms, "version": version}, pos


def decode_answer(data: bytes) -> dict[str, Any]:
    """``decode("Answer", data)`` (the same dict, faster)."""
    found = read_current("Answer", data, _read_answer)
    return found if found is not None else decode("Answer", data)


# decode_answer_json remembers at most this many distinct binding entries (a variable and its term; then forgets
# them at once), each of at most this many bytes: a few MB for usual IRIs, under 30 MB whatever the stream holds
JSON_TERMS_KEPT, JSON_TERM_BYTES_KEPT = 1 << 15, 256
# entry encoding -> (variable, SPARQL JSON term, (variable, *json_term_fields(term)))
remembered_entries: dict[bytes, tuple[str, dict[str, str], tuple[str, ...]]] = {}


def json_term_fields(term: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    """A SPARQL JSON term as ``(type, value, datatype, xml:lang)``, "" for a field it has not: what an answer's
    ``key`` (:func:`decode_answer_json`) is made of."""
    return term["type"], term["value"], term.get("datatype", ""), term.get("xml:lang", "")


def _string_end(data: bytes, pos: int) -> int:
    """Where the Avro string at ``pos`` ends (most lengths are one byte: read inline)."""
    byte = data[pos]
    size, end = ((byte >> 1) ^ -(byte & 1), pos + 1) if byte < 0x80 else read_long(data, pos)
    if size < 0:
        raise IndexError("negative string size")
    return end + size


def _read_json_entry(data: bytes, pos: int) -> tuple[tuple[str, dict[str, str], tuple[str, ...]], int]:
    """The binding map entry at ``pos`` (a variable, then its SparqlTerm) as ``(variable, SPARQL JSON term, its
    key item)``, built once per distinct encoding: the gateway reads every answer, and a stream's answers repeat
    few terms.  The dicts are shared: never change them."""
    start = pos
    term_at = _string_end(data, pos)
    if data[term_at] > 4:
        raise IndexError(f"TermType byte {data[term_at]}")
    end = _string_end(data, term_at + 1)
    for _optional in range(2):  # datatype, lang: ["null", string]
        branch = data[end]
        if branch == 2:  # (branch 1, zigzag)
            end = _string_end(data, end + 1)
        elif branch == 0:
            end += 1
        else:
            raise IndexError(f"union branch byte {branch}")
    if end > len(data):
        raise IndexError("entry runs past the end")
    key = data[start:end]
    found = remembered_entries.get(key)
    if found is None:
        var, _ = read_string(data, start)
        avro, parsed_to = _read_term(data, term_at)
        if parsed_to != end:
            raise IndexError("term ends elsewhere")
        term = sparql_json_term(avro)
        found = var, term, (var, *json_term_fields(term))
        if len(key) <= JSON_TERM_BYTES_KEPT:
            if len(remembered_entries) >= JSON_TERMS_KEPT:
                remembered_entries.clear()
            remembered_entries[key] = found
    return found, end


def _read_answer_json(data: bytes) -> tuple[dict[str, Any], int]:
    """An Answer with SPARQL JSON terms, and its ``key``: the binding's ``(variable, *json_term_fields(term))``
    tuples, sorted (None if a variable is repeated: the map then holds its last term)."""
    query_id, pos = read_string(data, HEADER_LEN)
    n, pos = read_long(data, pos)
    seq, pos = read_long(data, pos)
    sign, pos = read_string(data, pos)
    entries, pos = read_array(data, pos, _read_json_entry)  # (an Avro map: its blocks are an array's)
    binding = {var: term for var, term, _item in entries}
    key = tuple(sorted([item for _var, _term, item in entries])) if len(entries) == len(binding) else None
    snapshot, pos = read_boolean(data, pos)
    produced_at_ms, pos = read_long(data, pos)
    version, pos = read_long(data, pos)
    return {"query_id": query_id, "n": n, "seq": seq, "sign": sign, "binding": binding, "snapshot": snapshot,
            "produced_at_ms": produced_at_ms, "version": version,
            "key": key}, pos


def decode_answer_json(data: bytes) -> dict[str, Any]:
    """:func:`decode_answer` with the binding's terms as SPARQL JSON terms (:func:`sparql_json_term`), what the
    gateway serves, each distinct term converted once; and ``key``, the binding's sorted ``(variable,
    *json_term_fields(term))`` tuples when read on the fast path (else None): the gateway folds answers by it."""
    found = read_current("Answer", data, _read_answer_json)
    if found is not None:
        return found
    record = decode("Answer", data)
    return {**record, "binding": {var: sparql_json_term(term) for var, term in record["binding"].items()},
            "key": None}
