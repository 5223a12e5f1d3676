"""The runtime of one registered query: its parts' states, how its patterns are indexed, its output.

`RegisteredQuery` builds, from a query's plan, one state per part (`cbgp.engine.part_state`) and one `Handler` per
pattern (what the engine's predicate index files it under and how a triple binds it); var-var patterns read
`cbgp.engine.edge_tables.EdgeTable`s the engine shares between queries.  `PerGraphQuery` is a `GRAPH ?g` query: one
`RegisteredQuery` instance per named graph.  `cbgp.engine.engine.Engine` indexes the handlers and dispatches
changes; see its docstring for the whole flow.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from itertools import product
from typing import Iterable

from cbgp.change import ROLE_BOTH, ROLE_OBJECT, ROLE_SUBJECT
from cbgp.query.plan import ComponentPart, GroundPart, Plan, StarPart, decompose
from cbgp.engine.edge_tables import EdgeTable
from cbgp.query.sparql import BOUND_GRAPH, ParsedQuery, graph_instance, graph_variable, is_var
from cbgp.engine.part_state import SINGLE, VAR_VAR, ComponentState, GroundState, StarState
from cbgp.terms import DEFAULT_GRAPH_ID, TermDictionary


Delta = tuple[str, int, tuple[int, ...]]

# How a pattern is matched against a triple (s, o).
BY_OBJECT = 0  # ?x p c        -> value s, indexed by o
BY_SUBJECT = 1  # c p ?x        -> value o, indexed by s
GROUND = 2  # c p c'            -> indexed by s, checks o
SELF_LOOP = 3  # ?x p ?x        -> requires s == o
VAR_PAIR = 4  # ?x p ?y          -> values (s, o)


class Handler:
    """One pattern of one part of one registered query, as seen by the index."""

    __slots__ = ("query", "part_index", "state", "local", "match", "key", "check", "role", "order", "table",
                 "gate", "companions")

    def __init__(self, query, part_index, state, local, match, key, check, role, order):  # noqa: ANN001
        self.table: EdgeTable | None = None  # a var-var pattern's pairs
        # A var-var pattern whose end variable ("s" or "o") has single-variable patterns can only match
        # where that variable's mask is full: it is filed under such values (watch_*) instead of firing on
        # every triple of its predicate.  None: not gated.
        self.gate: tuple[str, int] | None = None
        # Gated handlers of the same part and relation, which this (single-variable) pattern's step can open.
        self.companions: list[Handler] | None = None
        self.query = query
        self.part_index = part_index
        self.state = state
        self.local = local  # bit for ground/star states, pattern index for components
        self.match = match
        self.key = key  # the constant the index files it under (object or subject), None: by predicate
        self.check = check  # the constant object of a ground pattern
        self.role = role
        self.order = order  # (query number, part index, pattern index): processing order


class PredicateIndex:
    __slots__ = ("by_object", "by_subject", "by_predicate", "watch_object", "watch_subject", "tables")

    def __init__(self) -> None:
        self.by_object: dict[int, list[Handler]] = {}
        self.by_subject: dict[int, list[Handler]] = {}
        self.by_predicate: list[Handler] = []
        # Gated var-var handlers by the value at their gated end (a handler, or a list of several).
        self.watch_object: dict[int, Handler | list[Handler]] = {}
        self.watch_subject: dict[int, Handler | list[Handler]] = {}
        self.tables: list[EdgeTable] = []  # the relation's var-var tables: shared ones and private ones

    def lists(self) -> Iterable[list[Handler]]:
        yield from self.by_object.values()
        yield from self.by_subject.values()
        yield self.by_predicate

    def empty(self) -> bool:
        return not (self.by_object or self.by_subject or self.by_predicate or self.watch_object
                    or self.watch_subject or self.tables)


@dataclass
class _Slots:
    positions: tuple[int, ...]  # where a part's row values go in the full variable tuple


class RegisteredQuery:
    """Runtime of one query: its parts' states, product assembly and projection."""

    def __init__(self, name: str, plan: Plan, number: int, dictionary: TermDictionary,
                 constants: dict[str, int] | None = None, owner: object = None,
                 bound_terms: dict[str, int] | None = None) -> None:
        self.name = name
        self.plan = plan
        self.number = number
        self.owner = owner if owner is not None else self  # what `register(..., only=)` filters on
        query = plan.query
        variables = [v for v in query.variables if any(v in p.variables() for p in query.patterns)]
        var_index = {v: i for i, v in enumerate(variables)}
        self.n_vars = len(variables)
        # Projected variables fixed by the instance (GRAPH ?g bound to its graph) sit after the variables.
        constants = constants or {}
        self.template = [0] * self.n_vars + list(constants.values())
        for position, var in enumerate(constants, self.n_vars):
            var_index["?" + var] = position
        present = [v for v in query.projected if "?" + v in var_index]
        self.columns = tuple(present)
        self.projection = tuple(var_index["?" + v] for v in present)
        self.distinct = query.distinct
        self.counts: dict[tuple[int, ...], int] = {}
        parts = plan.parts
        multi = len(parts) > 1
        self.single_part = not multi
        self.states: list = []
        self.slots: list[tuple[int, ...]] = []  # where each part's row values go in the full tuple
        self.handlers: list[tuple[int, int, Handler]] = []  # (graph id, predicate id, handler)
        # The var-var tables this query reads, by (graph, predicate, role): private ones first, then the
        # engine's shared ones once it adopts them (Engine._adopt).
        self.tables: dict[tuple[int, int, int], EdgeTable] = {}
        self.table_users: list[tuple[ComponentState, int]] = []  # (state, pattern) reading a table
        self._dictionary = dictionary
        self._bound_terms = bound_terms or {}  # placeholder term -> id known without its term (GRAPH ?g)
        for part_index, part in enumerate(parts):
            if isinstance(part, GroundPart):
                state = self._ground_part(part_index, part, multi)
                self.slots.append(())
            elif isinstance(part, StarPart):
                state = self._star_part(part_index, part, multi)
                self.slots.append((var_index[part.variable],))
            else:
                state = self._component_part(part_index, part, multi)
                self.slots.append(tuple(var_index[v] for v in part.variables))
            self.states.append(state)
        # A single part whose row is already the projected tuple needs no re-assembly: the hot path.
        self.rows_are_output = (
            self.single_part and not self.distinct
            and self.slots[0] == tuple(range(self.n_vars)) == self.projection
        )

    def _const(self, term: str) -> int:
        bound = self._bound_terms.get(term)
        return bound if bound is not None else self._dictionary.encode(term)

    def _add_handler(self, pattern_index: int, part_index: int, position: int, state, local: int,  # noqa: ANN001
                     match: int, key: int | None, check: int | None, role: int) -> Handler:
        """Index one pattern; `position` is its rank in the part (the fixed processing order)."""
        t = self.plan.query.patterns[pattern_index]
        graph = DEFAULT_GRAPH_ID if t.g is None else self._const(t.g)
        handler = Handler(self, part_index, state, local, match, key, check, role,
                           (self.number, part_index, position))
        self.handlers.append((graph, self._const(t.p), handler))
        return handler

    def _ground_part(self, part_index: int, part: GroundPart, multi: bool) -> GroundState:
        state = GroundState(len(part.patterns))
        # Whole query: by its subject's partition (the one subject of every pattern when placed by centre),
        # where a routed triple comes with the subject role; a change of the total order has every role.
        role = ROLE_BOTH if multi else ROLE_SUBJECT
        for bit_no, index in enumerate(part.patterns):
            t = self.plan.query.patterns[index]
            self._add_handler(index, part_index, bit_no, state, 1 << bit_no, GROUND, self._const(t.s),
                              self._const(t.o), role)
        return state

    def _star_part(self, part_index: int, part: StarPart, multi: bool) -> StarState:
        state = StarState(len(part.patterns), multi)
        centre = part.variable
        for bit_no, index in enumerate(part.patterns):
            t = self.plan.query.patterns[index]
            if t.s == centre and t.o == centre:
                match, key, centre_role = SELF_LOOP, None, ROLE_SUBJECT
            elif t.s == centre:
                match, key, centre_role = BY_OBJECT, self._const(t.o), ROLE_SUBJECT
            else:
                match, key, centre_role = BY_SUBJECT, self._const(t.s), ROLE_OBJECT
            # Partitioned by centre value only when the star is the whole query; else every change counts once.
            self._add_handler(index, part_index, bit_no, state, 1 << bit_no, match, key, None,
                              ROLE_BOTH if multi else centre_role)
        return state

    def _component_part(self, part_index: int, part: ComponentPart, multi: bool) -> ComponentState:
        local_vars = {v: i for i, v in enumerate(part.variables)}
        specs: list[tuple[int, ...]] = []
        matches: list[tuple[int, int | None]] = []
        for index in part.patterns:
            t = self.plan.query.patterns[index]
            if is_var(t.s) and is_var(t.o) and t.s != t.o:
                specs.append((VAR_VAR, local_vars[t.s], local_vars[t.o]))
                matches.append((VAR_PAIR, None))
            elif is_var(t.s) and t.s == t.o:
                specs.append((SINGLE, local_vars[t.s]))
                matches.append((SELF_LOOP, None))
            elif is_var(t.s):
                specs.append((SINGLE, local_vars[t.s]))
                matches.append((BY_OBJECT, self._const(t.o)))
            else:
                specs.append((SINGLE, local_vars[t.o]))
                matches.append((BY_SUBJECT, self._const(t.s)))
        orders = [[local_vars[v] for v in part.join_order(index)] for index in part.patterns]
        state = ComponentState(len(part.variables), specs, orders, multi)
        # A single-centre component that is the whole query is partitioned by its centre's value like a star:
        # each pattern fires where the triple was routed for the centre's end (see ComponentPart.centre).
        centre = None if multi else part.centre
        handlers: list[Handler] = []
        relations: list[tuple[int, int]] = []
        for local, index in enumerate(part.patterns):
            match, key = matches[local]
            if centre is None:
                role = ROLE_BOTH
            else:
                role = ROLE_SUBJECT if self.plan.query.patterns[index].s == centre else ROLE_OBJECT
            handler = self._add_handler(index, part_index, local, state, local, match, key, None, role)
            graph, predicate, _h = self.handlers[-1]
            handlers.append(handler)
            relations.append((graph, predicate))
            if match == VAR_PAIR:
                table_key = (graph, predicate, role)
                table = self.tables.get(table_key)
                if table is None:
                    table = self.tables[table_key] = EdgeTable(table_key, self.owner)
                handler.table = table
                state.bind(local, table)
                self.table_users.append((state, local))
                if state.full[state.obj[local]]:
                    handler.gate = ("o", state.obj[local])
                elif state.full[state.subj[local]]:
                    handler.gate = ("s", state.subj[local])
        state.compile()
        for j, relation in enumerate(relations):
            state.same[j] = [k for k, other in enumerate(relations)
                             if k != j and other == relation and state.kinds[k] == VAR_VAR]
            if state.kinds[j] == SINGLE:
                gated = [handlers[k] for k in state.same[j] if handlers[k].gate is not None]
                handlers[j].companions = gated or None
        return state

    # -- emission --

    def emit(self, part_index: int, deltas: list[tuple[int, tuple[int, ...]]], out: list[Delta]) -> None:
        if self.rows_are_output:
            name = self.name
            out.extend((name, diff, row) for diff, row in deltas)
            return
        if self.single_part:
            slots = self.slots[0]
            for diff, row in deltas:
                full = self.template.copy()
                for position, value in zip(slots, row):
                    full[position] = value
                self._project(diff, full, out)
            return
        others = [k for k in range(len(self.states)) if k != part_index]
        answer_lists = [self.states[k].answers() for k in others]
        if any(not answers for answers in answer_lists):
            return
        own_slots = self.slots[part_index]
        other_slots = [self.slots[k] for k in others]
        for diff, row in deltas:
            for combo in product(*answer_lists):
                full = self.template.copy()
                for position, value in zip(own_slots, row):
                    full[position] = value
                for slots, other_row in zip(other_slots, combo):
                    for position, value in zip(slots, other_row):
                        full[position] = value
                self._project(diff, full, out)

    def _project(self, diff: int, full: list[int], out: list[Delta]) -> None:
        row = tuple(full[i] for i in self.projection)
        if not self.distinct:
            out.append((self.name, diff, row))
            return
        count = self.counts.get(row, 0)
        if diff > 0:
            self.counts[row] = count + 1
            if count == 0:
                out.append((self.name, 1, row))
        elif count == 1:
            del self.counts[row]
            out.append((self.name, -1, row))
        elif count > 1:
            self.counts[row] = count - 1

    def state_entries(self, tables: bool = True) -> int:
        """Entries of this query's state; `tables`: with the var-var tables it reads, shared ones in full."""
        own = sum(state.entries() for state in self.states) + len(self.counts)
        return own + (sum(t.entries() for t in self.tables.values()) if tables else 0)

    def state_bytes(self, tables: bool = True) -> int:
        """Approximate bytes of this query's state (containers; term ids are shared with the dictionary)."""
        own = sum(state.approx_bytes() for state in self.states) + sys.getsizeof(self.counts)
        return own + (sum(t.approx_bytes() for t in self.tables.values()) if tables else 0)

    def rebind(self, old: EdgeTable, new: EdgeTable) -> None:
        """Read `new` wherever this query read `old` (same pairs: adoption of a shared table, or a copy)."""
        self.tables[old.key] = new
        for _graph, _predicate, handler in self.handlers:
            if handler.table is old:
                handler.table = new
        states = []
        for state, j in self.table_users:
            if state.tables[j] is old:
                state.bind(j, new)
                if state not in states:
                    states.append(state)
        for state in states:
            state.compile()


