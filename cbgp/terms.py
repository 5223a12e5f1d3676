"""RDF terms as canonical N-Triples strings, and their integer dictionary.

Every component of the project identifies a term by one string: its canonical
N-Triples form (`<iri>`, `_:label`, `"lex"`, `"lex"@lang`, `"lex"^^<datatype>`).
Two terms are the same RDF term exactly when their canonical strings are equal,
which is what BGP matching needs.  Canonical means: `xsd:string` literals are
written without a datatype (RDF 1.1 makes them the same term), language tags are
lower-cased (they are case-insensitive), and only `"`, `\\`, newline and carriage
return are escaped in lexical forms.

Inside the engine terms are integers (`TermDictionary`); the default graph is
id 0, which no term ever gets.
"""

from __future__ import annotations

import hashlib
import re
from typing import Iterable, Mapping

XSD = "http://www.w3.org/2001/XMLSchema#"
XSD_STRING = XSD + "string"
RDF_LANG_STRING = "http://www.w3.org/1999/02/22-rdf-syntax-ns#langString"
DEFAULT_GRAPH_ID = 0
# The largest term the fleet carries (UTF-8 bytes): ingest refuses longer ones, and an expression that would make
# one (REPLACE, GROUP_CONCAT) is an error instead
MAX_TERM_SETTING, DEFAULT_MAX_TERM_BYTES = "CBGP_MAX_TERM_BYTES", 64 * 1024

_ESCAPE_OUT = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r"}
_ESCAPE_OUT_RE = re.compile(r'[\\"\n\r]')
_ESCAPE_IN_RE = re.compile(r"\\(u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|[tbnrf\"'\\])")
_SIMPLE_ESCAPES = {"t": "\t", "b": "\b", "n": "\n", "r": "\r", "f": "\f", '"': '"', "'": "'", "\\": "\\"}
_IRI_ESCAPE_RE = re.compile(r"\\(u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8})")


class TermError(ValueError):
    """A string is not a valid RDF term in N-Triples syntax."""


def escape_lexical(lexical: str) -> str:
    return _ESCAPE_OUT_RE.sub(lambda m: _ESCAPE_OUT[m.group(0)], lexical)


def unescape_lexical(escaped: str) -> str:
    def repl(m: re.Match[str]) -> str:
        code = m.group(1)
        if code[0] in "uU":
            return chr(int(code[1:], 16))
        return _SIMPLE_ESCAPES[code]

    return _ESCAPE_IN_RE.sub(repl, escaped)


def iri(value: str) -> str:
    return "<" + value + ">"


def bnode(label: str) -> str:
    return "_:" + label


def literal(lexical: str, language: str | None = None, datatype: str | None = None) -> str:
    """Canonical N-Triples form of a literal."""
    body = '"' + escape_lexical(lexical) + '"'
    if language:
        return body + "@" + language.lower()
    if datatype and datatype not in (XSD_STRING, RDF_LANG_STRING):
        return body + "^^<" + datatype + ">"
    return body


def is_iri(term: str) -> bool:
    return term.startswith("<")


def is_bnode(term: str) -> bool:
    return term.startswith("_:")


def is_literal(term: str) -> bool:
    return term.startswith('"')


def split_literal(term: str) -> tuple[str, str | None, str | None]:
    """(lexical form, language, datatype IRI) of a canonical literal string."""
    close = term.rfind('"')
    if close <= 0:
        raise TermError(f"not a literal: {term!r}")
    lexical = unescape_lexical(term[1:close])
    rest = term[close + 1 :]
    if not rest:
        return lexical, None, None
    if rest.startswith("@"):
        return lexical, rest[1:], None
    if rest.startswith("^^<") and rest.endswith(">"):
        return lexical, None, rest[3:-1]
    raise TermError(f"malformed literal suffix {rest!r} in {term!r}")


def to_sparql_json(term: str) -> dict[str, str]:
    """SPARQL 1.1 Query Results JSON form of a canonical term."""
    if term.startswith("<"):
        return {"type": "uri", "value": _IRI_ESCAPE_RE.sub(lambda m: chr(int(m.group(1)[1:], 16)), term[1:-1])}
    if term.startswith("_:"):
        return {"type": "bnode", "value": term[2:]}
    lexical, language, datatype = split_literal(term)
    out = {"type": "literal", "value": lexical}
    if language:
        out["xml:lang"] = language
    elif datatype:
        out["datatype"] = datatype
    return out


