"""Continuous evaluation of many BGP queries over one stream of triple changes.

`Engine.apply(sign, s, p, o, g)` takes one change (term ids, sign +1 insert /
-1 delete) and returns the delta answers it causes, as `(query, sign, row)`
tuples where `row` holds the ids of the query's projected variables
(`Engine.columns(query)`).

How one change flows:
1. A predicate index (per graph) finds the patterns the triple can match:
   `(?x p c)` by object, `(c p ?x)` and ground patterns by subject, var-var and
   self-loop patterns by predicate alone.  Irrelevant triples cost one lookup.
2. The hits are processed query by query, part by part (ground, stars,
   components: the plan's fixed order) and pattern by pattern in increasing
   index.  That order makes the semi-naive sum exact when one triple matches
   several patterns (analysis-001 sections 3.4, 3.9).
3. A part's delta is multiplied with the *current* answers of the query's other
   parts (delta rule for cartesian products: parts before it already include
   this change, parts after it do not, so every product tuple is counted once).
4. The full binding is projected; without DISTINCT every solution's row is
   reported, with DISTINCT a row counts 0 -> 1 as `+` and 1 -> 0 as `-`.

Partitioned use (state workers): `apply(..., role=ROLE_SUBJECT)` fires only the
patterns whose centre is the subject (`?x p c`, `?x p ?x`, and in a single-centre
component `?x p ?y` centred on ?x), ROLE_OBJECT only those centred on the object;
other patterns (ground parts, products, multi-centre components) need ROLE_ALL.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from itertools import product
from typing import Iterable

from cbgp.plan import ComponentPart, GroundPart, Plan, StarPart, decompose
from cbgp.sparql import ParsedQuery, TriplePattern, graph_variable, is_var, parse_query
from cbgp.state import SINGLE, VAR_VAR, ComponentState, GroundState, StarState
from cbgp.terms import DEFAULT_GRAPH_ID, TermDictionary

ROLE_SUBJECT = 1
ROLE_OBJECT = 2
ROLE_ALL = 3

Delta = tuple[str, int, tuple[int, ...]]

# How a pattern is matched against a triple (s, o).
_BY_OBJECT = 0  # ?x p c        -> value s, indexed by o
_BY_SUBJECT = 1  # c p ?x        -> value o, indexed by s
_GROUND = 2  # c p c'            -> indexed by s, checks o
_SELF_LOOP = 3  # ?x p ?x        -> requires s == o
_VAR_VAR = 4  # ?x p ?y          -> values (s, o)


class EngineError(ValueError):
    """A query cannot be registered or unregistered (duplicate name, unknown name, ...)."""


class _Handler:
    """One pattern of one part of one registered query, as seen by the index."""

    __slots__ = ("query", "part_index", "state", "local", "match", "key", "check", "role", "order")

    def __init__(self, query, part_index, state, local, match, key, check, role, order):  # noqa: ANN001
        self.query = query
        self.part_index = part_index
        self.state = state
        self.local = local  # bit for ground/star states, pattern index for components
        self.match = match
        self.key = key  # the constant the index files it under (object or subject), None: by predicate
        self.check = check  # the constant object of a ground pattern
        self.role = role
        self.order = order  # (query number, part index, pattern index): processing order


class _PredicateIndex:
    __slots__ = ("by_object", "by_subject", "by_predicate")

    def __init__(self) -> None:
        self.by_object: dict[int, list[_Handler]] = {}
        self.by_subject: dict[int, list[_Handler]] = {}
        self.by_predicate: list[_Handler] = []

    def lists(self) -> Iterable[list[_Handler]]:
        yield from self.by_object.values()
        yield from self.by_subject.values()
        yield self.by_predicate

    def empty(self) -> bool:
        return not (self.by_object or self.by_subject or self.by_predicate)


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
        self.handlers: list[tuple[int, int, _Handler]] = []  # (graph id, predicate id, handler)
        self._dictionary = dictionary
        self._bound_terms = bound_terms or {}  # placeholder term -> id known without its term (GRAPH ?g)
        for part_index, part in enumerate(parts):
            if isinstance(part, GroundPart):
                state = self._ground_part(part_index, part)
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
                     match: int, key: int | None, check: int | None, role: int) -> None:
        """Index one pattern; `position` is its rank in the part (the fixed processing order)."""
        t = self.plan.query.patterns[pattern_index]
        graph = DEFAULT_GRAPH_ID if t.g is None else self._const(t.g)
        handler = _Handler(self, part_index, state, local, match, key, check, role,
                           (self.number, part_index, position))
        self.handlers.append((graph, self._const(t.p), handler))

    def _ground_part(self, part_index: int, part: GroundPart) -> GroundState:
        state = GroundState(len(part.patterns))
        for bit_no, index in enumerate(part.patterns):
            t = self.plan.query.patterns[index]
            self._add_handler(index, part_index, bit_no, state, 1 << bit_no, _GROUND, self._const(t.s),
                              self._const(t.o), ROLE_ALL)
        return state

    def _star_part(self, part_index: int, part: StarPart, multi: bool) -> StarState:
        state = StarState(len(part.patterns), multi)
        centre = part.variable
        for bit_no, index in enumerate(part.patterns):
            t = self.plan.query.patterns[index]
            if t.s == centre and t.o == centre:
                match, key, centre_role = _SELF_LOOP, None, ROLE_SUBJECT
            elif t.s == centre:
                match, key, centre_role = _BY_OBJECT, self._const(t.o), ROLE_SUBJECT
            else:
                match, key, centre_role = _BY_SUBJECT, self._const(t.s), ROLE_OBJECT
            # Partitioned by centre value only when the star is the whole query; else every change counts once.
            self._add_handler(index, part_index, bit_no, state, 1 << bit_no, match, key, None,
                              ROLE_ALL if multi else centre_role)
        return state

    def _component_part(self, part_index: int, part: ComponentPart, multi: bool) -> ComponentState:
        local_vars = {v: i for i, v in enumerate(part.variables)}
        specs: list[tuple[int, ...]] = []
        matches: list[tuple[int, int | None]] = []
        for index in part.patterns:
            t = self.plan.query.patterns[index]
            if is_var(t.s) and is_var(t.o) and t.s != t.o:
                specs.append((VAR_VAR, local_vars[t.s], local_vars[t.o]))
                matches.append((_VAR_VAR, None))
            elif is_var(t.s) and t.s == t.o:
                specs.append((SINGLE, local_vars[t.s]))
                matches.append((_SELF_LOOP, None))
            elif is_var(t.s):
                specs.append((SINGLE, local_vars[t.s]))
                matches.append((_BY_OBJECT, self._const(t.o)))
            else:
                specs.append((SINGLE, local_vars[t.o]))
                matches.append((_BY_SUBJECT, self._const(t.s)))
        orders = [[local_vars[v] for v in part.join_order(index)] for index in part.patterns]
        state = ComponentState(len(part.variables), specs, orders, multi)
        # A single-centre component that is the whole query is partitioned by its centre's value like a star:
        # each pattern fires where the triple was routed for the centre's end (see ComponentPart.centre).
        centre = None if multi else part.centre
        for local, index in enumerate(part.patterns):
            match, key = matches[local]
            if centre is None:
                role = ROLE_ALL
            else:
                role = ROLE_SUBJECT if self.plan.query.patterns[index].s == centre else ROLE_OBJECT
            self._add_handler(index, part_index, local, state, local, match, key, None, role)
        return state

    # -- emission --

    def emit(self, part_index: int, deltas: list[tuple[int, tuple[int, ...]]], out: list[Delta]) -> None:
        if self.rows_are_output:
            name = self.name
            out.extend((name, sign, row) for sign, row in deltas)
            return
        if self.single_part:
            slots = self.slots[0]
            for sign, row in deltas:
                full = self.template.copy()
                for position, value in zip(slots, row):
                    full[position] = value
                self._project(sign, full, out)
            return
        others = [k for k in range(len(self.states)) if k != part_index]
        answer_lists = [self.states[k].answers() for k in others]
        if any(not answers for answers in answer_lists):
            return
        own_slots = self.slots[part_index]
        other_slots = [self.slots[k] for k in others]
        for sign, row in deltas:
            for combo in product(*answer_lists):
                full = self.template.copy()
                for position, value in zip(own_slots, row):
                    full[position] = value
                for slots, other_row in zip(other_slots, combo):
                    for position, value in zip(slots, other_row):
                        full[position] = value
                self._project(sign, full, out)

    def _project(self, sign: int, full: list[int], out: list[Delta]) -> None:
        row = tuple(full[i] for i in self.projection)
        if not self.distinct:
            out.append((self.name, sign, row))
            return
        count = self.counts.get(row, 0)
        if sign > 0:
            self.counts[row] = count + 1
            if count == 0:
                out.append((self.name, 1, row))
        elif count == 1:
            del self.counts[row]
            out.append((self.name, -1, row))
        elif count > 1:
            self.counts[row] = count - 1

    def state_entries(self) -> int:
        return sum(state.entries() for state in self.states) + len(self.counts)

    def state_bytes(self) -> int:
        """Approximate bytes of this query's state (containers; term ids are shared with the dictionary)."""
        return sum(state.approx_bytes() for state in self.states) + sys.getsizeof(self.counts)


