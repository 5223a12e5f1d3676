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

from functools import partial
from typing import Any, Callable, Iterable

from rdflib.term import Variable

from cbgp.algebra.expressions import Terms, expression_variables

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
    """Row of `source` schema -> row of `target` schema (missing variables unbound).  A module function or a
    partial of one, not a closure: operator trees are pickled into checkpoints."""
    if source == target:
        return _same_row
    index = {v: i for i, v in enumerate(source)}
    return partial(_remap, tuple(index.get(v, -1) for v in target))


def _same_row(row: Row) -> Row:
    return row


def _remap(positions: tuple[int, ...], row: Row) -> Row:
    return tuple(None if i < 0 else row[i] for i in positions)


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
    copies = False  # (a checkpoint from before held values: each value held, a variable's too, which is exact)

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
        self.copies = isinstance(expr, Variable)  # (BIND(?x AS ?y), and an aggregate's value named by the algebra)

    def receive(self, slot: int, delta: Delta) -> None:
        """Each row with its value; the values are held while rows name them (``TermDictionary.hold``: a value
        computed over an aggregate's changes at each of them), once per row copy: a retracted row's value is
        the one its insertion computed (no expression here is nondeterministic)."""
        self.deltas_in += len(delta)
        out: Delta = {}
        terms = self.terms
        hold = not self.copies  # (a variable's value is held by what made the row, which lives as long as this one)
        if hold:
            terms.forget_released()
        value, hold_id, release = terms.value, terms.dictionary.hold_id, terms.release
        for row, n in delta.items():
            new = list(self.remap(row))
            if new[self.position] is None:
                v = new[self.position] = value(self.expr, self.child_schema, row, hold)
                if hold and v is not None:  # (held once by the computation: n copies in all, or -n and that one out)
                    if n > 1:
                        hold_id(v, n - 1)
                    elif n < 0:
                        for _ in range(1 - n):
                            release(v)
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

    def __init__(self, left: Operator, right: Operator, exists: bool | None = None, conditions: tuple = (),
                 terms: Terms | None = None) -> None:
        super().__init__(left, right)
        self.schema = left.schema
        self.certain = left.certain
        self.exists = exists  # None: MINUS, True: FILTER EXISTS, False: FILTER NOT EXISTS
        # EXISTS { P FILTER(e) } where e reads a variable of the outer row that P does not bind: e is evaluated
        # on the outer row merged with each row of P (what substituting the outer row into the pattern gives)
        self.conditions, self.terms = conditions, terms
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
        if self.conditions:
            merged, schema = self.merge(left, right), self.merged_schema
            if not all(self.terms.ebv(c, schema, merged) for c in self.conditions):
                return None
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
