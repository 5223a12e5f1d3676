"""Derived streams: a CONSTRUCT registered with ``stream=<iri>`` feeds named graph ``<iri>``
through updates.raw, and a BGP query reads it back.  The queries the tests register, and pyoxigraph as the oracle:
the CONSTRUCT over the base graph (default graph) and any query over a sequence of quad changes."""

from __future__ import annotations

from collections import Counter
from typing import Iterable

import pyoxigraph as ox

from cbgp.terms import from_oxigraph, to_oxigraph
from services.codec import canonical_binding
from services.registry.core import Registry
from tests.fleet_support import EX

DERIVED = f"<{EX}adults>"  # the stream's named graph
# The derived stream: a FILTER and literals (language-tagged names, typed ages) in its triples; a triple made
# by several solutions (a person with two names has one age triple) is in the graph once.
ADULTS = (f"CONSTRUCT {{ ?x <{EX}adultName> ?n . ?x <{EX}age> ?a }} "
          f"WHERE {{ ?x <{EX}type> <{EX}Person> . ?x <{EX}name> ?n . ?x <{EX}age> ?a FILTER(?a >= 18) }}")
# Reads the derived graph, joined with the base graph.
READER = f"SELECT ?x ?n ?t WHERE {{ GRAPH {DERIVED} {{ ?x <{EX}adultName> ?n }} ?x <{EX}likes> ?t }}"


def plan_of(query_id: str, sparql: str, seq: int = 0, **options: str) -> dict:
    """The QueryPlan record the registry publishes (version 1, registered at ``seq``)."""
    decision = Registry().decide({"command": "REGISTER", "query_id": query_id, "sparql": sparql, "options": options},
                                 lambda: seq)
    assert decision.status["status"] == "ACCEPTED", decision.status
    return decision.plan[1]


def construct(store: ox.Store, text: str = ADULTS) -> set[tuple[str, str, str]]:
    """The CONSTRUCT of ``text`` over ``store``'s default graph, as canonical terms."""
    return {(from_oxigraph(t.subject), from_oxigraph(t.predicate), from_oxigraph(t.object))
            for t in store.query(text)}


def answers(store: ox.Store, text: str) -> Counter:
    result = store.query(text)
    names = [v.value for v in result.variables]
    return Counter(canonical_binding({n: from_oxigraph(s[n]) for n in names if s[n] is not None}) for s in result)


def quad(s: str, p: str, o: str, g: str | None) -> ox.Quad:
    return ox.Quad(to_oxigraph(s), to_oxigraph(p), to_oxigraph(o), ox.DefaultGraph() if g is None else to_oxigraph(g))


def per_seq_deltas(changes: Iterable[tuple[int, int, str, str, str, str | None]], text: str) -> tuple[Counter, Counter]:
    """pyoxigraph re-evaluating ``text`` after every change ``(seq, sign, s, p, o, g)`` (terms, g None = default):
    ``(Counter((seq, sign, binding)), final answers)``."""
    store = ox.Store()
    current: Counter = Counter()
    deltas: Counter = Counter()
    for seq, sign, s, p, o, g in changes:
        (store.add if sign > 0 else store.remove)(quad(s, p, o, g))
        new = answers(store, text)
        for key, n in (new - current).items():
            deltas[(seq, "+", key)] += n
        for key, n in (current - new).items():
            deltas[(seq, "-", key)] += n
        current = new
    return deltas, current


def expected_reader(base: ox.Store, text: str = READER, graph: str = DERIVED) -> Counter:
    """``text`` over the base graph plus the CONSTRUCT of the base graph in ``graph``: what the reader must see."""
    store = ox.Store()
    store.extend(ox.Quad(q.subject, q.predicate, q.object, ox.DefaultGraph()) for q in base
                 if isinstance(q.graph_name, ox.DefaultGraph))
    store.extend(quad(s, p, o, graph) for s, p, o in construct(base))
    return answers(store, text)
