"""Term ids <-> rdflib terms, SPARQL expression evaluation and the SPARQL ORDER BY order.

Expressions are evaluated by rdflib's own SPARQL expression evaluator (the
`Expr.eval` functions rdflib's algebra attaches, `_ebv` for filters), so
effective boolean values, type errors and the function library follow rdflib;
terms are decoded from their ids once and cached.  FILTERs of the common
shapes are compiled instead (`cbgp.algebra.fast_filters`), and hand rdflib
the rows they are not sure of.  Values an expression
computes (not copied from the solution) are written in the canonical lexical
form pyoxigraph writes them (`2` not `2.0` for decimals and doubles), so that
a `BIND(?x + 1 AS ?y)` answer is the same term whichever engine computed it.
"""

from __future__ import annotations

import math
import re

from decimal import Context, Decimal, InvalidOperation
from typing import Any

from rdflib import RDF, BNode, Literal, Node, URIRef, Variable
from rdflib.plugins.sparql.evalutils import _ebv, _eval
from rdflib.plugins.sparql.sparql import FrozenBindings, QueryContext, SPARQLError

from cbgp.algebra.fast_filters import INTEGER_TYPES as _INTEGER_TYPES
from cbgp.algebra.fast_filters import NO_ZONE_SPAN, Fallback, compile_filter, compile_term, lang_matches
from cbgp.algebra.regex import regex, replace
from cbgp.terms import XSD, TermDictionary, from_rdflib, split_literal

NUMERIC_TYPES = _INTEGER_TYPES | {XSD + "decimal", XSD + "float", XSD + "double"}


def to_rdflib(term: str):  # noqa: ANN201
    if term.startswith("<"):
        return URIRef(term[1:-1])
    if term.startswith("_:"):
        return BNode(term[2:])
    lexical, language, datatype = split_literal(term)
    if language:
        return Literal(lexical, lang=language)
    if datatype:
        return Literal(lexical, datatype=URIRef(datatype), normalize=False)
    return Literal(lexical)


