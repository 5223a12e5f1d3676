"""SPARQL's REGEX and REPLACE in time linear in the text, as pyoxigraph's.

rdflib evaluates them with Python's ``re``, which backtracks: ``REGEX(?name, "^(a+)+$")`` took 0.9 s on a name of
24 letters and doubles with each one more, so one query, or one value in the data, could hold a worker for hours.
RE2 (``google-re2``) runs in time linear in the text, as the Rust engine pyoxigraph uses.  Its ``\\d``, ``\\w``
and ``\\s`` are ASCII where both of those are Unicode, so they are rewritten to the Unicode classes Rust's are
(the characters Unicode 16 assigned are unknown to RE2's tables: the difference that remains).  RE2 has no Unicode
word boundary, so a pattern with ``\\b`` or ``\\B`` over a text that is not ASCII is handed to pyoxigraph itself
(about 50 µs a call, linear too), as is one with ``\\W`` or ``\\S`` inside a bracketed class.
Patterns are compiled once (a bounded cache) with RE2's memory bound; one RE2 refuses (a back-reference, which
pyoxigraph refuses too) is an error, so the FILTER is false.  REPLACE reads its replacement as pyoxigraph does.
"""

from __future__ import annotations

from typing import Any

import re2
from rdflib import Literal
from rdflib.plugins.sparql.operators import string
from rdflib.plugins.sparql.sparql import SPARQLError

from cbgp.query.limits import limit
from cbgp.terms import DEFAULT_MAX_TERM_BYTES, MAX_TERM_SETTING

__all__ = ["regex", "replace", "translate"]

# Rust's Unicode classes (regex-syntax's perl classes): \w is Alphabetic, marks, decimal digits, connector
# punctuation and the joiners; \s is White_Space.  Alphabetic, a property RE2 lacks, is the letters, the letter
# numbers and the marks, and the symbols it names alone: circled and squared Latin letters (Other_Alphabetic).
_ALPHABETIC_SYMBOLS = r"\x{24B6}-\x{24E9}\x{1F130}-\x{1F149}\x{1F150}-\x{1F169}\x{1F170}-\x{1F189}"
_WORD = r"\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}" + _ALPHABETIC_SYMBOLS
_SPACE = r"\t\n\x{0B}\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}"
_INSIDE = {"d": r"\p{Nd}", "D": r"\P{Nd}", "w": _WORD, "s": _SPACE}
_OUTSIDE = {"d": r"\p{Nd}", "D": r"\P{Nd}", "w": f"[{_WORD}]", "W": f"[^{_WORD}]", "s": f"[{_SPACE}]",
            "S": f"[^{_SPACE}]"}
_FLAGS = {"i": "i", "s": "s", "m": "m"}  # XPath's flags RE2 has; "q" quotes the pattern, "x" drops its spaces
_CACHE: dict[tuple[str, str], Any] = {}
_CACHE_SIZE = 1024
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # (a refused pattern is the query's error, said once where it is reported)


RE2, BOUNDARY, OXIGRAPH = "re2", "boundary", "oxigraph"  # who matches a pattern (see translate)


def translate(pattern: str) -> tuple[str, str]:
    """``pattern`` with ``\\d \\D \\w \\W \\s \\S`` as Unicode classes RE2 reads, and who matches it: RE2;
    RE2 on ASCII texts only (``BOUNDARY``: a word boundary, ``\\b`` or ``\\B``); or pyoxigraph always
    (``OXIGRAPH``: a class inside a class, ``\\W`` or ``\\S`` inside a class, or a class operation ``&&`` ``--``
    ``~~``, which RE2 reads otherwise)."""
    out: list[str] = []
    inside = False
    mode = RE2
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            e = pattern[i + 1]
            out.append((_INSIDE if inside else _OUTSIDE).get(e, c + e))
            if e in "bB" and not inside and mode == RE2:
                mode = BOUNDARY
            elif e in "WS" and inside:
                mode = OXIGRAPH  # (a Unicode class's complement among a class's items: RE2 has no way to say it)
            i += 2
            continue
        if inside and (c == "[" or pattern[i:i + 2] in ("&&", "--", "~~")):
            mode = OXIGRAPH
        if c == "[" and not inside:
            inside = True
            out.append(c)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":  # a "]" first in a class is itself
                out.append("\\]")
                i += 1
            continue
        if c == "]" and inside:
            inside = False
        out.append(c)
        i += 1
    return "".join(out), mode


def _compiled(pattern: str, flags: str) -> tuple[Any, str]:
    """RE2's program of ``pattern`` with ``flags`` (None when pyoxigraph matches it), and who matches it."""
    key = (pattern, flags)
    found = _CACHE.get(key)
    if found is None:
        text, mode = pattern, RE2
        if "q" in flags:
            text = re2.escape(pattern)
        else:
            if "x" in flags:
                text = "".join(ch for ch in text if ch not in " \t\n\r")
            text, mode = translate(text)
        inline = "".join(sorted({_FLAGS[f] for f in flags if f in _FLAGS}))
        try:
            found = (None if mode == OXIGRAPH else re2.compile(f"(?{inline}){text}" if inline else text, _OPTIONS),
                     mode)
        except re2.error as exc:
            raise SPARQLError(f"invalid regular expression {pattern!r}: {exc}") from None
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.clear()
        _CACHE[key] = found
    return found


_OXIGRAPH: list = []  # an empty pyoxigraph store, made when first needed


