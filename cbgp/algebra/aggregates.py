"""GROUP BY with aggregates, maintained incrementally: COUNT [DISTINCT], SUM and AVG kept exactly under
insertions and deletions, MIN, MAX, SAMPLE, GROUP_CONCAT [DISTINCT], HAVING.  An operator of
`cbgp.algebra.operators` (same contract: `out = f(in)` after each input delta).
"""

from __future__ import annotations

import math
from decimal import ROUND_DOWN, Context, Decimal
from fractions import Fraction
from typing import Any

from cbgp.algebra.operators import Delta, Operator, Row, add
from cbgp.algebra.expressions import Terms, format_decimal, format_double
from cbgp.query.limits import limit
from cbgp.terms import DEFAULT_MAX_TERM_BYTES, MAX_TERM_SETTING, XSD, literal, split_literal


_ERROR = object()


class _Sum:
    """SUM/AVG of one group, kept exactly under insertions and deletions: integers as int, decimals as Decimal
    (100 digits), floats as Fraction (every float is a fraction, so removing one restores the sum exactly and
    the double result is the correctly rounded sum, as math.fsum gives); NaN and infinities are counted."""

    __slots__ = ("errors", "count", "ranks", "integer", "decimal", "fraction", "special")

    def __init__(self) -> None:
        self.errors = 0
        self.count = 0
        self.ranks = [0, 0, 0, 0]
        self.integer = 0
        self.decimal = Decimal(0)
        self.fraction = Fraction(0)
        self.special: dict[float, int] = {}

    def add(self, parsed: tuple | None, w: int) -> None:
        if parsed is None:
            self.errors += w
            return
        rank, number = parsed
        self.ranks[rank] += w
        self.count += w
        if isinstance(number, float):
            if math.isfinite(number):
                self.fraction += Fraction(number) * w
            else:
                key = repr(number)
                self.special[key] = self.special.get(key, 0) + w
        elif rank == 1:
            self.decimal = _EXACT.add(self.decimal, _EXACT.multiply(number, w))
        else:
            self.integer += number * w


_EXACT = Context(prec=100)


class _Group:
    __slots__ = ("n", "values", "row", "cache", "counts", "sums", "lengths")

    def __init__(self, n_aggregates: int, kinds: tuple = ()) -> None:
        self.sums = [_Sum() if kind in _SUMS else None for kind in kinds]
        # GROUP_CONCAT: the length of its value (lexical forms and separators), kept as values come and go, so a
        # group past the term limit is unbound without sorting it (a sort of the whole group per change otherwise)
        self.lengths = [0 if kind == "Aggregate_GroupConcat" else None for kind in kinds]
        self.n = 0
        self.values: list[dict] = [{} for _ in range(n_aggregates)]
        self.counts = [0] * n_aggregates  # COUNT: bound values (with multiplicity, or distinct ones)
        self.row: Row | None = None
        # Per aggregate: its last value, or _DIRTY when a change may have moved it (MIN/MAX/SAMPLE keep
        # theirs on most changes: a new value is compared with it, and only removing it forces a rescan).
        self.cache: list = [_DIRTY] * n_aggregates


_DIRTY = object()
_EXTREMES = ("Aggregate_Min", "Aggregate_Max", "Aggregate_Sample")
_SUMS = ("Aggregate_Sum", "Aggregate_Avg")
_COMPUTED = ("Aggregate_Count", "Aggregate_Sum", "Aggregate_Avg", "Aggregate_GroupConcat")


def _separator(a: Any) -> str:
    """A GROUP_CONCAT's separator (a space unless SEPARATOR says)."""
    return " " if a.separator is None else str(a.separator)


