"""FILTERs of the common shapes, evaluated on the terms' strings instead of through rdflib.

rdflib's evaluator costs tens of microseconds a row (bindings, rdflib terms, its node lookups), so a FILTER made
the row it filtered cost ten to a hundred times the join that made it. ``compile_filter`` turns an expression
built only from the shapes below into a function of a row. Any other expression is not compiled, and a row whose
terms leave the ground these shapes are sure of (an integer subtype, a number's form another numeric type might
read, two dates or two booleans compared, a dateTime with a timezone against one without exactly 14 hours apart, an
escaped character in a string test) raises :class:`Fallback`, so that row is evaluated by rdflib (with
``strict_comparisons``).

Shapes: ``&&``, ``||``, ``!``; ``BOUND``, ``isIRI``/``isURI``, ``isBlank``, ``isLiteral``, ``sameTerm``;
``=``, ``!=``, ``<``, ``>``, ``<=``, ``>=``, ``IN`` and ``NOT IN``; ``CONTAINS``, ``STRSTARTS``, ``STRENDS``,
``langMatches``; over variables, constants and ``STR``, ``LANG``, ``DATATYPE`` of them. Comparisons
follow SPARQL's operator mapping: numbers (xsd:integer, decimal, float, double) and xsd:dateTime by value,
simple literals and language-tagged strings of one language by their characters, IRIs and blank nodes as terms
(never ordered), a literal never equal to an IRI, literals of two value spaces never equal nor ordered, a literal of
an unknown datatype or an ill-typed number equal only to itself, a dateTime without a timezone compared with one
with by XSD's 14 hours either side (an error inside them, for ``=`` too: pyoxigraph calls them unequal); an error
(an unbound variable) is false in a FILTER and absorbed by ``||`` and ``&&`` as SPARQL's three-valued logic says.
"""

from __future__ import annotations

import operator
import re
import struct
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any, Callable

from rdflib import BNode, Literal, URIRef, Variable

from cbgp.terms import RDF_LANG_STRING, XSD, XSD_STRING, from_rdflib, is_bnode, is_iri, is_literal

_RDF = RDF_LANG_STRING[:-len("langString")]
# XSD's integer types: xsd:integer and the types derived from it (each with its own range).
INTEGER_TYPES = {XSD + t for t in (
    "integer", "int", "long", "short", "byte", "nonNegativeInteger", "nonPositiveInteger", "positiveInteger",
    "negativeInteger", "unsignedLong", "unsignedInt", "unsignedShort", "unsignedByte")}
ERROR = object()  # a SPARQL expression error


class Fallback(Exception):
    """This row is outside what the compiled filter is sure of: evaluate it with rdflib."""


_FALLBACK = Fallback()
Row = tuple
BoolFn = Callable[[Row], Any]  # True, False or ERROR
TermFn = Callable[[Row], Any]  # a term's string or ERROR

_FLOATING = re.compile(r"(?:[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|NaN|-?INF)\Z")


def _double(lexical: str) -> float:
    return float(lexical.replace("INF", "inf"))


def _single(value: float) -> float:
    """``value`` rounded to single precision (an xsd:float's)."""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        raise _FALLBACK from None


def _float(lexical: str) -> float:
    return _single(_double(lexical))


_NUMBER = {XSD + "integer": (0, re.compile(r"[+-]?\d+\Z"), int),
           XSD + "decimal": (1, re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)\Z"), Decimal),
           XSD + "float": (2, _FLOATING, _float), XSD + "double": (3, _FLOATING, _double)}
_NUMERIC_OTHER = INTEGER_TYPES - set(_NUMBER)  # (a subtype's range is not checked here: rdflib's)
_NOT_A_NUMBER = (None, None)
_DATE_TIME = XSD + "dateTime"
_DATE_TIME_SHAPE = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?(Z|[+-]\d\d:\d\d)?\Z")
_INSTANT = 10  # the rank of an xsd:dateTime: ordered among its own kind only
_ILL_TYPED = -1  # the rank of a number whose form no numeric type has ("abc"^^xsd:integer): a value of no space
_NO_NUMBER_HAS = re.compile(r"[^0-9+\-.eEINFa\s]")  # (a character of no numeric form, whitespace aside)


