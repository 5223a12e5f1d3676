"""Reference answers from pyoxigraph, an engine we did not write.

`OracleGraph` keeps the graph in a pyoxigraph store and re-evaluates a query
from scratch; `ReplayedAnswers` folds our delta stream into a multiset and
checks the contract on the way (a `-` always removes something present);
`replay_matches_oracle` checks `cbgp replay`'s deltas against it update by update.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyoxigraph as ox

from cbgp.terms import from_oxigraph, from_sparql_json, to_oxigraph

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


def replay_matches_oracle(tmp_path: Path, updates: list[tuple[int, str, str, str]], texts: dict[str, str]) -> Counter:
    """Run ``cbgp replay`` (the command a user runs) over ``updates`` with the queries ``texts`` and assert that each
    update's deltas of each query are pyoxigraph's answers after it minus those before it; returns how many updates
    changed each query's answers."""
    patch = tmp_path / "stream.rdfp"
    patch.write_text("".join(f"{'A' if d > 0 else 'D'} {s} {p} {o} .\n" for d, s, p, o in updates))
    args = [sys.executable, "-m", "services.commands.main", "replay", "--patch", str(patch)]
    for name, text in texts.items():
        (tmp_path / f"{name}.rq").write_text(text)
        args += ["--query", f"{name}={tmp_path / name}.rq"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    by_seq: dict[int, dict[str, Counter]] = {}
    for line in result.stdout.splitlines():
        delta = json.loads(line)
        row = tuple(sorted((v, from_sparql_json(t)) for v, t in delta["binding"].items()))
        by_seq.setdefault(delta["seq"], {}).setdefault(delta["query"], Counter())[row] += \
            1 if delta["sign"] == "+" else -1
    oracle = OracleGraph()
    before = {name: Counter() for name in texts}
    changed: Counter = Counter()
    for seq, (d, s, p, o) in enumerate(updates, 1):
        oracle.apply(d, s, p, o)
        for name, text in texts.items():
            after = oracle.answers(text)
            want = Counter(after)
            want.subtract(before[name])
            want = Counter({row: n for row, n in want.items() if n})
            got = Counter({row: n for row, n in by_seq.get(seq, {}).get(name, Counter()).items() if n})
            assert got == want, f"{name} at update {seq} {(d, s, p, o)}"
            changed[name] += bool(want)
            before[name] = after
    return changed
