"""Incremental SPARQL algebra operators over multisets of solution mappings.

Every operator keeps `out = f(in)` for the multisets of its inputs after each
input delta it receives, so any order and batching of input deltas gives exact
results (a join receiving deltas from both sides in one update applies the
delta rule sequentially: left delta x old right, then new left x right delta).

A solution is a tuple aligned with the operator's `schema` (sorted variable
names, no '?'), holding term ids, None where the variable is unbound.  A delta
is a dict row -> signed multiplicity without zero entries.
"""

from __future__ import annotations

import bisect
import math
from decimal import ROUND_DOWN, Context, Decimal
from fractions import Fraction
from typing import Any, Callable, Iterable

from cbgp.algebra.terms import XSD, Terms, expression_variables, format_decimal, format_double
from cbgp.terms import literal, split_literal

Row = tuple
Delta = dict
MEMO_LIMIT = 100_000  # remembered filter outcomes per one-variable filter (cleared when full)


def add(delta: Delta, row: Row, n: int) -> None:
    value = delta.get(row, 0) + n
    if value:
        delta[row] = value
    else:
        delta.pop(row, None)


def remapper(source: tuple[str, ...], target: tuple[str, ...]) -> Callable[[Row], Row]:
    """Row of `source` schema -> row of `target` schema (missing variables unbound)."""
    if source == target:
        return lambda row: row
    index = {v: i for i, v in enumerate(source)}
    positions = [index.get(v, -1) for v in target]

    def remap(row: Row) -> Row:
        return tuple(None if i < 0 else row[i] for i in positions)

    return remap


class Operator:
    """A node of the operator tree: inputs are numbered slots, output goes to `parent`."""

    name = "Operator"
    schema: tuple[str, ...] = ()
    certain: frozenset[str] = frozenset()

    def __init__(self, children: Iterable["Operator"] = ()) -> None:
        self.children = list(children)
        self.parent: Operator | None = None
        self.slot = 0
        self.sink: Callable[[Delta], None] | None = None
        for slot, child in enumerate(self.children):
            child.parent = self
            child.slot = slot
        self.deltas_in = 0  # rows received (for the benchmark)

    def emit(self, out: Delta) -> None:
        if not out:
            return
        if self.parent is not None:
            self.parent.receive(self.slot, out)
        elif self.sink is not None:
            self.sink(out)

    def receive(self, slot: int, delta: Delta) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def start(self) -> None:
        """Emit what the operator answers before any change (constant rows, an empty group's row)."""
        for child in self.children:
            child.start()

    def entries(self) -> int:
        """Entries of state held by this operator (not its children)."""
        return 0

    def describe(self) -> str:
        return self.name

    def explain(self, indent: int = 0) -> list[str]:
        lines = ["  " * indent + self.describe()]
        for child in self.children:
            lines.extend(child.explain(indent + 1))
        return lines

    def walk(self) -> Iterable["Operator"]:
        yield self
        for child in self.children:
            yield from child.walk()


class Constant(Operator):
    """VALUES (and the empty group pattern: one empty solution)."""

    name = "Values"

    def __init__(self, schema: tuple[str, ...], rows: list[Row]) -> None:
        super().__init__()
        self.schema = schema
        self.rows = rows
        self.certain = frozenset(v for i, v in enumerate(schema) if all(r[i] is not None for r in rows))

    def start(self) -> None:
        out: Delta = {}
        for row in self.rows:
            add(out, row, 1)
        self.emit(out)

    def describe(self) -> str:
        return f"Values {len(self.rows)} row(s) ({', '.join('?' + v for v in self.schema)})"


class Leaf(Operator):
    """A BGP whose solutions come from elsewhere (the engine); `push` feeds its deltas in."""

    name = "BGP"

    def __init__(self, schema: tuple[str, ...], label: str) -> None:
        super().__init__()
        self.schema = schema
        self.certain = frozenset(schema)
        self.label = label

    def push(self, delta: Delta) -> None:
        self.deltas_in += len(delta)
        self.emit(delta)

    def describe(self) -> str:
        return self.label


