"""Per-part state of a query, keyed by the value of each star's central node.

How it works: docs/design/internals.md, cbgp.engine.part_state.
"""

from __future__ import annotations

import sys
from itertools import islice
from typing import Iterator

Row = tuple[int, ...]
_SAMPLE = 1000  # neighbour tables larger than this are sampled when estimating their bytes


def table_bytes(table: dict | None) -> int:
    """Approximate bytes of a neighbour table: the dict plus its tuple- and set-valued entries (ids are
    shared ints)."""
    if table is None:
        return 0
    size = sys.getsizeof(table)
    if not table:
        return size
    values = table.values() if len(table) <= _SAMPLE else list(islice(table.values(), _SAMPLE))
    many = sum(sys.getsizeof(v) for v in values if type(v) is tuple or type(v) is set)
    return size + many * len(table) // len(values)


# --- neighbour containers: int when single, tuple when a few, set when many -----------------------------
# A 2-element set costs 216 bytes and an 8-element one 728; the tuple costs 40 + 8 per element, and its
# linear scan is as fast as hashing up to a few dozen ids.  A set shrinking to _SMALL // 2 becomes a
# tuple again (not at _SMALL: a neighbour count going up and down by one would convert every time).

_SMALL = 16


def nb_add(table: dict, key: int, value: int) -> bool:
    current = table.get(key)
    if current is None:
        table[key] = value
        return True
    kind = type(current)
    if kind is tuple:
        if value in current:
            return False
        table[key] = current + (value,) if len(current) < _SMALL else {*current, value}
        return True
    if kind is set:
        if value in current:
            return False
        current.add(value)
        return True
    if current == value:
        return False
    table[key] = (current, value)
    return True


def nb_remove(table: dict, key: int, value: int) -> bool:
    current = table.get(key)
    if current is None:
        return False
    kind = type(current)
    if kind is tuple:
        if value not in current:
            return False
        if len(current) == 2:
            table[key] = current[1] if current[0] == value else current[0]
        else:
            i = current.index(value)
            table[key] = current[:i] + current[i + 1:]
        return True
    if kind is set:
        if value not in current:
            return False
        current.discard(value)
        if len(current) <= _SMALL // 2:
            table[key] = tuple(current)
        return True
    if current == value:
        del table[key]
        return True
    return False


def nb_has(table: dict, key: int, value: int) -> bool:
    current = table.get(key)
    if current is None:
        return False
    kind = type(current)
    if kind is tuple or kind is set:
        return value in current
    return current == value


def nb_same(a: int | tuple | set, b: int | tuple | set) -> bool:
    """Whether two neighbour containers hold the same values (tuples keep their insertion order)."""
    return a == b or set(nb_iter(a)) == set(nb_iter(b))


def watch_add(table: dict, key: int, handler: object) -> None:
    """File a handler under a value: the bare handler when alone, a list when several."""
    current = table.get(key)
    if current is None:
        table[key] = handler
    elif type(current) is list:
        current.append(handler)
    else:
        table[key] = [current, handler]


def watch_remove(table: dict, key: int, handler: object) -> None:
    current = table[key]
    if type(current) is list:
        current.remove(handler)
        if len(current) == 1:
            table[key] = current[0]
    else:
        del table[key]


def nb_iter(current: int | tuple | set) -> Iterator[int] | tuple | set:
    kind = type(current)
    return current if kind is tuple or kind is set else (current,)


def nb_len(current: int | tuple | set) -> int:
    kind = type(current)
    return len(current) if kind is tuple or kind is set else 1


# --- ground part ------------------------------------------------------------------------------------

class GroundState:
    __slots__ = ("bits", "full")

    def __init__(self, size: int) -> None:
        self.bits = 0
        self.full = (1 << size) - 1

    def step(self, diff: int, bit: int) -> list[tuple[int, Row]]:
        bits = self.bits
        if diff > 0:
            if bits & bit:
                return []
            bits |= bit
            self.bits = bits
            return [(1, ())] if bits == self.full else []
        if not bits & bit:
            return []
        self.bits = bits ^ bit
        return [(-1, ())] if bits == self.full else []

    def answers(self) -> list[Row]:
        return [()] if self.bits == self.full else []

    def entries(self) -> int:
        return 1

    def approx_bytes(self) -> int:
        return sys.getsizeof(self.bits)