class Terms:
    """The dictionary seen as rdflib terms, with the evaluation context expressions need."""

    def __init__(self, dictionary: TermDictionary, prologue: Any = None) -> None:
        self.dictionary = dictionary
        self._rdflib: dict[int, Any] = {}
        self._keys: dict[int, tuple] = {}
        self._numbers: dict[int, tuple | None] = {}
        self._fast: dict[tuple, tuple] = {}  # (compiler, id(expr), schema) -> (expr, compiled or None)
        self._released: list[int] = []  # held terms let go: out of the caches above at forget_released()
        self.ctx = QueryContext(initBindings={})
        if prologue is not None:
            self.ctx.prologue = prologue

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fast"] = {}  # (compiled functions do not pickle; they are made again at the first row)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("_released", [])  # (older checkpoints)

    def release(self, term_id: int) -> None:
        """Let go of a term this query's operators held (``TermDictionary.hold``)."""
        self.dictionary.release(term_id)
        self._released.append(term_id)

    def forget_released(self) -> None:
        """Drop the terms let go from the caches: called before a change, once the retractions that named them
        went through (an id freed and made again is the same term, so a late entry is only memory)."""
        released = self._released
        if released:
            for cache in (self._rdflib, self._keys, self._numbers):
                if cache:
                    for term_id in released:
                        cache.pop(term_id, None)
            released.clear()

    def rdflib(self, term_id: int):  # noqa: ANN201
        found = self._rdflib.get(term_id)
        if found is None:
            found = self._rdflib[term_id] = to_rdflib(self.dictionary.decode(term_id))
        return found

    def encode_rdflib(self, term, inputs: dict | None = None, hold: bool = False) -> int:  # noqa: ANN001
        """Id of an rdflib term an expression produced, computed values in oxigraph's canonical form (``hold``:
        held, ``TermDictionary.hold``)."""
        encode = self.dictionary.hold if hold else self.dictionary.encode
        if isinstance(term, Literal) and inputs and any(
                isinstance(v, Literal) and str(v) == str(term) and v.datatype == term.datatype
                and v.language == term.language for v in inputs.values()):
            return encode(from_rdflib(term))
        return encode(canonical(term))

    def bindings(self, schema: tuple[str, ...], row: tuple) -> FrozenBindings:
        rdf = self.rdflib
        return FrozenBindings(self.ctx, {Variable(v): rdf(x) for v, x in zip(schema, row) if x is not None})

    def _compiled(self, compiler, expr, schema: tuple[str, ...]):  # noqa: ANN001, ANN202
        """``compiler``'s function of ``expr`` over rows of ``schema`` (None: rdflib evaluates it), made once."""
        key = (compiler, id(expr), schema)
        entry = self._fast.get(key)
        if entry is None or entry[0] is not expr:  # (an id is reused only once its expression is gone)
            entry = self._fast[key] = (expr, compiler(expr, schema, self.dictionary.decode))
        return entry[1]

    def ebv(self, expr, schema: tuple[str, ...], row: tuple) -> bool:  # noqa: ANN001
        compiled = self._compiled(compile_filter, expr, schema)
        if compiled is not None:
            try:
                return compiled(row)
            except (Fallback, KeyError):
                pass  # (rdflib decides, as for every filter the compiler does not cover)
        try:
            return bool(_ebv(expr, self.bindings(schema, row)))
        except (SPARQLError, ValueError, TypeError, ArithmeticError, AttributeError, KeyError):
            return False  # an error rdflib let through is still an error: the filter rejects

    def value(self, expr, schema: tuple[str, ...], row: tuple, hold: bool = False) -> int | None:  # noqa: ANN001
        """Id of the expression's value on a row, None on an error (unbound variable included); ``hold``: the
        value is held once more (``TermDictionary.hold``; a kept term needs nothing)."""
        if isinstance(expr, Variable):
            name = str(expr)
            for v, x in zip(schema, row):
                if v == name:
                    if hold and x is not None:
                        self.dictionary.hold_id(x)
                    return x
            return None
        compiled = self._compiled(compile_term, expr, schema)
        if compiled is not None:
            try:
                term = compiled(row)
            except KeyError:
                return None
            if term is None:
                return None
            return self.dictionary.hold(term) if hold else self.dictionary.encode(term)
        bindings = self.bindings(schema, row)
        try:
            result = _eval(expr, bindings)
        except SPARQLError:
            return None
        except (ValueError, TypeError, ArithmeticError, InvalidOperation, AttributeError, KeyError):
            # rdflib lets some errors through
            return None
        if isinstance(result, SPARQLError) or result is None:
            return None
        if not isinstance(result, (URIRef, BNode, Literal)):
            return None
        return self.encode_rdflib(result, dict(bindings), hold)

    def numeric(self, term_id: int) -> tuple[int, Any] | None:
        """(rank 0 integer / 1 decimal / 2 float / 3 double, value) of a numeric literal, else None."""
        try:
            return self._numbers[term_id]
        except KeyError:
            pass
        term = self.dictionary.decode(term_id)
        found = None
        if term.startswith('"'):
            lexical, _language, datatype = split_literal(term)
            if datatype in NUMERIC_TYPES:
                number = numeric_value(lexical, datatype)
                if number is not None:
                    rank = 0 if datatype in _INTEGER_TYPES else {XSD + "decimal": 1, XSD + "float": 2}.get(datatype, 3)
                    found = (rank, number)
        self._numbers[term_id] = found
        return found

    def order_key(self, term_id: int | None) -> tuple:
        """The SPARQL ORDER BY order: unbound < blank nodes < IRIs < literals (numbers by value first)."""
        if term_id is None:
            return (0,)
        found = self._keys.get(term_id)
        if found is None:
            found = self._keys[term_id] = order_key(self.dictionary.decode(term_id))
        return found


class Descending:
    """A sort key in reverse (DESC): compares the other way round."""

    __slots__ = ("key",)

    def __init__(self, key: tuple) -> None:
        self.key = key

    def __lt__(self, other: "Descending") -> bool:
        return other.key < self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Descending) and other.key == self.key