_BOUND_GRAPH = "<urn:cbgp:bound-graph>"  # stands for an instance's graph in its patterns; never looked up


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
        names = [v for v in query.variables if any(v in p.variables() for p in query.patterns)]
        self.columns = tuple(v for v in query.projected if "?" + v in names or "?" + v == self.graph_var)

    def instance(self, graph: int) -> tuple[RegisteredQuery, bool]:
        """The instance for a graph id, and whether it was just created."""
        found = self.instances.get(graph)
        if found is not None:
            return found, False
        # The graph is known by id only (a worker's dictionary need not hold data terms): patterns get a
        # placeholder constant that the instance maps straight to that id.
        term = _BOUND_GRAPH
        var = self.graph_var

        def sub(value: str) -> str:
            return term if value == var else value

        patterns = tuple(TriplePattern(sub(t.s), t.p, sub(t.o), term) for t in self.query.patterns)
        instance_query = ParsedQuery(self.query.text, patterns, self.query.projected, self.query.distinct,
                                     self.query.select_star,
                                     tuple(v for v in self.query.variables if v != var))
        constants = {var[1:]: graph} if var[1:] in self.query.projected else {}
        created = RegisteredQuery(self.name, decompose(instance_query), self.number, self.dictionary,
                                  constants, owner=self, bound_terms={_BOUND_GRAPH: graph})
        # Rows must list the columns in the wrapper's order whichever variables the instance has.
        created.columns = tuple(c for c in self.columns if c in created.columns)
        self.instances[graph] = created
        return created, True

    def state_entries(self) -> int:
        return sum(instance.state_entries() for instance in self.instances.values())

    def state_bytes(self) -> int:
        return sum(instance.state_bytes() for instance in self.instances.values())


