"""Behaviour of the input parsers, checked against pyoxigraph / rdflib parsing the same data."""

from __future__ import annotations

import json

import pyoxigraph as ox
import pytest
import rdflib
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cbgp.inputs.formats import (
    InputError,
    InputFormatError,
    Update,
    detect_format,
    parse_input,
    parse_json_lines,
    parse_nquads,
    parse_ntriples,
    parse_patch,
    parse_term,
    parse_turtle,
)
from cbgp.terms import TermError, from_oxigraph, from_rdflib

XSD = "http://www.w3.org/2001/XMLSchema#"


def updates(items) -> list[Update]:
    return [i for i in items if isinstance(i, Update)]


def errors(items) -> list[InputError]:
    return [i for i in items if isinstance(i, InputError)]


def quads(items) -> list[tuple]:
    return [(u.op, u.s, u.p, u.o, u.g) for u in updates(items)]


def oracle(data: str, fmt: ox.RdfFormat) -> list[tuple]:
    """What pyoxigraph makes of `data`, as canonical (op, s, p, o, g) inserts."""
    out = []
    for q in ox.parse(data.encode(), fmt):
        g = None if isinstance(q.graph_name, ox.DefaultGraph) else from_oxigraph(q.graph_name)
        out.append((1, from_oxigraph(q.subject), from_oxigraph(q.predicate), from_oxigraph(q.object), g))
    return out


# Terms whose canonical form needs work: escapes, \u in IRIs and literals, case of language tags, xsd:string.
TRICKY_NQUADS_TERMS = [
    '<http://ex.org/s> <http://ex.org/p> "tab\\there \\"quoted\\" back\\\\slash" .',
    '<http://ex.org/s> <http://ex.org/p> "line\\nbreak\\rcr \\u00e9 \\U0001F600 \\b\\f" .',
    '<http://ex.org/s> <http://ex.org/p> "Hallo"@DE-at .',
    '<http://ex.org/s> <http://ex.org/p> "plain"^^<http://www.w3.org/2001/XMLSchema#string> .',
    '<http://ex.org/s> <http://ex.org/p> "5"^^<http://www.w3.org/2001/XMLSchema#integer> .',
    '<http://ex.org/caf\\u00e9> <http://ex.org/p> <http://ex.org/\\U0001F600> .',
    '_:b1 <http://ex.org/p> _:b2 <http://ex.org/graph> .',
    '<http://ex.org/s> <http://ex.org/p> "raw é ✓ \U0001F600" _:g .',
    '<http://ex.org/s> <http://ex.org/p> "" .',
]


# ----------------------------------------------------------------------------- RDF Patch


def test_patch_terms_are_canonical_like_pyoxigraph_nquads():
    patch = "".join(f"A {line}\n" for line in TRICKY_NQUADS_TERMS)
    got = quads(parse_patch(patch))
    assert got == oracle("\n".join(TRICKY_NQUADS_TERMS), ox.RdfFormat.N_QUADS)
    assert got[2][3] == '"Hallo"@de-at' and got[3][3] == '"plain"'


def test_patch_prefixes_resolve_like_turtle_in_rdflib():
    patch = (
        "PA ex: <http://ex.org/ns#> .\n"
        'PA "xsd" "http://www.w3.org/2001/XMLSchema#" .\n'
        "PA : <http://default.org/> .\n"
        'A ex:s ex:p "7"^^xsd:integer .\n'
        "A :s ex:with\\.dot :o .\n"
        "PD ex: <http://ex.org/ns#> .\n"
        "A ex:s ex:p ex:o .\n"
    )
    ttl = (
        "@prefix ex: <http://ex.org/ns#> . @prefix xsd: <http://www.w3.org/2001/XMLSchema#> .\n"
        "@prefix : <http://default.org/> .\n"
        'ex:s ex:p "7"^^xsd:integer .\n:s ex:with\\.dot :o .\n'
    )
    graph = rdflib.Graph().parse(data=ttl, format="turtle")
    items = list(parse_patch(patch))
    assert {t[1:4] for t in quads(items)} == {tuple(from_rdflib(x) for x in triple) for triple in graph}
    [err] = errors(items)
    assert err.line == 7 and "undeclared prefix 'ex:'" in err.message


