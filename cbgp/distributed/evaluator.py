"""Var-connected components evaluated across partitions: state keyed by centre value, probes between them.

How it works: docs/design/internals.md, cbgp.distributed.evaluator.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from typing import Callable, Iterable, NamedTuple

from cbgp.change import ROLE_OBJECT, ROLE_SUBJECT
from cbgp.distributed.program import ComponentProgram
from cbgp.distributed.versioned_state import LiveCounts, PatternStore, present_at
from cbgp.query.plan import FAN_IN, FAN_OUT, OBJECT_END, SUBJECT_END, route_cost


Row = tuple[int, ...]

# Route choices (_QueryState.choose_routes): after this many changes stored at a partition, then every so many.
RECHOOSE_AT, RECHOOSE_EVERY = 256, 4096


class Probe(NamedTuple):
    """A partial binding of update ``seq`` on its way to partition ``dest``, to continue at ``step``.  (Named
    tuples: a probe, an ack and a delta are made per binding, and a frozen dataclass costs several times more
    to build.)"""

    dest: int
    query: str
    seq: int
    diff: int
    triple: tuple[int, int, int, int]  # (s, p, o, g) of the update
    pattern: int  # j, the pattern the update matched where the probe started
    step: int
    binding: Row
    origin: int  # the partition counting this update's live probes
    snapshot: bool = False  # part of a late registration's history (see PartitionEvaluator.register)
    born_ms: int = 0  # when the update entered the system (ms; 0: unknown): its answers' latency starts there
    route: int = 0  # which of pattern's routes it follows (ComponentProgram.routes_of; chosen where it started)


class Ack(NamedTuple):
    """To ``dest`` (the origin): a probe of (``query``, ``seq``, ``snapshot``) was answered with ``delta + 1``
    remote children.  An answer with exactly one child changes no count: no ack is made for it."""

    dest: int
    query: str
    seq: int
    delta: int
    snapshot: bool = False


class Delta(NamedTuple):
    query: str
    seq: int
    diff: int
    row: Row
    snapshot: bool = False
    born_ms: int = 0  # the born_ms of the update whose probe made it


# Probes, acks and deltas from a tuple of all their fields, at C speed: ``Probe(...)`` runs a named tuple's Python
# ``__new__`` (0.3 us more), and the walks make one per binding.  (No length check: callers pass every field.)
probe_of = partial(tuple.__new__, Probe)
ack_of = partial(tuple.__new__, Ack)
delta_of = partial(tuple.__new__, Delta)


@dataclass
class Outputs:
    """What to send.  The acks go out before the probes (and, on one partition of the probes topic, are
    appended before them): a probe's children must never overtake the ack that counts them at their origin."""

    deltas: list[Delta] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)

    def extend(self, other: Outputs) -> None:
        self.deltas.extend(other.deltas)
        self.probes.extend(other.probes)
        self.acks.extend(other.acks)


def _projector(projection: tuple[int, ...]) -> Callable[[list[int]], Row]:
    """The emitted row of a binding (a tuple whatever the number of projected variables)."""
    if len(projection) == 1:
        (only,) = projection
        return lambda binding: (binding[only],)
    if not projection:
        return lambda _binding: ()
    return lambda binding, get=itemgetter(*projection): get(binding)