def _instant(lexical: str) -> tuple[bool, datetime]:
    """``(has a timezone, the instant as a naive UTC datetime)`` of an xsd:dateTime (:class:`Fallback` for a
    form outside the common one: a year past 9999, 24:00:00, more than microseconds)."""
    match = _DATE_TIME_SHAPE.match(lexical)
    if match is None:
        raise _FALLBACK
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    try:
        value = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                         int((fraction or "").ljust(6, "0")))
    except ValueError:
        raise _FALLBACK from None
    if zone is None:
        return False, value
    if zone != "Z":
        offset = timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
        value = value - offset if zone[0] == "+" else value + offset
    return True, value


def _number(term: str, cache: dict[str, tuple]) -> tuple:
    """``(rank, value)`` of a literal of xsd:integer (rank 0), xsd:decimal (1), xsd:float (2), xsd:double (3) or
    xsd:dateTime (``_INSTANT``), ``(_ILL_TYPED, None)`` for one of the four numeric types with a character none of
    their forms has, ``(None, None)`` for any other term; :class:`Fallback` for another numeric type or another
    ill-typed value."""
    found = cache.get(term)
    if found is not None:
        return found
    found = _NOT_A_NUMBER
    if term[-1] == ">" and term[0] == '"':
        cut = term.rfind('"^^<')
        datatype = term[cut + 4:-1]
        number = _NUMBER.get(datatype)
        if number is not None:
            rank, shape, convert = number
            lexical = term[1:cut]
            if shape.match(lexical) is not None:
                found = (rank, convert(lexical))
            elif _NO_NUMBER_HAS.search(lexical):
                found = (_ILL_TYPED, None)
            else:
                raise _FALLBACK  # (a form another numeric type or a looser reading might take)
        elif datatype == _DATE_TIME:
            found = (_INSTANT, _instant(term[1:cut]))
        elif datatype in _NUMERIC_OTHER:
            raise _FALLBACK
    if len(cache) > 100_000:
        cache.clear()
    cache[term] = found
    return found


NO_ZONE_SPAN = timedelta(hours=14)  # a dateTime without a timezone: any instant within 14 hours of it (XSD)


def _instants(value_a: Any, value_b: Any, compare: Callable[[Any, Any], bool]) -> Any:
    """Two xsd:dateTime values compared.  One with a timezone and one without are compared as XSD does: by the span
    of 14 hours either side of the one without, an error inside it (for ``=`` too, as the W3C tests and
    :mod:`cbgp.algebra.expressions` say; pyoxigraph calls them unequal), :class:`Fallback` on its very ends."""
    if value_a[0] == value_b[0]:
        return compare(value_a[1], value_b[1])
    if compare is not operator.lt and compare is not operator.eq:
        raise _FALLBACK
    zoned, floating = (value_a[1], value_b[1]) if value_a[0] else (value_b[1], value_a[1])
    low, high = floating - NO_ZONE_SPAN, floating + NO_ZONE_SPAN
    if low < zoned < high:
        return ERROR
    if zoned < low or zoned > high:
        if compare is operator.eq:
            return False
        return (zoned < low) == value_a[0]  # (a zoned first: below the span is less; a floating first: above)
    raise _FALLBACK


_BOOLEANS = frozenset(f'"{value}"^^<{XSD}boolean>' for value in ("true", "false", "1", "0"))
_DATE_SHAPE = re.compile(rf'"(\d{{4}})-(\d\d)-(\d\d)(?:Z|[+-]\d\d:\d\d)?"\^\^<{re.escape(XSD)}date>\Z')


def _space(term: str) -> str | None:
    """The value space of a string, a language-tagged string, a boolean or a date literal (None: another term)."""
    if _simple(term):
        return "string"
    if _tagged(term):
        return "lang"
    if term in _BOOLEANS:
        return "boolean"
    match = _DATE_SHAPE.match(term)
    if match is not None:
        try:
            date(*map(int, match.groups()))
        except ValueError:
            return None  # (an ill-typed date)
        return "date"
    return None


def _two_spaces(a: str, b: str) -> bool:
    """Two literals of two of the value spaces :func:`_space` knows (never equal, never ordered)."""
    space_a, space_b = _space(a), _space(b)
    return space_a is not None and space_b is not None and space_a != space_b


def _tagged(term: str) -> bool:
    """A language-tagged literal."""
    return term[-1] != '"' and term[-1] != ">"


def _unknown(term: str) -> bool:
    """A literal of a datatype outside XSD's and RDF's namespaces: no value space, no operator."""
    return term[-1] == ">" and not term.startswith((XSD, _RDF), term.rfind('"^^<') + 4)


def _get(node: Any, key: str) -> Any:
    """An rdflib expression node's part (``CompValue.get`` answers a missing key with the key itself)."""
    return dict.get(node, key)