def test_patch_transactions_commit_abort_and_positions():
    patch = (
        "H id <uuid:0686c69d-8f89-4496-acb5-744f0157a8db> .\n"
        "A <http://e/a> <http://e/p> <http://e/1> .\n"  # position 1, immediate
        "TX .\n"
        "A <http://e/a> <http://e/p> <http://e/2> .\n"  # 2
        "D <http://e/a> <http://e/p> <http://e/1> .\n"  # 3
        "TC .\n"
        "TX .\n"
        "PA ex: <http://e/> .\n"
        "A ex:a ex:p ex:3 .\n"  # 4, discarded
        "TA .\n"
        "A ex:a ex:p ex:4 .\n"  # 5: error, the prefix went away with the TA
        "D <http://e/a> <http://e/p> <http://e/2> .\n"  # 6
    )
    items = list(parse_patch(patch))
    got = [(u.op, u.o, u.line, u.position) for u in updates(items)]
    assert got == [(1, "<http://e/1>", 2, 1), (1, "<http://e/2>", 4, 2), (-1, "<http://e/1>", 5, 3),
                   (-1, "<http://e/2>", 12, 6)]
    assert [(e.line, "undeclared prefix" in e.message) for e in errors(items)] == [(11, True)]


def test_patch_updates_of_a_transaction_come_out_only_at_commit():
    patch = "TX .\nA <http://e/a> <http://e/p> <http://e/1> .\nA <http://e/a> <http://e/p> bad .\nTC .\n"
    items = list(parse_patch(patch))
    # The error (line 3) is reported when met; the good update of the transaction waits for TC.
    assert [type(i).__name__ for i in items] == ["InputError", "Update"]
    assert items[0].line == 3 and items[1].line == 2


def test_patch_unterminated_transaction_is_reported_on_its_tx_line_and_dropped():
    patch = "A <http://e/a> <http://e/p> <http://e/0> .\nTX .\nA <http://e/a> <http://e/p> <http://e/1> .\n"
    items = list(parse_patch(patch))
    assert [u.o for u in updates(items)] == ["<http://e/0>"]
    [err] = errors(items)
    assert err.line == 2 and "never committed" in err.message and err.text == "TX ."


def test_patch_commit_or_abort_without_transaction_and_nested_tx_are_errors():
    items = list(parse_patch("TC .\nTX .\nTX .\nA <http://e/a> <http://e/p> <http://e/1> .\nTC\nTA .\n"))
    assert [e.line for e in errors(items)] == [1, 3, 6]
    assert [u.line for u in updates(items)] == [4]


def test_patch_blank_nodes_keep_their_labels_across_the_patch():
    patch = "A _:x <http://e/p> _:y .\nTX .\nD <_:x> <http://e/p> _:y .\nTC .\n"
    assert quads(parse_patch(patch)) == [(1, "_:x", "<http://e/p>", "_:y", None),
                                        (-1, "_:x", "<http://e/p>", "_:y", None)]


def test_jena_blank_node_form_takes_only_a_label_that_would_be_valid_as_underscore_colon():
    """``<_:label>`` is Jena's way of writing ``_:label``: its label obeys the same rule, so an empty one, or one
    with a space or a NUL, is an error line rather than a term no other parser would give back."""
    patch = ("A <_:> <http://e/p> <http://e/o> .\nA <_:a b> <http://e/p> <http://e/o> .\n"
             "A <_:a\x00> <http://e/p> <http://e/o> .\nA <_:b1.x> <http://e/p> <http://e/o> .\n")
    items = list(parse_patch(patch))
    assert [(e.line, e.message) for e in errors(items)] == [
        (line, "malformed blank node label in <_:...>") for line in (1, 2, 3)]
    assert quads(items) == [(1, "_:b1.x", "<http://e/p>", "<http://e/o>", None)]
    assert parse_term("_:b1.x") == "_:b1.x"


