"""Reference answers from pyoxigraph, an engine we did not write.

`OracleGraph` keeps the graph in a pyoxigraph store and re-evaluates a query
from scratch; `ReplayedAnswers` folds our delta stream into a multiset and
checks the contract on the way (a `-` always removes something present).
"""

from __future__ import annotations

from collections import Counter

import pyoxigraph as ox

from cbgp.terms import from_oxigraph, to_oxigraph

Row = tuple[tuple[str, str], ...]  # sorted (variable, canonical term) pairs


def _quad(s: str, p: str, o: str, g: str | None) -> ox.Quad:
    graph = ox.DefaultGraph() if g is None else to_oxigraph(g)
    return ox.Quad(to_oxigraph(s), to_oxigraph(p), to_oxigraph(o), graph)


class OracleGraph:
    def __init__(self) -> None:
        self.store = ox.Store()

    def apply(self, op: int, s: str, p: str, o: str, g: str | None = None) -> None:
        quad = _quad(s, p, o, g)
        if op > 0:
            self.store.add(quad)
        else:
            self.store.remove(quad)

    def answers(self, query: str) -> Counter[Row]:
        out: Counter[Row] = Counter()
        solutions = self.store.query(query)
        names = [v.value for v in solutions.variables]
        for solution in solutions:
            row = []
            for name in names:
                term = solution[name]
                if term is not None:
                    row.append((name, from_oxigraph(term)))
            out[tuple(sorted(row))] += 1
        return out


class ReplayedAnswers:
    """A query's answers rebuilt from its deltas alone."""

    def __init__(self) -> None:
        self.rows: Counter[Row] = Counter()

    def apply(self, sign: int, binding: dict[str, str], distinct: bool = False) -> None:
        row = tuple(sorted(binding.items()))
        if sign > 0:
            assert not (distinct and self.rows[row]), f"+ for an answer already present: {row}"
            self.rows[row] += 1
        else:
            assert self.rows[row] > 0, f"- for an answer not present: {row}"
            self.rows[row] -= 1
            if not self.rows[row]:
                del self.rows[row]
