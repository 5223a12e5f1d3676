"""Continuous evaluation of many BGP queries over one stream of triple changes.

How it works: docs/design/internals.md, cbgp.engine.engine.
"""

from __future__ import annotations

from typing import Iterable

from cbgp.change import ROLE_BOTH
from cbgp.query.plan import Plan, decompose
from cbgp.engine.registered import BY_OBJECT, BY_SUBJECT, GROUND, SELF_LOOP, Delta, PerGraphQuery, RegisteredQuery, Handler, PredicateIndex
from cbgp.engine.edge_tables import EdgeTable
from cbgp.query.sparql import ParsedQuery, graph_variable, parse_query
from cbgp.engine.part_state import StarState
from cbgp.terms import DEFAULT_GRAPH_ID, TermDictionary


class EngineError(ValueError):
    """A query cannot be registered or unregistered (duplicate name, unknown name, ...)."""


class Engine:
    """Registered queries plus the shared predicate index over their patterns."""

    def __init__(self, dictionary: TermDictionary | None = None, keep_graph: bool = False) -> None:
        self.dictionary = dictionary if dictionary is not None else TermDictionary()
        self.queries: dict[str, RegisteredQuery] = {}
        self._index: dict[int, dict[int, PredicateIndex]] = {}  # graph id -> predicate id -> index
        self._per_graph: dict[int, list[PerGraphQuery]] = {}  # predicate id -> GRAPH ?g queries using it
        self._next_number = 0
        # Var-var tables shared by every query reading them, by (graph, predicate, role) (cbgp.engine.edge_tables), and
        # the private tables of queries registered since the last apply, to adopt a shared one at the next.
        self._shared: dict[tuple[int, int, int], EdgeTable] = {}
        self._pending: list[tuple[RegisteredQuery, EdgeTable]] = []
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
            self._dispatch(1, s, p, o, g, ROLE_BOTH, out, only={registered})
        return out

    def _index_handlers(self, registered: RegisteredQuery) -> None:
        for graph, predicate, handler in registered.handlers:
            index = self._index.setdefault(graph, {}).setdefault(predicate, PredicateIndex())
            if handler.match == BY_OBJECT:
                index.by_object.setdefault(handler.key, []).append(handler)
            elif handler.match in (BY_SUBJECT, GROUND):
                index.by_subject.setdefault(handler.key, []).append(handler)
            elif handler.gate is not None:
                end, var = handler.gate
                watch = index.watch_object if end == "o" else index.watch_subject
                handler.state.gates[var].append((watch, handler))
            else:
                index.by_predicate.append(handler)
        for table in registered.tables.values():  # new, hence private: adopted at the next apply
            graph, predicate, _role = table.key
            self._index[graph][predicate].tables.append(table)
            self._pending.append((registered, table))

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
            for watch in (index.watch_object, index.watch_subject):
                for key in list(watch):
                    found = watch[key]
                    if type(found) is list:
                        kept = [h for h in found if h.query is not registered]
                        if len(kept) > 1:
                            watch[key] = kept
                        elif kept:
                            watch[key] = kept[0]
                        else:
                            del watch[key]
                    elif found.query is registered:
                        del watch[key]
        for table in registered.tables.values():
            graph, predicate, _role = table.key
            index = self._index[graph][predicate]
            if table.owner is None:
                table.users -= 1
                if table.users:
                    continue
                del self._shared[table.key]
            index.tables = [t for t in index.tables if t is not table]
        if self._pending:
            self._pending = [(q, t) for q, t in self._pending if q is not registered]
        for graph, predicate, _handler in registered.handlers:
            by_predicate = self._index.get(graph, {})
            index = by_predicate.get(predicate)
            if index is not None and index.empty():
                del by_predicate[predicate]

    def _adopt(self) -> None:
        """Let the queries registered since the last apply read the shared tables (cbgp.engine.edge_tables).

        A private table becomes the shared one of its key if there is none; it is dropped for the shared
        one when both hold the same pairs (the query's replay brought it where the others are); else it
        stays private (an `initial` that is not the engine's history), tried again at a few later applies.
        """
        pending, self._pending = self._pending, []
        for query, table in pending:
            if query.tables.get(table.key) is not table:
                continue
            shared = self._shared.get(table.key)
            if shared is None:
                table.owner = None
                table.users = 1
                self._shared[table.key] = table
            elif table.same_pairs(shared):
                query.rebind(table, shared)
                shared.users += 1
                graph, predicate, _role = table.key
                index = self._index[graph][predicate]
                index.tables = [t for t in index.tables if t is not table]
            else:
                table.attempts += 1
                if table.attempts < 3:
                    self._pending.append((query, table))

    def _unshare(self, registered: RegisteredQuery | PerGraphQuery) -> None:
        """Give a query private copies of the shared tables it reads, so that a change fed to it alone
        (apply_to) leaves the other queries' tables as they are; adopted again at the next apply."""
        instances = registered.instances.values() if isinstance(registered, PerGraphQuery) else (registered,)
        for query in instances:
            for table in list(query.tables.values()):
                if table.owner is not None:
                    continue
                if table.users == 1:  # its only reader: the table itself becomes private
                    del self._shared[table.key]
                    table.owner, table.users = query.owner, 0
                    self._pending.append((query, table))
                    continue
                private = table.copy(query.owner)
                query.rebind(table, private)
                graph, predicate, _role = table.key
                index = self._index[graph][predicate]
                table.users -= 1
                index.tables.append(private)
                self._pending.append((query, private))

    def unregister(self, name: str) -> None:
        """Remove a query and free all its state (a shared table once its last reader goes)."""
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

    def predicates(self) -> set[int]:
        """The predicate ids of every registered pattern: a change with another predicate changes nothing."""
        return {p for by_predicate in self._index.values() for p in by_predicate} | set(self._per_graph)

    def columns(self, name: str) -> tuple[str, ...]:
        return self.queries[name].columns

    # -- updates --

    def apply(self, diff: int, s: int, p: int, o: int, g: int = DEFAULT_GRAPH_ID, role: int = ROLE_BOTH) -> list[Delta]:
        """Apply one change (ids) and return the delta answers of every query."""
        if self.graph is not None and role == ROLE_BOTH:
            quad = (s, p, o, g)
            if diff > 0:
                self.graph.add(quad)
            else:
                self.graph.discard(quad)
        if self._pending:
            self._adopt()
        out: list[Delta] = []
        self._dispatch(diff, s, p, o, g, role, out, None)
        return out

    def apply_to(self, name: str, diff: int, s: int, p: int, o: int, g: int = DEFAULT_GRAPH_ID,
                 role: int = ROLE_BOTH) -> list[Delta]:
        """Apply one change (ids) to the query ``name`` alone and return its deltas.

        For bringing a query registered late up to date by replaying the changes the other queries already
        saw (unlike ``register(initial=...)``, this takes deletions and roles).  The engine's graph copy
        (``keep_graph``) is not touched: the change is not new to the engine.
        """
        registered = self.queries[name]
        self._unshare(registered)
        out: list[Delta] = []
        self._dispatch(diff, s, p, o, g, role, out, {registered})
        return out

    def isolate(self, names: Iterable[str]) -> set[RegisteredQuery | PerGraphQuery]:
        """Give the queries ``names`` private copies of the tables they read (as ``apply_to`` does) and return
        them, for :meth:`apply_to_set`: a burst of late registrations replayed together, one dispatch a change."""
        owners: set[RegisteredQuery | PerGraphQuery] = set()
        for name in names:
            registered = self.queries[name]
            self._unshare(registered)
            owners.add(registered)
        return owners

    def apply_to_set(self, owners: set[RegisteredQuery | PerGraphQuery], diff: int, s: int, p: int, o: int,
                     g: int = DEFAULT_GRAPH_ID, role: int = ROLE_BOTH) -> list[Delta]:
        """``apply_to`` for every query :meth:`isolate` returned, at once (no apply in between: it adopts the
        shared tables again)."""
        out: list[Delta] = []
        self._dispatch(diff, s, p, o, g, role, out, owners)
        return out

    def apply_terms(self, diff: int, s: str, p: str, o: str, g: str | None = None) -> list[Delta]:
        encode = self.dictionary.encode
        return self.apply(diff, encode(s), encode(p), encode(o), DEFAULT_GRAPH_ID if g is None else encode(g))

    def _dispatch(self, diff: int, s: int, p: int, o: int, g: int, role: int, out: list[Delta],
                  only: set[RegisteredQuery | PerGraphQuery] | None) -> None:
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
        fresh: list[EdgeTable] = []
        for table in index.tables:
            if table.role & role != table.role or (only is not None and table.owner not in only):
                continue
            if table.add(s, o) if diff > 0 else table.has(s, o):
                table.fresh = True
                fresh.append(table)
        hits: list[Handler] = []
        found = index.by_object.get(o)
        if found:
            hits.extend(found)
        found = index.by_subject.get(s)
        if found:
            hits.extend(found)
        if index.by_predicate:
            hits.extend(index.by_predicate)
        if fresh:
            found = index.watch_object.get(o)
            if found is not None:
                if type(found) is list:
                    hits.extend(found)
                else:
                    hits.append(found)
            found = index.watch_subject.get(s)
            if found is not None:
                if type(found) is list:
                    hits.extend(found)
                else:
                    hits.append(found)
            companions = [c for h in hits if h.companions for c in h.companions]
            if companions:  # a gate this triple may open on its way (see Handler.gate)
                hits = list({id(h): h for h in hits + companions}.values())
        if hits:
            if len(hits) > 1:
                hits.sort(key=_order)
            self._run(hits, diff, s, o, role, out, only)
        for table in fresh:
            table.fresh = False
            if diff < 0:
                table.remove(s, o)

    def _run(self, hits: list[Handler], diff: int, s: int, o: int, role: int, out: list[Delta],
             only: set[RegisteredQuery | PerGraphQuery] | None) -> None:
        for h in hits:
            if only is not None and h.query.owner not in only:
                continue
            if h.role & role != h.role:
                continue
            match = h.match
            if match == BY_OBJECT:
                values: tuple[int, ...] = (s,)
            elif match == BY_SUBJECT:
                values = (o,)
            elif match == GROUND:
                if o != h.check:
                    continue
                deltas = h.state.step(diff, h.local)
                if deltas:
                    h.query.emit(h.part_index, deltas, out)
                continue
            elif match == SELF_LOOP:
                if s != o:
                    continue
                values = (s,)
            else:
                if not h.table.fresh:  # a duplicate insert, a delete of an absent pair, or not this role
                    continue
                values = (s, o)
            state = h.state
            if type(state) is StarState:
                deltas = state.step(diff, h.local, values[0])
            else:
                deltas = state.step(diff, h.local, values, s, o)
            if deltas:
                h.query.emit(h.part_index, deltas, out)

    # -- introspection --

    def _tables(self) -> Iterable[EdgeTable]:
        for by_predicate in self._index.values():
            for index in by_predicate.values():
                yield from index.tables

    def state_entries(self, name: str | None = None) -> int:
        """State entries of one query (with every var-var table it reads, shared ones in full: what it
        would hold alone), or of the engine (each table once, however many queries read it)."""
        if name is not None:
            return self.queries[name].state_entries()
        return (sum(q.state_entries(tables=False) for q in self.queries.values())
                + sum(table.entries() for table in self._tables()))

    def state_bytes(self, name: str | None = None) -> int:
        """Approximate bytes of query state (one query, or all): what the state metrics report.  As
        `state_entries`: a query is charged its shared tables in full, the engine each table once."""
        if name is not None:
            return self.queries[name].state_bytes()
        return (sum(q.state_bytes(tables=False) for q in self.queries.values())
                + sum(table.approx_bytes() for table in self._tables()))

    def decode_row(self, name: str, row: tuple[int, ...]) -> dict[str, str]:
        decode = self.dictionary.decode
        return {var: decode(value) for var, value in zip(self.queries[name].columns, row)}


def _order(handler: Handler) -> tuple[int, int, int]:
    return handler.order
