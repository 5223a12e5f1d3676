"""The engine of a worker's shard (``services.worker.core``): :class:`WorkerEngine`, the BGP engine that also
replays a log into a subset of its queries and evaluates operator queries (:class:`FleetOperatorQuery`: FILTER,
OPTIONAL, aggregates, ASK as the fleet reports it), over a :class:`ShardDictionary` that knows which term ids it
made itself (to be published).  No Kafka here."""

from __future__ import annotations

from collections import Counter as Multiset
from typing import Iterable

from cbgp.change import ROLE_BOTH
from cbgp.engine.engine import Engine, EngineError
from cbgp.terms import DEFAULT_GRAPH_ID, TermDictionary

# ASK in the fleet: one variable ?ask, "false" from registration, flipped by a '-'/'+' pair when it changes.
ASK_VARIABLE = "ask"
ASK_TRUE = '"true"^^<http://www.w3.org/2001/XMLSchema#boolean>'
ASK_FALSE = '"false"^^<http://www.w3.org/2001/XMLSchema#boolean>'


class ShardDictionary(TermDictionary):
    """A shard's term dictionary: ids learnt from the dictionary topic (:meth:`add`) and ids made here
    (``made``: query constants, values an operator computes -- a COUNT, a BIND, a CONSTRUCT's blank node --
    which the worker publishes on the dictionary topic before the answers that use them)."""

    __slots__ = ("made",)

    def __init__(self) -> None:
        super().__init__(stable=True)
        self.made: set[int] = set()

    def encode(self, term: str) -> int:
        found = self._ids.get(term)
        if found is not None:
            return found
        term_id = super().encode(term)
        self.made.add(term_id)
        return term_id

    def hold(self, term: str) -> int:
        term_id = super().hold(term)
        if term_id in self._held:
            self.made.add(term_id)
        return term_id

    def add(self, term_id: int, term: str) -> None:
        super().add(term_id, term)
        self.made.discard(term_id)

    def collect(self) -> list[int]:
        freed = super().collect()
        for term_id in freed:
            self.made.discard(term_id)
        return freed

    def knows(self, term_id: int) -> bool:
        return term_id in self._terms or term_id in self._held


def ask_initial(rows: list[tuple[int, tuple]], true: tuple, false: tuple) -> list[tuple[int, tuple]]:
    """An ASK query's first answer as the fleet reports it: ``?ask`` true if the algebra's empty row is there."""
    return [(1, true if sum(diff for diff, _row in rows) > 0 else false)]


def ask_flip(deltas: list[tuple[int, tuple]], true: tuple, false: tuple) -> list[tuple[int, tuple]]:
    """An ASK query's deltas as the fleet reports them: its empty row coming or going flips ``?ask``."""
    net = sum(diff for diff, _row in deltas)
    if net > 0:
        return [(-1, false), (1, true)]
    return [(-1, true), (1, false)] if net < 0 else []


class FleetOperatorQuery:
    """One operator query (``cbgp.algebra.OperatorQuery``) as the fleet reports it: rows in ``columns``
    order (None: unbound), and ASK as the boolean variable ``?ask`` (the algebra's one empty row while the
    pattern matches becomes ``false`` -> ``true``, a retraction and an assertion in the same update)."""

    def __init__(self, spec: object, dictionary: TermDictionary) -> None:
        from cbgp.algebra import OperatorQuery

        self.query = OperatorQuery(spec, dictionary)  # type: ignore[arg-type]
        self.ask = self.query.form == "ASK"
        if self.ask:
            self.columns: tuple[str, ...] = (ASK_VARIABLE,)
            self.true, self.false = (dictionary.encode(ASK_TRUE),), (dictionary.encode(ASK_FALSE),)
        else:
            self.columns = self.query.columns

    def initial(self) -> list[tuple[int, tuple]]:
        rows = self.query.initial()
        return ask_initial(rows, self.true, self.false) if self.ask else rows

    def apply(self, diff: int, s: int, p: int, o: int, g: int, role: int = ROLE_BOTH) -> list[tuple[int, tuple]]:
        deltas = self.query.apply(diff, s, p, o, g)  # (a whole shard's changes: every role)
        return ask_flip(deltas, self.true, self.false) if self.ask and deltas else deltas

    def state_entries(self) -> int:
        return self.query.state_entries()

    def state_bytes(self) -> int:
        return self.query.state_bytes()

    def explain(self) -> str:
        return self.query.explain()


