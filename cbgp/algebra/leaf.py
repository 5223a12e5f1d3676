"""A basic graph pattern the BGP engine does not take: variables in predicate position.

The leaf keeps the quads that match at least one of its patterns (constants
checked) in a few indexes and computes each change's delta by the semi-naive
rule over the pattern list: for an inserted quad t, the new solutions are, for
each pattern i that t matches, those with pattern i mapped to t, patterns
before i mapped into the graph without t and patterns after i into the graph
with t -- each new solution is counted once, at the first pattern that maps to
t.  A deletion is the mirror image.  Duplicate inserts and deletes of absent
quads change nothing.
"""

from __future__ import annotations

from cbgp.algebra.operators import Delta, Leaf, add
from cbgp.terms import DEFAULT_GRAPH_ID

Quad = tuple[int, int, int, int]
# A pattern position: ("var", name) or ("term", id); the graph position may also be ("default",) or
# ("named", var) for GRAPH ?g (any named graph); the predicate position may be ("not", frozenset of ids), a
# negated property set.


class PatternLeaf(Leaf):
    """A BGP evaluated here (predicate variables allowed), fed every change of the query."""

    def __init__(self, schema: tuple[str, ...], patterns: list[tuple], label: str) -> None:
        super().__init__(schema, label)
        self.patterns = patterns
        self.quads: set[Quad] = set()
        self.by_s: dict[int, set[Quad]] = {}
        self.by_o: dict[int, set[Quad]] = {}
        self.by_p: dict[int, set[Quad]] = {}
        self.positions = {v: i for i, v in enumerate(schema)}

    def unify(self, pattern: tuple, quad: Quad, binding: dict) -> dict | None:
        new = binding
        for (kind, value), term in zip(pattern, quad):
            if kind == "term":
                if term != value:
                    return None
            elif kind == "not":
                if term in value:
                    return None
            elif kind == "default":
                if term != DEFAULT_GRAPH_ID:
                    return None
            else:
                if kind == "named" and term == DEFAULT_GRAPH_ID:
                    return None
                bound = new.get(value)
                if bound is None:
                    if new is binding:
                        new = dict(binding)
                    new[value] = term
                elif bound != term:
                    return None
        return new

    def relevant(self, quad: Quad) -> bool:
        return any(self.unify(p, quad, {}) is not None for p in self.patterns)

    def candidates(self, pattern: tuple, binding: dict):  # noqa: ANN201
        best = None
        for (kind, value), table in zip(pattern[:3], (self.by_s, self.by_p, self.by_o)):
            if kind == "not":
                continue
            term = value if kind == "term" else binding.get(value)
            if term is not None:
                found = table.get(term, set())
                if best is None or len(found) < len(best):
                    best = found
        return self.quads if best is None else best

    def solutions(self, index: int, binding: dict, changed: Quad, focus: int):  # noqa: ANN201
        """Bindings extending `binding` for patterns index.. (pattern `focus` is already mapped to `changed`)."""
        if index == len(self.patterns):
            yield binding
            return
        if index == focus:
            yield from self.solutions(index + 1, binding, changed, focus)
            return
        pattern = self.patterns[index]
        for quad in list(self.candidates(pattern, binding)):
            if index < focus and quad == changed:
                continue  # patterns before the focus see the graph without the changed quad
            extended = self.unify(pattern, quad, binding)
            if extended is not None:
                yield from self.solutions(index + 1, extended, changed, focus)

    def change(self, diff: int, quad: Quad) -> None:
        present = quad in self.quads
        if (diff > 0) == present or not self.relevant(quad):
            return
        if diff > 0:
            self._index(quad, True)
        out: Delta = {}
        for focus, pattern in enumerate(self.patterns):
            start = self.unify(pattern, quad, {})
            if start is None:
                continue
            for binding in self.solutions(0, start, quad, focus):
                add(out, tuple(binding.get(v) for v in self.schema), diff)
        if diff < 0:
            self._index(quad, False)
        self.push(out)

    def _index(self, quad: Quad, insert: bool) -> None:
        s, p, o, _g = quad
        if insert:
            self.quads.add(quad)
            for table, key in ((self.by_s, s), (self.by_p, p), (self.by_o, o)):
                table.setdefault(key, set()).add(quad)
        else:
            self.quads.discard(quad)
            for table, key in ((self.by_s, s), (self.by_p, p), (self.by_o, o)):
                bucket = table.get(key)
                if bucket is not None:
                    bucket.discard(quad)
                    if not bucket:
                        del table[key]

    def entries(self) -> int:
        return len(self.quads)

    def describe(self) -> str:
        return self.label + " (evaluated by the operator layer: variable predicate)"