def test_patch_rejects_literal_subject_and_bad_positions_with_clear_messages():
    patch = (
        'A "lit" <http://e/p> <http://e/o> .\n'
        "A <http://e/s> _:p <http://e/o> .\n"
        'A <http://e/s> <http://e/p> <http://e/o> "g" .\n'
        "A <http://e/s> <http://e/p> .\n"
    )
    errs = errors(parse_patch(patch))
    assert [(e.line, e.column) for e in errs] == [(1, 3), (2, 16), (3, 42), (4, 3)]
    assert "literal cannot be the subject" in errs[0].message
    assert "predicate must be an IRI" in errs[1].message
    assert "graph name must be an IRI or a blank node" in errs[2].message
    assert "needs 3 or 4 terms" in errs[3].message


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("A <http://e/s> <http://e/p> <rel> .", "No scheme"),
        ("A <http://e/s> <http://e/p> <http://e/o>", "final '.'"),
        ('A <http://e/s> <http://e/p> "open .', "unterminated string"),
        ('A <http://e/s> <http://e/p> "bad \\q escape" .', "invalid escape"),
        ('A <http://e/s> <http://e/p> "\\uD800" .', "not a Unicode character"),
        ('A <http://e/s> <http://e/p> "x"^^<http://www.w3.org/1999/02/22-rdf-syntax-ns#langString> .', "langString"),
        ("A <http://e/s> <http://e/p> <http://e/o> . extra", "after the final '.'"),
        ("X <http://e/s> <http://e/p> <http://e/o> .", "unknown row keyword 'X'"),
        ("<http://e/s> <http://e/p> <http://e/o> .", "expected a row keyword"),
        ("A <http://e/s> <http://e/p> <http://%zz> .", "percent"),
    ],
)
def test_patch_malformed_line_is_reported_and_neighbours_survive(line, fragment):
    patch = f"A <http://e/s> <http://e/p> <http://e/1> .\n{line}\nA <http://e/s> <http://e/p> <http://e/3> .\n"
    items = list(parse_patch(patch))
    assert [(u.o, u.line) for u in updates(items)] == [("<http://e/1>", 1), ("<http://e/3>", 3)]
    [err] = errors(items)
    assert err.line == 2 and fragment in err.message and err.text == line
    assert str(err).startswith("line 2: ")


def test_patch_comments_blank_lines_and_crlf():
    patch = "# header comment\r\n\r\n  A <http://e/s> <http://e/p> <http://e/o> . # trailing\r\nTX\rTC .\r"
    items = list(parse_patch(patch))
    assert not errors(items)
    assert [(u.line, u.position) for u in updates(items)] == [(3, 1)]


def test_patch_strict_mode_raises_with_the_line_number():
    patch = "A <http://e/s> <http://e/p> <http://e/o> .\n\nA <http://e/s> <http://e/p> .\n"
    with pytest.raises(InputFormatError, match="^line 3: "):
        list(parse_patch(patch, strict=True))


def test_one_megabyte_literal_parses_in_every_line_format():
    big = "x\\n" * 350_000
    expected = '"' + big + '"'
    nt = f'<http://e/s> <http://e/p> "{big}" .\n'
    assert updates(parse_patch("A " + nt))[0].o == expected
    assert updates(parse_ntriples(nt))[0].o == expected
    assert updates(parse_turtle(nt))[0].o == expected
    line = json.dumps({"op": "+", "s": "<http://e/s>", "p": "<http://e/p>", "o": '"' + big + '"'})
    assert updates(parse_json_lines(line))[0].o == expected


# ------------------------------------------------------------- N-Triples / N-Quads / Turtle


def test_ntriples_and_nquads_terms_are_canonical_like_pyoxigraph():
    triples = [t for t in TRICKY_NQUADS_TERMS if t.count(" ") == 3 or '"' in t and t.rstrip(" .").endswith('"')]
    nq = "\n".join(TRICKY_NQUADS_TERMS) + "\n"
    assert quads(parse_nquads(nq)) == oracle(nq, ox.RdfFormat.N_QUADS)
    nt = "\n".join(t for t in triples if not t.endswith("> .") or t.count("<") <= 3) + "\n"
    got = quads(parse_ntriples(nt))
    assert got == oracle(nt, ox.RdfFormat.N_TRIPLES) and got
    assert all(g is None for *_, g in got)


def test_ntriples_bad_lines_are_reported_and_every_good_line_comes_out():
    lines = [
        "<http://e/s> <http://e/p> <http://e/1> .",
        '<http://e/s> <http://e/p> "unterminated .',  # pyoxigraph alone would swallow the next line
        "<http://e/s> <http://e/p> <http://e/3> .",
        "# comment",
        "<http://e/s> <http://e/p> <http://e/5> . trailing junk",
        "<http://e/s> <http://e/p> <http://e/6> .",
        "<http://e/s> <http://e/p> <http://e/7>",  # missing dot: pyoxigraph reports it on the next line
        "<http://e/s> <http://e/p> <http://e/8> .",
        '"lit" <http://e/p> <http://e/9> .',
        "<http://e/s> <http://e/p> <http://e/10> .",
    ]
    items = list(parse_ntriples("\n".join(lines)))
    assert [(u.o, u.line) for u in updates(items)] == [
        ("<http://e/1>", 1), ("<http://e/3>", 3), ("<http://e/6>", 6), ("<http://e/8>", 8), ("<http://e/10>", 10)]
    assert [e.line for e in errors(items)] == [2, 5, 7, 9]
    assert all(e.text == lines[e.line - 1] for e in errors(items))
    assert [u.position for u in updates(items)] == [1, 3, 5, 7, 9]  # statements, comment not counted


