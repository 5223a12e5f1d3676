"""Operator queries placed by centre value: their BGP leaves evaluated where their centres
live, the operators applied where the leaves' deltas are released in seq order.

How it works: docs/design/internals.md, cbgp.algebra.by_centre.
"""

from __future__ import annotations

from dataclasses import dataclass

from cbgp.algebra.compile import Builder, EngineLeaf, OperatorQuerySpec
from cbgp.algebra.operators import Delta, add, remapper
from cbgp.algebra.continuous import OperatorTree
from cbgp.algebra.expressions import Terms
from cbgp.engine.assembly import assembler_for, split_parts
from cbgp.query.plan import BY_CENTRE, Plan, decompose
from cbgp.query.sparql import parse_query
from cbgp.terms import TermDictionary


@dataclass(frozen=True)
class LeafPart:
    """One part of one BGP leaf of an operator query, as the fleet evaluates it."""

    index: int  # its number among all the leaves' parts: PartDelta.part
    leaf: int  # the leaf (OperatorTree's engine leaves, in order)
    part: int  # its index in the leaf's decomposition; -1: the leaf whole (a leaf of one part)
    plan: Plan  # what a routed shard registers: in its engine, or in its evaluator when ``plan.probed``
    # A leaf (or a product leaf's part) with FILTERs pushed into its patterns: its query with them, and the
    # query's prologue (the filters' IRIs), so a shard can keep the changes they reject out of its state (its
    # engine's, or its evaluator's for a leaf joined by probes).
    pushed: EngineLeaf | None = None
    prologue: object = None


def _leaf_parts(engine_leaves: list[EngineLeaf], prologue: object = None) -> tuple[LeafPart, ...] | None:
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
    a leaf with a variable predicate (matched against every change, ``PatternLeaf``), a leaf that is not
    placed by centre itself, or no leaf at all (VALUES alone)."""
    builder = Builder(spec, Terms(TermDictionary(stable=True), spec.prologue), pushdown=True)
    builder.build_root()
    if builder.pattern_leaves or not builder.engine_leaves:
        return None
    return _leaf_parts(builder.engine_leaves, spec.prologue)


class OperatorAssembler:
    """An operator query's answers from its leaves' part deltas, released in seq order: per update,
    :meth:`apply` multiplies each multi-part leaf's parts, nets each leaf's deltas and pushes them through the
    operators.  Rows of a part name their variables (what a worker reports), so the order of its columns
    does not matter.  ``dictionary``: term ids as the fleet's (stable ids; expressions read the terms, and
    values the operators compute -- a COUNT, a BIND -- get ids there)."""

    def __init__(self, spec: OperatorQuerySpec, dictionary: TermDictionary) -> None:
        self.tree = OperatorTree(spec, dictionary, pushdown=False)
        engine_leaves = self.tree.builder.engine_leaves
        parts = _leaf_parts(engine_leaves) if not self.tree.builder.pattern_leaves else None
        if not parts:
            raise ValueError("the query cannot be evaluated by centre (see leaf_parts)")
        self.parts = parts
        self.columns = self.tree.columns
        self.form = self.tree.form
        self.leaves = [engine_leaf.leaf for engine_leaf in engine_leaves]
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


__all__ = ["LeafPart", "OperatorAssembler", "leaf_parts"]
