"""RDF Patch rows and N-Triples terms: the hand-written tokenizer behind `cbgp.inputs.formats`.

The common row `A <s> <p> <o> .` is recognised by one compiled whole-line
regex whose captures already are canonical terms; everything else (escapes,
prefixed names, language tags to lower-case, transactions, errors) goes through
`read_term`, which validates like N-Triples does.  IRIs are checked by
pyoxigraph's `NamedNode` (full RFC 3987), remembered once valid because the
same IRIs recur on most lines.

`parse_patch_lines` takes the `Update` and error constructors as arguments so
that this module does not import `cbgp.inputs.formats` (which imports it).
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Iterator, TypeVar

import pyoxigraph as ox

from cbgp.terms import RDF_LANG_STRING, XSD_STRING, literal

U = TypeVar("U")
E = TypeVar("E")

_PN_CHARS_BASE = (
    "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u02ff\u0370-\u037d\u037f-\u1fff\u200c-\u200d"
    "\u2070-\u218f\u2c00-\u2fef\u3001-\ud7ff\uf900-\ufdcf\ufdf0-\ufffd\U00010000-\U000effff"
)
_PN_CHARS_U = _PN_CHARS_BASE + "_"
_PN_CHARS = _PN_CHARS_U + "\\-0-9\u00b7\u0300-\u036f\u203f-\u2040"
_PLX = r"%[0-9A-Fa-f]{2}|\\[_~.\-!$&'()*+,;=/?#@%]"
_PN_PREFIX = f"[{_PN_CHARS_BASE}](?:[{_PN_CHARS}.]*[{_PN_CHARS}])?"
_PN_LOCAL = f"(?:[{_PN_CHARS_U}:0-9]|{_PLX})(?:(?:[{_PN_CHARS}.:]|{_PLX})*(?:[{_PN_CHARS}:]|{_PLX}))?"

_BNODE_RE = re.compile(f"_:([{_PN_CHARS_U}:0-9](?:[{_PN_CHARS}.:]*[{_PN_CHARS}:])?)")
_PNAME_RE = re.compile(f"({_PN_PREFIX})?:({_PN_LOCAL})?")
_PNAME_NS_RE = re.compile(f"({_PN_PREFIX})?:?")
_LOCAL_ESCAPE_RE = re.compile(r"\\(.)")
_IRI_RE = re.compile(r"<([^<>\r\n]*)>")
_LITERAL_RE = re.compile(r'"([^"\\\r\n]*(?:\\.[^"\\\r\n]*)*)"')
_LANG_RE = re.compile(r"@([a-zA-Z]+(?:-[a-zA-Z0-9]+)*)")
_ESCAPE_RE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|([tbnrf\"'\\])|(.?))")
_IRI_ESCAPE_RE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|(.?))")
_SIMPLE = {"t": "\t", "b": "\b", "n": "\n", "r": "\r", "f": "\f", '"': '"', "'": "'", "\\": "\\"}
_KEYWORD_RE = re.compile(r"[ \t]*([A-Za-z]+)")
_LINE_SPLIT_RE = re.compile(r"\r\n|\r|\n")

# Whole-line fast path: plain IRIs, simple bnodes, escape-free literals with lower-case tags.
_IRI_F = r'<[A-Za-z][A-Za-z0-9+.\-]*:[^\x00-\x20<>"{}|^`\\]*>'
_BN_F = r"_:[A-Za-z0-9_](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_\-])?"
_LIT_F = r'"[^"\\\r\n]*"(?:@[a-z]+(?:-[a-z0-9]+)*|\^\^' + _IRI_F + ")?"
_FAST_AD = re.compile(
    rf"[ \t]*([AD])[ \t]+({_IRI_F}|{_BN_F})[ \t]+({_IRI_F})[ \t]+({_IRI_F}|{_BN_F}|{_LIT_F})"
    rf"(?:[ \t]+({_IRI_F}|{_BN_F}))?[ \t]*\.[ \t]*\Z"
)
_FAST_TERM = re.compile(rf"(?:{_IRI_F}|{_BN_F}|{_LIT_F})\Z")
_XSD_STRING_SUFFIX = "^^<" + XSD_STRING + ">"
_LANG_STRING_SUFFIX = "^^<" + RDF_LANG_STRING + ">"
_VALID_IRIS: set[str] = set()  # bracketed IRIs pyoxigraph accepted
_VALID_IRIS_LIMIT = 200_000


class PatchSyntaxError(ValueError):
    """A token is malformed; `column` is its 0-based offset in the line."""

    def __init__(self, message: str, column: int) -> None:
        super().__init__(message)
        self.message = message
        self.column = column


def split_lines(text: str) -> list[str]:
    """Lines split on LF, CRLF or CR (the RDF line breaks; not str.splitlines' extra ones)."""
    if "\r" in text:
        return _LINE_SPLIT_RE.split(text)
    return text.split("\n")


def _check_iri(value: str, column: int) -> None:
    term = "<" + value + ">"
    if term in _VALID_IRIS:
        return
    try:
        ox.NamedNode(value)
    except ValueError as exc:
        raise PatchSyntaxError(f"invalid IRI <{value[:80]}>: {exc}", column) from None
    if len(_VALID_IRIS) < _VALID_IRIS_LIMIT:
        _VALID_IRIS.add(term)


def _iri_valid(term: str) -> bool:
    """Fast-path check of a bracketed IRI; False sends the line to the slow path, which reports it."""
    try:
        _check_iri(term[1:-1], 0)
    except PatchSyntaxError:
        return False
    return True


def _code_point(hex_digits: str, column: int) -> str:
    code = int(hex_digits, 16)
    if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
        raise PatchSyntaxError(f"escape \\u{hex_digits} is not a Unicode character", column)
    return chr(code)


def _unescape(body: str, pattern: re.Pattern[str], what: str, column: int) -> str:
    def repl(m: re.Match[str]) -> str:
        short, long_, simple = m.group(1), m.group(2), m.group(3) if pattern is _ESCAPE_RE else None
        if short or long_:
            return _code_point(short or long_, column)
        if simple:
            return _SIMPLE[simple]
        bad = m.group(m.lastindex or 0)
        raise PatchSyntaxError(f"invalid escape '\\{bad}' in {what}", column)

    return pattern.sub(repl, body)


def _read_iri(text: str, pos: int, allow_patch_forms: bool) -> tuple[str, int]:
    m = _IRI_RE.match(text, pos)
    if m is None:
        raise PatchSyntaxError("unterminated IRI (missing '>') or invalid character in it", pos)
    value = m.group(1)
    if "\\" in value:
        value = _unescape(value, _IRI_ESCAPE_RE, "IRI", pos)
    if allow_patch_forms and value.startswith("_:"):
        # Jena writes blank nodes in patches as <_:label>: the label as one written _:label would be
        if _BNODE_RE.fullmatch(value) is None:
            raise PatchSyntaxError("malformed blank node label in <_:...>", pos)
        return value, m.end()
    _check_iri(value, pos)
    return "<" + value + ">", m.end()


def _read_pname(text: str, pos: int, prefixes: dict[str, str]) -> tuple[str, int]:
    m = _PNAME_RE.match(text, pos)
    if m is None:
        raise PatchSyntaxError(f"unexpected character {text[pos]!r} where a term was expected", pos)
    prefix = m.group(1) or ""
    if prefix not in prefixes:
        raise PatchSyntaxError(f"undeclared prefix '{prefix}:' (declare it with a PA row first)", pos)
    local = m.group(2) or ""
    if "\\" in local:
        local = _LOCAL_ESCAPE_RE.sub(r"\1", local)
    value = prefixes[prefix] + local
    _check_iri(value, pos)
    return "<" + value + ">", m.end()


def read_term(text: str, pos: int, prefixes: dict[str, str] | None, *, allow_patch_forms: bool = True) -> tuple[str, int]:
    """Read one term at `pos`: (canonical term, end offset).  Prefixed names need `prefixes`."""
    if pos >= len(text):
        raise PatchSyntaxError("expected a term, found the end of the line", pos)
    first = text[pos]
    if first == "<":
        return _read_iri(text, pos, allow_patch_forms)
    if first == "_":
        m = _BNODE_RE.match(text, pos)
        if m is None:
            raise PatchSyntaxError("malformed blank node label", pos)
        return "_:" + m.group(1), m.end()
    if first == '"':
        return _read_literal(text, pos, prefixes)
    if prefixes is not None and (first == ":" or first.isalpha()):
        return _read_pname(text, pos, prefixes)
    raise PatchSyntaxError(f"unexpected character {first!r} where a term was expected", pos)


def _read_literal(text: str, pos: int, prefixes: dict[str, str] | None) -> tuple[str, int]:
    m = _LITERAL_RE.match(text, pos)
    if m is None:
        raise PatchSyntaxError("unterminated string literal (or a raw newline or bad escape in it)", pos)
    lexical = m.group(1)
    if "\\" in lexical:
        lexical = _unescape(lexical, _ESCAPE_RE, "string literal", pos)
    end = m.end()
    if text.startswith("@", end):
        lang = _LANG_RE.match(text, end)
        if lang is None:
            raise PatchSyntaxError("malformed language tag", end)
        return literal(lexical, lang.group(1)), lang.end()
    if text.startswith("^^", end):
        datatype, end = read_term(text, end + 2, prefixes, allow_patch_forms=False)
        if datatype[0] != "<":
            raise PatchSyntaxError("a datatype must be an IRI", m.end() + 2)
        if datatype[1:-1] == RDF_LANG_STRING:
            raise PatchSyntaxError("rdf:langString needs a language tag, not a datatype", m.end() + 2)
        return literal(lexical, None, datatype[1:-1]), end
    return literal(lexical), end


_KIND = {"<": "an IRI", "_": "a blank node", '"': "a literal"}


def check_position(term: str, role: str) -> str | None:
    """Why `term` cannot stand as `role` (subject/predicate/object/graph), or None if it can."""
    kind = term[0]
    if role == "subject" and kind == '"':
        return f"a literal cannot be the subject of a triple: {term[:60]}"
    if role == "predicate" and kind != "<":
        return f"the predicate must be an IRI, got {_KIND[kind]}: {term[:60]}"
    if role == "graph" and kind == '"':
        return f"a graph name must be an IRI or a blank node, got a literal: {term[:60]}"
    return None


_ROLES = ("subject", "predicate", "object", "graph")


def _row_terms(line: str, pos: int, prefixes: dict[str, str]) -> list[tuple[str, int]]:
    """Terms of a row after its keyword, up to the final '.', with their columns."""
    terms: list[tuple[str, int]] = []
    n = len(line)
    while True:
        while pos < n and line[pos] in " \t":
            pos += 1
        if pos >= n or line[pos] == "#":
            raise PatchSyntaxError("missing the final '.' of the row", pos)
        if line[pos] == ".":
            rest = line[pos + 1 :].strip(" \t")
            if rest and rest[0] != "#":
                raise PatchSyntaxError("unexpected text after the final '.'", pos + 1)
            return terms
        term, end = read_term(line, pos, prefixes)
        terms.append((term, pos))
        pos = end


def _prefix_row(line: str, pos: int) -> tuple[str, str]:
    """(prefix, namespace IRI) of `PA pfx: <iri> .` or the spec's `PA "pfx" "iri" .`."""
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    if line.startswith('"', pos):
        name_term, pos = _read_literal(line, pos, None)
        name = name_term[1:-1]
    else:
        m = _PNAME_NS_RE.match(line, pos)
        if m is None or m.end() == pos:
            raise PatchSyntaxError("expected a prefix name like 'ex:'", pos)
        name, pos = m.group(1) or "", m.end()
    terms = _row_terms(line, pos, {})
    if len(terms) != 1:
        raise PatchSyntaxError("a prefix row is 'PA prefix: <iri> .'", pos)
    value, column = terms[0]
    if value[0] == '"':
        value = "<" + value[1:-1] + ">"
    if value[0] != "<":
        raise PatchSyntaxError("a prefix must map to an IRI", column)
    _check_iri(value[1:-1], column)
    return name, value[1:-1]


def parse_patch_lines(
    lines: Iterable[str],
    make_update: Callable[..., U],
    make_error: Callable[[int, int | None, str, str], E],
) -> Iterator[U | E]:
    """The state machine of RDF Patch (see `cbgp.inputs.formats.parse_patch` for the contract)."""
    prefixes: dict[str, str] = {}
    saved_prefixes: dict[str, str] = {}
    pending: list[U] = []
    in_tx = False
    tx_line, tx_text = 0, ""
    position = 0
    fast = _FAST_AD.match
    valid = _VALID_IRIS
    for lineno, line in enumerate(lines, 1):
        m = fast(line)
        if m is not None:
            subj, pred, obj, graph = m.group(2, 3, 4, 5)
            if (
                (subj[0] != "<" or subj in valid or _iri_valid(subj))
                and (pred in valid or _iri_valid(pred))
                and (obj[0] != "<" or obj in valid or _iri_valid(obj))
                and (graph is None or graph[0] != "<" or graph in valid or _iri_valid(graph))
                and (obj[0] != '"' or "^^" not in obj or _typed_ok(obj))
            ):
                position += 1
                if obj.endswith(_XSD_STRING_SUFFIX):
                    obj = obj[: -len(_XSD_STRING_SUFFIX)]
                update = make_update(1 if m.group(1) == "A" else -1, subj, pred, obj, graph, lineno, position)
                if in_tx:
                    pending.append(update)
                else:
                    yield update
                continue
        kw = _KEYWORD_RE.match(line)
        if kw is None:
            stripped = line.strip(" \t")
            if stripped and stripped[0] != "#":
                yield make_error(lineno, 1, "expected a row keyword (A, D, PA, PD, H, TX, TC, TA)", line)
            continue
        keyword, pos = kw.group(1), kw.end()
        if keyword in ("A", "D"):
            position += 1
        try:
            if pos < len(line) and line[pos] not in " \t.#":
                raise PatchSyntaxError(f"unknown row keyword starting {line[kw.start(1):pos + 1]!r}", kw.start(1))
            if keyword in ("A", "D"):
                terms = _row_terms(line, pos, prefixes)
                if len(terms) not in (3, 4):
                    raise PatchSyntaxError(f"an {keyword} row needs 3 or 4 terms (s p o [g]), got {len(terms)}",
                                           terms[0][1] if terms else pos)
                for (term, column), role in zip(terms, _ROLES):
                    reason = check_position(term, role)
                    if reason:
                        raise PatchSyntaxError(reason, column)
                update = make_update(1 if keyword == "A" else -1, terms[0][0], terms[1][0], terms[2][0],
                                     terms[3][0] if len(terms) == 4 else None, lineno, position)
                if in_tx:
                    pending.append(update)
                else:
                    yield update
            elif keyword in ("PA", "PD"):
                name, namespace = _prefix_row(line, pos)
                if keyword == "PA":
                    prefixes[name] = namespace
                else:
                    prefixes.pop(name, None)
            elif keyword == "H":
                key = _KEYWORD_RE.match(line, pos)
                if key is None:
                    raise PatchSyntaxError("a header row is 'H key value .'", pos)
                if len(_row_terms(line, key.end(), prefixes)) != 1:
                    raise PatchSyntaxError("a header row is 'H key value .' with exactly one value", key.end())
            elif keyword in ("TX", "TC", "TA"):
                rest = line[pos:].strip(" \t")
                if rest.startswith("."):
                    rest = rest[1:].lstrip(" \t")
                if rest and rest[0] != "#":
                    raise PatchSyntaxError(f"unexpected text after {keyword}", pos)
                if keyword == "TX":
                    if in_tx:
                        raise PatchSyntaxError(f"TX inside a transaction already open since line {tx_line}", kw.start(1))
                    in_tx, tx_line, tx_text = True, lineno, line
                    saved_prefixes = dict(prefixes)
                elif not in_tx:
                    raise PatchSyntaxError(f"{keyword} without an open transaction (no TX before it)", kw.start(1))
                elif keyword == "TC":
                    yield from pending
                    pending, in_tx = [], False
                else:
                    # TA: the transaction never happened, including its prefix changes.
                    pending, in_tx, prefixes = [], False, saved_prefixes
            else:
                raise PatchSyntaxError(f"unknown row keyword {keyword!r} (expected A, D, PA, PD, H, TX, TC or TA)",
                                       kw.start(1))
        except PatchSyntaxError as exc:
            yield make_error(lineno, exc.column + 1, exc.message, line)
    if in_tx:
        yield make_error(tx_line, 1, f"transaction opened here is never committed (no TC or TA before the end); "
                         f"its {len(pending)} update(s) are discarded", tx_text)


def fast_term(text: str) -> str | None:
    """Canonical form of a plain, already-canonical-looking term, or None to take the full path."""
    if _FAST_TERM.match(text) is None:
        return None
    if text[0] == "<":
        return text if text in _VALID_IRIS or _iri_valid(text) else None
    if text[0] == '"' and "^^" in text:
        if not _typed_ok(text):
            return None
        if text.endswith(_XSD_STRING_SUFFIX):
            return text[: -len(_XSD_STRING_SUFFIX)]
    return text


def _typed_ok(obj: str) -> bool:
    """A fast-path typed literal is fine unless its datatype is rdf:langString or an invalid IRI."""
    return not obj.endswith(_LANG_STRING_SUFFIX) and _iri_valid(obj[obj.index("^^") + 2 :])