def test_nquads_graph_is_the_fourth_term_and_strict_mode_names_the_line():
    nq = "<http://e/s> <http://e/p> <http://e/o> <http://e/g> .\n<http://e/s> <http://e/p> <http://e/o> .\n"
    assert [u.g for u in updates(parse_nquads(nq))] == ["<http://e/g>", None]
    with pytest.raises(InputFormatError, match="^line 2: "):
        list(parse_nquads("<http://e/s> <http://e/p> <http://e/o> .\nbad .\n", strict=True))


def test_ntriples_rejects_a_graph_term():
    items = list(parse_ntriples("<http://e/s> <http://e/p> <http://e/o> <http://e/g> .\n"))
    assert not updates(items) and errors(items)[0].line == 1


def test_turtle_matches_rdflib_and_resumes_after_an_error():
    ttl = (
        "@prefix ex: <http://ex.org/> .\n"
        'ex:a ex:p ex:b , "x"@EN ; ex:q [ ex:r 1 ] .\n'
        "ex:c ex:p bad .\n"
        "ex:d ex:p ex:e ;\n"
        "     ex:q ex:f .\n"
        "<rel> ex:p ex:g .\n"
    )
    items = list(parse_turtle(ttl, base="http://base.org/"))
    [err] = errors(items)
    assert err.line == 3 and "bad" in err.text
    good = ttl.replace("ex:c ex:p bad .\n", "")
    graph = rdflib.Graph().parse(data=good, format="turtle", publicID="http://base.org/")

    def shape(triples):  # blank node labels differ between parsers: compare with them blanked out
        return sorted(tuple("_" if t.startswith("_:") else t for t in triple) for triple in triples)

    assert shape(q[1:4] for q in quads(items)) == shape(tuple(from_rdflib(x) for x in t) for t in graph)
    assert [u.position for u in updates(items)] == list(range(1, 8))


def test_turtle_without_base_reports_relative_iris():
    items = list(parse_turtle("<rel> <http://e/p> <http://e/o> .\n<http://e/s> <http://e/p> <http://e/o> .\n"))
    assert [e.line for e in errors(items)] == [1] and len(updates(items)) == 1


# ----------------------------------------------------------------------------- JSON lines


def test_json_lines_ops_graphs_and_canonical_terms():
    lines = [
        {"op": "+", "s": "<http://e/s>", "p": "<http://e/p>", "o": '"caf\\u00e9"@FR'},
        {"op": "-", "s": "_:b", "p": "<http://e/p>", "o": '"1"^^<http://www.w3.org/2001/XMLSchema#string>',
         "g": "<http://e/g>"},
        {"op": "+", "s": "<http://e/s>", "p": "<http://e/p>", "o": "<http://e/o>", "g": None},
    ]
    got = list(parse_json_lines("\n".join(json.dumps(x) for x in lines)))
    assert quads(got) == [(1, "<http://e/s>", "<http://e/p>", '"café"@fr', None),
                          (-1, "_:b", "<http://e/p>", '"1"', "<http://e/g>"),
                          (1, "<http://e/s>", "<http://e/p>", "<http://e/o>", None)]
    assert [(u.line, u.position) for u in got] == [(1, 1), (2, 2), (3, 3)]