class Filter(Operator):
    name = "Filter"

    def __init__(self, child: Operator, expr: Any, terms: Terms, text: str) -> None:
        super().__init__([child])
        self.schema = child.schema
        self.certain = child.certain
        self.expr = expr
        self.terms = terms
        self.text = text
        names = expression_variables(expr)
        only = next(iter(names)) if len(names) == 1 else None
        self.memo_position = self.schema.index(only) if only in self.schema else None
        self.memo: dict = {}

    def receive(self, slot: int, delta: Delta) -> None:
        self.deltas_in += len(delta)
        ebv = self.terms.ebv
        expr, schema = self.expr, self.schema
        if self.memo_position is None:
            self.emit({row: n for row, n in delta.items() if ebv(expr, schema, row)})
            return
        # A filter on one variable is a function of that variable's term: remembered per term id.
        memo, position = self.memo, self.memo_position
        out: Delta = {}
        for row, n in delta.items():
            value = row[position]
            keep = memo.get(value)
            if keep is None:
                keep = ebv(expr, schema, row)
                if len(memo) >= MEMO_LIMIT:
                    memo.clear()
                memo[value] = keep
            if keep:
                out[row] = n
        self.emit(out)

    def describe(self) -> str:
        return f"Filter {self.text}"


class Extend(Operator):
    name = "Extend"

    def __init__(self, child: Operator, var: str, expr: Any, terms: Terms, text: str) -> None:
        super().__init__([child])
        self.var = var
        self.schema = tuple(sorted(set(child.schema) | {var}))
        self.certain = child.certain
        self.expr = expr
        self.terms = terms
        self.text = text
        self.remap = remapper(child.schema, self.schema)
        self.position = self.schema.index(var)
        self.child_schema = child.schema

    def receive(self, slot: int, delta: Delta) -> None:
        self.deltas_in += len(delta)
        out: Delta = {}
        value = self.terms.value
        for row, n in delta.items():
            new = list(self.remap(row))
            if new[self.position] is None:
                new[self.position] = value(self.expr, self.child_schema, row)
            add(out, tuple(new), n)
        self.emit(out)

    def describe(self) -> str:
        return f"Extend ?{self.var} := {self.text}"


class Project(Operator):
    name = "Project"

    def __init__(self, child: Operator, variables: Iterable[str]) -> None:
        super().__init__([child])
        self.schema = tuple(sorted(set(variables)))
        self.certain = child.certain & frozenset(self.schema)
        self.remap = remapper(child.schema, self.schema)

    def receive(self, slot: int, delta: Delta) -> None:
        self.deltas_in += len(delta)
        out: Delta = {}
        remap = self.remap
        for row, n in delta.items():
            add(out, remap(row), n)
        self.emit(out)

    def describe(self) -> str:
        return "Project " + " ".join("?" + v for v in self.schema)


class Distinct(Operator):
    name = "Distinct"

    def __init__(self, child: Operator) -> None:
        super().__init__([child])
        self.schema = child.schema
        self.certain = child.certain
        self.counts: dict[Row, int] = {}

    def receive(self, slot: int, delta: Delta) -> None:
        self.deltas_in += len(delta)
        out: Delta = {}
        counts = self.counts
        for row, n in delta.items():
            old = counts.get(row, 0)
            new = old + n
            if new:
                counts[row] = new
            else:
                del counts[row]
            if old <= 0 < new:
                out[row] = 1
            elif new <= 0 < old:
                out[row] = -1
        self.emit(out)

    def entries(self) -> int:
        return len(self.counts)