class GatedLeafPart:
    """A leaf of an operator query placed by centre (``cbgp.algebra.by_centre.LeafPart``) with FILTERs pushed
    into its patterns: its BGP in a private engine behind the filters' gate, so a change every pattern's filter
    rejects costs no state on this shard (the filters run again with the operators, at the answers service).
    Its deltas are the leaf's rows, as the shard engine's would be."""

    def __init__(self, part: object, dictionary: TermDictionary) -> None:
        from cbgp.algebra.continuous import FilterGate
        from cbgp.algebra.expressions import Terms

        self.engine = Engine(dictionary)
        self.engine.register("leaf", part.plan)  # type: ignore[attr-defined]
        self.columns = self.engine.columns("leaf")
        # (every change of the shard comes here: most have another predicate, and cost a set lookup)
        self.predicates = frozenset(dictionary.encode(t.p) for t in part.plan.query.patterns)  # type: ignore[attr-defined]
        self.gate = FilterGate.of([part.pushed], dictionary, Terms(dictionary, part.prologue))  # type: ignore[attr-defined]
        self.gated = 0  # changes kept out

    def initial(self) -> list[tuple[int, tuple]]:
        return []

    def apply(self, diff: int, s: int, p: int, o: int, g: int, role: int = ROLE_BOTH) -> list[tuple[int, tuple]]:
        if p not in self.predicates:
            return []
        if self.gate is not None and not self.gate.passes(s, p, o, g):
            self.gated += 1
            return []
        return [(d_diff, row) for _name, d_diff, row in self.engine.apply(diff, s, p, o, g, role)]

    def state_entries(self) -> int:
        return self.engine.state_entries()

    def state_bytes(self) -> int:
        return self.engine.state_bytes()


class PatternLeafPart:
    """A pattern leaf of an operator query placed by centre (``cbgp.algebra.by_centre.LeafPart.pattern``: a
    variable predicate, a negated property set, a zero-length path): fed the changes of the shard whose role it
    takes, so each of its solutions is found on one shard (a zero-length path counts the ends the shard owns).
    Its deltas are the leaf's rows; it reads ids only, no terms."""

    def __init__(self, part: object) -> None:
        self.leaf = part.pattern_leaf()  # type: ignore[attr-defined]
        self.role = part.role  # type: ignore[attr-defined]
        self.zero = type(self.leaf).__name__ == "ZeroLength"
        self.columns = tuple(self.leaf.schema)
        self.out: list[dict] = []
        self.leaf.sink = self.out.append

    def initial(self) -> list[tuple[int, tuple]]:
        return []

    def apply(self, diff: int, s: int, p: int, o: int, g: int, role: int = ROLE_BOTH) -> list[tuple[int, tuple]]:
        ends = role & self.role
        if not ends:
            return []
        if self.zero:
            self.leaf.change(diff, (s, p, o, g), ends)
        else:
            self.leaf.change(diff, (s, p, o, g))
        if not self.out:
            return []
        deltas = [(n, row) for delta in self.out for row, n in delta.items()]
        self.out.clear()
        return deltas

    def state_entries(self) -> int:
        return self.leaf.entries()

    def state_bytes(self) -> int:
        return 64 * self.leaf.entries()


def is_operator_spec(query: object) -> bool:
    """An operator query spec (``cbgp.algebra.OperatorQuerySpec``), told apart without importing rdflib."""
    return type(query).__name__ == "OperatorQuerySpec"