class Engine:
    """Registered queries plus the shared predicate index over their patterns."""

    def __init__(self, dictionary: TermDictionary | None = None, keep_graph: bool = False) -> None:
        self.dictionary = dictionary if dictionary is not None else TermDictionary()
        self.queries: dict[str, RegisteredQuery] = {}
        self._index: dict[int, dict[int, _PredicateIndex]] = {}  # graph id -> predicate id -> index
        self._per_graph: dict[int, list[PerGraphQuery]] = {}  # predicate id -> GRAPH ?g queries using it
        self._next_number = 0
        # Optional copy of the graph (ids), so that a query registered late can be bootstrapped.
        self.graph: set[tuple[int, int, int, int]] | None = set() if keep_graph else None

    # -- registration --

    def register(
        self,
        name: str,
        query: str | ParsedQuery | Plan,
        initial: Iterable[tuple[int, int, int, int]] | None = None,
    ) -> list[Delta]:
        """Register a query; return its answers over the current graph as `+` deltas.

        The current graph comes from `initial` (quads of ids) or, if the engine
        keeps the graph, from its own copy.
        """
        if name in self.queries:
            raise EngineError(f"a query named {name!r} is already registered")
        if isinstance(query, str):
            query = parse_query(query)
        parsed = query.query if isinstance(query, Plan) else query
        self._next_number += 1
        registered: RegisteredQuery | PerGraphQuery
        if graph_variable(parsed) is not None:
            registered = PerGraphQuery(name, parsed, self._next_number, self.dictionary)
            for predicate in registered.predicates:
                self._per_graph.setdefault(predicate, []).append(registered)
        else:
            plan = query if isinstance(query, Plan) else decompose(parsed)
            registered = RegisteredQuery(name, plan, self._next_number, self.dictionary)
            self._index_handlers(registered)
        self.queries[name] = registered
        source = initial if initial is not None else (self.graph or ())
        out: list[Delta] = []
        for s, p, o, g in list(source):
            self._dispatch(1, s, p, o, g, ROLE_ALL, out, only=registered)
        return out

    def _index_handlers(self, registered: RegisteredQuery) -> None:
        for graph, predicate, handler in registered.handlers:
            index = self._index.setdefault(graph, {}).setdefault(predicate, _PredicateIndex())
            if handler.match == _BY_OBJECT:
                index.by_object.setdefault(handler.key, []).append(handler)
            elif handler.match in (_BY_SUBJECT, _GROUND):
                index.by_subject.setdefault(handler.key, []).append(handler)
            else:
                index.by_predicate.append(handler)

    def _unindex_handlers(self, registered: RegisteredQuery) -> None:
        for graph, predicate, _handler in registered.handlers:
            by_predicate = self._index.get(graph, {})
            index = by_predicate.get(predicate)
            if index is None:
                continue
            for table in (index.by_object, index.by_subject):
                for key in list(table):
                    kept = [h for h in table[key] if h.query is not registered]
                    if kept:
                        table[key] = kept
                    else:
                        del table[key]
            index.by_predicate = [h for h in index.by_predicate if h.query is not registered]
            if index.empty():
                del by_predicate[predicate]

    def unregister(self, name: str) -> None:
        """Remove a query and free all its state."""
        registered = self.queries.pop(name, None)
        if registered is None:
            raise EngineError(f"no query named {name!r} is registered")
        if isinstance(registered, PerGraphQuery):
            for predicate in registered.predicates:
                kept = [w for w in self._per_graph.get(predicate, []) if w is not registered]
                if kept:
                    self._per_graph[predicate] = kept
                else:
                    self._per_graph.pop(predicate, None)
            for instance in registered.instances.values():
                self._unindex_handlers(instance)
        else:
            self._unindex_handlers(registered)

    def columns(self, name: str) -> tuple[str, ...]:
        return self.queries[name].columns

    # -- updates --

    def apply(self, sign: int, s: int, p: int, o: int, g: int = DEFAULT_GRAPH_ID, role: int = ROLE_ALL) -> list[Delta]:
        """Apply one change (ids) and return the delta answers of every query."""
        if self.graph is not None and role == ROLE_ALL:
            quad = (s, p, o, g)
            if sign > 0:
                self.graph.add(quad)
            else:
                self.graph.discard(quad)
        out: list[Delta] = []
        self._dispatch(sign, s, p, o, g, role, out, None)
        return out

    def apply_to(self, name: str, sign: int, s: int, p: int, o: int, g: int = DEFAULT_GRAPH_ID,
                 role: int = ROLE_ALL) -> list[Delta]:
        """Apply one change (ids) to the query ``name`` alone and return its deltas.

        For bringing a query registered late up to date by replaying the changes the other queries already
        saw (unlike ``register(initial=...)``, this takes deletions and roles).  The engine's graph copy
        (``keep_graph``) is not touched: the change is not new to the engine.
        """
        out: list[Delta] = []
        self._dispatch(sign, s, p, o, g, role, out, self.queries[name])
        return out

    def apply_terms(self, sign: int, s: str, p: str, o: str, g: str | None = None) -> list[Delta]:
        encode = self.dictionary.encode
        return self.apply(sign, encode(s), encode(p), encode(o), DEFAULT_GRAPH_ID if g is None else encode(g))

    def _dispatch(self, sign: int, s: int, p: int, o: int, g: int, role: int, out: list[Delta],
                  only: RegisteredQuery | PerGraphQuery | None) -> None:
        if g != DEFAULT_GRAPH_ID and p in self._per_graph:
            for wrapper in self._per_graph[p]:
                instance, created = wrapper.instance(g)
                if created:
                    self._index_handlers(instance)
        by_predicate = self._index.get(g)
        if by_predicate is None:
            return
        index = by_predicate.get(p)
        if index is None:
            return
        hits: list[_Handler] = []
        found = index.by_object.get(o)
        if found:
            hits.extend(found)
        found = index.by_subject.get(s)
        if found:
            hits.extend(found)
        if index.by_predicate:
            hits.extend(index.by_predicate)
        if not hits:
            return
        if len(hits) > 1:
            hits.sort(key=_order)
        for h in hits:
            if only is not None and h.query.owner is not only:
                continue
            if h.role & role != h.role:
                continue
            match = h.match
            if match == _BY_OBJECT:
                values: tuple[int, ...] = (s,)
            elif match == _BY_SUBJECT:
                values = (o,)
            elif match == _GROUND:
                if o != h.check:
                    continue
                deltas = h.state.step(sign, h.local)
                if deltas:
                    h.query.emit(h.part_index, deltas, out)
                continue
            elif match == _SELF_LOOP:
                if s != o:
                    continue
                values = (s,)
            else:
                values = (s, o)
            state = h.state
            if type(state) is StarState:
                deltas = state.step(sign, h.local, values[0])
            else:
                deltas = state.step(sign, h.local, values)
            if deltas:
                h.query.emit(h.part_index, deltas, out)

    # -- introspection --

    def state_entries(self, name: str | None = None) -> int:
        if name is not None:
            return self.queries[name].state_entries()
        return sum(q.state_entries() for q in self.queries.values())

    def state_bytes(self, name: str | None = None) -> int:
        """Approximate bytes of query state (one query, or all): what the state metrics report."""
        if name is not None:
            return self.queries[name].state_bytes()
        return sum(q.state_bytes() for q in self.queries.values())

    def decode_row(self, name: str, row: tuple[int, ...]) -> dict[str, str]:
        decode = self.dictionary.decode
        return {var: decode(value) for var, value in zip(self.queries[name].columns, row)}


def _order(handler: _Handler) -> tuple[int, int, int]:
    return handler.order
