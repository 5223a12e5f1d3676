"""Per-part state of a query, keyed by the value of each star's central node.

Three kinds of part (see `cbgp.plan`):

- `GroundState`: a match bitmap over the ground patterns (Algorithm 1, with the
  fix that a bit is only ever set when it was 0, so duplicates emit nothing).
- `StarState`: for a single-variable star, centre value -> bitmap of its
  patterns (corrected Algorithm 2: transition-based, one bit per matching
  pattern, hash lookup on delete, records dropped when their last bit clears).
- `ComponentState`: a var-connected component, stored as in the analysis'
  section 3.11: for every variable X and centre value x, one entry per pattern
  of X's star -- a bit for patterns whose other end is constant (or a
  self-loop), and a set of neighbour values for var-var patterns.  A var-var
  triple (x p y) can be kept under x in X's star (`forward[j][x]`) and under y
  in Y's star (`backward[j][y]`); only the directions the join plans read are
  kept, which for paths and trees is one.  No per-combination records, so
  memory is linear in the relevant triples present; deltas are enumerated by
  extending the updated pattern's binding along the precomputed join order.

Every state is also its own presence index for the triples it can match: a
pattern's bit or neighbour entry is set exactly when the matching triple is in
the graph.  So a duplicate insert or a delete of an absent triple is detected
per pattern and changes nothing, without keeping the whole graph.

Values are term ids (ints).  A neighbour set holding one value is stored as
the bare int: most centres have one neighbour per pattern, and a 1-element
`set` costs ~200 bytes where an int costs nothing extra (ids are shared).
"""

from __future__ import annotations

import sys
from itertools import islice
from typing import Iterator

Row = tuple[int, ...]
_SAMPLE = 1000  # neighbour tables larger than this are sampled when estimating their bytes


def table_bytes(table: dict | None) -> int:
    """Approximate bytes of a neighbour table: the dict plus its set-valued entries (ids are shared ints)."""
    if table is None:
        return 0
    size = sys.getsizeof(table)
    if not table:
        return size
    values = table.values() if len(table) <= _SAMPLE else list(islice(table.values(), _SAMPLE))
    sets = sum(sys.getsizeof(v) for v in values if type(v) is set)
    return size + sets * len(table) // len(values)


# --- neighbour containers: int when single, set when several --------------------------------------

def nb_add(table: dict, key: int, value: int) -> bool:
    current = table.get(key)
    if current is None:
        table[key] = value
        return True
    if type(current) is set:
        if value in current:
            return False
        current.add(value)
        return True
    if current == value:
        return False
    table[key] = {current, value}
    return True


def nb_remove(table: dict, key: int, value: int) -> bool:
    current = table.get(key)
    if current is None:
        return False
    if type(current) is set:
        if value not in current:
            return False
        current.discard(value)
        if len(current) == 1:
            table[key] = next(iter(current))
        return True
    if current == value:
        del table[key]
        return True
    return False


def nb_has(table: dict, key: int, value: int) -> bool:
    current = table.get(key)
    if current is None:
        return False
    if type(current) is set:
        return value in current
    return current == value


def nb_iter(current: int | set) -> Iterator[int] | set:
    return current if type(current) is set else (current,)


def nb_len(current: int | set) -> int:
    return len(current) if type(current) is set else 1


# --- ground part ------------------------------------------------------------------------------------

class GroundState:
    __slots__ = ("bits", "full")

    def __init__(self, size: int) -> None:
        self.bits = 0
        self.full = (1 << size) - 1

    def step(self, sign: int, bit: int) -> list[tuple[int, Row]]:
        bits = self.bits
        if sign > 0:
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

    def step(self, sign: int, bit: int, centre: int) -> list[tuple[int, Row]]:
        centres = self.centres
        mask = centres.get(centre, 0)
        if sign > 0:
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
        self.forward: list[dict | None] = [None] * len(patterns)
        self.backward: list[dict | None] = [None] * len(patterns)
        for j, kind in enumerate(self.kinds):
            if kind == VAR_VAR:
                if needs_forward[j] or not needs_backward[j]:
                    self.forward[j] = {}
                if needs_backward[j]:
                    self.backward[j] = {}
        self._plans = [self._compile(plan) for plan in raw_plans]
        self.answer_set: set[Row] | None = set() if track_answers else None

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

    # -- presence / storage (the pattern's own entry for this triple) --

    def store(self, j: int, values: tuple[int, ...]) -> bool:
        if self.kinds[j] == SINGLE:
            masks = self.masks[self.var[j]]
            mask = masks.get(values[0], 0)
            if mask & self.bit[j]:
                return False
            masks[values[0]] = mask | self.bit[j]
            return True
        forward, backward = self.forward[j], self.backward[j]
        if forward is not None:
            if not nb_add(forward, values[0], values[1]):
                return False
            if backward is not None:
                nb_add(backward, values[1], values[0])
            return True
        return nb_add(backward, values[1], values[0])

    def present(self, j: int, values: tuple[int, ...]) -> bool:
        if self.kinds[j] == SINGLE:
            return bool(self.masks[self.var[j]].get(values[0], 0) & self.bit[j])
        return self._has(j, values[0], values[1])

    def remove(self, j: int, values: tuple[int, ...]) -> None:
        if self.kinds[j] == SINGLE:
            masks = self.masks[self.var[j]]
            mask = masks[values[0]] & ~self.bit[j]
            if mask:
                masks[values[0]] = mask
            else:
                del masks[values[0]]
            return
        if self.forward[j] is not None:
            nb_remove(self.forward[j], values[0], values[1])
        if self.backward[j] is not None:
            nb_remove(self.backward[j], values[1], values[0])

    # -- updates --

    def step(self, sign: int, j: int, values: tuple[int, ...]) -> list[tuple[int, Row]]:
        """Apply one triple matching pattern j (bound to `values`); return the component's deltas.

        Insert: store, then enumerate the embeddings that map pattern j to this
        triple.  Delete: enumerate first, then remove.  Called for the matching
        patterns of one triple in increasing j, this counts each new embedding
        once (at the largest matching j for inserts, the smallest for deletes).
        """
        if sign > 0:
            if not self.store(j, values):
                return []
            rows = self._enumerate(j, values)
        else:
            if not self.present(j, values):
                return []
            rows = self._enumerate(j, values)
            self.remove(j, values)
        if self.answer_set is not None:
            if sign > 0:
                self.answer_set.update(rows)
            else:
                self.answer_set.difference_update(rows)
        return [(sign, row) for row in rows]

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
        total = sum(len(m) for m in self.masks)
        for table in self.forward:
            if table is not None:
                total += len(table)
        for table in self.backward:
            if table is not None:
                total += len(table)
        return total

    def approx_bytes(self) -> int:
        total = sum(sys.getsizeof(m) for m in self.masks)
        total += sum(table_bytes(t) for t in self.forward) + sum(table_bytes(t) for t in self.backward)
        if self.answer_set is not None:
            total += sys.getsizeof(self.answer_set)
        return total