class WorkerEngine(Engine):
    """An :class:`Engine` that can replay a log into a subset of its queries (late registration), and that
    evaluates operator queries (:class:`FleetOperatorQuery`) beside its BGP queries."""

    def __init__(self, dictionary: TermDictionary | None = None) -> None:
        super().__init__(dictionary)
        self.operators: dict[str, FleetOperatorQuery | GatedLeafPart | PatternLeafPart] = {}
        self.initial_rows: dict[str, list[tuple[int, tuple]]] = {}  # an operator query's rows before any change

    def register(self, name: str, query, initial=None):  # noqa: ANN001, ANN201
        part = type(query).__name__ == "LeafPart"  # (told apart without importing rdflib)
        if not part and not is_operator_spec(query):
            return super().register(name, query, initial)
        if name in self.queries or name in self.operators:
            raise EngineError(f"a query named {name!r} is already registered")
        if part:
            op = PatternLeafPart(query) if query.pattern is not None else GatedLeafPart(query, self.dictionary)
        else:
            op = FleetOperatorQuery(query, self.dictionary)
        self.operators[name] = op
        self.initial_rows[name] = op.initial()
        self.apply = self._apply_with_operators  # type: ignore[method-assign]
        return []

    def unregister(self, name: str) -> None:
        if self.operators.pop(name, None) is not None:
            self.initial_rows.pop(name, None)
            if not self.operators:
                del self.apply  # back to Engine.apply
            return
        super().unregister(name)

    def columns(self, name: str) -> tuple[str, ...]:
        op = self.operators.get(name)
        return op.columns if op is not None else super().columns(name)

    def term_predicates(self) -> frozenset[int] | None:
        """The predicates of the changes whose terms the operators read: those of the pushed FILTERs when every
        operator here is a leaf part, else None (an operator query reads every change's)."""
        predicates: set[int] = set()
        for op in self.operators.values():
            if isinstance(op, PatternLeafPart):
                continue
            if not isinstance(op, GatedLeafPart):
                return None
            if op.gate is not None:
                predicates.update(op.gate.gates)
        return frozenset(predicates)

    def _apply_with_operators(self, diff: int, s: int, p: int, o: int, g: int = DEFAULT_GRAPH_ID,
                              role: int = ROLE_BOTH) -> list:
        """``apply`` while operator queries are registered (installed on the instance: BGP-only shards keep
        ``Engine.apply`` with no extra call)."""
        out = Engine.apply(self, diff, s, p, o, g, role)
        for name, op in self.operators.items():
            for d_diff, row in op.apply(diff, s, p, o, g, role):
                out.append((name, d_diff, row))
        return out

    def targets(self, names: Iterable[str]) -> tuple[list[str], set]:
        """``names`` prepared for :meth:`apply_to_targets`: their operator queries, and their BGP queries isolated
        (``Engine.isolate``).  Valid until the next ``apply``."""
        operators = sorted(name for name in names if name in self.operators)
        return operators, self.isolate(sorted(name for name in names if name not in self.operators))

    def apply_to_targets(self, targets: tuple[list[str], set], diff: int, s: int, p: int, o: int,
                         g: int = DEFAULT_GRAPH_ID, role: int = ROLE_BOTH) -> list:
        """``apply_to`` for each of ``targets``, a change dispatched once for all their BGP queries."""
        operators, owners = targets
        out = self.apply_to_set(owners, diff, s, p, o, g, role) if owners else []
        for name in operators:
            out += [(name, d_diff, row) for d_diff, row in self.operators[name].apply(diff, s, p, o, g, role)]
        return out

    def apply_to(self, name: str, diff: int, s: int, p: int, o: int, g: int = DEFAULT_GRAPH_ID,
                 role: int = ROLE_BOTH) -> list:
        op = self.operators.get(name)
        if op is None:
            return super().apply_to(name, diff, s, p, o, g, role)
        return [(name, d_diff, row) for d_diff, row in op.apply(diff, s, p, o, g, role)]

    def state_entries(self, name: str | None = None) -> int:
        if name is None:
            return super().state_entries() + sum(op.state_entries() for op in self.operators.values())
        op = self.operators.get(name)
        return op.state_entries() if op is not None else super().state_entries(name)

    def state_bytes(self, name: str | None = None) -> int:
        if name is None:
            return super().state_bytes() + sum(op.state_bytes() for op in self.operators.values())
        op = self.operators.get(name)
        return op.state_bytes() if op is not None else super().state_bytes(name)

    def replay(self, changes: Iterable[tuple], collect: set[str], only: bool) -> dict[str, Multiset]:
        """Apply ``changes``; return the net deltas of the queries in ``collect`` (row -> multiplicity), an
        operator query's rows before any change included.

        ``only=True`` feeds the changes to the ``collect`` queries alone (the others already saw them).
        """
        net: dict[str, Multiset] = {name: Multiset() for name in collect}
        for name in collect:
            for diff, row in self.initial_rows.get(name, ()):
                net[name][row] += diff
        self.initial_rows.clear()  # every operator query registered so far is replayed now
        targets = self.targets(collect) if only else None
        for _seq, diff, s, p, o, g, _time, role, _refresh in changes:
            if targets is not None:
                # Engine.register(initial=...) only inserts and ignores roles; a replay needs both.
                out = self.apply_to_targets(targets, diff, s, p, o, g, role)
            else:
                out = self.apply(diff, s, p, o, g, role)
            for name, delta_diff, row in out:
                if name in net:
                    net[name][row] += delta_diff
        return net