# --- single-variable star -----------------------------------------------------------------------------

class StarState:
    """centre value -> bitmap of the star's patterns present for it."""

    __slots__ = ("centres", "full", "complete")

    def __init__(self, size: int, track_answers: bool) -> None:
        self.centres: dict[int, int] = {}
        self.full = (1 << size) - 1
        # The answer set is only needed when another part must be multiplied with it.
        self.complete: set[int] | None = set() if track_answers else None

    def step(self, diff: int, bit: int, centre: int) -> list[tuple[int, Row]]:
        centres = self.centres
        mask = centres.get(centre, 0)
        if diff > 0:
            if mask & bit:
                return []
            mask |= bit
            centres[centre] = mask
            if mask == self.full:
                if self.complete is not None:
                    self.complete.add(centre)
                return [(1, (centre,))]
            return []
        if not mask & bit:
            return []
        out = []
        if mask == self.full:
            if self.complete is not None:
                self.complete.discard(centre)
            out = [(-1, (centre,))]
        mask ^= bit
        if mask:
            centres[centre] = mask
        else:
            del centres[centre]
        return out

    def answers(self) -> list[Row]:
        assert self.complete is not None
        return [(x,) for x in self.complete]

    def entries(self) -> int:
        return len(self.centres)

    def approx_bytes(self) -> int:
        return sys.getsizeof(self.centres) + (sys.getsizeof(self.complete) if self.complete is not None else 0)


# --- var-connected component ----------------------------------------------------------------------------

SINGLE = 0  # pattern with one variable: constant other end, or a self-loop ?x p ?x
VAR_VAR = 1  # pattern joining two distinct variables