class Aggregate(Operator):
    """GROUP BY + aggregates: per group, the multiset of each aggregate's argument values.

    A changed group's old row is retracted and its new row asserted in the same delta.
    Without GROUP BY the one group exists even when empty (COUNT 0).
    """

    name = "Aggregate"

    def __init__(self, child: Operator, group_exprs: list | None, aggregates: list, terms: Terms) -> None:
        super().__init__([child])
        self.group_exprs = group_exprs
        self.aggregates = aggregates
        self.terms = terms
        self.schema = tuple(sorted(str(a.res) for a in aggregates))
        order = {v: i for i, v in enumerate(self.schema)}
        self.positions = [order[str(a.res)] for a in aggregates]
        self.certain = frozenset(str(a.res) for a in aggregates if a.name == "Aggregate_Count")
        self.groups: dict[tuple, _Group] = {}
        # (kind, argument expression or None for *, DISTINCT) read once: rdflib's attribute access is slow.
        self.specs = [(a.name, None if dict.get(a, "vars") == "*" else dict.get(a, "vars"),
                       bool(dict.get(a, "distinct"))) for a in aggregates]
        self.kinds = tuple(kind for kind, _, _ in self.specs)
        self._derive()

    def _derive(self) -> None:
        """What follows from the aggregates: the columns whose values the operator computes and holds
        (TermDictionary.hold: each group's row holds them once, let go when the row is replaced or retracted; MIN,
        MAX and SAMPLE pick input terms), and each GROUP_CONCAT's separator length."""
        self.held = tuple(p for a, p in zip(self.aggregates, self.positions) if a.name in _COMPUTED)
        self.separators = [len(_separator(a)) if a.name == "Aggregate_GroupConcat" else 0 for a in self.aggregates]

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if "held" not in state or "separators" not in state:  # (an older checkpoint: its rows' values were kept
            # for good, so letting go of them is harmless)
            self._derive()

    def _lexical_length(self, v: int) -> int:
        """What value ``v`` adds to a GROUP_CONCAT (its lexical form; a term that is no simple or language-tagged
        literal makes the result an error whatever the length)."""
        term = self.terms.dictionary.decode(v)
        return len(split_literal(term)[0]) if term.startswith('"') else len(term)

    def _lengths(self, group: _Group) -> list:
        """The group's GROUP_CONCAT lengths (counted from its values for a group checkpointed without them)."""
        lengths = getattr(group, "lengths", None)
        if lengths is None:
            lengths = group.lengths = [None] * len(self.aggregates)
            for i, (kind, _arg, distinct) in enumerate(self.specs):
                if kind == "Aggregate_GroupConcat":
                    lengths[i] = sum((self._lexical_length(v) + self.separators[i]) * (1 if distinct else m)
                                     for v, m in group.values[i].items() if v is not None and m > 0)
        return lengths

    def _let_go(self, row: Row) -> None:
        release = self.terms.release
        for p in self.held:
            if row[p] is not None:
                release(row[p])

    def start(self) -> None:
        super().start()
        if not self.group_exprs and () not in self.groups:
            group = self.groups[()] = _Group(len(self.aggregates), self.kinds)
            group.row = self.compute(group)
            self.emit({group.row: 1})

    def receive(self, slot: int, delta: Delta) -> None:
        self.deltas_in += len(delta)
        self.terms.forget_released()
        schema = self.children[0].schema
        value = self.terms.value
        touched: dict[tuple, _Group] = {}
        for row, n in delta.items():
            key = tuple(value(e, schema, row) for e in self.group_exprs) if self.group_exprs else ()
            group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = _Group(len(self.aggregates), self.kinds)
            group.n += n
            for i, (kind, arg, distinct) in enumerate(self.specs):
                values = group.values[i]
                v = row if arg is None else value(arg, schema, row)
                if kind == "Aggregate_Count":
                    if v is not None:
                        if not distinct:
                            group.counts[i] += n  # no multiset needed
                            continue
                        old = values.get(v, 0)
                        if old <= 0 < old + n:
                            group.counts[i] += 1
                        elif old + n <= 0 < old:
                            group.counts[i] -= 1
                        add(values, v, n)
                    continue
                if kind in _SUMS:
                    if distinct:
                        old = values.get(v, 0)
                        add(values, v, n)
                        w = 1 if old <= 0 < old + n else (-1 if old + n <= 0 < old else 0)
                    else:
                        w = n  # no multiset needed
                    if w:
                        group.sums[i].add(None if v is None else self.terms.numeric(v), w)
                    group.cache[i] = _DIRTY
                    continue
                if kind == "Aggregate_GroupConcat" and v is not None:
                    old = values.get(v, 0)
                    w = (1 if old <= 0 < old + n else (-1 if old + n <= 0 < old else 0)) if distinct else n
                    if w:
                        self._lengths(group)[i] += w * (self._lexical_length(v) + self.separators[i])
                add(values, v, n)
                if kind in _EXTREMES:
                    self._hint(group, i, kind, v, n, values)
                else:
                    group.cache[i] = _DIRTY
            touched[key] = group
        out: Delta = {}
        for key, group in touched.items():
            if group.n > 0 or not self.group_exprs:
                new = self.compute(group)
            else:
                new = None
                del self.groups[key]
            old = group.row
            if new != old:
                if old is not None:
                    add(out, old, -1)
                if new is not None:
                    add(out, new, 1)
                group.row = new
                if old is not None and self.held:
                    self._let_go(old)
            elif new is not None and self.held:
                self._let_go(new)  # (the same values again: the row holds them once)
        self.emit(out)

    def _sum_result(self, kind: str, state: _Sum) -> int | None:
        encode = self.terms.dictionary.hold
        if state.errors > 0:
            return None  # a value that is not a number: SUM and AVG are errors, the variable unbound
        if state.count == 0:
            return encode(literal("0", None, XSD + "integer"))
        rank = max(r for r in range(4) if state.ranks[r] > 0)
        if rank >= 2:
            total: Any = float(Fraction(state.integer) + Fraction(state.decimal) + state.fraction)
            for key, n in state.special.items():
                if n > 0:
                    total += float(key)
        elif rank == 1:
            total = _EXACT.add(Decimal(state.integer), state.decimal)
        else:
            total = state.integer
        if kind == "Aggregate_Sum":
            return encode(_number_literal(total, rank))
        if rank <= 1:
            quotient = _EXACT.divide(Decimal(total), Decimal(state.count))
            return encode(_number_literal(quotient.quantize(Decimal(1).scaleb(-18), rounding=ROUND_DOWN), 1))
        return encode(_number_literal(float(total) / state.count, rank))

    def _hint(self, group: _Group, i: int, kind: str, v: Any, n: int, values: dict) -> None:
        cached = group.cache[i]
        if cached is _DIRTY:
            return
        if v is None:  # an error value: MIN/MAX become unbound, SAMPLE ignores it
            if kind != "Aggregate_Sample":
                group.cache[i] = _DIRTY
            return
        if None in values and kind != "Aggregate_Sample":
            return  # still unbound (cached None)
        if n > 0:
            if cached is None:
                group.cache[i] = _DIRTY
            elif self._better(kind, v, cached):
                group.cache[i] = v
        elif v == cached and v not in values:
            group.cache[i] = _DIRTY

    def _better(self, kind: str, v: int, than: int) -> bool:
        key = self._extreme_key
        if kind == "Aggregate_Max":
            return key(v) > key(than)
        return key(v) < key(than)

    def _extreme_key(self, v: int) -> tuple:
        return (self.terms.order_key(v), self.terms.dictionary.decode(v))

    def compute(self, group: _Group) -> Row:
        row: list = [None] * len(self.schema)
        for i, (a, values, position) in enumerate(zip(self.aggregates, group.values, self.positions)):
            cached = group.cache[i]
            if a.name == "Aggregate_Count":
                cached = self.terms.dictionary.hold(literal(str(group.counts[i]), None, XSD + "integer"))
            elif a.name in _SUMS:
                cached = self._sum_result(a.name, group.sums[i])
            elif cached is _DIRTY:
                if a.name == "Aggregate_GroupConcat" and self._lengths(group)[i] > limit(MAX_TERM_SETTING,
                                                                                           DEFAULT_MAX_TERM_BYTES):
                    row[position] = None  # past the fleet's term limit: an error, so unbound
                    continue
                cached = self.aggregate(a, values)
                if a.name in _EXTREMES:
                    group.cache[i] = cached
            row[position] = cached
        return tuple(row)

    def aggregate(self, a: Any, values: dict) -> int | None:
        kind = a.name
        distinct = bool(a.distinct)
        encode = self.terms.dictionary.hold
        if kind == "Aggregate_Count":
            if distinct:
                count = sum(1 for v in values if v is not None)
            else:
                count = sum(m for v, m in values.items() if v is not None)
            return encode(literal(str(count), None, XSD + "integer"))
        if kind == "Aggregate_Sample":
            present = [v for v in values if v is not None]
            return min(present, key=self._extreme_key) if present else None
        if None in values:
            return None  # an error in the argument of SUM, AVG, MIN, MAX, GROUP_CONCAT: unbound
        if kind in ("Aggregate_Min", "Aggregate_Max"):
            if not values:
                return None
            pick = min if kind == "Aggregate_Min" else max
            return pick(values, key=self._extreme_key)
        decode = self.terms.dictionary.decode
        if kind == "Aggregate_GroupConcat":
            separator = _separator(a)
            parts: list[str] = []
            languages = set()
            # (a group whose value would pass the fleet's term limit never gets here: its kept length says so)
            for v in sorted(values, key=lambda v: (self.terms.order_key(v), decode(v))):
                term = decode(v)
                if not term.startswith('"'):
                    return None
                lexical, language, datatype = split_literal(term)
                if datatype is not None:
                    return None
                languages.add(language)
                parts.extend([lexical] * (1 if distinct else values[v]))
            language = next(iter(languages)) if len(languages) == 1 else None
            return encode(literal(separator.join(parts), language))
        # SUM / AVG: exact sums of integers and decimals (order-free), math.fsum once a float takes part
        numeric = self.terms.numeric
        exact: Any = 0
        floats: list[float] = []
        kind_rank = 0  # 0 integer, 1 decimal, 2 float, 3 double
        count = 0
        for v, m in values.items():
            parsed = numeric(v)
            if parsed is None:
                return None
            rank, number = parsed
            kind_rank = max(kind_rank, rank)
            m = 1 if distinct else m
            count += m
            if isinstance(number, float):
                floats.extend([number] * m)
            elif rank:
                exact = Decimal(exact) + Decimal(number) * m
            else:
                exact = exact + number * m
        if floats:
            import math

            total: Any = math.fsum(floats + [float(exact)])
        else:
            total = exact
        if kind == "Aggregate_Sum":
            return encode(_number_literal(total, kind_rank))
        if kind == "Aggregate_Avg":
            if count == 0:
                return encode(literal("0", None, XSD + "integer"))
            if kind_rank <= 1:
                quotient = (Decimal(total) / Decimal(count)).quantize(Decimal(1).scaleb(-18), rounding=ROUND_DOWN)
                return encode(_number_literal(quotient, 1))
            return encode(_number_literal(float(total) / count, kind_rank))
        raise ValueError(f"unknown aggregate {kind}")  # pragma: no cover - the compiler rejects it

    def entries(self) -> int:
        return sum(1 + sum(len(v) for v in g.values) for g in self.groups.values())

    def describe(self) -> str:
        names = ", ".join(f"{a.name[len('Aggregate_'):].upper()}{'(DISTINCT)' if a.distinct else ''}"
                          for a in self.aggregates if not str(a.res).startswith("__group"))
        by = f" by {len(self.group_exprs)} key(s)" if self.group_exprs else " (one group)"
        return f"Aggregate{by}: {names}"


def _number_literal(value: Any, rank: int) -> str:
    if rank == 0:
        return literal(str(int(value)), None, XSD + "integer")
    if rank == 1:
        return literal(format_decimal(Decimal(value)), None, XSD + "decimal")
    datatype = XSD + ("float" if rank == 2 else "double")
    return literal(format_double(float(value)), None, datatype)
