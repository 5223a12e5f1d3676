"""Property paths that recurse: the closure of a path (`+`) and the zero-length path (`*`, `?`).

The Builder (`cbgp.algebra.compile`) rewrites what does not recurse -- sequence, inverse, alternative, negated
property sets -- into BGPs, unions and DISTINCT, the operators the engine already evaluates.  What is left is here:

- `ZeroLength`: a leaf fed every change, answering (n, n) for every node n of the active graph (a subject or an
  object of one of its triples), as pyoxigraph does; a constant end only counts that term.
- `Closure`: the set of pairs (x, y) joined by one or more steps of its child relation (the inner path, a
  multiset of (start, end) pairs), kept exact under deletions and cycles by recomputing the reach of the sources
  a removed step could cut (delete and re-derive, restricted to those sources) and extending the others by
  breadth-first search.  A constant end anchors it: only that source's reach (or, at the object end, the reach
  over reversed steps) is kept, so its state and work are what the anchor reaches.  With both ends variables
  every source's reach is kept: quadratic in the worst case, and bounded by `CBGP_MAX_PATH_PAIRS`.

Semantics, cost and the bound: docs/semantics.md (property paths) and docs/design/internals.md.
"""

from __future__ import annotations

from cbgp.algebra.operators import Delta, Leaf, Operator, add
from cbgp.engine.engine import EngineError
from cbgp.query.limits import limit
from cbgp.terms import DEFAULT_GRAPH_ID

PAIRS_SETTING = "CBGP_MAX_PATH_PAIRS"
DEFAULT_MAX_PATH_PAIRS = 1_000_000
Quad = tuple[int, int, int, int]


class PathLimitError(EngineError):
    """A closure would hold more pairs than its bound."""


def _end_binding(spec: tuple, node: int, binding: dict) -> bool:
    """Bind ``node`` at one end of a path (``("var", name)`` or ``("term", id)``); False when it cannot."""
    kind, value = spec
    if kind == "term":
        return value == node
    bound = binding.setdefault(value, node)
    return bound == node


def _graph_binding(graph: tuple, g: int, binding: dict) -> bool:
    kind, value = graph
    if kind == "default":
        return g == DEFAULT_GRAPH_ID
    if kind == "named":
        if g == DEFAULT_GRAPH_ID:
            return False
        binding[value] = g
        return True
    return value == g


class ZeroLength(Leaf):
    """The zero-length path between ``start`` and ``end`` over the nodes of the active graph (``graph``:
    ``("default", None)``, ``("named", var)`` or ``("term", id)``)."""

    def __init__(self, schema: tuple[str, ...], start: tuple, end: tuple, graph: tuple, label: str) -> None:
        super().__init__(schema, label)
        self.subject, self.object, self.graph = start, end, graph
        self.patterns = [(start, ("var", None), end, graph)]  # (what a window's GRAPH check reads)
        constants = {value for kind, value in (start, end) if kind == "term"}
        self.anchor = next(iter(constants)) if len(constants) == 1 else None
        self.never = len(constants) > 1  # two different constants: no node is both
        self.quads: set[Quad] = set()
        self.counts: dict[tuple[int, int], int] = {}  # (graph, node) -> triples it is a subject or object of

    def change(self, diff: int, quad: Quad) -> None:
        if self.never:
            return
        s, _p, o, g = quad
        anchor = self.anchor
        if anchor is not None and s != anchor and o != anchor:
            return
        if not _graph_binding(self.graph, g, {}):
            return
        if (diff > 0) == (quad in self.quads):
            return  # a duplicate insert or the delete of an absent triple
        if diff > 0:
            self.quads.add(quad)
        else:
            self.quads.discard(quad)
        out: Delta = {}
        for node in {s, o}:
            if anchor is not None and node != anchor:
                continue
            key = (g, node)
            old = self.counts.get(key, 0)
            new = old + diff
            if new:
                self.counts[key] = new
            else:
                del self.counts[key]
            if (old == 0) != (new == 0):
                binding: dict = {}
                _graph_binding(self.graph, g, binding)
                if _end_binding(self.subject, node, binding) and _end_binding(self.object, node, binding):
                    add(out, tuple(binding.get(v) for v in self.schema), 1 if new else -1)
        self.push(out)

    def entries(self) -> int:
        return len(self.quads) + len(self.counts)

    def describe(self) -> str:
        return self.label + " (zero-length: the nodes of the graph, evaluated by the operator layer)"