def from_sparql_json(obj: dict[str, str]) -> str:
    """Inverse of `to_sparql_json`; accepts the older `typed-literal` type too."""
    kind = obj.get("type")
    if kind == "uri":
        return iri(obj["value"])
    if kind == "bnode":
        return bnode(obj["value"])
    if kind in ("literal", "typed-literal"):
        return literal(obj["value"], obj.get("xml:lang"), obj.get("datatype"))
    raise TermError(f"unknown SPARQL JSON term type {kind!r}")


def from_rdflib(term) -> str:  # noqa: ANN001 - rdflib is imported lazily by callers
    """Canonical string of an rdflib URIRef / BNode / Literal."""
    from rdflib import BNode, Literal, URIRef

    if isinstance(term, URIRef):
        return iri(str(term))
    if isinstance(term, BNode):
        return bnode(str(term))
    if isinstance(term, Literal):
        return literal(str(term), term.language, str(term.datatype) if term.datatype else None)
    raise TermError(f"not an RDF term: {term!r}")


def from_oxigraph(term) -> str:  # noqa: ANN001
    """Canonical string of a pyoxigraph NamedNode / BlankNode / Literal."""
    import pyoxigraph as ox

    if isinstance(term, ox.NamedNode):
        return iri(term.value)
    if isinstance(term, ox.BlankNode):
        return bnode(term.value)
    if isinstance(term, ox.Literal):
        language = term.language
        return literal(term.value, language, None if language else term.datatype.value)
    raise TermError(f"not an RDF term: {term!r}")


def to_oxigraph(term: str):  # noqa: ANN201
    import pyoxigraph as ox

    if term.startswith("<"):
        return ox.NamedNode(term[1:-1])
    if term.startswith("_:"):
        return ox.BlankNode(term[2:])
    lexical, language, datatype = split_literal(term)
    if language:
        return ox.Literal(lexical, language=language)
    if datatype:
        return ox.Literal(lexical, datatype=ox.NamedNode(datatype))
    return ox.Literal(lexical)


def stable_term_id(term: str) -> int:
    """A 63-bit id that every process computes alike for the same term.

    Ingest replicas encode terms without coordinating: the id is a hash of the
    canonical string, and the dictionary topic only maps ids back to terms.  A
    collision (about 1 in 10^10 for 10^4.5 ... 10^9 terms) is detected where the
    dictionary is written and reported, never silently merged.
    """
    digest = hashlib.blake2b(term.encode("utf-8"), digest_size=8).digest()
    value = int.from_bytes(digest, "big") & 0x7FFF_FFFF_FFFF_FFFF
    return value or 1


class TermCollisionError(RuntimeError):
    """Two different terms hashed to the same stable id."""