def _simple(term: str) -> bool:
    """A simple literal (no language, no datatype: the canonical form drops xsd:string)."""
    return term[0] == '"' and term[-1] == '"'


class _Compiler:
    def __init__(self, schema: tuple[str, ...], decode: Callable[[int], str]) -> None:
        self.schema, self.decode = schema, decode
        self.numbers: dict[str, tuple] = {}

    # --- terms -----------------------------------------------------------------------------------------
    def term(self, node: Any) -> TermFn | None:
        if isinstance(node, Variable):
            name = str(node)
            if name not in self.schema:
                return lambda row: ERROR
            index, decode = self.schema.index(name), self.decode

            def variable(row: Row) -> Any:
                value = row[index]
                return ERROR if value is None else decode(value)
            return variable
        if isinstance(node, (URIRef, Literal)) and not isinstance(node, BNode):
            constant = from_rdflib(node)
            return lambda row: constant
        function = _TERM_FUNCTIONS.get(getattr(node, "name", None))
        return None if function is None else self.applied(function, node)

    def applied(self, function: Callable[[str], Any], node: Any) -> Callable[[Row], Any] | None:
        """``function`` of the term ``node``'s argument makes (ERROR where that argument is one)."""
        arg = self.term(_get(node, "arg"))
        if arg is None:
            return None

        def call(row: Row) -> Any:
            term = arg(row)
            return ERROR if term is ERROR else function(term)
        return call

    # --- comparisons -----------------------------------------------------------------------------------
    def equal(self, a: Any, b: Any) -> Any:
        """RDFterm-equal with the value spaces' ``=`` (True, False, ERROR; :class:`Fallback`)."""
        if a is ERROR or b is ERROR:
            return ERROR
        literal_a, literal_b = a[0] == '"', b[0] == '"'
        if not (literal_a or literal_b):
            return a == b
        if literal_a != literal_b:
            return False
        found = self.by_value(a, b, operator.eq)
        if found is not None:
            return found
        if a == b:
            return True
        if (_simple(a) and _simple(b)) or _tagged(a) or _tagged(b):
            return False  # (a language-tagged string equals no other literal, as in pyoxigraph)
        if _unknown(a) or _unknown(b):
            return ERROR  # (RDFterm-equal: two literals, not the same term, one outside every value space)
        if _two_spaces(a, b):
            return False
        raise _FALLBACK

    def less(self, a: Any, b: Any) -> Any:
        """``a < b`` for two numbers, two dateTimes or two simple literals (True, False, ERROR; :class:`Fallback`),
        an error for terms of no common order.  A term is never less than itself, whatever its kind (pyoxigraph
        orders the same term as equal before any value)."""
        if a is ERROR or b is ERROR:
            return ERROR
        if a == b:
            return False
        if a[0] != '"' or b[0] != '"':
            return ERROR  # (an IRI or a blank node has no order)
        found = self.by_value(a, b, operator.lt)
        if found is not None:
            return found
        simple_a, simple_b = _simple(a), _simple(b)
        if simple_a and simple_b:
            if "\\" not in a and "\\" not in b:
                return a[1:-1] < b[1:-1]
            raise _FALLBACK
        if simple_a or simple_b or _tagged(a) != _tagged(b) or _unknown(a) or _unknown(b):
            return ERROR  # (a string against another kind of literal, or one of no value space: no order)
        if _tagged(a):  # (and b: two language-tagged strings, ordered within one language only, as in pyoxigraph)
            cut_a, cut_b = a.rfind('"@'), b.rfind('"@')
            if a[cut_a + 2:].lower() != b[cut_b + 2:].lower():
                return ERROR
            if "\\" not in a and "\\" not in b:
                return a[1:cut_a] < b[1:cut_b]
            raise _FALLBACK
        if _two_spaces(a, b):
            return ERROR
        raise _FALLBACK

    def by_value(self, a: str, b: str, compare: Callable[[Any, Any], bool]) -> Any:
        """``compare`` of two literals' values when both are numbers or both dateTimes (ERROR for NaN in an
        order, as in pyoxigraph); None when neither is such a value.  When one is: ``=`` is false and an order an
        error against a literal of another value space (a string, a boolean, a dateTime against a number), both are
        errors against one of no value space; :class:`Fallback` otherwise."""
        rank_a, value_a = _number(a, self.numbers)
        rank_b, value_b = _number(b, self.numbers)
        if rank_a is None and rank_b is None:
            return None
        if rank_a == _ILL_TYPED or rank_b == _ILL_TYPED:  # (as a literal of an unknown datatype, in pyoxigraph)
            if a == b:
                return compare is operator.eq
            return False if compare is operator.eq and (_tagged(a) or _tagged(b)) else ERROR
        if rank_a is None or rank_b is None:
            other = a if rank_a is None else b
            if other[0] == '"' and _unknown(other):
                return ERROR  # (a literal of no value space neither equals nor orders with a number, as in pyoxigraph)
            if _space(other) is not None:
                return False if compare is operator.eq else ERROR  # (another value space: never equal, no order)
            raise _FALLBACK
        if (rank_a == _INSTANT) != (rank_b == _INSTANT):
            return False if compare is operator.eq else ERROR  # (a number and a dateTime, as above)
        if rank_a == _INSTANT:
            return _instants(value_a, value_b, compare)
        if rank_a >= 2 or rank_b >= 2:  # XPath's promotion: to double if either is one, else to float
            x, y = float(value_a), float(value_b)
            if rank_a < 3 and rank_b < 3:
                x, y = _single(x), _single(y)
            if compare is operator.lt and (x != x or y != y):
                return ERROR
            return compare(x, y)
        return compare(value_a, value_b)

    def relation(self, node: Any) -> BoolFn | None:
        op = _get(node, "op")
        left = self.term(_get(node, "expr"))
        if left is None:
            return None
        if op in ("IN", "NOT IN"):
            rights = [self.term(other) for other in _get(node, "other") or ()]
            if any(right is None for right in rights):
                return None
            equal, negate = self.equal, op == "NOT IN"

            def among(row: Row) -> Any:
                a = left(row)
                error = False
                for right in rights:
                    found = equal(a, right(row))
                    if found is True:
                        return not negate
                    if found is ERROR:
                        error = True
                return ERROR if error else negate
            return among
        right = self.term(_get(node, "other"))
        if right is None:
            return None
        if op in ("=", "!="):
            equal, negate = self.equal, op == "!="

            def equality(row: Row) -> Any:
                found = equal(left(row), right(row))
                return found if found is ERROR else found != negate
            return equality
        less = self.less
        if op == "<":
            return lambda row: less(left(row), right(row))
        if op == ">":
            return lambda row: less(right(row), left(row))
        if op in ("<=", ">="):
            first, second = (left, right) if op == "<=" else (right, left)
            equal = self.equal

            def at_most(row: Row) -> Any:
                a, b = first(row), second(row)
                if a == b and a is not ERROR:
                    return True  # (the same term, NaN included: see less)
                found = less(a, b)
                return found if found is not False else equal(a, b)
            return at_most
        return None

    # --- booleans --------------------------------------------------------------------------------------
    def boolean(self, node: Any) -> BoolFn | None:
        name = getattr(node, "name", None)
        if name in ("ConditionalAndExpression", "ConditionalOrExpression"):
            parts = [self.boolean(_get(node, "expr")), *(self.boolean(o) for o in _get(node, "other") or ())]
            if any(part is None for part in parts):
                return None
            stop = name == "ConditionalOrExpression"  # the value that decides: True for ||, False for &&

            def connective(row: Row) -> Any:
                error = False
                for part in parts:
                    found = part(row)
                    if found is stop:
                        return stop
                    if found is ERROR:
                        error = True
                return ERROR if error else not stop
            return connective
        if name == "UnaryNot":
            inner = self.boolean(_get(node, "expr"))
            if inner is None:
                return None

            def negation(row: Row) -> Any:
                found = inner(row)
                return found if found is ERROR else not found
            return negation
        if name == "RelationalExpression":
            return self.relation(node)
        if name == "Builtin_BOUND":
            arg = _get(node, "arg")
            if not isinstance(arg, Variable):
                return None
            if str(arg) not in self.schema:
                return lambda row: False
            index = self.schema.index(str(arg))
            return lambda row: row[index] is not None
        if name == "Builtin_sameTerm":
            a, b = self.term(_get(node, "arg1")), self.term(_get(node, "arg2"))
            if a is None or b is None:
                return None

            def same(row: Row) -> Any:
                x, y = a(row), b(row)
                return ERROR if x is ERROR or y is ERROR else x == y  # (canonical strings: one per term)
            return same
        test = _STRING_TESTS.get(name)
        if test is not None:
            a, b = self.term(_get(node, "arg1")), self.term(_get(node, "arg2"))
            if a is None or b is None:
                return None

            simple_only = name == "Builtin_LANGMATCHES"  # (a tag and a range: two simple literals)

            def strings(row: Row) -> Any:
                x, y = a(row), b(row)
                if x is ERROR or y is ERROR or not _compatible(x, y) or (simple_only and not _simple(x)):
                    return ERROR
                if "\\" in x or "\\" in y:
                    raise _FALLBACK  # (compared escaped, "\\n" would contain "n")
                return test(x[1:x.rfind('"')], y[1:y.rfind('"')])
            return strings
        test = _KIND_TESTS.get(name)
        return None if test is None else self.applied(test, node)


