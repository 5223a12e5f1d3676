"""Running operator queries beside the BGP engine.

`OperatorQuery` is one query's operator tree: its BGP leaves are registered in
a private `Engine` (projecting all their variables, no DISTINCT) that shares
the caller's term dictionary, leaves with a variable predicate are
`PatternLeaf`s, and `apply` returns the query's consolidated delta answers for
one change (rows in `columns` order, None for an unbound variable, `-` rows
first).  A private engine per query is what makes filter push-down possible:
the change is dropped before the engine when every pattern of this query that
it could match rejects it.

`ContinuousEngine` is the drop-in for `Engine` that takes any supported query:
plain BGP SELECTs go to one shared `Engine` exactly as before (the fast path),
other queries get an `OperatorQuery`.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from cbgp.algebra.compile import Builder, EngineLeaf, OperatorQuerySpec, analyse
from cbgp.algebra.operators import MEMO_LIMIT, Constant, Delta, add, remapper
from cbgp.algebra.paths import Closure, PathLimitError, Steps
from cbgp.algebra.expressions import Terms, expression_variables
from cbgp.engine.engine import Engine, EngineError
from cbgp.query.plan import Plan
from cbgp.query.sparql import ParsedQuery, is_var
from cbgp.terms import DEFAULT_GRAPH_ID, TermDictionary

Delta3 = tuple[str, int, tuple]
log = logging.getLogger(__name__)


class OperatorTree:
    """A query's operators above its BGP leaves, fed with the leaves' deltas: by :class:`OperatorQuery`'s
    private engine, or (``cbgp.algebra.by_centre``) by leaves evaluated elsewhere and released in seq order.

    A query whose state would pass a bound (a property path's closure: ``PathLimitError``) stops: ``failed``
    says why, it answers nothing more and its state is dropped, and every other query goes on."""

    failed: str | None = None

    def __init__(self, spec: OperatorQuerySpec, dictionary: TermDictionary, pushdown: bool = True) -> None:
        self.spec = spec
        self.terms = Terms(dictionary, spec.prologue)
        builder = self.builder = Builder(spec, self.terms, pushdown=pushdown)
        self.root = builder.build_root()
        self.columns = builder.columns
        self.form = spec.form
        self.to_columns = remapper(self.root.schema, self.columns)
        self.pending: Delta = {}
        self.root.sink = self._collect
        self.root.start()

    def _collect(self, delta: Delta) -> None:
        for row, n in delta.items():
            add(self.pending, row, n)

    def initial(self) -> list[tuple[int, tuple]]:
        """Answers before any change (VALUES rows, an aggregate's empty group, ASK false...)."""
        return self._drain()

    def push(self, leaves: list, batches: dict[int, Delta]) -> list[tuple[int, tuple]]:
        """One change's net deltas of some leaves (leaf number -> rows in the leaf's schema), in leaf order:
        the query's answer deltas (``-`` rows first)."""
        if self.failed is not None:
            return []
        try:
            for number in sorted(batches):
                if batches[number]:
                    leaves[number].push(batches[number])
        except PathLimitError as error:
            self.stop(str(error))
            return []
        return self._drain() if self.pending else []

    def stop(self, reason: str) -> None:
        """Stop answering (see the class): the reason is logged once and kept in ``failed``, and the operators go
        (unlinked from one another and from the builder, so a leaf a caller still holds keeps none of them)."""
        self.failed = reason
        self.pending = {}
        old, self.root = self.root, Constant(self.root.schema, [])
        for op in list(old.walk()):
            op.parent, op.children = None, []
        self.builder = None  # type: ignore[assignment]
        log.error("event=query_stopped reason=%r", reason)

    def _drain(self) -> list[tuple[int, tuple]]:
        pending, self.pending = self.pending, {}
        out: list[tuple[int, tuple]] = []
        to_columns = self.to_columns
        for row, n in pending.items():
            if n < 0:
                out.extend([(-1, to_columns(row))] * -n)
        for row, n in pending.items():
            if n > 0:
                out.extend([(1, to_columns(row))] * n)
        return out


class FilterGate:
    """FILTER push-down: a FILTER conjunct on the variables of one engine pattern is attached to it
    (``EngineLeaf.pushed``); a change that every engine pattern it could match rejects by its pushed filters can
    take part in no answer, so it is dropped before the engine and costs no state.  Only predicates with a pushed
    filter are gated.  (The filters stay in the operator tree too: they decide the answers.)"""

    def __init__(self, gates: dict[int, list], terms: Terms) -> None:
        self.gates = gates  # predicate id -> [(s, o, graph, filters, their variables)] of its engine patterns
        self.terms = terms
        self._memo: dict = {}  # (id of the filters, pattern binding) -> outcome

    def __getstate__(self) -> dict:
        # (a checkpoint pickles the gate; the memo is keyed by object ids, which mean nothing in the next life)
        return {**self.__dict__, "_memo": {}}

    @classmethod
    def of(cls, engine_leaves: list[EngineLeaf], dictionary: TermDictionary, terms: Terms) -> FilterGate | None:
        """The gate of ``engine_leaves``' patterns, or None when no filter was pushed into any."""
        gates: dict[int, list] = {}
        any_filter = False
        for engine_leaf in engine_leaves:
            for index, pattern in enumerate(engine_leaf.query.patterns):
                filters = engine_leaf.pushed.get(index, [])
                any_filter = any_filter or bool(filters)
                p = dictionary.encode(pattern.p)
                g = pattern.g
                graph = DEFAULT_GRAPH_ID if g is None else (None if g.startswith("?") else dictionary.encode(g))
                s = pattern.s if pattern.s.startswith("?") else dictionary.encode(pattern.s)
                o = pattern.o if pattern.o.startswith("?") else dictionary.encode(pattern.o)
                names = tuple(sorted(set().union(*(expression_variables(f) for f in filters)))) if filters else ()
                gates.setdefault(p, []).append((s, o, graph, filters, names))
        gates = {p: entries for p, entries in gates.items() if any(e[3] for e in entries)}
        return cls(gates, terms) if any_filter else None

    def passes(self, s: int, p: int, o: int, g: int) -> bool:
        """Whether the change may match a pattern its pushed filters accept (always, for an ungated predicate)."""
        entries = self.gates.get(p)
        if entries is None:
            return True
        ebv = self.terms.ebv
        for ps, po, pg, filters, names in entries:
            if pg is not None and pg != g:
                continue
            if not filters:
                if (isinstance(ps, str) or ps == s) and (isinstance(po, str) or po == o):
                    return True
                continue
            binding: dict[str, int] = {}
            ok = True
            for term, value in ((ps, s), (po, o)):
                if isinstance(term, str):
                    name = term[1:]
                    if binding.setdefault(name, value) != value:
                        ok = False
                elif term != value:
                    ok = False
            if not ok:
                continue
            schema = names  # the filters' variables: their outcome depends on these terms only
            row = tuple(binding[n] for n in schema)
            memo = self._memo
            key = (id(filters), row)
            keep = memo.get(key)
            if keep is None:
                keep = all(ebv(f, schema, row) for f in filters)
                if len(memo) >= MEMO_LIMIT:
                    memo.clear()
                memo[key] = keep
            if keep:
                return True
        return False


def single_step(engine_leaf: EngineLeaf) -> tuple[str, bool] | None:
    """``(predicate, subject first)`` when the leaf is one triple pattern ``?a <p> ?b`` of the default graph, two
    different variables both in its schema and no filter pushed into it (a property path's step, say): its rows
    are the changes of that predicate as they come, so it needs no engine state; else None."""
    patterns = engine_leaf.query.patterns
    if len(patterns) != 1 or engine_leaf.pushed:
        return None
    pattern = patterns[0]
    if pattern.g is not None or is_var(pattern.p) or not is_var(pattern.s) or not is_var(pattern.o):
        return None
    subject, object_ = pattern.s[1:], pattern.o[1:]
    schema = engine_leaf.leaf.schema
    if subject == object_ or len(schema) != 2 or set(schema) != {subject, object_}:
        return None
    return pattern.p, schema[0] == subject


class OperatorQuery(OperatorTree):
    """One query's operator tree over its private engine (see the module).  ``steps``, given by an engine that
    keeps each single-step relation once (:class:`ContinuousEngine`), returns that engine's
    :class:`~cbgp.algebra.paths.Steps` of a predicate: the closures over one then read it instead of keeping a
    copy, and its changes reach them through ``apply(..., stepped=True)``."""

    # predicate id -> [(leaf name, subject first)] of the single-step leaves, fed without the engine, and the
    # (subject, object) pairs of that predicate present, for set semantics as the engine's tables keep it (a
    # duplicate insert or the delete of an absent triple changes nothing).  A query pickled before there were
    # any has none: its engine holds all its leaves.
    direct: dict[int, list[tuple[str, bool]]] = {}
    present: dict[int, set[tuple[int, int]]] = {}
    # predicate id -> the closures sharing the engine's Steps of it (their step leaves are not fed)
    shared: dict[int, list[Closure]] = {}

    def __init__(self, spec: OperatorQuerySpec, dictionary: TermDictionary, pushdown: bool = True,
                 steps: Callable[[int], Steps] | None = None) -> None:
        super().__init__(spec, dictionary, pushdown)
        builder = self.builder
        self.engine = Engine(dictionary)
        self.engine_leaves = builder.engine_leaves
        self.leaves = {}
        self.leaf_columns = {}
        self.direct, self.present, self.shared = {}, {}, {}
        for number, engine_leaf in enumerate(builder.engine_leaves):
            name = f"leaf{number}"
            self.leaves[name] = engine_leaf.leaf
            step = single_step(engine_leaf)
            if step is not None:
                predicate = dictionary.encode(step[0])
                closure = engine_leaf.leaf.parent
                if steps is not None and isinstance(closure, Closure) and closure.graph_var is None:
                    start = engine_leaf.query.patterns[0].s[1:] == closure.step_vars[0]
                    closure.share(steps(predicate), start)
                    self.shared.setdefault(predicate, []).append(closure)
                    continue
                self.direct.setdefault(predicate, []).append((name, step[1]))
                self.present.setdefault(predicate, set())
                continue
            self.engine.register(name, engine_leaf.query)
            self.leaf_columns[name] = remapper(self.engine.columns(name), engine_leaf.leaf.schema)
        self.pattern_leaves = builder.pattern_leaves
        self.gate = FilterGate.of(builder.engine_leaves, dictionary, self.terms) if pushdown else None
        self.gated = 0  # changes dropped by push-down

    # -- changes --

    def apply(self, diff: int, s: int, p: int, o: int, g: int = DEFAULT_GRAPH_ID,
              stepped: bool = False) -> list[tuple[int, tuple]]:
        """One change's answer deltas (``stepped``: it changed the engine's shared steps of ``p``, already)."""
        if self.failed is not None:
            return []
        try:
            if stepped:
                for closure in self.shared.get(p, ()):
                    closure.step(diff, s, o)
            return self._apply(diff, s, p, o, g)
        except PathLimitError as error:
            self.stop(str(error))
            return []

    def seed(self) -> list[tuple[int, tuple]]:
        """The answers of the closures sharing an engine's steps over what those hold (at registration)."""
        try:
            for closures in self.shared.values():
                for closure in closures:
                    closure.seed()
        except PathLimitError as error:
            self.stop(str(error))
            return []
        return self._drain() if self.pending else []

    def stop(self, reason: str) -> None:
        """As :meth:`OperatorTree.stop`, and its private engine's state dropped too."""
        super().stop(reason)
        self.engine = Engine(self.engine.dictionary)
        self.leaves, self.pattern_leaves, self.engine_leaves = {}, [], []
        self.direct, self.present, self.shared = {}, {}, {}

    def _apply(self, diff: int, s: int, p: int, o: int, g: int) -> list[tuple[int, tuple]]:
        if self.engine.queries or self.direct:  # (the leaves fed here: not those of closures sharing steps)
            if self.gate is not None and not self.gate.passes(s, p, o, g):
                self.gated += 1
            else:
                deltas = self.engine.apply(diff, s, p, o, g) if self.engine.queries else []
                direct = self.direct.get(p) if g == DEFAULT_GRAPH_ID else None
                if direct:
                    present = self.present[p]
                    if (diff > 0) == ((s, o) in present):
                        direct = None  # a duplicate insert or the delete of an absent triple
                    elif diff > 0:
                        present.add((s, o))
                    else:
                        present.discard((s, o))
                if deltas or direct:
                    batches: dict[str, Delta] = {}
                    for name, sgn, row in deltas:
                        batch = batches.get(name)
                        if batch is None:
                            batch = batches[name] = {}
                        add(batch, self.leaf_columns[name](row), sgn)
                    for name, subject_first in direct or ():
                        batches[name] = {((s, o) if subject_first else (o, s)): diff}
                    for name in sorted(batches, key=lambda n: int(n[4:])):
                        if batches[name]:
                            self.leaves[name].push(batches[name])
        for leaf in self.pattern_leaves:
            leaf.change(diff, (s, p, o, g))
        return self._drain() if self.pending else []

    def predicates(self) -> set[int | None]:
        """The predicate ids a change must have to reach this query (None: any, for a variable predicate)."""
        found: set[int | None] = set(self.engine.predicates()) | set(self.direct) | set(self.shared)
        if self.pattern_leaves:
            found.add(None)
        return found

    def state_entries(self) -> int:
        return (self.engine.state_entries() + sum(map(len, self.present.values()))
                + sum(op.entries() for op in self.root.walk()))

    def state_bytes(self) -> int:
        return (self.engine.state_bytes() + 64 * sum(map(len, self.present.values()))
                + 64 * sum(op.entries() for op in self.root.walk()))

    def explain(self) -> str:
        if self.failed is not None:
            return f"{self.form} query stopped: {self.failed}"
        lines = [f"{self.form} query evaluated by operators over {len(self.leaves)} engine BGP(s)"
                 f" and {len(self.pattern_leaves)} leaf(s) fed every change (variable predicate, negated property"
                 f" set, zero-length path):"]
        lines.extend("  " + line for line in self.root.explain())
        return "\n".join(lines)


class ContinuousEngine:
    """`Engine` for every supported query: BGP SELECTs on the shared fast path, others with operators.

    The ids in the deltas :meth:`apply` returns decode until :meth:`collect` frees the terms an aggregate
    computed and let go since (``TermDictionary.collect``): a caller that reads each change's deltas as they
    come calls it after reading them, one that gathers deltas once it has read what it gathered."""

    def __init__(self, dictionary: TermDictionary | None = None, keep_graph: bool = False,
                 pushdown: bool = True) -> None:
        self.engine = Engine(dictionary, keep_graph=keep_graph)
        self.dictionary = self.engine.dictionary
        self.operator_queries: dict[str, OperatorQuery] = {}
        # Operator queries by the predicates their BGP leaves read (None: a variable predicate, every change), in
        # registration order: a change visits the queries it can touch, not every one registered.
        self._by_predicate: dict[int | None, dict[str, OperatorQuery]] = {}
        self.pushdown = pushdown
        # predicate id -> the one copy of its single-step relation that every closure over it reads, and the
        # queries sharing it (a copy is dropped with its last query)
        self.steps: dict[int, Steps] = {}
        self._step_users: dict[int, set[str]] = {}
        self._source: list | None = None  # (the graph during a registration: what a new Steps starts from)

    def register(self, name: str, query: str | ParsedQuery | Plan | OperatorQuerySpec,
                 initial: Iterable[tuple[int, int, int, int]] | None = None) -> list[Delta3]:
        if name in self.engine.queries or name in self.operator_queries:
            raise EngineError(f"a query named {name!r} is already registered")
        if isinstance(query, str):
            query = analyse(query)
        if isinstance(query, (ParsedQuery, Plan)):  # a BGP (or its decomposition): the BGP engine's
            return self.engine.register(name, query, initial)
        source = self._source = list(initial if initial is not None else (self.engine.graph or ()))
        try:
            op = OperatorQuery(query, self.dictionary, self.pushdown, self._steps_of)
        except BaseException:
            for predicate in [p for p in self.steps if p not in self._step_users]:
                del self.steps[predicate]  # (made for this query alone)
            raise
        finally:
            self._source = None
        self.operator_queries[name] = op
        for predicate in op.predicates():
            self._by_predicate.setdefault(predicate, {})[name] = op
        for predicate in op.shared:
            self._step_users.setdefault(predicate, set()).add(name)
        out = [(name, diff, row) for diff, row in op.initial()]
        for s, p, o, g in source:
            out.extend((name, diff, row) for diff, row in op.apply(1, s, p, o, g))
        out.extend((name, diff, row) for diff, row in op.seed())
        if op.failed is not None:  # refused at registration: its state over the graph is over a bound
            self.unregister(name)
            raise EngineError(op.failed)
        return _consolidate(out)

    def _steps_of(self, predicate: int) -> Steps:
        """The engine's one copy of ``predicate``'s steps, made from the graph at the first query reading it."""
        steps = self.steps.get(predicate)
        if steps is None:
            steps = self.steps[predicate] = Steps()
            for s, p, o, g in self._source or ():
                if p == predicate and g == DEFAULT_GRAPH_ID:
                    steps.change(1, s, o)
        return steps

    def unregister(self, name: str) -> None:
        op = self.operator_queries.pop(name, None)
        if op is None:
            self.engine.unregister(name)
            return
        self._release_steps(name)
        for predicate in op.predicates():
            queries = self._by_predicate[predicate]
            del queries[name]
            if not queries:
                del self._by_predicate[predicate]

    def _release_steps(self, name: str) -> None:
        """``name`` reads no shared steps any more (unregistered, or stopped): a copy is dropped with its last query."""
        for predicate in list(self._step_users):
            users = self._step_users[predicate]
            users.discard(name)
            if not users:
                del self._step_users[predicate], self.steps[predicate]

    def columns(self, name: str) -> tuple[str, ...]:
        op = self.operator_queries.get(name)
        return op.columns if op is not None else self.engine.columns(name)

    def apply(self, diff: int, s: int, p: int, o: int, g: int = DEFAULT_GRAPH_ID) -> list[Delta3]:
        out = self.engine.apply(diff, s, p, o, g)
        if not self._by_predicate:
            return out
        touched = self._by_predicate.get(p)
        every = self._by_predicate.get(None)
        if every:
            touched = every if not touched else {n: self.operator_queries[n] for n in self.operator_queries
                                                 if n in touched or n in every}
        steps = self.steps.get(p) if g == DEFAULT_GRAPH_ID else None
        stepped = steps is not None and steps.change(diff, s, o)
        for name, op in (touched or {}).items():
            for d_diff, row in op.apply(diff, s, p, o, g, stepped):
                out.append((name, d_diff, row))
            if stepped and op.failed is not None:  # stopped: its share of the steps freed at their next change
                self._release_steps(name)
        return out

    def collect(self) -> list[int]:
        """Free the computed terms let go since the last call (the deltas returned so far were read)."""
        return self.dictionary.collect()

    def apply_terms(self, diff: int, s: str, p: str, o: str, g: str | None = None) -> list[Delta3]:
        encode = self.dictionary.encode
        return self.apply(diff, encode(s), encode(p), encode(o), DEFAULT_GRAPH_ID if g is None else encode(g))

    def decode_row(self, name: str, row: tuple) -> dict[str, str]:
        decode = self.dictionary.decode
        return {var: decode(value) for var, value in zip(self.columns(name), row) if value is not None}

    def state_entries(self, name: str | None = None) -> int:
        """The entries of state of one query, or of the engine (the shared steps, each kept both ways, included)."""
        if name is None:
            return (self.engine.state_entries() + sum(q.state_entries() for q in self.operator_queries.values())
                    + 2 * sum(steps.size for steps in self.steps.values()))
        op = self.operator_queries.get(name)
        return op.state_entries() if op is not None else self.engine.state_entries(name)

    def explain(self, name: str) -> str:
        return self.operator_queries[name].explain()


def _consolidate(deltas: list[Delta3]) -> list[Delta3]:
    total: dict[tuple[str, tuple], int] = {}
    for name, diff, row in deltas:
        key = (name, row)
        total[key] = total.get(key, 0) + diff
    out: list[Delta3] = []
    for (name, row), n in total.items():
        if n < 0:
            out.extend([(name, -1, row)] * -n)
    for (name, row), n in total.items():
        if n > 0:
            out.extend([(name, 1, row)] * n)
    return out