class PerGraphQuery:
    """A query whose patterns all sit in one `GRAPH ?g` block: one instance per named graph.

    Every relevant triple of the instance for graph g lies in g, so the first
    such triple creates the instance (with ?g replaced by g) before it is
    dispatched, and the instance never misses history.
    """

    def __init__(self, name: str, query: ParsedQuery, number: int, dictionary: TermDictionary) -> None:
        self.name = name
        self.query = query
        self.number = number
        self.graph_var = graph_variable(query)
        self.plan = decompose(query)
        self.dictionary = dictionary
        self.instances: dict[int, RegisteredQuery] = {}
        self.predicates = {dictionary.encode(p.p) for p in query.patterns}
        self.distinct = query.distinct
        self.counts: dict[tuple[int, ...], int] = {}  # DISTINCT's, shared by the instances
        names = [v for v in query.variables if any(v in p.variables() for p in query.patterns)]
        self.columns = tuple(v for v in query.projected if "?" + v in names or "?" + v == self.graph_var)

    def instance(self, graph: int) -> tuple[RegisteredQuery, bool]:
        """The instance for a graph id, and whether it was just created."""
        found = self.instances.get(graph)
        if found is not None:
            return found, False
        # The graph is known by id only (a worker's dictionary need not hold data terms): patterns get a
        # placeholder constant that the instance maps straight to that id.
        var = self.graph_var
        instance_query = graph_instance(self.query)
        constants = {var[1:]: graph} if var[1:] in self.query.projected else {}
        created = RegisteredQuery(self.name, decompose(instance_query), self.number, self.dictionary,
                                  constants, owner=self, bound_terms={BOUND_GRAPH: graph})
        # Rows must list the columns in the wrapper's order whichever variables the instance has.
        created.columns = tuple(c for c in self.columns if c in created.columns)
        # DISTINCT is over every graph's solutions (a row found in two graphs is one answer): one count for all.
        created.counts = self.counts
        self.instances[graph] = created
        return created, True

    def state_entries(self, tables: bool = True) -> int:
        # (the DISTINCT counts, shared by the instances, once)
        return sum(instance.state_entries(tables) - len(self.counts)
                   for instance in self.instances.values()) + len(self.counts)

    def state_bytes(self, tables: bool = True) -> int:
        shared = sys.getsizeof(self.counts)
        return sum(instance.state_bytes(tables) - shared for instance in self.instances.values()) + shared