class ComponentState:
    """State and delta enumeration of one var-connected component.

    Pattern j (local index) is either SINGLE on variable `var[j]` with bit
    `bit[j]` in `masks[var[j]]`, or VAR_VAR from subject variable `subj[j]` to
    object variable `obj[j]` with neighbour tables `forward[j]` (subject value
    -> object values) and `backward[j]` (object value -> subject values).
    """

    def __init__(
        self,
        n_vars: int,
        patterns: list[tuple[int, ...]],
        join_orders: list[list[int]],
        track_answers: bool,
    ) -> None:
        # patterns[j] = (SINGLE, var) or (VAR_VAR, subject_var, object_var)
        self.n_vars = n_vars
        self.kinds = [p[0] for p in patterns]
        self.masks: list[dict[int, int]] = [{} for _ in range(n_vars)]
        self.full = [0] * n_vars
        self.bit = [0] * len(patterns)
        self.var = [-1] * len(patterns)
        self.subj = [-1] * len(patterns)
        self.obj = [-1] * len(patterns)
        for j, spec in enumerate(patterns):
            if spec[0] == SINGLE:
                v = spec[1]
                self.var[j] = v
                self.bit[j] = 1 << bin(self.full[v]).count("1")
                self.full[v] |= self.bit[j]
            else:
                self.subj[j], self.obj[j] = spec[1], spec[2]
        raw_plans = [self._plan(j, order) for j, order in enumerate(join_orders)]
        # Keep a var-var pattern's table only in the directions some join plan reads to generate
        # candidates (the first edge of each step), plus one direction to record presence: about half
        # the memory of keeping both, and membership checks can read either direction.
        needs_forward = [False] * len(patterns)
        needs_backward = [False] * len(patterns)
        for _initial, _checks, steps in raw_plans:
            for _z, edges in steps:
                k, z_is_object, _w = edges[0]
                if z_is_object:
                    needs_forward[k] = True
                else:
                    needs_backward[k] = True
        # A var-var pattern's pairs live in an EdgeTable (cbgp.engine.edge_tables) the engine binds and updates; the
        # directions are what this component's plans read (at least one, to record presence).
        self.needs_forward = [kind == VAR_VAR and (needs_forward[j] or not needs_backward[j])
                              for j, kind in enumerate(self.kinds)]
        self.needs_backward = [kind == VAR_VAR and needs_backward[j] for j, kind in enumerate(self.kinds)]
        self.tables: list = [None] * len(patterns)
        self.forward: list[dict | None] = [None] * len(patterns)
        self.backward: list[dict | None] = [None] * len(patterns)
        self._raw_plans = raw_plans
        self._plans: list = []
        # same[j]: the var-var patterns k != j over the same relation (graph, predicate) as pattern j, whose
        # tables one triple can modify together with pattern j's (set by the engine: see step).
        self.same: list[list[int]] = [[] for _ in patterns]
        # gates[v]: (watch table, handler) pairs to file a centre value under while its mask on v is full.
        self.gates: list[list] = [[] for _ in range(n_vars)]
        self.answer_set: set[Row] | None = set() if track_answers else None

    def bind(self, j: int, table) -> None:  # noqa: ANN001
        """Read var-var pattern j's pairs from `table` (an EdgeTable); call `compile` after the last bind."""
        table.need(self.needs_forward[j], self.needs_backward[j])
        self.tables[j] = table

    def compile(self) -> None:
        self.forward = [t.forward if t is not None else None for t in self.tables]
        self.backward = [t.backward if t is not None else None for t in self.tables]
        self._plans = [self._compile(plan) for plan in self._raw_plans]

    def _plan(self, j: int, order: list[int]) -> tuple:
        """For pattern j: its variables, the var-var patterns to check among them, and the extension steps."""
        initial = [self.var[j]] if self.kinds[j] == SINGLE else [self.subj[j], self.obj[j]]
        bound = set(initial)
        # Pattern j itself is present by construction (stored before, removed after enumeration).
        checks = [
            k
            for k in range(len(self.kinds))
            if k != j and self.kinds[k] == VAR_VAR and self.subj[k] in bound and self.obj[k] in bound
        ]
        steps = []
        for z in order:
            if z in bound:
                continue
            edges = []  # (pattern, z is its object, the bound variable at its other end)
            for k in range(len(self.kinds)):
                if self.kinds[k] != VAR_VAR:
                    continue
                if self.obj[k] == z and self.subj[k] in bound:
                    edges.append((k, True, self.subj[k]))
                elif self.subj[k] == z and self.obj[k] in bound:
                    edges.append((k, False, self.obj[k]))
            assert edges, "join order must reach every variable through a var-var pattern"
            steps.append((z, edges))
            bound.add(z)
        return tuple(initial), checks, steps

    def _compile(self, plan: tuple) -> tuple:
        """Bind a plan to the tables: generators read a maintained direction, the rest are checks."""
        initial, checks, steps = plan
        compiled = []
        for z, edges in steps:
            generators = []
            others = []
            for k, z_is_object, w in edges:
                table = self.forward[k] if z_is_object else self.backward[k]
                if table is not None:
                    generators.append((table, w))
                else:
                    others.append((k, z_is_object, w))
            compiled.append((z, generators, others, self.masks[z], self.full[z]))
        return tuple(initial), checks, compiled

    def _has(self, k: int, subject: int, object_: int) -> bool:
        forward = self.forward[k]
        if forward is not None:
            return nb_has(forward, subject, object_)
        return nb_has(self.backward[k], object_, subject)

    # -- the masks of single-variable patterns (var-var pairs are in the engine's EdgeTables) --

    def store(self, j: int, values: tuple[int, ...]) -> bool:
        v = self.var[j]
        masks = self.masks[v]
        x = values[0]
        mask = masks.get(x, 0)
        bit = self.bit[j]
        if mask & bit:
            return False
        mask |= bit
        masks[x] = mask
        if mask == self.full[v] and self.gates[v]:
            for watch, handler in self.gates[v]:
                watch_add(watch, x, handler)
        return True

    def present(self, j: int, values: tuple[int, ...]) -> bool:
        return bool(self.masks[self.var[j]].get(values[0], 0) & self.bit[j])

    def remove(self, j: int, values: tuple[int, ...]) -> None:
        v = self.var[j]
        masks = self.masks[v]
        x = values[0]
        old = masks[x]
        if old == self.full[v] and self.gates[v]:
            for watch, handler in self.gates[v]:
                watch_remove(watch, x, handler)
        mask = old & ~self.bit[j]
        if mask:
            masks[x] = mask
        else:
            del masks[x]

    # -- updates --

    def step(self, diff: int, j: int, values: tuple[int, ...], s: int = 0, o: int = 0) -> list[tuple[int, Row]]:
        """Apply one triple (s, o) matching pattern j (bound to `values`); return the component's deltas.

        Single-variable pattern: insert stores its bit, then enumerates the embeddings that map pattern j
        to this triple; delete enumerates first, then clears the bit.  Var-var pattern: the engine has
        already added the pair to its table (insert) or removes it after every query (delete).  Tables of
        the relation that this triple modified (``fresh``) already show it to every pattern, so an
        embedding also mapping a later pattern k > j (insert; earlier k < j for delete) of that relation
        to this triple is left to k.  Called for the matching patterns of one triple in increasing j, this
        counts each new embedding once (at the largest matching j for inserts, the smallest for
        deletes), as if every pattern kept its own copy updated in that order.
        """
        single = self.kinds[j] == SINGLE
        if diff > 0:
            if single and not self.store(j, values):
                return []
            rows = self._enumerate(j, values)
        else:
            if single and not self.present(j, values):
                return []
            rows = self._enumerate(j, values)
            if single:
                self.remove(j, values)
        if rows and self.same[j]:
            tables = self.tables
            later = [k for k in self.same[j] if (k > j if diff > 0 else k < j) and tables[k].fresh]
            if later:
                subj, obj = self.subj, self.obj
                rows = [row for row in rows
                        if not any(row[subj[k]] == s and row[obj[k]] == o for k in later)]
        if self.answer_set is not None:
            if diff > 0:
                self.answer_set.update(rows)
            else:
                self.answer_set.difference_update(rows)
        return [(diff, row) for row in rows]

    def _enumerate(self, j: int, values: tuple[int, ...]) -> list[Row]:
        initial, checks, steps = self._plans[j]
        binding: list[int] = [0] * self.n_vars
        for v, value in zip(initial, values):
            full = self.full[v]
            if full and self.masks[v].get(value, 0) != full:
                return []
            binding[v] = value
        for k in checks:
            if not self._has(k, binding[self.subj[k]], binding[self.obj[k]]):
                return []
        out: list[Row] = []
        self._extend(binding, steps, 0, out)
        return out

    def _extend(self, binding: list[int], steps: list, depth: int, out: list[Row]) -> None:
        if depth == len(steps):
            out.append(tuple(binding))
            return
        z, generators, others, masks, full = steps[depth]
        best = None
        best_index = 0
        for index, (table, w) in enumerate(generators):
            neighbours = table.get(binding[w])
            if neighbours is None:
                return
            if best is None or nb_len(neighbours) < nb_len(best):
                best, best_index = neighbours, index
        checks = [edge for index, edge in enumerate(generators) if index != best_index]
        has = self._has
        for value in nb_iter(best):
            if full and masks.get(value, 0) != full:
                continue
            if checks and not all(nb_has(table, binding[w], value) for table, w in checks):
                continue
            if others and not all(
                has(k, binding[w], value) if z_is_object else has(k, value, binding[w])
                for k, z_is_object, w in others
            ):
                continue
            binding[z] = value
            self._extend(binding, steps, depth + 1, out)

    def answers(self) -> list[Row]:
        assert self.answer_set is not None
        return list(self.answer_set)

    def entries(self) -> int:
        """Mask entries (the var-var tables are counted by their owner: see cbgp.engine.edge_tables)."""
        return sum(len(m) for m in self.masks)

    def approx_bytes(self) -> int:
        total = sum(sys.getsizeof(m) for m in self.masks)
        if self.answer_set is not None:
            total += sys.getsizeof(self.answer_set)
        return total