class Union(Operator):
    name = "Union"

    def __init__(self, left: Operator, right: Operator) -> None:
        super().__init__([left, right])
        self.schema = tuple(sorted(set(left.schema) | set(right.schema)))
        self.certain = left.certain & right.certain
        self.remaps = [remapper(left.schema, self.schema), remapper(right.schema, self.schema)]

    def receive(self, slot: int, delta: Delta) -> None:
        self.deltas_in += len(delta)
        remap = self.remaps[slot]
        out: Delta = {}
        for row, n in delta.items():
            add(out, remap(row), n)
        self.emit(out)


class _Binary(Operator):
    """Two inputs stored by the values of the variables both always bind (the join key)."""

    def __init__(self, left: Operator, right: Operator) -> None:
        super().__init__([left, right])
        ls, rs = left.schema, right.schema
        shared = set(ls) & set(rs)
        key = sorted(shared & left.certain & right.certain)
        self.key_positions = ([ls.index(v) for v in key], [rs.index(v) for v in key])
        check = sorted(shared - set(key))
        self.check = [(ls.index(v), rs.index(v)) for v in check]
        self.shared = [(ls.index(v), rs.index(v)) for v in sorted(shared)]
        self.merged_schema = tuple(sorted(set(ls) | set(rs)))
        self.merge_plan = [(ls.index(v) if v in ls else -1, rs.index(v) if v in rs else -1)
                           for v in self.merged_schema]
        self.stores: list[dict[tuple, dict[Row, int]]] = [{}, {}]

    def key(self, slot: int, row: Row) -> tuple:
        return tuple(row[i] for i in self.key_positions[slot])

    def compatible(self, left: Row, right: Row) -> bool:
        for i, j in self.check:
            a, b = left[i], right[j]
            if a is not None and b is not None and a != b:
                return False
        return True

    def merge(self, left: Row, right: Row) -> Row:
        return tuple(left[i] if i >= 0 and left[i] is not None else (right[j] if j >= 0 else None)
                     for i, j in self.merge_plan)

    def store(self, slot: int, key: tuple, row: Row, n: int) -> None:
        table = self.stores[slot]
        bucket = table.get(key)
        if bucket is None:
            bucket = table[key] = {}
        add(bucket, row, n)
        if not bucket:
            del table[key]

    def entries(self) -> int:
        return sum(len(b) for table in self.stores for b in table.values())


class Join(_Binary):
    name = "Join"

    def __init__(self, left: Operator, right: Operator) -> None:
        super().__init__(left, right)
        self.schema = self.merged_schema
        self.certain = left.certain | right.certain

    def receive(self, slot: int, delta: Delta) -> None:
        self.deltas_in += len(delta)
        other = self.stores[1 - slot]
        out: Delta = {}
        for row, n in delta.items():
            key = self.key(slot, row)
            bucket = other.get(key)
            if bucket:
                for other_row, m in bucket.items():
                    left, right = (row, other_row) if slot == 0 else (other_row, row)
                    if self.compatible(left, right):
                        add(out, self.merge(left, right), n * m)
            self.store(slot, key, row, n)
        self.emit(out)

    def describe(self) -> str:
        return "Join" + self._key_text()

    def _key_text(self) -> str:
        key = [self.children[0].schema[i] for i in self.key_positions[0]]
        return f" on {', '.join('?' + v for v in key)}" if key else " (no common always-bound variable: product)"


