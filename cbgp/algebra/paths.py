"""Property paths that recurse: the closure of a path (`+`) and the zero-length path (`*`, `?`).

The Builder (`cbgp.algebra.compile`) rewrites what does not recurse -- sequence, inverse, alternative, negated
property sets -- into BGPs, unions and DISTINCT, the operators the engine already evaluates.  What is left is here:

- `ZeroLength`: a leaf fed every change, answering (n, n) for every node n of the active graph (a subject or an
  object of one of its triples), as pyoxigraph does; a constant end only counts that term.
- `Closure`: the set of pairs (x, y) joined by one or more steps of its child relation (the inner path, a
  multiset of (start, end) pairs), kept exact under deletions and cycles by a spanning tree per source (as the
  streaming regular-path-query work does): a new step grows the trees that hold its start by breadth-first
  search; a removed step that is in no tree changes nothing, one that is cuts its subtree off, which is
  re-attached through the other steps into it, and what is not re-attached is no longer reached.  A constant
  end anchors it: only that source's tree (or, at the object end, the tree over reversed steps) is kept, so its
  pairs and its work are what the anchor reaches.  With both ends variables every source has a tree: quadratic
  in the worst case, and bounded by `CBGP_MAX_PATH_PAIRS`.
- `Steps`: the step relation ``?a <p> ?b`` of the closures in one engine (`cbgp.algebra.continuous`), kept once
  and read by each of them.  A closure fed its steps by a child (in the fleet) keeps every step of its relation.

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

    def change(self, diff: int, quad: Quad, ends: int = 3) -> None:
        """``ends``: which ends of the triple this leaf counts (1 the subject, 2 the object, 3 both: a routed
        shard counts the nodes it owns, the bits of the change's role)."""
        if self.never:
            return
        s, _p, o, g = quad
        anchor = self.anchor
        if anchor is not None and s != anchor and o != anchor:
            return
        graph: dict = {}  # the graph variable's binding, if any
        if not _graph_binding(self.graph, g, graph):
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
            if ends != 3 and not ends & ((1 if node == s else 0) | (2 if node == o else 0)):
                continue
            key = (g, node)
            old = self.counts.get(key, 0)
            new = old + diff
            if new:
                self.counts[key] = new
            else:
                del self.counts[key]
            if (old == 0) != (new == 0):
                binding = dict(graph)
                if _end_binding(self.subject, node, binding) and _end_binding(self.object, node, binding):
                    add(out, tuple(binding.get(v) for v in self.schema), 1 if new else -1)
        self.push(out)

    def entries(self) -> int:
        return len(self.quads) + len(self.counts)

    def describe(self) -> str:
        return self.label + " (zero-length: the nodes of the graph, evaluated by the operator layer)"


class _Tree:
    """What one source reaches: a spanning tree (``parent`` of every reached node but the root, ``children``),
    and whether the source reaches itself (``cyclic``: a step into it from the tree or from itself)."""

    __slots__ = ("root", "parent", "children", "cyclic")

    def __init__(self, root: int) -> None:
        self.root = root
        self.parent: dict[int, int] = {}
        self.children: dict[int, set[int]] = {}
        self.cyclic = False

    def holds(self, node: int) -> bool:
        return node == self.root or node in self.parent


class Steps:
    """The (subject, object) pairs of one predicate in the default graph, with set semantics (a duplicate insert or
    the delete of an absent triple changes nothing) and adjacency both ways: the step relation ``?a <p> ?b`` of
    the closures over it, kept once per engine and read by each of them (:meth:`Closure.share`)."""

    __slots__ = ("out", "into", "size")

    def __init__(self) -> None:
        self.out: dict[int, set[int]] = {}
        self.into: dict[int, set[int]] = {}
        self.size = 0

    def change(self, diff: int, s: int, o: int) -> bool:
        """Apply one change of the predicate; whether the relation changed."""
        following = self.out.get(s)
        if (diff > 0) == (following is not None and o in following):
            return False
        if diff > 0:
            self.out.setdefault(s, set()).add(o)
            self.into.setdefault(o, set()).add(s)
            self.size += 1
            return True
        for adjacency, node, other in ((self.out, s, o), (self.into, o, s)):
            nodes = adjacency[node]
            nodes.discard(other)
            if not nodes:
                del adjacency[node]
        self.size -= 1
        return True


class Closure(Operator):
    """The pairs joined by one or more steps of the child relation (schema: ``step_start``, ``step_end`` and
    the graph variable, if any), bound to ``start`` and ``end`` (``("var", name)`` or ``("term", id)``)."""

    name = "Closure"
    shared: Steps | None = None  # the engine's step relation this closure reads (``share``), or None: its own
    flipped = False  # (shared) the step's start is the object of the predicate's triples

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
        # Anchored at the subject: the tree of that term; at the object only: the tree over reversed steps.
        if start[0] == "term":
            self.sources, self.reverse = frozenset([start[1]]), False
        elif end[0] == "term":
            self.sources, self.reverse = frozenset([end[1]]), True
        else:
            self.sources, self.reverse = None, False  # every node with a step out of it
        self.max_pairs = limit(PAIRS_SETTING, DEFAULT_MAX_PATH_PAIRS)
        # per context (graph id or None): steps out of and into each node ({node: multiplicity}), the trees by
        # source, and the sources whose tree holds each node (not as its root)
        self.out: dict = {}
        self.into: dict = {}
        self.trees: dict = {}
        self.held_by: dict = {}
        self.pairs = 0
        self.steps = 0  # distinct steps present (each kept twice: in ``out`` and in ``into``)
        self.step_vars = (step_start, step_end)

    def __setstate__(self, state: dict) -> None:
        """Unpickled (a checkpoint): one written before ``steps`` was kept counts them from ``out``."""
        self.__dict__.update(state)
        if "steps" not in state:
            self.steps = sum(len(following) for adjacency in self.out.values() for following in adjacency.values())

    def share(self, steps: Steps, subject_first: bool) -> None:
        """Read the step relation from ``steps``, an engine's one copy of ``?a <p> ?b`` (``subject_first``: the
        step starts at the triple's subject), instead of keeping its own: the child leaf is no longer fed;
        :meth:`step` is called after each change of ``steps`` and :meth:`seed` once, to grow the trees from
        what ``steps`` holds."""
        self.shared, self.flipped = steps, subject_first == self.reverse
        forward, backward = (steps.into, steps.out) if self.flipped else (steps.out, steps.into)
        self.out, self.into, self.steps = {None: forward}, {None: backward}, 0

    def step(self, diff: int, s: int, o: int) -> None:
        """One change of the shared step relation (already applied to it): its trees cut or grown."""
        u, v = (o, s) if self.flipped else (s, o)
        if self.sources is not None:  # anchored: one tree
            tree = self.trees.get(None, {}).get(next(iter(self.sources)))
            if tree is None:
                if u not in self.sources:
                    return  # (no tree yet, and the step does not start it)
            elif not tree.holds(u) or (v != tree.root and (tree.parent.get(v) != u if diff < 0 else tree.holds(v))):
                return  # (what the tree holds, and whether it reaches its root, do not change)
        out: Delta = {}
        self._update(None, [(u, v)] if diff > 0 else [], [] if diff > 0 else [(u, v)], out)
        self.emit(out)

    def seed(self) -> None:
        """Grow the trees from the shared steps as they are (a closure sharing them from its registration)."""
        following = self.out[None]
        sources = following if self.sources is None else [u for u in self.sources if u in following]
        out: Delta = {}
        self._update(None, [(u, v) for u in sources for v in following[u]], [], out)
        self.emit(out)

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
            old = _bump(self.out.setdefault(context, {}), u, v, n)
            _bump(self.into.setdefault(context, {}), v, u, n)
            new = old + n
            if old <= 0 < new:
                added.setdefault(context, []).append((u, v))
                self.steps += 1
            elif new <= 0 < old:
                removed.setdefault(context, []).append((u, v))
                self.steps -= 1
        out: Delta = {}
        for context in set(added) | set(removed):
            self._update(context, added.get(context, []), removed.get(context, []), out)
        self.emit(out)

    def _holders(self, context: object, node: int) -> set:
        """The sources whose tree holds ``node`` (as a reached node, or as the root)."""
        found = set(self.held_by.get(context, {}).get(node, ()))
        if node in self.trees.get(context, {}):
            found.add(node)
        return found

    def _update(self, context: object, added: list, removed: list, out: Delta) -> None:
        """The steps all changed already: cut the trees the removed steps were in, then grow the trees that hold
        a new step's start, then check which sources reach themselves (only where that may have changed: the
        tree's nodes, or the steps into its root)."""
        trees = self.trees.setdefault(context, {})
        touched: set = set()  # the trees whose nodes, or steps into or out of their root, changed
        for u, v in removed:
            for source in self._holders(context, u):
                tree = trees[source]
                if tree.parent.get(v) == u:
                    self._cut(context, tree, v, out)
                    touched.add(source)
                elif source == u or source == v:
                    touched.add(source)
        for u, _v in added:
            if self.sources is None or u in self.sources:
                if u not in trees:
                    trees[u] = _Tree(u)
        for u, v in added:
            for source in self._holders(context, u):
                tree = trees[source]
                if not tree.holds(v):
                    self._grow(context, tree, [(u, v)], out)
                    touched.add(source)
                elif source == v:
                    touched.add(source)
        into = self.into.get(context, {})
        for source in touched:
            tree = trees.get(source)
            if tree is None:
                continue
            cyclic = any(tree.holds(w) for w in into.get(source, ()))
            if cyclic != tree.cyclic:
                self._count(1 if cyclic else -1)
                tree.cyclic = cyclic
                self._pair(context, source, source, 1 if cyclic else -1, out)
            if not tree.parent and not tree.cyclic and not self.out.get(context, {}).get(source):
                del trees[source]

    def _grow(self, context: object, tree: _Tree, steps: list, out: Delta) -> None:
        """Attach each step's end (its start held) and breadth-first what it reaches."""
        following = self.out.get(context, {})
        frontier = []
        for u, v in steps:
            if tree.holds(u) and not tree.holds(v):
                self._attach(context, tree, v, u, out)
                frontier.append(v)
        while frontier:
            reached = []
            for node in frontier:
                for after in following.get(node, ()):
                    if not tree.holds(after):
                        self._attach(context, tree, after, node, out)
                        reached.append(after)
            frontier = reached

    def _cut(self, context: object, tree: _Tree, top: int, out: Delta) -> None:
        """The step into ``top`` from its parent is gone: detach its subtree, re-attach what another step into
        it from the rest of the tree still reaches, and retract the others."""
        cut = [top]
        for node in cut:
            cut.extend(tree.children.get(node, ()))
        siblings = tree.children.get(tree.parent[top])
        siblings.discard(top)
        if not siblings:
            del tree.children[tree.parent[top]]
        for node in cut:
            del tree.parent[node]
            tree.children.pop(node, None)
            holders = self.held_by[context][node]
            holders.discard(tree.root)
            if not holders:
                del self.held_by[context][node]
            self._pair(context, tree.root, node, -1, out)
        self._count(-len(cut))
        into = self.into.get(context, {})
        steps = [(w, node) for node in cut for w in into.get(node, ()) if tree.holds(w)]  # (the cut are not held)
        self._grow(context, tree, steps, out)  # (a node re-attached is asserted again: its retraction cancels)

    def _attach(self, context: object, tree: _Tree, node: int, parent: int, out: Delta) -> None:
        self._count(1)
        tree.parent[node] = parent
        tree.children.setdefault(parent, set()).add(node)
        self.held_by.setdefault(context, {}).setdefault(node, set()).add(tree.root)
        self._pair(context, tree.root, node, 1, out)

    def _count(self, growth: int) -> None:
        if growth > 0 and self.pairs + growth > self.max_pairs:
            raise PathLimitError(f"the path {self.label} would hold more than {self.max_pairs:,} pairs "
                                 f"({PAIRS_SETTING}); anchor it with a constant end or raise the limit")
        self.pairs += growth

    def _pair(self, context: object, source: int, node: int, diff: int, out: Delta) -> None:
        first, last = (node, source) if self.reverse else (source, node)
        binding: dict = {}
        if self.graph_var is not None:
            binding[self.graph_var] = context
        if _end_binding(self.subject, first, binding) and _end_binding(self.object, last, binding):
            add(out, tuple(binding.get(v) for v in self.schema), diff)

    def entries(self) -> int:
        """The pairs of its trees and the steps it keeps: none when it reads an engine's shared steps, else every
        step of its relation, anchored or not (a step out of a node no tree holds yet may be walked once a new
        step reaches that node)."""
        return self.pairs + self.steps

    def describe(self) -> str:
        if self.shared is not None:
            return (f"Closure {self.label}, {self.mode()}: {self.pairs} pair(s) over the engine's "
                    f"{self.shared.size} shared step(s)")
        return f"Closure {self.label}, {self.mode()}: {self.pairs} pair(s) over {self.steps} step(s)"


def closure_pairs(root: Operator) -> int | None:
    """The pairs the closures of an operator tree hold (``cbgp_path_pairs``), or None when it has none."""
    closures = [op for op in root.walk() if isinstance(op, Closure)]
    return sum(op.pairs for op in closures) if closures else None


def _bump(adjacency: dict, node: int, other: int, n: int) -> int:
    """Add ``n`` to the multiplicity of the step between ``node`` and ``other``; the old multiplicity."""
    steps = adjacency.setdefault(node, {})
    old = steps.get(other, 0)
    if old + n:
        steps[other] = old + n
    else:
        del steps[other]
        if not steps:
            del adjacency[node]
    return old