class Closure(Operator):
    """The pairs joined by one or more steps of the child relation (schema: ``step_start``, ``step_end`` and
    the graph variable, if any), bound to ``start`` and ``end`` (``("var", name)`` or ``("term", id)``)."""

    name = "Closure"

    def __init__(self, child: Operator, step_start: str, step_end: str, start: tuple, end: tuple,
                 graph_var: str | None, label: str) -> None:
        super().__init__([child])
        self.subject, self.object, self.graph_var, self.label = start, end, graph_var, label
        names = {value for kind, value in (start, end) if kind == "var"}
        if graph_var is not None:
            names.add(graph_var)
        self.schema = tuple(sorted(names))
        self.certain = frozenset(self.schema)
        position = {v: i for i, v in enumerate(child.schema)}
        self.positions = (position[step_start], position[step_end],
                          position[graph_var] if graph_var is not None else None)
        # Anchored at the subject: the reach of that term; at the object only: the reach over reversed steps.
        if start[0] == "term":
            self.sources, self.reverse = frozenset([start[1]]), False
        elif end[0] == "term":
            self.sources, self.reverse = frozenset([end[1]]), True
        else:
            self.sources, self.reverse = None, False  # every node with a step out of it
        self.max_pairs = limit(PAIRS_SETTING, DEFAULT_MAX_PATH_PAIRS)
        self.steps: dict = {}  # context (graph id or None) -> node -> {next node: multiplicity}
        self.reach: dict = {}  # context -> source -> set of nodes reached in one or more steps
        self.reached_by: dict = {}  # context -> node -> sources that reach it
        self.pairs = 0

    def mode(self) -> str:
        if self.sources is None:
            return "every source (unanchored)"
        return "anchored at the object (reversed steps)" if self.reverse else "anchored at the subject"

    def receive(self, slot: int, delta: Delta) -> None:
        self.deltas_in += len(delta)
        i_start, i_end, i_graph = self.positions
        added: dict = {}
        removed: dict = {}
        for row, n in delta.items():
            u, v = row[i_start], row[i_end]
            if u is None or v is None:
                continue
            if self.reverse:
                u, v = v, u
            context = row[i_graph] if i_graph is not None else None
            steps = self.steps.setdefault(context, {})
            out_of = steps.setdefault(u, {})
            old = out_of.get(v, 0)
            new = old + n
            if new:
                out_of[v] = new
            else:
                del out_of[v]
                if not out_of:
                    del steps[u]
            if old <= 0 < new:
                added.setdefault(context, []).append((u, v))
            elif new <= 0 < old:
                removed.setdefault(context, []).append((u, v))
        out: Delta = {}
        for context in set(added) | set(removed):
            self._update(context, added.get(context, []), removed.get(context, []), out)
        self.emit(out)

    def _sources_of(self, context: object, node: int) -> set:
        """The sources whose reach a step out of ``node`` can change."""
        found = set(self.reached_by.get(context, {}).get(node, ()))
        if self.sources is None or node in self.sources:
            found.add(node)
        return found

    def _update(self, context: object, added: list, removed: list, out: Delta) -> None:
        cut: set = set()
        for u, _v in removed:
            cut |= self._sources_of(context, u)
        grown: set = set()
        for u, _v in added:
            grown |= self._sources_of(context, u)
        steps = self.steps.get(context, {})
        for source in cut:  # delete and re-derive, for the sources a removed step could cut only
            self._set_reach(context, source, self._search(steps, [source], set()), out)
        for source in grown - cut:
            reach = self.reach.get(context, {}).get(source, set())
            frontier = [v for u, v in added if (u == source or u in reach) and v not in reach]
            if frontier:
                self._set_reach(context, source, self._search(steps, frontier, set(reach), seeded=True), out)

    @staticmethod
    def _search(steps: dict, frontier: list, seen: set, seeded: bool = False) -> set:
        """Breadth-first: ``seen`` plus every node one or more steps from ``frontier`` (``seeded``: the frontier
        nodes are themselves reached)."""
        if seeded:
            frontier = [v for v in frontier if not (v in seen or seen.add(v))]
        while frontier:
            following = []
            for node in frontier:
                for after in steps.get(node, ()):
                    if after not in seen:
                        seen.add(after)
                        following.append(after)
            frontier = following
        return seen

    def _set_reach(self, context: object, source: int, reach: set, out: Delta) -> None:
        reaches = self.reach.setdefault(context, {})
        old = reaches.get(source, set())
        if reach == old:
            return
        reached_by = self.reached_by.setdefault(context, {})
        growth = len(reach) - len(old)
        if growth > 0 and self.pairs + growth > self.max_pairs:
            raise PathLimitError(f"the path {self.label} would hold more than {self.max_pairs:,} pairs "
                                 f"({PAIRS_SETTING}); anchor it with a constant end or raise the limit")
        self.pairs += growth
        for node in old - reach:
            self._pair(context, source, node, -1, out)
            holders = reached_by[node]
            holders.discard(source)
            if not holders:
                del reached_by[node]
        for node in reach - old:
            self._pair(context, source, node, 1, out)
            reached_by.setdefault(node, set()).add(source)
        if reach:
            reaches[source] = reach
        else:
            reaches.pop(source, None)

    def _pair(self, context: object, source: int, node: int, diff: int, out: Delta) -> None:
        first, last = (node, source) if self.reverse else (source, node)
        binding: dict = {}
        if self.graph_var is not None:
            binding[self.graph_var] = context
        if _end_binding(self.subject, first, binding) and _end_binding(self.object, last, binding):
            add(out, tuple(binding.get(v) for v in self.schema), diff)

    def entries(self) -> int:
        return self.pairs

    def describe(self) -> str:
        return f"Closure {self.label}, {self.mode()}: {self.pairs} pair(s)"
