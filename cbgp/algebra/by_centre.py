"""Operator queries placed by centre value: their BGP leaves evaluated where their centres
live, the operators applied where the leaves' deltas are released in seq order.

How it works: docs/design/internals.md, cbgp.algebra.by_centre.
"""

from __future__ import annotations

from dataclasses import dataclass

from cbgp.algebra.compile import Builder, EngineLeaf, OperatorQuerySpec
from cbgp.algebra.operators import Delta, Leaf, add, remapper
from cbgp.algebra.continuous import OperatorTree
from cbgp.algebra.expressions import Terms
from cbgp.algebra.leaf import PatternLeaf
from cbgp.algebra.paths import ZeroLength
from cbgp.change import ROLE_BOTH, ROLE_OBJECT, ROLE_SUBJECT
from cbgp.engine.assembly import assembler_for, split_parts
from cbgp.query.plan import BY_CENTRE, Plan, decompose
from cbgp.query.sparql import parse_query
from cbgp.terms import TermDictionary


@dataclass(frozen=True)
class LeafPart:
    """One part of one BGP leaf of an operator query, as the fleet evaluates it."""

    index: int  # its number among all the leaves' parts: PartDelta.part
    leaf: int  # the leaf (OperatorTree's engine leaves in order, then its pattern leaves)
    part: int  # its index in the leaf's decomposition; -1: the leaf whole (a leaf of one part)
    plan: Plan | None  # what a routed shard registers: in its engine, or in its evaluator when ``plan.probed``
    # A leaf (or a product leaf's part) with FILTERs pushed into its patterns: its query with them, and the
    # query's prologue (the filters' IRIs), so a shard can keep the changes they reject out of its state (its
    # engine's, or its evaluator's for a leaf joined by probes).
    pushed: EngineLeaf | None = None
    prologue: object = None
    # A pattern leaf (a variable predicate, a negated property set, a zero-length path): how to build it
    # (``pattern_leaf``), and the roles of the changes a routed shard feeds it (``pattern_role``).
    pattern: tuple | None = None
    role: int = 0

    @property
    def probed(self) -> bool:
        """Joined by probes between the routed shards (in their evaluators, not their engines)."""
        return self.plan is not None and self.plan.probed

    def pattern_leaf(self) -> Leaf:
        """A new, unattached copy of this part's pattern leaf."""
        kind, *args = self.pattern  # type: ignore[misc]
        if kind == "zero":
            return ZeroLength(*args)
        schema, patterns, label = args
        return PatternLeaf(schema, list(patterns), label)


def pattern_role(leaf: Leaf) -> int | None:
    """The roles of the routed changes a shard feeds a pattern leaf so that each solution is found on exactly one
    shard, or None (its patterns share no end: only one owner of every change can evaluate it).

    A zero-length path counts each node where the node lives: both roles, each end counted for its own.  A
    pattern leaf whose patterns all have the same subject (a variable or a constant) is evaluated where that
    subject lives, every triple of a solution there; the same object, where that lives."""
    if isinstance(leaf, ZeroLength):
        return ROLE_BOTH
    if isinstance(leaf, PatternLeaf):
        if len({pattern[0] for pattern in leaf.patterns}) == 1:
            return ROLE_SUBJECT
        if len({pattern[2] for pattern in leaf.patterns}) == 1:
            return ROLE_OBJECT
    return None


def _pattern_recipe(leaf: Leaf) -> tuple:
    if isinstance(leaf, ZeroLength):
        return ("zero", leaf.schema, leaf.subject, leaf.object, leaf.graph, leaf.label)
    return ("pattern", leaf.schema, tuple(leaf.patterns), leaf.label)  # type: ignore[attr-defined]


def _leaf_parts(engine_leaves: list[EngineLeaf], pattern_leaves: list[Leaf] = (),  # type: ignore[assignment]
                prologue: object = None) -> tuple[LeafPart, ...] | None:
    out: list[LeafPart] = []
    for number, engine_leaf in enumerate(engine_leaves):
        plan = decompose(engine_leaf.query)
        if plan.placement != BY_CENTRE:
            return None
        if len(plan.parts) == 1:
            pushed = engine_leaf if engine_leaf.pushed else None
            out.append(LeafPart(len(out), number, -1, plan, pushed, prologue if pushed else None))
            continue
        for part in split_parts(engine_leaf.query):
            part_plan = decompose(parse_query(part.sparql))
            pushed = _part_filters(engine_leaf, plan.parts[part.index].patterns, part_plan)
            out.append(LeafPart(len(out), number, part.index, part_plan, pushed, prologue if pushed else None))
    for number, leaf in enumerate(pattern_leaves, start=len(engine_leaves)):
        role = pattern_role(leaf)
        if role is None:
            return None
        out.append(LeafPart(len(out), number, -1, None, pattern=_pattern_recipe(leaf), role=role))
    return tuple(out)