def _by_pyoxigraph(call: str, arguments: dict[str, Any]) -> Literal:
    """``call`` (REGEX or REPLACE over ``?t ?p ?r ?f``) evaluated by pyoxigraph, the arguments given as values,
    never as query text."""
    import pyoxigraph as ox

    if not _OXIGRAPH:
        _OXIGRAPH.append(ox.Store())
    names = " ".join(f"?{name}" for name in arguments)
    values = {ox.Variable(name): _literal(value) for name, value in arguments.items()}
    solution = next(iter(_OXIGRAPH[0].query(f"SELECT {names} ({call} AS ?m) WHERE {{}}", substitutions=values)))
    found = solution["m"]
    if found is None:
        raise SPARQLError(f"{call.split('(')[0]} failed in pyoxigraph")
    datatype = found.datatype.value if found.language is None else None
    return Literal(found.value, lang=found.language,
                   datatype=None if datatype == XSD_STRING else datatype)


XSD_STRING = "http://www.w3.org/2001/XMLSchema#string"


def _literal(value: Literal) -> Any:
    import pyoxigraph as ox

    if value.language:
        return ox.Literal(str(value), language=value.language)
    return ox.Literal(str(value), datatype=ox.NamedNode(str(value.datatype)) if value.datatype else None)


def _flags(value: Any) -> str:
    return str(string(value)) if value is not None else ""


def regex(e: Any, ctx: Any) -> Literal:
    """REGEX(text, pattern[, flags]): whether the pattern matches somewhere in the text."""
    text, pattern, flags = string(e.text), string(e.pattern), _flags(e.flags)
    compiled, mode = _compiled(str(pattern), flags)
    if mode == OXIGRAPH or (mode == BOUNDARY and not str(text).isascii()):
        return _by_pyoxigraph("REGEX(?t, ?p, ?f)", {"t": text, "p": pattern, "f": Literal(flags)})
    return Literal(compiled.search(str(text)) is not None)


def replace(e: Any, ctx: Any) -> Literal:
    """REPLACE(text, pattern, replacement[, flags]), the replacement read as pyoxigraph reads it (Rust's regex
    syntax: ``$n``, ``$name`` and ``${name}`` are groups, the longest name that follows, and a missing one is
    empty; ``$$`` is a dollar; a backslash is itself)."""
    text, pattern, flags = string(e.arg), string(e.pattern), _flags(e.flags)
    compiled, mode = _compiled(str(pattern), flags)
    most = limit(MAX_TERM_SETTING, DEFAULT_MAX_TERM_BYTES)
    if mode == OXIGRAPH or (mode == BOUNDARY and not str(text).isascii()):
        replacement = string(e.replacement)
        if len(text) + (len(text) + 1) * len(replacement) > most:  # (what it could make, before pyoxigraph does)
            raise SPARQLError(f"REPLACE could make a term over {most:,} bytes ({MAX_TERM_SETTING})")
        return _by_pyoxigraph("REPLACE(?t, ?p, ?r, ?f)", {"t": text, "p": pattern, "r": replacement,
                                                          "f": Literal(flags)})
    pieces = _template(str(string(e.replacement)))
    value, out, size = str(text), [], 0
    last = None  # where the previous match ended: an empty match there is not one (Rust's rule, and pyoxigraph's;
    # RE2's finditer also yields one twice at the end of a line).  One walk of the text: linear.
    for match in compiled.finditer(value):
        start, end = match.span()
        if start == end == last:
            continue
        kept = value[0 if last is None else last:start]
        made = [p if isinstance(p, str) else _group(match, p[0]) for p in pieces]
        out.append(kept)
        out.extend(made)
        size += len(kept) + sum(map(len, made))
        if size > most:  # ("" replaced by a long text between every two letters: the square of the term limit)
            raise SPARQLError(f"REPLACE would make a term over {most:,} bytes ({MAX_TERM_SETTING})")
        last = end
    out.append(value[0 if last is None else last:])
    result = "".join(out)
    if len(result.encode()) > most:
        raise SPARQLError(f"REPLACE would make a term over {most:,} bytes ({MAX_TERM_SETTING})")
    return Literal(result, datatype=text.datatype, lang=text.language)


def _group(match: Any, name: str) -> str:
    try:
        found = match.group(int(name) if name.isdigit() else name)
    except (IndexError, KeyError, ValueError, re2.error):
        return ""
    return found or ""


_NAME = frozenset("_0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _template(replacement: str) -> list:
    """The replacement as text pieces and ``(group name,)`` pieces."""
    pieces: list = []
    text: list[str] = []
    i, n = 0, len(replacement)
    while i < n:
        c = replacement[i]
        if c == "$" and i + 1 < n:
            if replacement[i + 1] == "$":
                text.append("$")
                i += 2
                continue
            if replacement[i + 1] == "{":
                close = replacement.find("}", i + 2)
                if close >= 0:  # (an empty name is a group nobody has: nothing)
                    pieces += ["".join(text), (replacement[i + 2:close],)]
                    text, i = [], close + 1
                    continue
            j = i + 1
            while j < n and replacement[j] in _NAME:
                j += 1
            if j > i + 1:
                pieces += ["".join(text), (replacement[i + 1:j],)]
                text, i = [], j
                continue
        text.append(c)
        i += 1
    pieces.append("".join(text))
    return [p for p in pieces if p != ""]
