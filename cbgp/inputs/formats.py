"""Input parsers: RDF Patch, N-Triples, N-Quads, Turtle and JSON lines -> `Update`s.

Every parser is a generator of `Update | InputError`, in source order.  Bad input
never stops a parser: a malformed statement yields an `InputError` naming its line
and parsing goes on, so the good statements around it still come out.  With
`strict=True` the first error raises `InputFormatError` instead.

Terms come out as canonical N-Triples strings (see `cbgp.terms`), so two
updates talk about the same RDF term exactly when their strings are equal.

RDF Patch is parsed by a hand-written line tokenizer (a whole-line regex covers
the common `A <s> <p> <o> .` case); the RDF formats go through pyoxigraph, with
our own error recovery around it because pyoxigraph's own recovery can swallow
a good line after a bad one.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, NamedTuple

import pyoxigraph as ox

from cbgp.inputs.patch import (
    PatchSyntaxError,
    check_position,
    fast_term,
    parse_patch_lines,
    read_term,
    split_lines,
)
from cbgp.terms import TermError, from_oxigraph
from cbgp.query.sparql import text_error

__all__ = [
    "Update",
    "InputError",
    "InputFormatError",
    "parse_patch",
    "parse_ntriples",
    "parse_nquads",
    "parse_turtle",
    "parse_json_lines",
    "parse_input",
    "detect_format",
    "sniff_format",
    "parse_term",
    "FORMATS",
]

FORMATS = ("patch", "ntriples", "nquads", "turtle", "jsonl")
_TEXT_LIMIT = 200


class Update(NamedTuple):
    """One change to the graph: `op` is +1 (insert) or -1 (delete).

    `line` is the 1-based source line where the statement starts (0 if unknown);
    `position` is the 1-based index of the statement among the input's A/D lines
    (patch) or statements (other formats), `cbgp replay`'s "seq".  A named tuple: a parser makes one per
    statement, and a frozen dataclass cost four times as much to build (2.3 against 0.6 us).
    """

    op: int
    s: str
    p: str
    o: str
    g: str | None
    line: int
    position: int


@dataclass(frozen=True, slots=True)
class InputError:
    """A statement that could not be parsed; `text` is the offending line (<= 200 chars)."""

    line: int
    column: int | None
    message: str
    text: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class InputFormatError(ValueError):
    """Raised in strict mode at the first malformed statement; the message names its line."""


def _error(line: int, column: int | None, message: str, text: str) -> InputError:
    return InputError(line, column, message, text[:_TEXT_LIMIT])


def _strictly(items: Iterable[Update | InputError]) -> Iterator[Update | InputError]:
    for item in items:
        if isinstance(item, InputError):
            raise InputFormatError(str(item))
        yield item


def _maybe_strict(items: Iterator[Update | InputError], strict: bool) -> Iterator[Update | InputError]:
    # Wrapping only in strict mode keeps the default path free of a generator hop per update.
    return _strictly(items) if strict else items


def parse_term(text: str) -> str:
    """One N-Triples term (IRI, blank node or literal) -> its canonical string.

    Raises `TermError` with the reason when `text` is not exactly one valid term.
    """
    bad = _SURROGATE.search(text)
    if bad:
        raise TermError(f"invalid Unicode: the lone surrogate U+{ord(bad.group()):04X}")
    fast = fast_term(text)
    if fast is not None:
        return fast
    try:
        term, end = read_term(text, _skip_ws(text, 0), None, allow_patch_forms=False)
    except PatchSyntaxError as exc:
        raise TermError(f"{exc.message} in {text[:_TEXT_LIMIT]!r}") from None
    if _skip_ws(text, end) != len(text):
        raise TermError(f"unexpected text after the term in {text[:_TEXT_LIMIT]!r}")
    return term


def _skip_ws(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos] in " \t":
        pos += 1
    return pos


# ----------------------------------------------------------------------------- RDF Patch


def parse_patch(text: str, *, strict: bool = False) -> Iterator[Update | InputError]:
    """Parse an RDF Patch (https://afs.github.io/rdf-delta/rdf-patch.html).

    One row per line: `A s p o [g] .`, `D s p o [g] .`, `PA pfx: <iri> .`,
    `PD pfx: <iri> .`, `H key value .`, `TX .`, `TC .`, `TA .`.  Updates inside
    a transaction come out only at its `TC`; `TA` discards them (and undoes its
    prefix changes), but their positions stay consumed.  A malformed row inside a
    transaction is reported and the transaction goes on without it.  An
    unterminated `TX` at the end is reported on the `TX` line and its updates are
    dropped.  Every A/D line consumes a position, also a malformed one, so the
    position of a good line never depends on which other lines are valid.
    """
    items: Iterator[Update | InputError] = parse_patch_lines(split_lines(text), Update, _error)
    return _maybe_strict(items, strict)


# ------------------------------------------------------------- N-Triples / N-Quads


_CR_RE = re.compile(rb"\r\n?")
_OX_PREFIX_RE = re.compile(r"^Parser error [^:]*: ")


def _ox_message(exc: SyntaxError) -> tuple[str, int | None]:
    """pyoxigraph's message without its location prefix, and the 1-based start column."""
    message = _OX_PREFIX_RE.sub("", str(exc.msg if exc.msg else exc))
    column = exc.offset if isinstance(exc.offset, int) and exc.offset > 0 else None
    return message, column


_NAMED_NODE, _BLANK_NODE = ox.NamedNode, ox.BlankNode


def _convert(term: object) -> str:
    """`from_oxigraph`, with IRIs and blank nodes (most terms) done inline: this runs 3-4 times per quad."""
    kind = type(term)
    if kind is _NAMED_NODE:
        return "<" + term.value + ">"  # type: ignore[attr-defined]
    if kind is _BLANK_NODE:
        return "_:" + term.value  # type: ignore[attr-defined]
    return from_oxigraph(term)


_DEFAULT_GRAPH = ox.DefaultGraph


def _parse_line_format(text: str, fmt: ox.RdfFormat, strict: bool) -> Iterator[Update | InputError]:
    return _maybe_strict(_line_format_items(text, fmt), strict)


def _line_format_items(text: str, fmt: ox.RdfFormat) -> Iterator[Update | InputError]:
    """N-Triples / N-Quads through pyoxigraph, with per-line error recovery.

    Both formats hold exactly one statement per content line (not blank, not a
    comment), and pyoxigraph rejects a second statement on a line, so the k-th
    quad pyoxigraph yields belongs to the k-th content line.  On a SyntaxError
    the suspects are the last quad's line (trailing junk is reported after its
    quad) and the first line without a quad; each is judged by parsing it alone,
    then bulk parsing restarts on the line after.  The last quad is held back
    until the next one arrives so that a line judged bad never leaks a quad.
    """
    # surrogatepass: a lone surrogate becomes invalid UTF-8 that pyoxigraph reports on its line.
    data = text.encode("utf-8", "surrogatepass")
    if b"\r" in data:
        # CR is a line break in these formats and never raw inside a term; one kind of break keeps offsets simple.
        data = _CR_RE.sub(b"\n", data)
    starts: list[int] = []
    linenos: list[int] = []
    offset = 0
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        stripped = raw.lstrip(b" \t")
        if stripped and stripped[0] != 0x23:  # '#'
            starts.append(offset)
            linenos.append(lineno)
        offset += len(raw) + 1
    n = len(starts)
    conv = _convert

    def line_bytes(i: int) -> bytes:
        end = data.find(b"\n", starts[i])
        return data[starts[i] : end if end >= 0 else len(data)]

    def update(quad: ox.Quad, i: int) -> Update:
        graph = quad.graph_name
        return Update(1, conv(quad.subject), conv(quad.predicate), conv(quad.object),
                      None if type(graph) is _DEFAULT_GRAPH else conv(graph), linenos[i] if i < n else 0, i + 1)

    def judge(i: int) -> Update | InputError:
        raw = line_bytes(i)
        try:
            quads = list(ox.parse(raw, fmt))
        except SyntaxError as exc:
            message, column = _ox_message(exc)
            text = raw.decode("utf-8", "replace")
            if column is None or "end of file" in message.lower():  # (what the line shows says more)
                cause = text_error(text)
                if cause is not None and cause.column is not None and "prefix" not in cause.message:
                    message, column = cause.message.removeprefix("SPARQL syntax error: "), cause.column
            return _error(linenos[i], column, message, text)
        if len(quads) != 1:
            return _error(linenos[i], None, "expected exactly one statement on the line", raw.decode("utf-8", "replace"))
        return update(quads[0], i)

    buf = io.BytesIO(data)
    idx = 0
    while idx < n:
        buf.seek(starts[idx])
        held: ox.Quad | None = None
        held_idx = -1
        try:
            for quad in ox.parse(buf, fmt):
                if held is not None:
                    yield update(held, held_idx)
                held, held_idx = quad, idx
                idx += 1
        except SyntaxError:
            if held is not None:
                verdict = judge(held_idx)
                yield verdict
                if isinstance(verdict, InputError):
                    continue  # restart on the line after the held one, which is `idx`
            if idx < n:
                yield judge(idx)
                idx += 1
            continue
        if held is not None:
            yield update(held, held_idx)
        if idx < n:
            # pyoxigraph ended cleanly with lines unaccounted for: judge one alone so we always progress.
            yield judge(idx)
            idx += 1


def parse_ntriples(text: str, *, strict: bool = False) -> Iterator[Update | InputError]:
    """Parse N-Triples; every triple is an insert into the default graph.

    `position` counts content lines (statements), also malformed ones.
    """
    return _parse_line_format(text, ox.RdfFormat.N_TRIPLES, strict)


def parse_nquads(text: str, *, strict: bool = False) -> Iterator[Update | InputError]:
    """Parse N-Quads; every quad is an insert, `g` is the 4th term (None = default graph)."""
    return _parse_line_format(text, ox.RdfFormat.N_QUADS, strict)


# ----------------------------------------------------------------------------- Turtle


class _ChainReader:
    """File-like reader: a prologue, then `data` from `start`, without copying `data`."""

    def __init__(self, prologue: bytes, data: bytes, start: int) -> None:
        self._parts = [memoryview(prologue), memoryview(data)[start:]]

    def read(self, size: int = -1) -> bytes:
        while self._parts and not len(self._parts[0]):
            self._parts.pop(0)
        if not self._parts:
            return b""
        head = self._parts[0]
        if size is None or size < 0 or size >= len(head):
            self._parts.pop(0)
            return bytes(head)
        self._parts[0] = head[size:]
        return bytes(head[:size])


_LINE_BREAK_RE = re.compile(rb"\r\n|\r|\n")
_STATEMENT_START = frozenset(b"@<_[(:\"'") | frozenset(range(0x41, 0x5B)) | frozenset(range(0x61, 0x7B))


def parse_turtle(text: str, *, strict: bool = False, base: str | None = None) -> Iterator[Update | InputError]:
    """Parse Turtle with pyoxigraph; every triple is an insert into the default graph.

    `line` is 0 (pyoxigraph does not say where a triple came from); `position`
    counts triples.  Recovery is best effort: after a syntax error at line L we
    report it and restart at the first line after L that can start a statement
    (its previous content line ends with `.` and it begins like a subject or a
    directive), re-declaring the prefixes and base seen so far.  Triples of the
    broken statement that pyoxigraph emitted before the error are kept; the rest
    of that statement is skipped.
    """
    return _maybe_strict(_turtle_items(text, base), strict)


def _turtle_items(text: str, base: str | None) -> Iterator[Update | InputError]:
    data = text.encode("utf-8", "surrogatepass")
    line_starts = [0] + [m.end() for m in _LINE_BREAK_RE.finditer(data)]
    conv = _convert
    position = 0
    resume = 1  # 1-based line where the current parse starts
    prefixes: dict[str, str] = {}
    base_iri = base
    while True:
        prologue = "".join(f"@prefix {p}: <{v}> . " for p, v in prefixes.items())
        if base_iri and resume > 1:
            prologue = f"@base <{base_iri}> . " + prologue
        # The prologue sits on its own line so pyoxigraph's line numbers shift by exactly one.
        head = (prologue + "\n").encode("utf-8") if prologue else b""
        parser = ox.parse(_ChainReader(head, data, line_starts[resume - 1]), ox.RdfFormat.TURTLE, base_iri=base_iri)
        try:
            for quad in parser:
                position += 1
                yield Update(1, conv(quad.subject), conv(quad.predicate), conv(quad.object), None, 0, position)
            return
        except SyntaxError as exc:
            message, column = _ox_message(exc)
            rel = exc.lineno if isinstance(exc.lineno, int) else 1
            line = max(resume, resume + rel - 1 - (1 if head else 0))
            line = min(line, len(line_starts))
            yield _error(line, column, message, _line_text(data, line_starts, line))
            prefixes.update(parser.prefixes)
            base_iri = parser.base_iri or base_iri
            nxt = _next_statement_line(data, line_starts, line)
            if nxt is None:
                return
            resume = nxt


def _line_text(data: bytes, line_starts: list[int], line: int) -> str:
    start = line_starts[line - 1]
    end = line_starts[line] if line < len(line_starts) else len(data)
    return data[start:end].rstrip(b"\r\n").decode("utf-8", "replace")


def _next_statement_line(data: bytes, line_starts: list[int], after: int) -> int | None:
    previous_ends_statement = _line_text(data, line_starts, after).rstrip().endswith(".")
    for line in range(after + 1, len(line_starts) + 1):
        stripped = _line_text(data, line_starts, line).strip()
        if not stripped or stripped.startswith("#"):
            continue
        if previous_ends_statement and (ord(stripped[0]) in _STATEMENT_START or stripped[0] > "\x7f"):
            return line
        previous_ends_statement = stripped.endswith(".")
    return None


# ----------------------------------------------------------------------------- JSON lines

_OPS = {"+": 1, "-": -1}
_FIELD_POSITIONS = (("s", "subject"), ("p", "predicate"), ("o", "object"))


def parse_json_lines(text: str, *, strict: bool = False) -> Iterator[Update | InputError]:
    """Parse JSON lines `{"op": "+"|"-", "s": ..., "p": ..., "o": ..., "g": ...}`.

    Terms are N-Triples terms; `g` is optional (absent or null = default graph).
    `position` counts non-blank lines, also malformed ones.
    """
    return _maybe_strict(_json_items(text), strict)


def _json_items(text: str) -> Iterator[Update | InputError]:
    position = 0
    decode = json.loads
    for lineno, line in enumerate(split_lines(text), 1):
        if not line.strip():
            continue
        position += 1
        try:
            obj = decode(line)
        except json.JSONDecodeError as exc:
            yield _error(lineno, exc.colno, f"invalid JSON: {exc.msg}", line)
            continue
        except RecursionError:
            yield _error(lineno, None, "invalid JSON: nested too deeply", line)
            continue
        if not isinstance(obj, dict):
            yield _error(lineno, None, f"expected a JSON object, got {type(obj).__name__}", line)
            continue
        problem = _json_update(obj, lineno, position)
        yield problem if isinstance(problem, Update) else _error(lineno, None, problem, line)


def _json_update(obj: dict, lineno: int, position: int) -> Update | str:
    """The update of one JSON object, or the reason it is not one."""
    if "op" not in obj:
        return "missing field 'op'"
    op = _OPS.get(obj["op"]) if isinstance(obj["op"], str) else None
    if op is None:
        return f"field 'op' must be \"+\" or \"-\", got {json.dumps(obj['op'])[:40]}"
    terms: list[str] = []
    for key, role in _FIELD_POSITIONS + (("g", "graph"),):
        value = obj.get(key)
        if value is None:
            if key == "g":
                terms.append("")
                continue
            return f"missing field {key!r}"
        if not isinstance(value, str):
            return f"field {key!r} must be a string holding an N-Triples term, got {type(value).__name__}"
        try:
            term = parse_term(value)
        except TermError as exc:
            return f"field {key!r}: {exc}"
        reason = check_position(term, role)
        if reason:
            return f"field {key!r}: {reason}"
        terms.append(term)
    return Update(op, terms[0], terms[1], terms[2], terms[3] or None, lineno, position)


# ----------------------------------------------------------------------------- dispatch

_EXTENSIONS = {
    ".rdfp": "patch", ".patch": "patch", ".nt": "ntriples", ".nq": "nquads",
    ".ttl": "turtle", ".jsonl": "jsonl", ".ndjson": "jsonl",
}
_MEDIA_TYPES = {
    "application/rdf-patch": "patch", "text/rdf-patch": "patch",
    "application/n-triples": "ntriples", "text/n-triples": "ntriples",
    "application/n-quads": "nquads", "text/n-quads": "nquads", "text/x-nquads": "nquads",
    "text/turtle": "turtle", "application/x-turtle": "turtle",
    "application/jsonl": "jsonl", "application/x-ndjson": "jsonl", "application/json-lines": "jsonl",
    "application/x-jsonlines": "jsonl",
}


def detect_format(name_or_media_type: str) -> str:
    """Format name (one of `FORMATS`) from a file name, extension, media type or format name."""
    key = name_or_media_type.strip().lower()
    media = key.split(";", 1)[0].strip()
    if media in _MEDIA_TYPES:
        return _MEDIA_TYPES[media]
    if key in FORMATS:
        return key
    dot = key.rfind(".")
    if dot >= 0 and key[dot:] in _EXTENSIONS:
        return _EXTENSIONS[key[dot:]]
    known = ", ".join(sorted(_EXTENSIONS)) + "; " + ", ".join(sorted(_MEDIA_TYPES))
    raise ValueError(f"cannot tell the input format of {name_or_media_type!r}; known: {known}")


_PATCH_ROW = re.compile(r"^(A|D|PA|PD|H|TX|TC|TA)\s")
_UPDATE_WORD = re.compile(r"\b(INSERT|DELETE|CLEAR|DROP|CREATE|LOAD|COPY|MOVE|ADD|WITH)\b", re.IGNORECASE)


def sniff_format(data: bytes, sample_lines: int = 20) -> str | None:
    """The format the start of ``data`` is written in, for a file whose name does not say (``changes.txt``):
    ``patch``, ``jsonl``, ``sparql-update``, ``turtle``, ``nquads`` or ``ntriples``; None when it cannot tell."""
    text = data[:65536].decode("utf-8", errors="replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        return None
    first = lines[0]
    if _PATCH_ROW.match(first + " "):
        return "patch"
    if first.startswith("{"):
        return "jsonl"
    if _UPDATE_WORD.search(text):
        masked = re.sub(r'"[^"\n]*"|<[^>\s]*>', " ", text)  # (not a keyword inside a literal or an IRI)
        if _UPDATE_WORD.search(masked):
            return "sparql-update"
    if first.startswith("@") or first.upper().startswith(("PREFIX", "BASE")) or any(
            ln.endswith((";", ",")) for ln in lines[:sample_lines]):
        return "turtle"
    for line in lines[:sample_lines]:  # the first line either reads (a later one may be the broken one)
        if not any(isinstance(item, InputError) for item in parse_ntriples(line)):
            return "ntriples"
        if not any(isinstance(item, InputError) for item in parse_nquads(line)):
            return "nquads"
    return "turtle" if first.startswith(("<", "_:", "[")) else None


_PARSERS: dict[str, Callable[..., Iterator[Update | InputError]]] = {
    "patch": parse_patch, "ntriples": parse_ntriples, "nquads": parse_nquads, "jsonl": parse_json_lines,
}


def parse_input(data: bytes | str, fmt: str, *, strict: bool = False, base: str | None = None) -> Iterator[Update | InputError]:
    """Parse `data` in format `fmt` (one of `FORMATS`); bytes are decoded as UTF-8.

    A line that is not valid UTF-8 yields an `InputError` and is parsed as if
    blank, so the other lines still come out.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown input format {fmt!r}; expected one of {', '.join(FORMATS)}")
    decode_errors: list[InputError] = []
    text = data if isinstance(data, str) else _decode(data, decode_errors)
    if fmt == "turtle":
        items = parse_turtle(text, base=base)
    else:
        items = _PARSERS[fmt](text)
    if decode_errors:
        items = _merge_by_line(items, decode_errors)
    if "\\u" in text or "\\U" in text:  # only an escape can make a lone surrogate out of valid UTF-8
        items = _without_surrogates(items)
    return _maybe_strict(items, strict)


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _without_surrogates(items: Iterator[Update | InputError]) -> Iterator[Update | InputError]:
    """A statement whose terms hold a lone surrogate (``"\\ud800"`` in JSON or N-Triples) is not RDF: an
    InputError in its place (the dictionary could not encode it as UTF-8)."""
    for item in items:
        if isinstance(item, Update):
            for term in (item.s, item.p, item.o, item.g or ""):
                bad = _SURROGATE.search(term)
                if bad:
                    item = _error(item.line, None, f"invalid Unicode: an escape makes the lone surrogate "
                                  f"U+{ord(bad.group()):04X}", term.encode("utf-8", "backslashreplace").decode())
                    break
        yield item


def _decode(data: bytes, errors: list[InputError]) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    # Slow path only for broken input: decode line by line, keeping the breaks so line numbers hold.
    parts = re.split(rb"(\r\n|\r|\n)", data)
    out: list[str] = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(part.decode("ascii"))
            continue
        try:
            out.append(part.decode("utf-8"))
        except UnicodeDecodeError as exc:
            line = i // 2 + 1
            bad = part[exc.start : exc.start + 1].hex()
            errors.append(_error(line, exc.start + 1, f"invalid UTF-8 (byte 0x{bad} at byte {exc.start + 1})",
                                 part.decode("utf-8", "replace")))
            out.append("")
    return "".join(out)


def _merge_by_line(items: Iterator[Update | InputError], errors: list[InputError]) -> Iterator[Update | InputError]:
    pending = iter(errors)
    nxt = next(pending, None)
    for item in items:
        while nxt is not None and 0 < item.line and nxt.line <= item.line:
            yield nxt
            nxt = next(pending, None)
        yield item
    while nxt is not None:
        yield nxt
        nxt = next(pending, None)