def _compatible(text: str, pattern: str) -> bool:
    """SPARQL's argument compatibility of CONTAINS and its kin: two string literals (simple or language-tagged;
    no IRI, number or other datatype), the second simple or tagged as the first."""
    if text[0] != '"' or pattern[0] != '"' or text[-1] == ">" or pattern[-1] == ">":
        return False
    return _simple(pattern) or text[text.rfind('"'):] == pattern[pattern.rfind('"'):]


def _str(term: str) -> Any:
    if term[0] == "<":
        return '"' + term[1:-1] + '"'  # (an IRI holds no quote, backslash or line break: no escape to write)
    if term[0] == '"':
        return term[:term.rfind('"') + 1]
    return ERROR


def _lang(term: str) -> Any:
    if term[0] != '"':
        return ERROR
    rest = term[term.rfind('"') + 1:]
    return '"' + rest[1:] + '"' if rest[:1] == "@" else '""'


def _datatype(term: str) -> Any:
    if term[0] != '"':
        return ERROR
    rest = term[term.rfind('"') + 1:]
    if not rest:
        return f"<{XSD_STRING}>"
    return f"<{RDF_LANG_STRING}>" if rest[0] == "@" else rest[2:]


def lang_matches(tag: str, wanted: str) -> bool:
    """langMatches as SPARQL defines it (RFC 4647 basic filtering): "*" matches every non-empty tag, a range
    matches the tag equal to it or starting with it and "-", case-insensitively; so "" matches literals without
    a language tag (and a string starting "-"), as in pyoxigraph and Jena (rdflib matches nothing to "")."""
    tag, wanted = tag.lower(), wanted.lower()
    if wanted == "*":
        return tag != ""
    return tag == wanted or tag.startswith(wanted + "-")


