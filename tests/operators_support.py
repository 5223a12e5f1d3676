"""Operator queries in the fleet: the queries the tests register, their QueryPlan records as the
registry makes them, and pyoxigraph as the oracle of their per-update deltas (aligned on ingest's seq)."""

from __future__ import annotations

from collections import Counter
from typing import Iterable

import pyoxigraph as ox

from cbgp.terms import DEFAULT_GRAPH_ID, from_oxigraph, to_oxigraph
from services.codec import canonical_binding
from services.registry.core import Registry
from tests.fleet_support import EX

XSD_BOOLEAN = "<http://www.w3.org/2001/XMLSchema#boolean>"

OPERATOR_QUERIES = {
    # FILTER on a typed literal (pushed into the star: rejected ages cost no state)
    "adults": f"SELECT ?x ?a WHERE {{ ?x <{EX}age> ?a FILTER(?a >= 30 && ?a < 60) }}",
    # OPTIONAL: a person without a name is an answer with ?n unbound, retracted when a name appears
    "named": f"SELECT ?x ?n WHERE {{ ?x <{EX}type> <{EX}Person> OPTIONAL {{ ?x <{EX}name> ?n }} }}",
    # GROUP BY + COUNT with HAVING: a group's row is retracted and re-asserted when its count changes
    "popular": (f"SELECT ?t (COUNT(?x) AS ?c) WHERE {{ ?x <{EX}likes> ?t }} GROUP BY ?t "
                f"HAVING (COUNT(?x) >= 12)"),
}
LATE_QUERIES = {
    # registered mid-stream: COUNT DISTINCT per group, a UNION, an ASK and a CONSTRUCT
    "fans": (f"SELECT ?x (COUNT(DISTINCT ?y) AS ?k) WHERE {{ {{ ?x <{EX}knows> ?y }} UNION {{ ?y <{EX}knows> ?x }} }} "
             f"GROUP BY ?x"),
    "oldrobot": f"ASK {{ ?x <{EX}type> <{EX}Robot> . ?x <{EX}age> ?a FILTER(?a > 86) }}",
    "liked": f"CONSTRUCT {{ ?t <{EX}likedBy> ?x }} WHERE {{ ?x <{EX}likes> ?t . ?x <{EX}type> <{EX}Cat> }}",
}


def plan_record(query_id: str, sparql: str, seq: int = 0) -> dict:
    """The QueryPlan record the registry publishes for ``sparql`` (version 1, registered at ``seq``)."""
    decision = Registry().decide({"command": "REGISTER", "query_id": query_id, "sparql": sparql}, lambda: seq)
    assert decision.status["status"] == "ACCEPTED", decision.status
    return decision.plan[1]


class Oracle:
    """pyoxigraph re-evaluating each query after every change: answers as canonical bindings (ASK as ``ask``,
    CONSTRUCT as ``subject predicate object``, the fleet's representations)."""

    def __init__(self, queries: dict[str, str]) -> None:
        self.store = ox.Store()
        self.queries = queries
        self.current = {name: self.answers(text) for name, text in queries.items()}

    def answers(self, text: str) -> Counter:
        result = self.store.query(text)
        if isinstance(result, (bool, ox.QueryBoolean)):
            return Counter({canonical_binding({"ask": f'"{str(bool(result)).lower()}"^^{XSD_BOOLEAN}'}): 1})
        if isinstance(result, ox.QueryTriples):
            return Counter({canonical_binding({"subject": from_oxigraph(t.subject), "predicate":
                                               from_oxigraph(t.predicate), "object": from_oxigraph(t.object)}): 1
                            for t in result})
        names = [v.value for v in result.variables]
        out: Counter = Counter()
        for solution in result:
            out[canonical_binding({n: from_oxigraph(solution[n]) for n in names if solution[n] is not None})] += 1
        return out

    def apply(self, seq: int, sign: int, s: str, p: str, o: str) -> Counter:
        """Apply one change; return its deltas ``(query, seq, sign, binding)``."""
        quad = ox.Quad(to_oxigraph(s), to_oxigraph(p), to_oxigraph(o), ox.DefaultGraph())
        if sign > 0:
            self.store.add(quad)
        else:
            self.store.remove(quad)
        deltas: Counter = Counter()
        for name, text in self.queries.items():
            new = self.answers(text)
            old = self.current[name]
            for key, n in (new - old).items():
                deltas[(name, seq, "+", key)] += n
            for key, n in (old - new).items():
                deltas[(name, seq, "-", key)] += n
            self.current[name] = new
        return deltas


def changes_of_lines(lines: list[str]) -> list[tuple[int, int, str, str, str, int]]:
    """Ingest's effective changes of RDF Patch ``A``/``D`` lines (set semantics), ``(seq, sign, s, p, o, g)``
    with the terms themselves and seq 1, 2, ... as ingest numbers them."""
    present: set[tuple[str, str, str]] = set()
    out = []
    for line in lines:
        s, p, o = line[2:-2].split(" ", 2)
        triple = (s, p, o)
        if line[0] == "A" and triple not in present:
            present.add(triple)
            out.append((len(out) + 1, 1, s, p, o, DEFAULT_GRAPH_ID))
        elif line[0] == "D" and triple in present:
            present.discard(triple)
            out.append((len(out) + 1, -1, s, p, o, DEFAULT_GRAPH_ID))
    return out


def oracle_deltas(changes: Iterable[tuple[int, int, int, int, int, int]], terms: dict[int, str] | None,
                  queries: dict[str, str], late: dict[str, str] | None = None,
                  late_after_seq: int | None = None) -> tuple[Counter, dict[str, Counter], dict[str, Counter]]:
    """Per-update deltas of ``queries`` over ingest's changes ``(seq, sign, s, p, o, g)`` (term ids, or the terms
    themselves when ``terms`` is None), plus those
    of ``late`` after ``late_after_seq``; returns (deltas, final answers, late queries' answers at that seq)."""
    oracle = Oracle({**queries, **(late or {})})
    deltas: Counter = Counter()
    snapshot: dict[str, Counter] = {}
    for seq, sign, s, p, o, g in changes:
        assert g == DEFAULT_GRAPH_ID
        if late and late_after_seq is not None and seq > late_after_seq and not snapshot:
            snapshot = {name: Counter(oracle.current[name]) for name in late}
        deltas += oracle.apply(seq, sign, *((s, p, o) if terms is None else (terms[s], terms[p], terms[o])))
    if late and not snapshot:
        snapshot = {name: Counter(oracle.current[name]) for name in late}
    if late:
        deltas = Counter({k: n for k, n in deltas.items() if k[0] not in late or k[1] > late_after_seq})
    return deltas, dict(oracle.current), snapshot
