"""Multi-centre components compiled for :mod:`cbgp.distributed.evaluator`: each pattern as a spec over local variable
numbers, and, per pattern an update may match, its probes' routes -- the end of the update's triple whose
partition starts them (the triple is routed to both) and the orders of the steps matching the other patterns.
The first route is chosen by :func:`probe_route` with a cost model that needs no statistics; the others are
the alternatives a partition switches to when its own counts say they send fewer probes
(:mod:`cbgp.distributed.evaluator`).  Every partition numbers them alike, from the query alone, so a probe names its
route by index."""

from __future__ import annotations

from dataclasses import dataclass

from cbgp.query.plan import ComponentPart, Plan, Step, route_variants, stored_ends
from cbgp.query.sparql import graph_variable, is_var
from cbgp.terms import DEFAULT_GRAPH_ID, TermDictionary


@dataclass(frozen=True)
class PatternSpec:
    """One triple pattern of a component, with variables as local numbers (-1: a constant)."""

    predicate: int
    graph: int
    subject_var: int
    object_var: int
    subject_const: int
    object_const: int
    graph_var: int = -1  # the local number of a GRAPH ?g variable (then ``graph`` is -1: any named graph)

    def matches(self, s: int, p: int, o: int, g: int) -> bool:
        if p != self.predicate:
            return False
        if self.graph_var < 0:
            if g != self.graph:
                return False
        elif g == DEFAULT_GRAPH_ID:
            return False  # GRAPH ?g ranges over the named graphs
        if self.subject_var < 0 and s != self.subject_const:
            return False
        if self.object_var < 0 and o != self.object_const:
            return False
        return not (self.subject_var >= 0 and self.subject_var == self.object_var and s != o)

    def ends(self) -> tuple[int, ...]:
        """The ends whose value is a variable: where the pattern's triples are stored."""
        return stored_ends(self.subject_var, self.object_var)


@dataclass(frozen=True)
class ComponentProgram:
    """A multi-centre component compiled for distributed evaluation."""

    name: str
    n_vars: int
    patterns: tuple[PatternSpec, ...]
    plans: tuple[tuple[Step, ...], ...]  # per updated pattern j: the steps matching the other patterns
    projection: tuple[int, ...]  # local variables of the emitted row, in the query's projected order
    columns: tuple[str, ...]
    variables: tuple[str, ...]
    starts: tuple[int, ...] = ()  # per pattern j: the end whose partition starts its probes (see probe_route)
    variants: tuple[tuple[tuple[Step, ...], ...], ...] = ()  # per pattern j: its routes, plans[j] first
    # A GRAPH ?g component (every pattern in that one block, ?g in no other position): the local number of ?g.
    # Each graph is evaluated alone: stores are keyed by (centre value, graph), and a binding's ?g is the
    # graph of the triple that started it, so every step reads the same graph.
    graph_var: int = -1

    def routes_of(self, j: int) -> tuple[tuple[Step, ...], ...]:
        """Pattern ``j``'s routes, indexed as probes name them (the first: ``plans[j]``)."""
        return self.variants[j] if self.variants else (self.plans[j],)

    def predicates(self) -> frozenset[int]:
        """The predicates of its patterns: the changes it reads."""
        return frozenset(spec.predicate for spec in self.patterns)

    def start_end(self, j: int) -> int:
        """Which end of pattern ``j``'s triple starts its probes (its triple is routed to both)."""
        return self.starts[j] if self.starts else self.patterns[j].ends()[0]


def compile_component(name: str, plan: Plan, dictionary: TermDictionary) -> ComponentProgram:
    """Compile a plan whose one part is a var-connected component (projection without DISTINCT: DISTINCT is
    applied where the partitions' deltas are consolidated)."""
    (part,) = plan.parts
    if not isinstance(part, ComponentPart):
        raise ValueError("distributed evaluation takes one var-connected component")
    query = plan.query
    graph_name = graph_variable(query)
    if graph_name is not None and graph_name in part.variables:
        raise ValueError("a GRAPH variable that is also a subject or object is not supported here")
    variables = part.variables + (() if graph_name is None else (graph_name,))
    local = {v: i for i, v in enumerate(variables)}
    graph_var = -1 if graph_name is None else local[graph_name]
    specs = []
    for index in part.patterns:
        t = query.patterns[index]
        if is_var(t.p):
            raise ValueError("a variable predicate is not supported here")
        graph = DEFAULT_GRAPH_ID if t.g is None else -1 if graph_var >= 0 else dictionary.encode(t.g)
        specs.append(PatternSpec(
            predicate=dictionary.encode(t.p), graph=graph,
            subject_var=local[t.s] if is_var(t.s) else -1, object_var=local[t.o] if is_var(t.o) else -1,
            subject_const=-1 if is_var(t.s) else dictionary.encode(t.s),
            object_const=-1 if is_var(t.o) else dictionary.encode(t.o), graph_var=graph_var))
    pairs = [(spec.subject_var, spec.object_var) for spec in specs]
    planned = [route_variants(pairs, j) for j in range(len(specs))]
    columns = tuple(v for v in query.projected if "?" + v in local)
    projection = tuple(local["?" + v] for v in columns)
    return ComponentProgram(name, len(variables), tuple(specs), tuple(routes[0] for _start, routes in planned),
                            projection, columns, variables, tuple(start for start, _routes in planned),
                            tuple(routes for _start, routes in planned), graph_var)


__all__ = [ "ComponentProgram", "PatternSpec", "compile_component",
           "route_variants"]