class TermDictionary:
    """Two-way map between canonical term strings and integer ids.

    `stable=False` (the default) numbers terms 1, 2, 3, ... in order of first
    sight, which is the fastest and the most compact; `stable=True` uses
    `stable_term_id`, so that independent processes agree on ids.

    A term an operator computes and holds only while it is an answer (an
    aggregate's value: a new one per change of its group) is *held*
    (:meth:`hold`) rather than encoded, and let go (:meth:`release`) when the
    answer is retracted; :meth:`collect`, called once the answers made so far
    have been read, frees the terms no holder keeps.  A held term is given its
    `stable_term_id` (the same id whenever it is made again); one also encoded
    or added (data, a query constant) is kept for good.
    """

    __slots__ = ("_ids", "_terms", "_stable", "_held", "_held_ids", "_let_go", "_journal")

    def __init__(self, stable: bool = False) -> None:
        self._ids: dict[str, int] = {}
        self._terms: dict[int, str] = {}
        self._stable = stable
        self._held: dict[int, list] = {}  # id -> [term, holders] of the held terms
        self._held_ids: dict[str, int] = {}
        self._let_go: list[int] = []  # released since the last collect()
        self._journal: list[int] | None = None  # see record_holds()

    def __setstate__(self, state: tuple) -> None:
        _none, slots = state
        for name, value in slots.items():
            setattr(self, name, value)
        for name, empty in (("_held", dict), ("_held_ids", dict), ("_let_go", list),  # (older checkpoints)
                            ("_journal", type(None))):
            if not hasattr(self, name):
                setattr(self, name, empty())

    def __len__(self) -> int:
        return len(self._ids) + len(self._held)

    @property
    def ids(self) -> Mapping[str, int]:
        """term -> id of every term kept for good: a live view for hot loops (``ids.get(term)``), not to be
        modified (a held term is not in it: a miss goes through :meth:`encode`, which keeps it)."""
        return self._ids

    def encode(self, term: str) -> int:
        found = self._ids.get(term)
        if found is not None:
            return found
        if self._held_ids:
            held = self._held_ids.pop(term, None)
            if held is not None:  # made by an operator, now data or a constant too: kept for good
                del self._held[held]
                self._ids[term] = held
                self._terms[held] = term
                return held
        new_id = stable_term_id(term) if self._stable else len(self._ids) + 1
        other = self._terms.get(new_id)
        if other is None and self._held:
            other = self._held.get(new_id, (None,))[0]
        if other is not None:
            raise TermCollisionError(f"terms {other!r} and {term!r} share id {new_id}")
        self._ids[term] = new_id
        self._terms[new_id] = term
        return new_id

    def hold(self, term: str) -> int:
        """Id of a term an operator computed, held once more until :meth:`release` (see the class doc)."""
        found = self._ids.get(term)
        if found is not None:
            return found
        held = self._held_ids.get(term)
        if held is not None:
            self._held[held][1] += 1
            if self._journal is not None:
                self._journal.append(held)
            return held
        new_id = stable_term_id(term)
        other = self._terms.get(new_id)
        if other is None:
            other = self._held.get(new_id, (None,))[0]
        if other is not None:
            raise TermCollisionError(f"terms {other!r} and {term!r} share id {new_id}")
        self._held[new_id] = [term, 1]
        self._held_ids[term] = new_id
        if self._journal is not None:
            self._journal.append(new_id)
        return new_id

    def hold_id(self, term_id: int, times: int = 1) -> bool:
        """Hold ``term_id`` ``times`` more, if it is held (a kept term needs nothing); whether it was."""
        entry = self._held.get(term_id)
        if entry is not None:
            entry[1] += times
            if self._journal is not None:
                self._journal.extend([term_id] * times)
        return entry is not None

    def record_holds(self, journal: list[int] | None) -> None:
        """From now, append to ``journal`` each id held (None: stop): the holds of code a caller then drops, to
        let go of in one go."""
        self._journal = journal

    def release(self, term_id: int) -> None:
        """Let go of one :meth:`hold` of ``term_id`` (nothing for a term kept for good)."""
        self._let_go.append(term_id)

    def collect(self) -> list[int]:
        """Free the held terms whose holders all let go; their ids.  Call it once the answers that name them
        were read (a retraction decodes its term after the hold was released)."""
        if not self._let_go:
            return []
        freed: list[int] = []
        held = self._held
        for term_id in self._let_go:
            entry = held.get(term_id)
            if entry is None:
                continue  # kept for good meanwhile (or never held)
            entry[1] -= 1
            if entry[1] <= 0:
                del held[term_id]
                del self._held_ids[entry[0]]
                freed.append(term_id)
        self._let_go.clear()
        return freed

    def held(self) -> int:
        """How many held terms are alive."""
        return len(self._held)

    def lookup(self, term: str) -> int | None:
        """Id of a term already seen, without adding it."""
        found = self._ids.get(term)
        return self._held_ids.get(term) if found is None else found

    def decode(self, term_id: int) -> str:
        try:
            return self._terms[term_id]
        except KeyError:
            entry = self._held.get(term_id)
            if entry is None:
                raise
            return entry[0]

    def add(self, term_id: int, term: str) -> None:
        """Record a mapping learnt elsewhere (e.g. read from the dictionary topic)."""
        other = self._terms.get(term_id)
        if other is not None and other != term:
            raise TermCollisionError(f"terms {other!r} and {term!r} share id {term_id}")
        if self._held:
            entry = self._held.get(term_id)
            if entry is not None:
                if entry[0] != term:
                    raise TermCollisionError(f"terms {entry[0]!r} and {term!r} share id {term_id}")
                del self._held[term_id]  # kept for good from now on
                del self._held_ids[term]
        self._ids[term] = term_id
        self._terms[term_id] = term

    def items(self) -> Iterable[tuple[str, int]]:
        return self._ids.items()