class _Matched(_Binary):
    """Left rows with the number of right rows that `match` them (LeftJoin, Minus, EXISTS).

    Subclasses say what a left delta emits (`left_changed`) and what a change of a stored left row's match
    count emits (`match_count_changed`); the counting and storing is here.
    """

    def __init__(self, left: Operator, right: Operator) -> None:
        super().__init__(left, right)
        self.matched: dict[Row, int] = {}

    def match(self, left: Row, right: Row) -> Any:  # pragma: no cover - abstract
        """None when `right` does not count for `left`, else what `match_count_changed` is given."""
        raise NotImplementedError

    def left_changed(self, row: Row, n: int, right_rows: dict[Row, int], out: Delta) -> int:  # pragma: no cover
        """Emit into `out` what left delta `row` x `n` causes; return how many of `right_rows` match it."""
        raise NotImplementedError

    def match_count_changed(self, row: Row, count: int, n: int, old: int, new: int, found: Any,
                            out: Delta) -> None:  # pragma: no cover - abstract
        """Emit what a right delta `n` (matching as `found`) causes for stored left `row` (`count` copies)."""
        raise NotImplementedError

    def receive(self, slot: int, delta: Delta) -> None:
        self.deltas_in += len(delta)
        out: Delta = {}
        if slot == 0:
            right = self.stores[1]
            for row, n in delta.items():
                key = self.key(0, row)
                total = self.left_changed(row, n, right.get(key) or {}, out)
                self.store(0, key, row, n)
                if key in self.stores[0] and row in self.stores[0][key]:
                    self.matched[row] = total
                else:
                    self.matched.pop(row, None)
        else:
            left = self.stores[0]
            matched = self.matched
            for row, n in delta.items():
                key = self.key(1, row)
                for other, c in (left.get(key) or {}).items():
                    found = self.match(other, row)
                    if found is None:
                        continue
                    old = matched[other]
                    new = old + n
                    matched[other] = new
                    self.match_count_changed(other, c, n, old, new, found, out)
                self.store(1, key, row, n)
        self.emit(out)

    def entries(self) -> int:
        return super().entries() + len(self.matched)


class LeftJoin(_Matched):
    """OPTIONAL { right FILTER(expr) }: a left row without a match is an answer until its first match."""

    name = "LeftJoin"

    def __init__(self, left: Operator, right: Operator, expr: Any, terms: Terms, text: str | None) -> None:
        super().__init__(left, right)
        self.schema = self.merged_schema
        self.certain = left.certain
        self.expr = expr
        self.terms = terms
        self.text = text
        self.pad = remapper(left.schema, self.schema)  # a left row alone, right variables unbound

    def match(self, left: Row, right: Row) -> Row | None:
        """The joined row, None when the rows are incompatible or the filter rejects them."""
        if not self.compatible(left, right):
            return None
        merged = self.merge(left, right)
        if self.expr is not None and not self.terms.ebv(self.expr, self.schema, merged):
            return None
        return merged

    def left_changed(self, row: Row, n: int, right_rows: dict[Row, int], out: Delta) -> int:
        total = 0
        for other, m in right_rows.items():
            merged = self.match(row, other)
            if merged is not None:
                total += m
                add(out, merged, n * m)
        if not total:
            add(out, self.pad(row), n)
        return total

    def match_count_changed(self, row: Row, count: int, n: int, old: int, new: int, found: Row,
                            out: Delta) -> None:
        add(out, found, count * n)
        if old == 0 and new > 0:
            add(out, self.pad(row), -count)
        elif old > 0 and new == 0:
            add(out, self.pad(row), count)

    def describe(self) -> str:
        text = "LeftJoin (OPTIONAL)"
        key = [self.children[0].schema[i] for i in self.key_positions[0]]
        if key:
            text += f" on {', '.join('?' + v for v in key)}"
        return text + (f" filter {self.text}" if self.text else "")


