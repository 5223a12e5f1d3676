"""The operators at the top of a plan: ORDER BY + LIMIT/OFFSET as a maintained window (`TopK`), and the ASK
and CONSTRUCT query forms.  Operators of `cbgp.algebra.operators` (same contract: `out = f(in)` after each
input delta).
"""

from __future__ import annotations

import bisect

from cbgp.algebra.operators import Delta, Operator, Row, add
from cbgp.algebra.expressions import Descending, Terms


# --- ORDER BY + LIMIT/OFFSET ---------------------------------------------------------------------

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
            parts.append(Descending(key) if descending else key)
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