def order_key(term: str) -> tuple:
    if term.startswith("_:"):
        return (1, term)
    if term.startswith("<"):
        return (2, term)
    lexical, language, datatype = split_literal(term)
    if datatype in NUMERIC_TYPES:
        number = numeric_value(lexical, datatype)
        if number is not None:
            return (3, 1, number, term)
    if language:
        return (3, 3, lexical, language)
    if datatype is None:
        return (3, 2, lexical, "")
    if datatype == XSD + "boolean":
        return (3, 0, lexical in ("true", "1"), term)
    return (3, 4, datatype, lexical)


def numeric_value(lexical: str, datatype: str):  # noqa: ANN201
    try:
        if datatype in _INTEGER_TYPES:
            return int(lexical.strip())
        if datatype == XSD + "decimal":
            return Decimal(lexical.strip())
        value = float(lexical.strip().replace("INF", "inf"))
        return value
    except (ValueError, InvalidOperation):
        return None


def canonical(term) -> str:  # noqa: ANN001
    """Canonical string of a computed rdflib term, numbers written as pyoxigraph writes them."""
    if isinstance(term, Literal) and term.datatype is not None and str(term.datatype) in NUMERIC_TYPES:
        datatype = str(term.datatype)
        value = term.toPython()
        if datatype in _INTEGER_TYPES and isinstance(value, int) and not isinstance(value, bool):
            return f'"{value}"^^<{datatype}>'
        if datatype == XSD + "decimal" and isinstance(value, (Decimal, int)):
            return f'"{format_decimal(Decimal(value))}"^^<{datatype}>'
        if datatype in (XSD + "double", XSD + "float") and isinstance(value, (float, int, Decimal)):
            return f'"{format_double(float(value))}"^^<{datatype}>'
    return from_rdflib(term)


def format_decimal(value: Decimal) -> str:
    text = format(value.normalize(Context(prec=100)), "f") if value != 0 else "0"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text or "0"