class Minus(_Matched):
    """MINUS, or FILTER [NOT] EXISTS (`exists`): a left row kept by how many right rows match it."""

    name = "Minus"

    def __init__(self, left: Operator, right: Operator, exists: bool | None = None) -> None:
        super().__init__(left, right)
        self.schema = left.schema
        self.certain = left.certain
        self.exists = exists  # None: MINUS, True: FILTER EXISTS, False: FILTER NOT EXISTS
        if exists is None:
            self.name = "Minus"
        else:
            self.name = "Filter EXISTS" if exists else "Filter NOT EXISTS"

    def match(self, left: Row, right: Row) -> bool | None:
        """True when `right` counts against `left`, else None."""
        if not self.compatible(left, right):
            return None
        if self.exists is None:  # MINUS ignores right rows sharing no bound variable
            return True if any(left[i] is not None and right[j] is not None for i, j in self.shared) else None
        return True

    def visible(self, matched: int) -> bool:
        return (matched > 0) if self.exists else (matched == 0)

    def left_changed(self, row: Row, n: int, right_rows: dict[Row, int], out: Delta) -> int:
        total = sum(m for other, m in right_rows.items() if self.match(row, other))
        if self.visible(total):
            add(out, row, n)
        return total

    def match_count_changed(self, row: Row, count: int, n: int, old: int, new: int, found: bool,
                            out: Delta) -> None:
        was, now = self.visible(old), self.visible(new)
        if was and not now:
            add(out, row, -count)
        elif now and not was:
            add(out, row, count)

    def describe(self) -> str:
        return self.name


# --- aggregates ----------------------------------------------------------------------------------

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
    __slots__ = ("n", "values", "row", "cache", "counts", "sums")

    def __init__(self, n_aggregates: int, kinds: tuple = ()) -> None:
        self.sums = [_Sum() if kind in _SUMS else None for kind in kinds]
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

    def start(self) -> None:
        super().start()
        if not self.group_exprs and () not in self.groups:
            group = self.groups[()] = _Group(len(self.aggregates), self.kinds)
            group.row = self.compute(group)
            self.emit({group.row: 1})

    def receive(self, slot: int, delta: Delta) -> None:
        self.deltas_in += len(delta)
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
            if new != group.row:
                if group.row is not None:
                    add(out, group.row, -1)
                if new is not None:
                    add(out, new, 1)
                group.row = new
        self.emit(out)

    def _sum_result(self, kind: str, state: _Sum) -> int | None:
        encode = self.terms.dictionary.encode
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
                cached = self.terms.dictionary.encode(literal(str(group.counts[i]), None, XSD + "integer"))
            elif a.name in _SUMS:
                cached = self._sum_result(a.name, group.sums[i])
            elif cached is _DIRTY:
                cached = self.aggregate(a, values)
                if a.name in _EXTREMES:
                    group.cache[i] = cached
            row[position] = cached
        return tuple(row)

    def aggregate(self, a: Any, values: dict) -> int | None:
        kind = a.name
        distinct = bool(a.distinct)
        encode = self.terms.dictionary.encode
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
            separator = " " if a.separator is None else str(a.separator)
            parts: list[str] = []
            languages = set()
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


# --- ORDER BY + LIMIT/OFFSET ---------------------------------------------------------------------

class _Desc:
    __slots__ = ("key",)

    def __init__(self, key: tuple) -> None:
        self.key = key

    def __lt__(self, other: "_Desc") -> bool:
        return other.key < self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and other.key == self.key