def _part_filters(engine_leaf: EngineLeaf, indices: tuple[int, ...], part_plan: Plan) -> EngineLeaf | None:
    """The FILTERs pushed into the patterns of one part of a product leaf (leaf pattern ``indices[j]`` is the
    part's pattern j), as a leaf of the part's own query, or None (none pushed).
    A pushed filter is a conjunct on one pattern's variables, so a triple it rejects is in no answer of the
    product either."""
    if not engine_leaf.pushed:
        return None
    patterns = part_plan.query.patterns
    if len(patterns) != len(indices) or any(patterns[j] != engine_leaf.query.patterns[i]
                                            for j, i in enumerate(indices)):
        return None  # (the part's text reordered its patterns: kept whole rather than guessed)
    filters = {j: engine_leaf.pushed[i] for j, i in enumerate(indices) if i in engine_leaf.pushed}
    return EngineLeaf(engine_leaf.leaf, part_plan.query, filters) if filters else None


def leaf_parts(spec: OperatorQuerySpec) -> tuple[LeafPart, ...] | None:
    """The parts the fleet evaluates by centre for an operator query, or None when it cannot be placed so:
    a pattern leaf whose patterns share no end (``pattern_role``), a BGP leaf that is not placed by centre
    itself, or no leaf at all (VALUES alone)."""
    builder = Builder(spec, Terms(TermDictionary(stable=True), spec.prologue), pushdown=True)
    builder.build_root()
    if not builder.engine_leaves and not builder.pattern_leaves:
        return None
    return _leaf_parts(builder.engine_leaves, builder.pattern_leaves, spec.prologue)


class OperatorAssembler:
    """An operator query's answers from its leaves' part deltas, released in seq order: per update,
    :meth:`apply` multiplies each multi-part leaf's parts, nets each leaf's deltas and pushes them through the
    operators.  Rows of a part name their variables (what a worker reports), so the order of its columns
    does not matter.  ``dictionary``: term ids as the fleet's (stable ids; expressions read the terms, and
    values the operators compute -- a COUNT, a BIND -- get ids there)."""

    def __init__(self, spec: OperatorQuerySpec, dictionary: TermDictionary) -> None:
        self.tree = OperatorTree(spec, dictionary, pushdown=False)
        engine_leaves = self.tree.builder.engine_leaves
        parts = _leaf_parts(engine_leaves, self.tree.builder.pattern_leaves)
        if not parts:
            raise ValueError("the query cannot be evaluated by centre (see leaf_parts)")
        self.parts = parts
        self.columns = self.tree.columns
        self.form = self.tree.form
        # (a pattern leaf here is fed its shards' deltas like a BGP leaf: it never sees a change itself)
        self.leaves = [engine_leaf.leaf for engine_leaf in engine_leaves] + list(self.tree.builder.pattern_leaves)
        # A leaf of several parts: its product's assembler, and its answers' remapping to the leaf's schema.
        self.assemblers = {}
        self._assembled_to_leaf = {}
        for number, engine_leaf in enumerate(engine_leaves):
            if any(p.leaf == number and p.part >= 0 for p in parts):
                assembler = self.assemblers[number] = assembler_for(engine_leaf.query)
                self._assembled_to_leaf[number] = remapper(assembler.columns, self.leaves[number].schema)
        self._remaps: dict[tuple[int, tuple[str, ...]], object] = {}

    def _target(self, part: LeafPart) -> tuple[str, ...]:
        if part.part < 0:
            return tuple(self.leaves[part.leaf].schema)
        return self.assemblers[part.leaf].parts[part.part].columns

    def initial(self) -> list[tuple[int, tuple]]:
        """Answers before any change (VALUES rows, an aggregate's empty group, ASK's false...)."""
        return self.tree.initial()

    def apply(self, deltas: list[tuple[int, int, tuple, tuple[str, ...]]]) -> list[tuple[int, tuple]]:
        """The answer deltas of one update from its part deltas ``(part, sign, row, row's variables)``, in any
        order (rows in ``columns`` order, None for an unbound variable; ``-`` rows first)."""
        if self.tree.failed is not None:  # stopped: what its leaves and products held goes too
            self.leaves, self.assemblers = [], {}
            return []
        batches: dict[int, Delta] = {}
        assembled: dict[int, list[tuple[int, int, tuple]]] = {}
        for index, diff, row, variables in deltas:
            if not 0 <= index < len(self.parts):
                raise ValueError(f"no part {index}: the query's leaves have {len(self.parts)} parts")
            part = self.parts[index]
            remap = self._remaps.get((index, variables))
            if remap is None:
                remap = self._remaps[(index, variables)] = remapper(variables, self._target(part))
            if part.part < 0:
                add(batches.setdefault(part.leaf, {}), remap(row), diff)
            else:
                assembled.setdefault(part.leaf, []).append((part.part, diff, remap(row)))
        for leaf, items in assembled.items():
            to_leaf = self._assembled_to_leaf[leaf]
            batch = batches.setdefault(leaf, {})
            for diff, row in self.assemblers[leaf].apply(items):
                add(batch, to_leaf(row), diff)
        return self.tree.push(self.leaves, batches)

    def state_entries(self) -> int:
        return (sum(op.entries() for op in self.tree.root.walk())
                + sum(assembler.state_entries() for assembler in self.assemblers.values()))


__all__ = ["LeafPart", "OperatorAssembler", "leaf_parts", "pattern_role"]