_TERM_FUNCTIONS: dict[str, Callable[[str], Any]] = {
    "Builtin_STR": _str, "Builtin_LANG": _lang, "Builtin_DATATYPE": _datatype}
_STRING_TESTS: dict[str, Callable[[str, str], bool]] = {
    "Builtin_CONTAINS": lambda text, part: part in text, "Builtin_STRSTARTS": str.startswith,
    "Builtin_STRENDS": str.endswith, "Builtin_LANGMATCHES": lang_matches}
_KIND_TESTS: dict[str, Callable[[str], bool]] = {
    "Builtin_isIRI": is_iri, "Builtin_isURI": is_iri, "Builtin_isBLANK": is_bnode, "Builtin_isLITERAL": is_literal}


def compile_filter(expr: Any, schema: tuple[str, ...], decode: Callable[[int], str]) -> Callable[[Row], bool] | None:
    """A function of a row (term ids in ``schema``'s order, None when unbound) giving the FILTER's verdict, or
    raising :class:`Fallback` for a row it is not sure of; None when ``expr`` has a shape not listed above."""
    fn = _Compiler(schema, decode).boolean(expr)
    if fn is None:
        return None

    def verdict(row: Row) -> bool:
        return fn(row) is True
    return verdict


def compile_term(expr: Any, schema: tuple[str, ...], decode: Callable[[int], str]) -> Callable[[Row], Any] | None:
    """A function of a row giving the term ``STR``, ``LANG`` or ``DATATYPE`` of a variable makes (its canonical
    string; None where SPARQL has an error, an unbound variable say), or None for any other expression."""
    if getattr(expr, "name", None) not in _TERM_FUNCTIONS or not isinstance(_get(expr, "arg"), Variable):
        return None
    fn = _Compiler(schema, decode).term(expr)

    def value(row: Row) -> Any:
        term = fn(row)  # type: ignore[misc]
        return None if term is ERROR else term
    return value


__all__ = ["ERROR", "INTEGER_TYPES", "NO_ZONE_SPAN", "Fallback", "compile_filter", "compile_term", "lang_matches"]