class TopK(Operator):
    """ORDER BY ... LIMIT/OFFSET: the window [offset, offset+limit) of the sorted multiset, maintained.

    Rows equal under the ORDER BY conditions are ordered by their terms, so the window is always
    defined; when such ties straddle its edge another engine may pick other rows.
    """

    name = "TopK"

    def __init__(self, child: Operator, conditions: list, start: int, length: int | None, terms: Terms) -> None:
        super().__init__([child])
        self.schema = child.schema
        self.certain = child.certain
        self.conditions = conditions  # [(expr or None, descending)]
        self.start_at = start
        self.length = length
        self.terms = terms
        self.sorted: list[tuple] = []  # (sort key, row)
        self.counts: dict[Row, int] = {}
        self.window: dict[Row, int] = {}

    def sort_key(self, row: Row) -> tuple:
        parts = []
        for expr, descending in self.conditions:
            key = self.terms.order_key(self.terms.value(expr, self.schema, row))
            parts.append(_Desc(key) if descending else key)
        decode = self.terms.dictionary.decode
        parts.append(tuple("" if v is None else decode(v) for v in row))
        return tuple(parts)

    def receive(self, slot: int, delta: Delta) -> None:
        self.deltas_in += len(delta)
        for row, n in delta.items():
            old = self.counts.get(row, 0)
            new = old + n
            entry = (self.sort_key(row), row)
            if old <= 0 < new:
                bisect.insort(self.sorted, entry)
            elif new <= 0 < old:
                index = bisect.bisect_left(self.sorted, entry)
                del self.sorted[index]
            if new:
                self.counts[row] = new
            else:
                del self.counts[row]
        window: dict[Row, int] = {}
        skip = self.start_at
        room = self.length if self.length is not None else float("inf")
        for _key, row in self.sorted:
            if room <= 0:
                break
            n = self.counts[row]
            if skip >= n:
                skip -= n
                continue
            take = min(n - skip, room)
            skip = 0
            window[row] = take
            room -= take
        out: Delta = {}
        for row, n in window.items():
            add(out, row, n)
        for row, n in self.window.items():
            add(out, row, -n)
        self.window = window
        self.emit(out)

    def entries(self) -> int:
        return len(self.counts)

    def describe(self) -> str:
        limit = "" if self.length is None else f" LIMIT {self.length}"
        return f"TopK ORDER BY ({len(self.conditions)} condition(s)){limit} OFFSET {self.start_at}"


# --- query forms ---------------------------------------------------------------------------------

class Ask(Operator):
    """ASK: one empty row while there is a solution (a boolean that flips)."""

    name = "Ask"

    def __init__(self, child: Operator) -> None:
        super().__init__([child])
        self.schema = ()
        self.total = 0

    def receive(self, slot: int, delta: Delta) -> None:
        self.deltas_in += len(delta)
        old = self.total
        self.total += sum(delta.values())
        if old <= 0 < self.total:
            self.emit({(): 1})
        elif self.total <= 0 < old:
            self.emit({(): -1})


class Construct(Operator):
    """CONSTRUCT: the set of instantiated template triples (a triple counted once per solution making it).

    A blank node of the template becomes, per solution, a blank node named after the solution, so the
    same solution retracts the same triples.
    """

    name = "Construct"

    def __init__(self, child: Operator, template: list[tuple], terms: Terms) -> None:
        super().__init__([child])
        self.schema = ("object", "predicate", "subject")
        self.template = template  # [(kind, value)] * 3 per triple: ("var", name) | ("term", id) | ("bnode", label)
        self.terms = terms
        self.counts: dict[Row, int] = {}
        self.index = {v: i for i, v in enumerate(child.schema)}

    def instantiate(self, row: Row) -> list[Row]:
        import hashlib

        decode = self.terms.dictionary.decode
        encode = self.terms.dictionary.encode
        out = []
        for triple in self.template:
            values = []
            for kind, value in triple:
                if kind == "term":
                    values.append(value)
                elif kind == "var":
                    i = self.index.get(value)
                    values.append(None if i is None else row[i])
                else:
                    digest = hashlib.blake2b(
                        repr((value, [None if v is None else decode(v) for v in row])).encode(),
                        digest_size=8).hexdigest()
                    values.append(encode(f"_:c{digest}"))
            s, p, o = values
            if s is None or p is None or o is None:
                continue
            if decode(s).startswith('"') or not decode(p).startswith("<"):
                continue
            out.append((o, p, s))
        return out

    def receive(self, slot: int, delta: Delta) -> None:
        self.deltas_in += len(delta)
        out: Delta = {}
        for row, n in delta.items():
            for triple in self.instantiate(row):
                old = self.counts.get(triple, 0)
                new = old + n
                if new:
                    self.counts[triple] = new
                else:
                    del self.counts[triple]
                if old <= 0 < new:
                    add(out, triple, 1)
                elif new <= 0 < old:
                    add(out, triple, -1)
        self.emit(out)

    def entries(self) -> int:
        return len(self.counts)