@pytest.mark.parametrize(
    "line, fragment",
    [
        ('{"op": "+", "s": ', "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"s": "<http://e/s>", "p": "<http://e/p>", "o": "<http://e/o>"}', "missing field 'op'"),
        ('{"op": "*", "s": "<http://e/s>", "p": "<http://e/p>", "o": "<http://e/o>"}', "field 'op' must be"),
        ('{"op": "+", "s": "<http://e/s>", "o": "<http://e/o>"}', "missing field 'p'"),
        ('{"op": "+", "s": "<http://e/s>", "p": 3, "o": "<http://e/o>"}', "field 'p' must be a string"),
        ('{"op": "+", "s": "<http://e/s>", "p": "<http://e/p>", "o": "not a term"}', "field 'o'"),
        ('{"op": "+", "s": "\\"lit\\"", "p": "<http://e/p>", "o": "<http://e/o>"}', "literal cannot be the subject"),
        ('{"op": "+", "s": "<http://e/s>", "p": "<http://e/p>", "o": "<http://e/o>", "g": "\\"g\\""}', "field 'g'"),
    ],
)
def test_json_lines_each_problem_has_its_own_error(line, fragment):
    good = '{"op": "+", "s": "<http://e/s>", "p": "<http://e/p>", "o": "<http://e/o>"}'
    items = list(parse_json_lines(f"{good}\n{line}\n{good}\n"))
    assert [u.line for u in updates(items)] == [1, 3]
    [err] = errors(items)
    assert err.line == 2 and fragment in err.message, err.message


# ----------------------------------------------------------------------------- terms, dispatch, bytes


@pytest.mark.parametrize("text", ['<http://e/x\\u0041>', '"a\\tb"@EN', '"1"^^<http://www.w3.org/2001/XMLSchema#int>',
                                  "_:b0", '"\\U0001F600"', '"a"^^<http://www.w3.org/2001/XMLSchema#string>'])
def test_parse_term_agrees_with_pyoxigraph(text):
    [q] = ox.parse(f"<http://e/s> <http://e/p> {text} .".encode(), ox.RdfFormat.N_TRIPLES)
    assert parse_term(text) == from_oxigraph(q.object)


@pytest.mark.parametrize("text", ["", "<rel>", "ex:p", '"open', "<http://e/a> <http://e/b>", '"x"@', "_:", "<a b>"])
def test_parse_term_rejects_bad_terms(text):
    with pytest.raises(TermError):
        parse_term(text)


def test_detect_format_by_extension_media_type_and_name():
    assert [detect_format(x) for x in ["a.rdfp", "b.patch", "c.NT", "d.nq", "e.ttl", "f.jsonl"]] == [
        "patch", "patch", "ntriples", "nquads", "turtle", "jsonl"]
    assert detect_format("application/rdf-patch") == "patch"
    assert detect_format("application/n-triples; charset=utf-8") == "ntriples"
    assert detect_format("text/turtle") == "turtle" and detect_format("nquads") == "nquads"
    with pytest.raises(ValueError, match="cannot tell the input format of 'x.bin'"):
        detect_format("x.bin")


@pytest.mark.parametrize("fmt", ["patch", "ntriples", "nquads", "turtle", "jsonl"])
def test_invalid_utf8_line_is_reported_and_the_others_parse(fmt):
    s, p = "<http://e/s>", "<http://e/p>"
    if fmt == "jsonl":
        rows = [json.dumps({"op": "+", "s": s, "p": p, "o": f'"{v}"'}).encode() for v in ("a", "b", "c")]
    else:
        rows = [f'{"A " if fmt == "patch" else ""}{s} {p} "{v}" .'.encode() for v in ("a", "b", "c")]
    rows[1] = rows[1].replace(b"<http://e/p>", b"<http://e/\xff\xfe>")
    items = list(parse_input(b"\n".join(rows) + b"\n", fmt))
    assert [u.o for u in updates(items)] == ['"a"', '"c"']
    [err] = errors(items)
    assert err.line == 2 and "invalid UTF-8" in err.message
    if fmt != "turtle":  # Turtle updates carry no line (0), so only line formats interleave by line
        assert [type(i).__name__ for i in items] == ["Update", "InputError", "Update"]
    with pytest.raises(InputFormatError, match="^line 2: invalid UTF-8"):
        list(parse_input(b"\n".join(rows), fmt, strict=True))


def test_parse_input_rejects_unknown_format():
    with pytest.raises(ValueError, match="unknown input format 'xml'"):
        parse_input("", "xml")


# ----------------------------------------------------------------------------- properties

_IRIS = st.builds(lambda tail: f"http://ex.org/{tail}", st.text("abcXYZ019_-/%é", max_size=8).filter(
    lambda t: "%" not in t))
_LANGS = st.sampled_from(["en", "EN-gb", "de", "fr-CA", "zh-Hant-TW"])
_DATATYPES = st.sampled_from([XSD + "integer", XSD + "string", "http://ex.org/dt", XSD + "date"])
_NAMED = _IRIS.map(ox.NamedNode)
_BNODE = st.sampled_from(["b0", "b1", "x2", "node"]).map(ox.BlankNode)
_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
_LITERAL = st.one_of(
    _TEXT.map(ox.Literal),
    st.builds(lambda v, lang: ox.Literal(v, language=lang), _TEXT, _LANGS),
    st.builds(lambda v, dt: ox.Literal(v, datatype=ox.NamedNode(dt)), _TEXT, _DATATYPES),
)
_SUBJECT = st.one_of(_NAMED, _BNODE)
_GRAPH = st.one_of(st.just(ox.DefaultGraph()), _NAMED, _BNODE)
_QUADS = st.lists(st.builds(ox.Quad, _SUBJECT, _NAMED, st.one_of(_NAMED, _BNODE, _LITERAL), _GRAPH), max_size=12)
_FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FAST
@given(_QUADS)
def test_random_graphs_parse_exactly_as_pyoxigraph_reparses_them(qs):
    triples = [ox.Quad(q.subject, q.predicate, q.object) for q in qs]
    for fmt, items, parse in [
        (ox.RdfFormat.N_QUADS, qs, parse_nquads),
        (ox.RdfFormat.N_TRIPLES, triples, parse_ntriples),
        (ox.RdfFormat.TURTLE, triples, parse_turtle),
    ]:
        text = ox.serialize(items, format=fmt).decode()
        got = list(parse(text))
        assert not errors(got), errors(got)
        assert quads(got) == oracle(text, fmt)


@_FAST
@given(_QUADS)
def test_random_graphs_as_patch_lines_parse_like_pyoxigraph(qs):
    text = ox.serialize(qs, format=ox.RdfFormat.N_QUADS).decode()
    patch = "".join(("A " if i % 2 else "D ") + line + "\n" for i, line in enumerate(text.split("\n")[:-1]))
    got = list(parse_patch(patch))
    expected = [(1 if i % 2 else -1, *q[1:]) for i, q in enumerate(oracle(text, ox.RdfFormat.N_QUADS))]
    assert quads(got) == expected and not errors(got)
    assert [u.position for u in got] == list(range(1, len(expected) + 1))


_GARBAGE = st.one_of(
    st.binary(max_size=200),
    st.lists(st.sampled_from([b"A ", b"D ", b"TX .", b"TC", b"TA", b"PA ex: <http://e/> .", b"<http://e/a>", b"ex:b",
                              b'"x', b'"', b"\\u12", b"_:", b"@en", b"^^", b" .", b"\n", b"\r", b"\xff", b"{", b"}",
                              b'"op": "+"', b"[", b"(", b";", b",", b"#", b"@prefix", b"\x00"]), max_size=30)
    .map(b"".join),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_GARBAGE, st.sampled_from(["patch", "ntriples", "nquads", "turtle", "jsonl"]))
def test_garbage_never_raises_outside_strict_mode(data, fmt):
    for item in parse_input(data, fmt):
        assert isinstance(item, (Update, InputError))
        if isinstance(item, InputError):
            assert item.line >= 1 and len(item.text) <= 200 and item.message


_LINE_GARBAGE = st.one_of(
    st.binary(max_size=40),
    st.lists(st.sampled_from([b"<http://e/a>", b'"x', b'"y"', b"_:b", b" .", b".", b"\xff", b"\\", b"{", b"A ", b"#",
                              b"TX", b"TC", b'"""', b"@en", b"^^", b"<", b">"]), max_size=8).map(b"".join),
).map(lambda b: b.replace(b"\n", b" ").replace(b"\r", b" "))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.none(), _LINE_GARBAGE), min_size=1, max_size=12),
       st.sampled_from(["patch", "ntriples", "nquads", "jsonl"]))
def test_a_corrupted_line_never_costs_a_good_line(plan, fmt):
    """Line formats: whatever garbage replaces some lines, every intact line still yields its update."""
    # A TX row is valid patch that rightly holds back the lines after it: not garbage.
    assume(fmt != "patch" or not any(g is not None and g.lstrip(b" \t").startswith(b"TX") for g in plan))
    rows = []
    for i, garbage in enumerate(plan):
        if garbage is not None:
            rows.append(garbage)
        elif fmt == "jsonl":
            rows.append(json.dumps({"op": "+", "s": "<http://e/s>", "p": "<http://e/p>", "o": f"<http://e/{i}>"}).encode())
        else:
            rows.append(f"{'A ' if fmt == 'patch' else ''}<http://e/s> <http://e/p> <http://e/{i}> .".encode())
    items = list(parse_input(b"\n".join(rows), fmt))
    by_line = {u.line: u.o for u in updates(items)}
    for i, garbage in enumerate(plan):
        if garbage is None:
            assert by_line.get(i + 1) == f"<http://e/{i}>", (i + 1, items)
    assert all(0 < e.line <= len(plan) for e in errors(items))