class _QueryState:
    """A query's stores at one partition, and its join plans compiled against them: a step of
    ``routes[j][r]`` (pattern j's route r) is ``(pattern, binds, at_var, end, store, checks, s_var, o_var,
    s_const, o_const)``, with ``checks`` (a check step: every stored end, any of which may be read where the
    probe is) as ``(var, end, store)``.

    ``choice[j]`` is the route this partition sends its updates of pattern j along: the cheapest by the route
    model (``cbgp.query.plan.route_cost``) with the fan-outs its own stores count (their keys hash here, a fair
    sample of every key), chosen again as the changes applied here reach RECHOOSE_AT, then every
    RECHOOSE_EVERY.  That depends on the log alone, so two workers holding the partition (a takeover) or a
    restore choose alike; a probe carries its route, so every partition continues it the same way."""

    def __init__(self, program: ComponentProgram, roots_after: int) -> None:
        self.program = program
        self.roots_after = roots_after  # updates up to this seq start no probes: the snapshot covers them
        self.registration_upto = -1  # updates up to this seq belong to the registration here (flagged snapshot)
        self.history_upto = -1  # changes up to this seq came in the registration's history: the log's are skipped
        # FILTERs pushed into the patterns (an object with passes(s, p, o, g); None: none): a change it rejects
        # takes part in no answer, so it is neither stored nor starts probes (the filters decide the answers
        # where the operators run).  A function of the change alone, so every owner of the partition agrees.
        self.gate = None
        self.gated = 0  # changes kept out by it
        # per pattern, per end: the store (only the ends whose value is a variable)
        self.stores: list[dict[int, PatternStore]] = [{end: PatternStore() for end in spec.ends()}
                                                       for spec in program.patterns]
        by_predicate: dict[int, list[int]] = {}
        for i, spec in enumerate(program.patterns):
            by_predicate.setdefault(spec.predicate, []).append(i)
        self.by_predicate = by_predicate
        self.project = _projector(program.projection)
        self.routes: list[tuple[tuple[tuple, ...], ...]] = [
            tuple(self._compile(steps) for steps in program.routes_of(j)) for j in range(len(program.patterns))]
        self.choice = [0] * len(program.patterns)
        self.applied_changes = 0  # changes stored here (the clock of the route choices)
        self.next_choice = RECHOOSE_AT
        # apply()'s work per predicate: (pattern, spec, subject-end store, object-end store, start role)
        self.hits: dict[int, tuple[tuple, ...]] = {
            p: tuple((i, program.patterns[i], self.stores[i].get(SUBJECT_END), self.stores[i].get(OBJECT_END),
                      ROLE_SUBJECT if program.start_end(i) == SUBJECT_END else ROLE_OBJECT) for i in hits)
            for p, hits in by_predicate.items()}

    def __getstate__(self) -> dict:
        # (a worker's shard checkpoint pickles the evaluator: the projector is a lambda, made again on load)
        state = self.__dict__.copy()
        del state["project"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({"gate": None, "gated": 0, "history_upto": -1, **state})  # (older checkpoints)
        self.project = _projector(self.program.projection)

    def _compile(self, steps: tuple) -> tuple[tuple, ...]:
        route = []
        for step in steps:
            spec = self.program.patterns[step.pattern]
            checks = ()
            if step.binds < 0:
                checks = tuple((spec.subject_var if end == SUBJECT_END else spec.object_var, end,
                                self.stores[step.pattern][end]) for end in spec.ends())
            route.append((step.pattern, step.binds, step.at, step.end, self.stores[step.pattern][step.end],
                          checks, spec.subject_var, spec.object_var, spec.subject_const, spec.object_const))
        return tuple(route)

    def choose_routes(self) -> None:
        """Set ``choice`` from this partition's counts (see the class doc)."""
        program = self.program
        pairs = [(spec.subject_var, spec.object_var) for spec in program.patterns]
        stores = self.stores

        def fan(i: int, end: int) -> float:
            return stores[i][end].fan(FAN_OUT if end == SUBJECT_END else FAN_IN)

        for j in range(len(pairs)):
            candidates = program.routes_of(j)
            if len(candidates) > 1:
                start = program.start_end(j)
                costs = [route_cost(pairs, j, start, steps, fan) for steps in candidates]
                self.choice[j] = costs.index(min(costs))

    def overlay(self, triple: tuple[int, int, int, int]) -> int:
        """The patterns an update's triple matches, as bits (the delta rule's view of the update itself)."""
        s, p, o, g = triple
        hits = self.by_predicate.get(p, ())
        if len(hits) == 1:
            return 1 << hits[0]  # the update matched the probe's pattern, the only one with its predicate
        mask = 0
        for i in hits:
            if self.program.patterns[i].matches(s, p, o, g):
                mask |= 1 << i
        return mask


class PartitionEvaluator:
    """The distributed evaluation at one partition: its stores, held probes and live-probe counts."""

    def __init__(self, partition: int, partitions: int) -> None:
        self.partition = partition
        self.partitions = partitions
        self.queries: dict[str, _QueryState] = {}
        self.applied = -1  # every change up to this seq routed here has been applied
        self.last_seq = -1  # the highest seq applied (the log is in seq order)
        self.held: list[tuple[int, int, Probe]] = []  # heap of (seq, arrival, probe) waiting for the applied frontier
        self._arrivals = 0
        self.unknown: list[Probe] = []  # probes of queries not registered here yet
        # (query, seq, snapshot) -> probes still alive elsewhere, for updates (and snapshots) that started here
        self.live = LiveCounts()
        self.probes_sent = 0
        self.probes_received = 0
        self.predicates: frozenset[int] = frozenset()  # of every registered query's patterns: other changes
        # start nothing and store nothing here (callers may skip apply() for them)
        self.by_predicate: dict[int, tuple[tuple[str, _QueryState, tuple], ...]] = {}  # p -> (query, state, hits)
        # (query, pattern, number of routes) -> the route of an update starting here; None: the counts choose
        # (tests set it to send probes along every route)
        self.route_policy: Callable[[str, int, int], int] | None = None

    def _index(self) -> None:
        by_predicate: dict[int, list[tuple[str, _QueryState, tuple]]] = {}
        for name, state in self.queries.items():
            for p, hits in state.hits.items():
                by_predicate.setdefault(p, []).append((name, state, hits))
        self.by_predicate = {p: tuple(targets) for p, targets in by_predicate.items()}
        self.predicates = frozenset(self.by_predicate)

    # -- registration

    def register(self, program: ComponentProgram, roots_after: int = -1, registration_upto: int = -1,
                 gate: object | None = None) -> None:
        """Add a query whose answers are enumerated as of ``roots_after`` (:meth:`snapshot`, the same seq on
        every partition) and whose deltas start with the updates after it.  Its state is then brought in with
        :meth:`replay_history` (or, in tests, :meth:`apply` on this partition's log so far, ``only=``); the
        updates up to ``registration_upto`` (the seq the registration answers as of) start probes flagged
        ``snapshot``: they are the registration's, which :meth:`pending` waits for and :meth:`completed_live`
        leaves out.  ``gate``: the FILTERs pushed into its patterns (see ``_QueryState.gate``)."""
        state = self.queries[program.name] = _QueryState(program, roots_after)
        state.registration_upto = registration_upto
        state.gate = gate
        self._index()

    def replay_history(self, name: str, history: Iterable[tuple], out: Outputs) -> Outputs:
        """Bring a just-registered query's state in from its registration's history: this partition's graph as
        of ``registration_upto`` as an insert-only history, each quad at its last insert's seq, in seq order
        (``distributed_state.insert_history``).  That history is a function of the seq alone, so every
        partition replays the same timeline of each triple, whether it read its log from offset 0 or moved a
        base to the point: the delta rule's sum telescopes over one timeline only (a triple present in
        ``[5, 8)`` at one partition and not at the other counts some pairs twice).  The log's changes up to
        that seq are skipped for this query from now on: they are in the history."""
        state = self.queries[name]
        for seq, diff, s, p, o, g, _time, role, *_refresh in history:
            self.apply(seq, diff, s, p, o, g, role, only=name, out=out)
        state.history_upto = state.registration_upto
        return out

    def snapshot(self, name: str) -> Outputs:
        """Start the enumeration of the query's answers as of its ``roots_after`` from this partition: every
        embedding whose first pattern's triple starts here (read at every partition as of that seq, once
        their applied frontiers have reached it).  The deltas are ``+``, seq ``roots_after + 1``, snapshot."""
        out = Outputs()
        state = self.queries[name]
        program = state.program
        as_of = state.roots_after
        spec = program.patterns[0]
        end = program.start_end(0)
        store = state.stores[0][end]
        nothing = (0, 0, 0, 0)  # id 0 is no term: the overlay of the delta rule matches no pattern
        for key, bucket in list(store.table.items()):
            graph = 0
            if program.graph_var >= 0:
                key, graph = key  # (centre value, graph)
            for other, history in list(bucket.items()):
                if not present_at(history, as_of):
                    continue
                s, o = (key, other) if end == SUBJECT_END else (other, key)
                binding = [0] * program.n_vars
                if program.graph_var >= 0:
                    binding[program.graph_var] = graph
                if spec.subject_var >= 0:
                    binding[spec.subject_var] = s
                if spec.object_var >= 0:
                    binding[spec.object_var] = o
                probe = Probe(self.partition, name, as_of + 1, 1, nothing, 0, 0, tuple(binding), self.partition,
                              True)
                self._continue(probe, out, origin_here=True)
        return out

    def pending(self, name: str, through: int = -1) -> bool:
        """Whether probes of the query's registration (``snapshot``), or of its updates up to seq ``through``,
        that started here are still alive."""
        return any(q == name and (snap or seq <= through) for q, seq, snap in self.live)

    def release_waiting(self, name: str) -> Outputs:
        """After a query's registration and history replay here: answer the probes that reached this partition
        before it knew the query."""
        out = Outputs()
        waiting = [p for p in self.unknown if p.query == name]
        self.unknown = [p for p in self.unknown if p.query != name]
        for probe in waiting:
            self._receive(probe, out)
        return out

    def adopt(self, other: PartitionEvaluator, name: str) -> None:
        """Take query ``name`` over from ``other``, an evaluator of this partition that read the same log for
        that query alone (a registration applied late, ``services.worker.probes``): its state, its held probes
        (in their order) and its live counts; what this one held or counted of it is dropped."""
        self.queries[name] = other.queries[name]
        self._index()
        self.held = [h for h in self.held if h[2].query != name]
        for seq, _arrival, probe in sorted((h for h in other.held if h[2].query == name), key=itemgetter(0, 1)):
            self._arrivals += 1
            self.held.append((seq, self._arrivals, probe))
        heapq.heapify(self.held)
        self.unknown = [p for p in self.unknown if p.query != name] + [p for p in other.unknown if p.query == name]
        self.live.drop_query(name)
        for key, count in list(other.live.counts.items()):
            if key[0] == name:
                self.live.add(key, count)
        self.probes_sent += other.probes_sent
        self.probes_received += other.probes_received

    def unregister(self, name: str) -> Outputs:
        """Free a query's state; its probes waiting here die (their origins are told, so counts complete)."""
        out = Outputs()
        self.queries.pop(name, None)
        self._index()
        dropped = [h[2] for h in self.held if h[2].query == name] + [p for p in self.unknown if p.query == name]
        self.held = [h for h in self.held if h[2].query != name]
        heapq.heapify(self.held)
        self.unknown = [p for p in self.unknown if p.query != name]
        for probe in dropped:
            self._finish(probe, 0, out)
        self.live.drop_query(name)  # its probes elsewhere die too: nothing of it is waited for
        return out

    # -- input

    def apply(self, seq: int, diff: int, s: int, p: int, o: int, g: int, role: int,
              only: str | None = None, born_ms: int = 0, out: Outputs | None = None) -> Outputs:
        """One change of this partition's routed log (``role``: which ends were routed here).  Store it, then
        start the probes of the patterns whose start end is here.  ``out``: add to it (and return it)."""
        if out is None:
            out = Outputs()
        if only is None:
            if seq > self.last_seq:
                self.last_seq = seq
            targets = self.by_predicate.get(p, ())
        else:
            state = self.queries[only]
            targets = ((only, state, state.hits[p]),) if p in state.hits else ()
        for name, state, hits in targets:
            if seq <= state.history_upto:
                continue  # (in the registration's history already: replay_history)
            if state.gate is not None and not state.gate.passes(s, p, o, g):
                state.gated += 1
                continue
            started = None
            for hit in hits:
                i, spec, subject_store, object_store, start_role = hit
                if (g != spec.graph and spec.graph_var < 0) or not spec.matches(s, p, o, g):
                    continue
                if spec.graph_var < 0:
                    if subject_store is not None and role & ROLE_SUBJECT:
                        subject_store.flip(s, o, seq, diff)
                    if object_store is not None and role & ROLE_OBJECT:
                        object_store.flip(o, s, seq, diff)
                else:  # GRAPH ?g: each graph's triples apart
                    if subject_store is not None and role & ROLE_SUBJECT:
                        subject_store.flip((s, g), o, seq, diff)
                    if object_store is not None and role & ROLE_OBJECT:
                        object_store.flip((o, g), s, seq, diff)
                state.applied_changes += 1
                if role & start_role and seq > state.roots_after:
                    if started is None:
                        started = [hit]
                    else:
                        started.append(hit)
            if state.applied_changes >= state.next_choice:
                state.next_choice = state.applied_changes + RECHOOSE_EVERY
                state.choose_routes()
            if started is None:
                continue
            triple = (s, p, o, g)
            snapshot = seq <= state.registration_upto
            policy = self.route_policy
            for j, spec, _s, _o, _r in started:
                binding = [0] * state.program.n_vars
                if spec.subject_var >= 0:
                    binding[spec.subject_var] = s
                if spec.object_var >= 0:
                    binding[spec.object_var] = o
                if spec.graph_var >= 0:
                    binding[spec.graph_var] = g
                route = state.choice[j] if policy is None else policy(name, j, len(state.routes[j]))
                probe = Probe(self.partition, name, seq, diff, triple, j, 0, (), self.partition, snapshot, born_ms,
                              route)
                self._continue(probe, out, True, binding)
        return out

    def gate_predicates(self) -> frozenset[int]:
        """The predicates of the changes whose terms the queries' gates read."""
        return frozenset(p for state in self.queries.values() if state.gate is not None
                         for p in state.gate.gates)

    def advance(self, frontier: int, out: Outputs | None = None) -> Outputs:
        """Every change up to ``frontier`` routed here has been applied (ingest's frontier mark, or the log
        position): answer the probes that were waiting for it."""
        if out is None:
            out = Outputs()
        if frontier <= self.applied:
            return out
        self.applied = frontier
        held = self.held
        while held and held[0][0] - 1 <= frontier:
            self._continue(heapq.heappop(held)[2], out, False)
        return out

    def on_probe(self, probe: Probe, known: bool = True, out: Outputs | None = None) -> Outputs:
        """A probe from another partition.  ``known=False``: its query is not registered here yet (this
        partition has not read the registration): it waits for :meth:`release_waiting`; a caller that knows
        the query was unregistered passes ``known=True`` after :meth:`unregister`, and the probe dies."""
        if out is None:
            out = Outputs()
        self.probes_received += 1
        if probe.query not in self.queries:
            if known:
                self._finish(probe, 0, out)
            else:
                self.unknown.append(probe)
            return out
        self._receive(probe, out)
        return out

    def _receive(self, probe: Probe, out: Outputs) -> None:
        if probe.seq - 1 > self.applied:
            self._arrivals += 1
            heapq.heappush(self.held, (probe.seq, self._arrivals, probe))
            return
        self._continue(probe, out, False)

    def on_ack(self, ack: Ack) -> None:
        if ack.query not in self.queries:
            return  # unregistered: its counts were dropped
        self.live.add((ack.query, ack.seq, ack.snapshot), ack.delta)

    # -- frontiers and versions

    def completed(self) -> int:
        """Every delta of a seq up to this has been emitted (by this partition's updates, wherever their
        probes went), registrations' probes included: the floor for collapsing versions."""
        oldest = self.live.oldest(registrations=True)
        return self.applied if oldest is None else min(self.applied, oldest - 1)

    def completed_live(self) -> int:
        """As :meth:`completed`, without the registrations' probes: what the answers side releases by (a
        registration is released by its own ready marks, so this never moves back when a query is added)."""
        oldest = self.live.oldest(registrations=False)
        return self.applied if oldest is None else min(self.applied, oldest - 1)

    def collapse(self, watermark: int, name: str | None = None) -> None:
        """Drop versions of query ``name`` (or all) that no probe can read any more: ``watermark`` is the
        minimum of every partition's :meth:`completed` (a probe of update k reads as of k - 1 >= it), read
        after *every* partition registered the query: one that has not yet will send its history's probes,
        which read as of old seqs."""
        for state in self.queries.values() if name is None else [self.queries[name]]:
            for stores in state.stores:
                for store in stores.values():
                    store.collapse(watermark)

    def state_entries(self, name: str | None = None) -> int:
        states = self.queries.values() if name is None else [self.queries[name]]
        return sum(store.entries() for state in states for stores in state.stores for store in stores.values())

    # -- probes

    def _continue(self, probe: Probe, out: Outputs, origin_here: bool, binding: list[int] | None = None) -> None:
        """Run ``probe`` from its step here (``binding``: its binding as a list, when the caller made one);
        count the remote children it makes and report them."""
        probes = out.probes
        before = len(probes)
        state = self.queries[probe.query]
        self._walk(state, probe, list(probe.binding) if binding is None else binding, probe.step, out,
                   state.routes[probe.pattern][probe.route], state.overlay(probe.triple) if probe.triple[1] else 0)
        children = len(probes) - before
        self.probes_sent += children
        if origin_here:
            if children:
                self.live.add((probe.query, probe.seq, probe.snapshot), children)
        elif children != 1:  # one child: the count at the origin is unchanged
            self._finish(probe, children, out)

    def _finish(self, probe: Probe, children: int, out: Outputs) -> None:
        ack = ack_of((probe.origin, probe.query, probe.seq, children - 1, probe.snapshot))
        if probe.origin == self.partition:
            self.on_ack(ack)
        else:
            out.acks.append(ack)

    def _walk(self, state: _QueryState, probe: Probe, binding: list[int], step_no: int, out: Outputs,
              route: tuple[tuple, ...], overlay: int) -> None:
        """Match ``route`` from ``step_no`` on for ``binding``: where a step's value lives on another partition,
        the binding goes there as a probe; every complete binding is a delta."""
        here = self.partition
        partitions = self.partitions
        as_of = probe.seq - 1
        j = probe.pattern
        graph_var = state.program.graph_var
        while step_no < len(route):
            i, binds, at_var, end, store, checks, s_var, o_var, s_const, o_const = route[step_no]
            if checks:
                # A check: any stored end whose value hashes here will do; else go to the planned one.
                for var, check_end, check_store in checks:
                    if binding[var] % partitions == here:
                        at_var, end, store = var, check_end, check_store
                        break
            key = binding[at_var]
            dest = key % partitions
            if dest != here:
                out.probes.append(probe_of((dest, probe.query, probe.seq, probe.diff, probe.triple, j, step_no,
                                            tuple(binding), probe.origin, probe.snapshot, probe.born_ms, probe.route)))
                return
            stored = key if graph_var < 0 else (key, binding[graph_var])  # GRAPH ?g: the binding's graph
            # The delta rule's view of update k's own triple: absent for patterns before j, present after.
            own = overlay >> i & 1
            if binds < 0:
                s_val = binding[s_var] if s_var >= 0 else s_const
                o_val = binding[o_var] if o_var >= 0 else o_const
                if own and s_val == probe.triple[0] and o_val == probe.triple[2]:
                    present = i > j
                else:
                    present = store.present(stored, o_val if end == SUBJECT_END else s_val, as_of)
                if not present:
                    return
                step_no += 1
                continue
            values = store.values(stored, as_of)
            if own:
                s_t, _p, o_t, _g = probe.triple
                own_key, own_other = (s_t, o_t) if end == SUBJECT_END else (o_t, s_t)
                if own_key == key:
                    if i > j:
                        if own_other not in values:
                            values.append(own_other)
                    elif own_other in values:
                        values.remove(own_other)
            step_no += 1
            if step_no == len(route):  # the last step: every value is a delta
                deltas = out.deltas
                project = state.project
                for value in values:
                    binding[binds] = value
                    deltas.append(delta_of((probe.query, probe.seq, probe.diff, project(binding), probe.snapshot,
                                            probe.born_ms)))
            else:
                for value in values:
                    binding[binds] = value
                    self._walk(state, probe, binding, step_no, out, route, overlay)
            binding[binds] = 0
            return
        out.deltas.append(delta_of((probe.query, probe.seq, probe.diff, state.project(binding), probe.snapshot,
                                    probe.born_ms)))


__all__ = ["Ack", "ComponentProgram", "Delta", "Outputs", "PartitionEvaluator", "Probe", "ack_of", "delta_of",
           "probe_of"]