def format_double(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "INF" if value > 0 else "-INF"
    if value == int(value) and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


# --- comparisons -----------------------------------------------------------------------------------
# rdflib orders literals of unrelated types (a string "greater" than a number) where SPARQL has a type error;
# `strict_comparisons` makes `<`, `>`, `<=`, `>=` of an algebra raise that error first, and `=`, `!=` of
# literals outside the value spaces it knows follow RDFterm-equal; STRDT takes simple literals only; a product of
# integers is an integer.

_ORDERED = {XSD + "dateTime": "dateTime", XSD + "date": "date", XSD + "time": "time", XSD + "string": "string"}


def _category(term: Literal) -> tuple | None:
    datatype = str(term.datatype) if term.datatype is not None else None
    if term.language:
        return ("lang", term.language.lower())
    if datatype is None:
        return ("string",)
    if datatype in NUMERIC_TYPES:
        return ("numeric",) if numeric_value(str(term), datatype) is not None else None
    kind = _ORDERED.get(datatype)
    if kind is None:
        return None
    if kind != "string" and term.value is None:
        return None  # ill-typed date/time
    return (kind,)


_BOOLEANS = {"true", "false", "1", "0"}
_TIMEZONE = re.compile(r"(Z|[+-]\d\d:\d\d)$")


def _strict_relational(e, ctx):  # noqa: ANN001, ANN202
    from rdflib.plugins.sparql.operators import RelationalExpression

    if e.other is not None and e.op in ("<", ">", "<=", ">="):
        a, b = e.expr, e.other
        if isinstance(a, (URIRef, BNode)) and a == b:
            return Literal(e.op in ("<=", ">="))  # (the same term orders as equal, as in pyoxigraph; others err)
        if isinstance(a, Literal) and isinstance(b, Literal):
            ca, cb = _category(a), _category(b)
            if ca is None or ca != cb:
                raise SPARQLError(f"cannot compare {a.n3()} and {b.n3()}")
            if _one_timezone(a, b):
                x, y = _far_instants(a, b)
                return Literal(x < y if e.op in ("<", "<=") else x > y)  # (never equal, so far apart)
    elif e.other is not None and e.op in ("=", "!="):
        found = _strict_equal(e.expr, e.other)
        if found is not None:
            return Literal(found == (e.op == "="))
    elif e.op in ("IN", "NOT IN"):
        # SPARQL's IN is the || of "=" with each item (an error unless one is true); rdflib's compares the
        # terms and never errs, so ("abc" IN ("x"^^<dt>)) was false where it is an error.
        found = _among(e.expr, [] if e.other is None or e.other == RDF.nil else e.other)
        return Literal(found == (e.op == "IN"))
    return RelationalExpression(e, ctx)


def _strict_equal(a: Any, b: Any) -> bool | None:
    """SPARQL's ``a = b`` where rdflib's differs (None: rdflib's is SPARQL's); raises SPARQLError for a type error."""
    if isinstance(a, SPARQLError):
        raise a
    if isinstance(b, SPARQLError):
        raise b
    # RDFterm-equal where no operator of the value space applies (a datatype we do not know, an ill-typed
    # value): the same term is equal, two other literals are a type error (rdflib says "not equal").
    if (isinstance(a, Literal) and isinstance(b, Literal) and not a.language and not b.language
            and (_unknown(a) or _unknown(b))):  # (a language-tagged string equals no other literal)
        if _same_term(a, b):
            return True
        raise SPARQLError(f"cannot tell whether {a.n3()} and {b.n3()} are equal")
    if _one_timezone(a, b):
        _far_instants(a, b)  # (within 14 hours a type error, as the W3C tests; pyoxigraph says unequal there too)
        return False
    return None


def _far_instants(a: Literal, b: Literal) -> tuple:
    """The instants of two dates or dateTimes, one with a timezone and one without.  XSD compares them as the latter
    at every timezone (14 hours either side): further apart they are ordered and unequal; closer it is
    indeterminate, a type error (the W3C tests)."""
    x, y = _instant(a), _instant(b)
    if abs(x - y) <= NO_ZONE_SPAN:
        raise SPARQLError(f"cannot compare {a.n3()} and {b.n3()}: one has a timezone, and they are within 14 hours")
    return x, y


def _among(a: Any, items: list) -> bool:
    """``a IN (items)``: true when ``a = item`` for one of them, else a type error if one of them was, else false."""
    error: SPARQLError | None = None
    for item in items:
        try:
            found = _strict_equal(a, item)
            if found is None:
                if not (isinstance(a, Node) and isinstance(item, Node)):
                    raise SPARQLError(f"cannot compare {a!r} and {item!r}")
                if not (isinstance(a, Literal) and isinstance(item, Literal)):
                    found = a == item  # (RDFterm-equal: an IRI or blank node equals only itself)
                else:
                    found = a.eq(item)
                    if found is NotImplemented:
                        raise SPARQLError(f"cannot compare {a.n3()} and {item.n3()}")
        except SPARQLError as exc:
            error = exc
        except TypeError as exc:
            error = SPARQLError(*exc.args)
        else:
            if found:
                return True
    if error is not None:
        raise error
    return False


def _strict_and(e, ctx):  # noqa: ANN001, ANN202
    """``&&`` as SPARQL: false when one operand is false, even if another is an error (rdflib errs then)."""
    from rdflib.plugins.sparql.operators import EBV

    if e.other is None:
        return e.expr
    error: SPARQLError | None = None
    for operand in [e.expr, *e.other]:
        try:
            if not EBV(operand):
                return Literal(False)
        except SPARQLError as exc:
            error = exc
    if error is not None:
        raise error
    return Literal(True)


def _one_timezone(a: Any, b: Any) -> bool:
    """Two well-typed xsd:date (or two xsd:dateTime) literals of which exactly one has a timezone."""
    if not (isinstance(a, Literal) and isinstance(b, Literal)) or a.datatype is None or a.datatype != b.datatype:
        return False
    if str(a.datatype) not in (XSD + "date", XSD + "dateTime") or a.value is None or b.value is None:
        return False
    return bool(_TIMEZONE.search(str(a))) != bool(_TIMEZONE.search(str(b)))  # (rdflib drops a date's timezone)


def _instant(term: Literal) -> Any:
    """A date's or dateTime's start as a naive datetime in UTC (as written when it has no timezone)."""
    from datetime import datetime, timedelta, timezone

    value = term.value
    if isinstance(value, datetime):
        return value.astimezone(timezone.utc).replace(tzinfo=None) if value.tzinfo is not None else value
    start = datetime(value.year, value.month, value.day)
    zone = _TIMEZONE.search(str(term))
    if zone is None or zone.group(1) == "Z":
        return start
    diff = 1 if zone.group(1)[0] == "+" else -1
    hours, minutes = int(zone.group(1)[1:3]), int(zone.group(1)[4:6])
    return start - diff * timedelta(hours=hours, minutes=minutes)


def _unknown(term: Literal) -> bool:
    """A literal no operator's value space covers: a datatype outside XSD, or an ill-typed number or boolean."""
    if term.datatype is None or term.language:
        return False
    datatype = str(term.datatype)
    if not datatype.startswith(XSD):
        return True
    if datatype in NUMERIC_TYPES:
        return numeric_value(str(term), datatype) is None
    return datatype == XSD + "boolean" and str(term) not in _BOOLEANS


def _same_term(a: Literal, b: Literal) -> bool:
    return (str(a) == str(b) and a.datatype == b.datatype
            and (a.language or "").lower() == (b.language or "").lower())


def _strict_strdt(e, ctx):  # noqa: ANN001, ANN202
    from rdflib.plugins.sparql.operators import Builtin_STRDT

    lexical = e.arg1
    if not isinstance(lexical, Literal) or lexical.language or (
            lexical.datatype is not None and str(lexical.datatype) != XSD + "string"):
        raise SPARQLError(f"STRDT expects a simple literal, not {lexical.n3()}")  # (rdflib takes any)
    return Builtin_STRDT(e, ctx)


_PROMOTION = ("integer", "decimal", "float", "double")  # XPath's numeric type promotion, narrowest first


def _typed_multiplicative(e, ctx):  # noqa: ANN001, ANN202
    """``*`` and ``/`` with XPath's numeric types: integer * integer is an integer, a double makes a double,
    integer / integer a decimal (rdflib computes everything in Decimal and answers xsd:decimal)."""
    if e.other is None:
        return e.expr
    operands = [e.expr, *e.other]
    values, rank = [], 0
    for x in operands:
        datatype = str(x.datatype) if isinstance(x, Literal) and x.datatype is not None else None
        value = numeric_value(str(x), datatype) if datatype in NUMERIC_TYPES else None
        if value is None:
            raise SPARQLError(f"not a number: {x.n3() if hasattr(x, 'n3') else x!r}")
        kind = "integer" if datatype in _INTEGER_TYPES else datatype[len(XSD):]
        rank = max(rank, _PROMOTION.index(kind))
        values.append(value)
    if rank == 0 and "/" in e.op:
        rank = 1  # integer division is a decimal
    kind = _PROMOTION[rank]
    exact = kind in ("integer", "decimal")
    result = Decimal(values[0]) if exact else float(values[0])
    for op, value in zip(e.op, values[1:]):
        value = Decimal(value) if exact else float(value)
        if op == "*":
            result = result * value
        elif value == 0:
            if exact:
                raise SPARQLError("divide by 0")
            result = float("nan") if result == 0 or result != result else math.copysign(float("inf"), result)
        else:
            result = result / value
    if kind == "integer":
        return Literal(int(result), datatype=URIRef(XSD + "integer"))
    return Literal(result, datatype=URIRef(XSD + kind))


def _basic_langmatches(e, ctx) -> Any:  # noqa: ANN001
    """langMatches as SPARQL defines it (``fast_filters.lang_matches``), not rdflib's."""
    from rdflib.plugins.sparql.operators import string

    tag, pattern = e.arg1, e.arg2
    for arg in (tag, pattern):
        if isinstance(arg, Literal) and arg.language:
            raise SPARQLError(f"langMatches takes simple literals, not {arg.n3()}")  # (as pyoxigraph; rdflib took it)
    return Literal(lang_matches(str(string(tag)), str(string(pattern))))


def _arguments(e) -> list:  # noqa: ANN001
    """A term test's arguments (isIRI, sameTerm, ...), an error when one is, as SPARQL's tests are (rdflib's answer
    false then: ``!isIRI(STR(?unbound))`` was true).  The tests are module functions: checkpoints pickle them by
    name (``cbgp.algebra.pickling``)."""
    args = [e.arg] if "arg" in e else [e.arg1, e.arg2]
    for arg in args:
        if isinstance(arg, SPARQLError):
            raise arg
    return args


def _is_iri(e, ctx):  # noqa: ANN001, ANN202
    return Literal(isinstance(_arguments(e)[0], URIRef))


def _is_blank(e, ctx):  # noqa: ANN001, ANN202
    return Literal(isinstance(_arguments(e)[0], BNode))


def _is_literal(e, ctx):  # noqa: ANN001, ANN202
    return Literal(isinstance(_arguments(e)[0], Literal))


def _is_numeric(e, ctx):  # noqa: ANN001, ANN202
    from rdflib.plugins.sparql.operators import numeric

    (term,) = _arguments(e)
    try:
        numeric(term)
    except Exception:  # noqa: BLE001 - rdflib's Builtin_isNUMERIC: anything numeric() refuses is not a number
        return Literal(False)
    return Literal(True)


def _is_same_term(e, ctx):  # noqa: ANN001, ANN202
    a, b = _arguments(e)
    return Literal(a == b)


_TESTS = {"Builtin_isIRI": _is_iri, "Builtin_isURI": _is_iri, "Builtin_isBLANK": _is_blank,
          "Builtin_isLITERAL": _is_literal, "Builtin_isNUMERIC": _is_numeric, "Builtin_sameTerm": _is_same_term}
_STRICTER = {"RelationalExpression": _strict_relational, "ConditionalAndExpression": _strict_and, **_TESTS,
             "Builtin_STRDT": _strict_strdt,
             "MultiplicativeExpression": _typed_multiplicative, "Builtin_LANGMATCHES": _basic_langmatches,
             "Builtin_REGEX": regex, "Builtin_REPLACE": replace}


def strict_comparisons(node) -> None:  # noqa: ANN001
    """Give every expression under `node` (an rdflib algebra) whose rdflib semantics differ from SPARQL's the
    SPARQL one (comparisons, IN, &&, the term tests, STRDT, typed arithmetic, langMatches; REGEX and REPLACE in
    linear time, ``cbgp.algebra.regex``), in place; idempotent."""
    from types import MethodType

    from rdflib.plugins.sparql.parserutils import CompValue, Expr

    seen: set[int] = set()

    def walk(n) -> None:  # noqa: ANN001
        if id(n) in seen:
            return
        seen.add(id(n))
        if isinstance(n, CompValue):
            if isinstance(n, Expr) and n.name in _STRICTER:
                n._evalfn = MethodType(_STRICTER[n.name], n)
            for key, value in n.items():
                if key != "_vars":
                    walk(value)
        elif isinstance(n, (list, tuple)):
            for value in n:
                walk(value)
        elif isinstance(n, dict):
            for value in n.values():
                walk(value)

    walk(node)


def expression_variables(expr: Any) -> set[str]:
    from rdflib import Variable
    from rdflib.plugins.sparql.parserutils import CompValue

    out: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, Variable):
            out.add(str(node))
        elif isinstance(node, CompValue):
            for key, value in node.items():
                if key != "_vars":
                    walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(expr)
    return out
