"""The worker's side of multi-centre queries (``cbgp.distributed.evaluator``): probes between routed partitions.

How it works: docs/design/internals.md, services.worker.probes.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, NamedTuple

from cbgp.change import Change
from cbgp.distributed.evaluator import Ack, Outputs, PartitionEvaluator, Probe, ack_of, probe_of
from cbgp.distributed.program import ComponentProgram
from cbgp.distributed.program import compile_component
from cbgp.distributed.versioned_state import fold, insert_history
from services import codec
from services.wire.records import Output, query_partition
from services.wire.loglines import kv

# The worker core's types, by name (it imports this module): a routed ``Shard`` and a ``QueryInfo``.
Shard = Any
QueryInfo = Any

log = logging.getLogger("cbgp.worker")

FLOOR_SECONDS = 1.0  # at most one floor broadcast per second per partition (they only let versions go)
MAX_PER_RECORD = 2000  # probes and acks per ProbeColumns record (a probe is 70-150 bytes: far below 1 MB)

# Reads the raw records of a routed partition: (partition, start, end) -> (offset, value) in offset order
# (end None: to the partition's end).
RecordReader = Callable[[int, int, "int | None"], Iterable[tuple[int, bytes]]]


class Before(NamedTuple):
    """What a registration at a point of a routed log needs of the records below it, given by a base instead
    (``services.worker.snapshots``): the partition's graph there, quad -> the change that inserted it, and the
    highest seq of a change or Frontier mark below it (the frontier the partition had applied)."""

    graph: dict
    applied: int


class ProbeRouting:
    """Outgoing probe traffic of one worker, and what it knows of the other partitions' floors."""

    def __init__(self, topics: dict[str, str], routed_partitions: int, deltas_partitions: int) -> None:
        self.topics = topics
        self.n_routed = routed_partitions
        self.n_deltas = deltas_partitions
        # Queued for the next flush, per destination partition: segments [sender, cause, query, acks, probes] in the
        # order they were made (a revoked partition's are dropped: its next owner makes them again).
        self.segments: dict[int, list[list]] = {}
        self.open_segments: dict[tuple[int, int, int, str], list] = {}  # (dest, sender, cause, query) -> segment
        self.registered: dict[int, list[tuple[int, tuple[str, int]]]] = {}
        self.floors: dict[int, tuple[int, frozenset[str]]] = {}  # partition -> (floor, queries registered there)
        self.floor_sent: dict[int, tuple[int, frozenset[str]]] = {}
        self.next_floor = 0.0
        self.sent = 0  # probes written to other partitions (metrics)
        self.received = 0
        # Passes changes through, the terms of those with the given predicates looked up in the dictionary topic
        # first (a gate's FILTERs read them; the worker core sets ``services.worker.shard_terms.learning``)
        self.learning: Callable[[Shard, Iterable[Change], frozenset[int]], Iterable[Change]] = \
            lambda _shard, changes, _predicates: changes

    # -- registration

    def register(self, shard: Shard, info: QueryInfo, program: ComponentProgram, plan: Any, upto: int,
                 history: list[Change]) -> None:
        """Add one of ``info``'s evaluator queries (``QueryInfo.probe_programs``: the query, or a product's
        multi-centre part; ``program``: compiled) to a routed shard being restored, at its point of the log
        (:func:`restore`, silently), with its registration's history."""
        self._registered(self._evaluator(shard), shard, program, _gate(shard, info, plan), upto, history)
        shard.probe_queries[program.name] = info

    def _registered(self, evaluator: PartitionEvaluator, shard: Shard, program: ComponentProgram, gate: Any,
                    upto: int, history: Iterable[Change]) -> Outputs:
        """Register ``program`` in ``evaluator`` as of seq ``upto`` with its history (the partition's graph then,
        as an insert-only history: ``PartitionEvaluator.replay_history``), then answer the probes that came
        before it; what that made."""
        evaluator.register(program, 0, upto, gate)
        made = evaluator.replay_history(program.name, self.learning(shard, history, _terms(gate)), Outputs())
        made.extend(evaluator.release_waiting(program.name))
        return made

    def register_at(self, shard: Shard, info: QueryInfo, name: str, plan: Any, upto: int,
                    point: int, point_changes: Iterable[Change] = (),
                    before: Before | None = None) -> list[tuple[int, Outputs]]:
        """Apply a registration at offset ``point`` of a serving shard's log, however far past it the shard
        is: a scratch evaluator reads the log for this query alone -- the records before ``point`` (the
        query's probes that came early wait), then the registration (the partition's graph as of seq ``upto``
        replayed as its history, ``PartitionEvaluator.replay_history``, starting probes flagged as the
        registration's; the early probes answered), then every record from ``point`` to the shard's position
        as the shard would have processed it -- and the query's state moves into the shard's evaluator.
        ``point_changes``: the changes of the record at ``point`` when the shard has not passed it (its
        changes up to ``upto`` are in the history).  ``before``: the log below the point as a base gave it; the
        scratch then reads from the point only (the query's probes are all above it: each was sent after the
        registration was published, when ingest had committed the transaction holding its seq, this
        partition's Frontier mark of it included).  Returns what each step made, ``(cause, outputs)``, the
        registration's under cause ``point - 1``: a function of the log alone, so an owner that reads the plan
        late makes what one that applied it at the point made, with the same segments and delta keys, and the
        receivers take one copy.  The registration is recorded in the shard's own log for its restores."""
        here = shard.partition
        program = compile_component(name, plan, shard.engine.dictionary)
        gate = _gate(shard, info, plan)
        terms = _terms(gate)  # (whose terms its FILTERs read)
        predicates = program.predicates()
        scratch = PartitionEvaluator(here, self.n_routed)
        channels: dict = {}
        steps: list[tuple[int, Outputs]] = []
        graph: dict = {}  # this partition's graph before the point, folded as the records come
        start = 0
        if before is not None:
            graph = {quad: change for quad, change in before.graph.items() if quad[1] in predicates}
            scratch.applied, start = before.applied, point

        def registration(tail: Iterable[Change]) -> Outputs:
            history = insert_history(fold(graph, tail, upto, predicates))
            return self._registered(scratch, shard, program, gate, upto, history)

        registered = False
        for offset, value in self.reader(here, start, shard.position):
            live = offset >= point
            if live and not registered:  # (the point may be a transaction marker's offset: no record has it)
                steps.append((point - 1, registration(record_changes(value) if offset == point else ())))
                registered = True
            made = Outputs()
            frontier = codec.frontier_of(value)
            record = None if frontier is not None else _probe_batch(value)
            if frontier is not None:
                scratch.advance(frontier.get(here, -1), made)
            elif record is not None:
                for acks, probes in taken_steps(channels, record, only=name):
                    for query, seq, delta, snapshot in acks:
                        scratch.on_ack(Ack(here, query, seq, delta, snapshot))
                    for item in probes:
                        scratch.on_probe(Probe(here, *item), live, made)
            else:
                changes = record_changes(value)
                if live:
                    for seq, diff, s, p, o, g, _time, role, _refresh in self.learning(shard, changes, terms):
                        scratch.apply(seq, diff, s, p, o, g, role, only=name, out=made)
                else:
                    fold(graph, changes, upto, predicates)
                if changes:
                    scratch.advance(changes[-1].seq, made)
            if live and (made.deltas or made.probes or made.acks):
                steps.append((offset, made))
        if not registered:
            steps.append((point - 1, registration(point_changes)))
        self._evaluator(shard).adopt(scratch, name)
        shard.probe_channels.update({key: taken for key, taken in channels.items() if key[1] == name})
        shard.probe_queries[name] = info
        shard.registered_at[name] = upto
        # Frontiers past the point went out before the query was known: its mark waits for the probes of the
        # records replayed up to there, or the answers service would release their deltas early.
        shard.ready_through[name] = scratch.applied
        self.registered.setdefault(here, []).append((here, (name, upto)))
        return steps

    def _evaluator(self, shard: Shard) -> PartitionEvaluator:
        if shard.evaluator is None:
            shard.evaluator = PartitionEvaluator(shard.partition, self.n_routed)
            shard.evaluator.applied = max(shard.frontier, shard.last_seq)
        return shard.evaluator

    reader: RecordReader  # set by the worker core

    def unregister(self, shard: Shard, name: str) -> None:
        if shard.evaluator is not None:
            shard.evaluator.unregister(name)  # its waiting probes die; their origins drop their counts too
        shard.probe_queries.pop(name, None)
        shard.registered_at.pop(name, None)
        shard.ready_through.pop(name, None)
        shard.ready_sent.discard(name)

    def forget(self, shard: Shard, name: str) -> None:
        """Evaluator query ``name`` ended without being registered in ``shard``: its probes waiting here die,
        and the channels of its segments go."""
        evaluator = shard.evaluator
        if evaluator is not None and any(probe.query == name for probe in evaluator.unknown):
            evaluator.unregister(name)
        for sender in range(self.n_routed):
            shard.probe_channels.pop((sender, name), None)

    # -- input

    def on_batch(self, shard: Shard, record: dict, known: Callable[[str], bool | None]) -> Outputs:
        """One probe record read from the shard's log.  ``known(name)``: True (registered here), None (not yet
        read from queries.plans: the probe waits), False (unregistered or replaced: the probe dies)."""
        evaluator = shard.evaluator
        out = Outputs()
        for floor in record["floors"]:
            self.floors[floor["partition"]] = (floor["floor"], frozenset(floor["queries"]))
        states: dict[str, bool | None] = {}  # known() per query, asked once per record

        def state(query: str) -> bool | None:
            if query not in states:
                states[query] = known(query)
            return states[query]

        # (an ended registration's segments leave no channel behind: their probes die, their acks are ignored)
        steps = taken_steps(shard.probe_channels, record, dead=lambda query: state(query) is False)
        if evaluator is None:
            if any(probes for _acks, probes in steps):
                # No probed query here yet: the probes wait in an evaluator for their registration.
                evaluator = shard.evaluator = PartitionEvaluator(shard.partition, self.n_routed)
                evaluator.applied = max(shard.frontier, shard.last_seq)
            else:
                return out
        here = shard.partition
        on_probe = evaluator.on_probe
        for acks, probes in steps:
            for query, seq, delta, snapshot in acks:
                evaluator.on_ack(ack_of((here, query, seq, delta, snapshot)))
            for item in probes:
                on_probe(probe_of((here, *item)), state(item[0]) is not None, out)
            self.received += len(probes)
        if record["floors"]:
            self._collapse(shard)
        return out

    def _collapse(self, shard: Shard) -> None:
        """Drop versions no probe can read: below every partition's floor, for the queries every partition
        has registered (one that has not will read old versions when it does)."""
        evaluator = shard.evaluator
        if evaluator is None or len(self.floors) < self.n_routed:
            return
        watermark = min(floor for floor, _queries in self.floors.values())
        for name in shard.probe_queries:
            if all(name in queries for _floor, queries in self.floors.values()):
                evaluator.collapse(watermark, name)

    # -- output

    def take(self, shard: Shard, out: Outputs, cause: int) -> list:
        """Queue ``out``'s probes and acks, made while the shard processed record ``cause`` of its log (a
        registration: the record before its point), for the next flush, one segment per destination and query
        (what a step adds to one already queued joins it: a receiver takes a (cause, chunk) once); return its
        deltas (the caller batches them)."""
        source = shard.partition
        for ack in out.acks:
            self._segment(ack.dest, source, cause, ack.query)[3].append(ack)
        for probe in out.probes:
            self._segment(probe.dest, source, cause, probe.query)[4].append(probe)
        return out.deltas

    def _segment(self, dest: int, source: int, cause: int, query: str) -> list:
        key = (dest, source, cause, query)
        segment = self.open_segments.get(key)
        if segment is None:
            segment = self.open_segments[key] = [source, cause, query, [], []]
            self.segments.setdefault(dest, []).append(segment)
        return segment

    def drop_from(self, partition: int) -> int:
        """Forget what routed partition ``partition`` queued (it was revoked); return how many items."""
        dropped = 0
        for dest in list(self.registered):
            kept = [item for item in self.registered[dest] if item[0] != partition]
            dropped += len(self.registered[dest]) - len(kept)
            self.registered[dest] = kept
        for dest in list(self.segments):
            kept = [segment for segment in self.segments[dest] if segment[0] != partition]
            dropped += sum(max(1, len(g[3]) + len(g[4])) for g in self.segments[dest] if g[0] == partition)
            self.segments[dest] = kept
        self.open_segments = {key: g for key, g in self.open_segments.items() if key[1] != partition}
        return dropped

    def flush(self, shards: Iterable[Shard]) -> list[Output]:
        """Steps 2 and 3 of the transaction (see the module doc)."""
        shards = list(shards)
        out: list[Output] = []
        floors = self._floors(shards)
        targets = {d for queue in (self.segments, self.registered) for d, items in queue.items() if items}
        for dest in sorted(targets | (set(range(self.n_routed)) if floors else set())):
            # Each segment cut into chunks of at most MAX_PER_RECORD items, acks first (where it is cut depends
            # on the segment alone: two owners cut it alike), packed into records of at most that many (a
            # record must stay well under the broker's 1 MB).
            chunks = []
            for source, cause, query, acks, probes in self.segments.get(dest, []):
                self.sent += len(probes)
                items = _merged(acks) + probes
                n_acks = len(items) - len(probes)
                for number, start in enumerate(range(0, len(items), MAX_PER_RECORD)):
                    end = min(start + MAX_PER_RECORD, len(items))
                    in_acks = max(0, min(end, n_acks) - start)
                    chunks.append(((source, cause, number, in_acks, end - start - in_acks, query),
                                   items[start:end]))
            records: list[list] = [[]]
            size = 0
            for chunk in chunks:
                if records[-1] and size + len(chunk[1]) > MAX_PER_RECORD:
                    records.append([])
                    size = 0
                records[-1].append(chunk)
                size += len(chunk[1])
            registered = [item for _source, item in self.registered.get(dest, [])]
            for number, record in enumerate(records):  # registrations and floors in the first
                value = _encode(record, registered if number == 0 else [], floors if number == 0 else [])
                out.append(Output(self.topics["updates.routed"], value, None, dest))
        self.segments, self.registered, self.open_segments = {}, {}, {}
        for shard in shards:
            evaluator = shard.evaluator
            if evaluator is None:
                continue
            # One mark per registration, once all its evaluator queries (a product's multi-centre parts) are
            # in: the answers service opens its gate on the first mark of each partition.
            by_query: dict[tuple[str, int], list[str]] = {}
            for name in shard.registered_at:
                info = shard.probe_queries[name]
                by_query.setdefault((info.query_id, info.version), []).append(name)
            for (query_id, version), names in by_query.items():
                if any(name in shard.ready_sent or evaluator.pending(name, shard.ready_through.get(name, -1))
                       for name in names):
                    continue
                as_of = max(shard.registered_at[name] for name in names)
                value = codec.encode_probe_ready(query_id, version, shard.partition, as_of)
                out.append(Output(self.topics["deltas.parts"], value, query_id.encode(),
                                  query_partition(query_id, self.n_deltas)))
                shard.ready_sent.update(names)
                log.info(kv(event="probe-registration-ready", query=f"{query_id}@{version}", partition=shard.partition,
                            as_of=as_of))
        return out

    def _floors(self, shards: list[Shard]) -> list[tuple[int, int, list[str]]]:
        """The floors to broadcast now: a shard's lowest readable seq and its queries, when they changed (at
        most once per FLOOR_SECONDS)."""
        now = time.monotonic()
        if now < self.next_floor:
            return []
        floors = []
        for shard in shards:
            if shard.evaluator is None:
                continue
            current = (shard.evaluator.completed(), frozenset(shard.probe_queries))
            if self.floor_sent.get(shard.partition) != current:
                self.floor_sent[shard.partition] = current
                floors.append((shard.partition, current[0], sorted(current[1])))
        if floors:
            self.next_floor = now + FLOOR_SECONDS
        return floors


def _merged(acks: list[Ack]) -> list[Ack]:
    """One step's acks to one origin as one per (query, seq, snapshot), their deltas summed, none of delta 0:
    the origin applies a segment's acks before its probes and reads its counts only after the record, so the
    sum is all it can tell apart."""
    if len(acks) < 2:
        return [ack for ack in acks if ack.delta]
    sums: dict[tuple[str, int, bool], int] = {}
    for ack in acks:
        key = (ack.query, ack.seq, ack.snapshot)
        sums[key] = sums.get(key, 0) + ack.delta
    dest = acks[0].dest
    return [Ack(dest, query, seq, delta, snapshot) for (query, seq, snapshot), delta in sums.items() if delta]


def _encode(chunks: list, registered: list, floors: list) -> bytes:
    """One ProbeColumns record of segment chunks ``((sender, cause, chunk, acks, probes), items)``."""
    acks: list = []
    probes: list = []
    for (_sender, _cause, _chunk, n_acks, _n_probes, _query), items in chunks:
        acks.extend(items[:n_acks])
        probes.extend(items[n_acks:])
    return codec.encode_probe_batch(probes, acks, registered, floors, [segment for segment, _items in chunks])


def taken_steps(channels: dict, record: dict, only: str | None = None,
                dead: Callable[[str], bool] | None = None) -> list[tuple[list, list]]:
    """The (acks, probes) of a probe record's segments that a shard takes (``channels``: its last (cause,
    chunk) taken per (sender, query), updated): each (sender, query, cause, chunk) once, in the order one owner
    of the sender makes them (a second owner's copy comes again, or out of that order, and is dropped).
    ``only``: the segments of that query alone; ``dead(query)``: its segments are taken without keeping their
    channel (an ended registration's).  A record written before segments is one step; one written before
    segments were per query keys its channels by sender (its registrations' segments, cause -1, are all
    taken)."""
    segments = record.get("segments")
    if segments is None:
        return [_of(record["acks"], record["probes"], only)]
    steps = []
    at_ack = at_probe = 0
    for sender, cause, chunk, n_acks, n_probes, query in segments:
        acks = record["acks"][at_ack:at_ack + n_acks]
        probes = record["probes"][at_probe:at_probe + n_probes]
        at_ack += n_acks
        at_probe += n_probes
        if only is not None and query is not None and query != only:
            continue
        if query is not None or cause >= 0:
            key = (sender, query)
            if (cause, chunk) <= channels.get(key, (-2, -1)):
                continue
            if dead is None or query is None or not dead(query):
                channels[key] = (cause, chunk)
        steps.append(_of(acks, probes, only) if query is None else (acks, probes))
    return steps


def _of(acks: list, probes: list, only: str | None) -> tuple[list, list]:
    """The acks and probes of query ``only`` (all when None)."""
    if only is None:
        return acks, probes
    return [a for a in acks if a[0] == only], [p for p in probes if p[0] == only]


def restore(routing: ProbeRouting, shard: Shard, infos: list[QueryInfo], known: Callable[[str], bool | None],
            start: int = 0) -> None:
    """Rebuild a routed shard's evaluators from its log (see the module doc) for the registrations ``infos``
    applied before its committed position (those it still owes apply at their point of the log, as new ones:
    ``WorkerCore._place``; meanwhile their probes wait here).  ``start`` > 0: the shard was given its
    checkpoint's evaluator as of that offset, and only the log after it is replayed into it."""
    probed = [i for i in infos if i.uses_probes]
    if not probed and not shard.pending:
        return  # probes in the log for no current query belong to unregistered ones: they died
    upto: dict[str, int] = {}
    # To the end, not the position: a registration's record is written after the offset committed with it
    # (so after a checkpoint taken once that offset committed, too).
    for _offset, value in routing.reader(shard.partition, start, None):
        record = _probe_batch(value)
        if record is not None:
            for item in record["registered"]:
                upto[item["query"]] = item["as_of"]
    # name -> (info, plan, seq, program): registered at their point of the replayed log, as register_at did
    waiting: dict[str, tuple[QueryInfo, Any, int, ComponentProgram]] = {}
    if start:
        shard.registered_at.update((name, seq) for name, seq in upto.items() if name in shard.probe_queries)
    else:
        # A fresh evaluator: its applied frontier moves with the replayed log, so probes wait in the replay as
        # they waited then (the engine's replay has already moved the shard's own position marks).
        shard.evaluator = PartitionEvaluator(shard.partition, routing.n_routed)
        for info in probed:
            for name, _part, plan in info.probe_programs():
                program = compile_component(name, plan, shard.engine.dictionary)
                waiting[name] = (info, plan, upto.get(name, -1), program)
    evaluator = shard.evaluator
    if evaluator is None:
        return
    graph: dict = {}  # the partition's graph so far (the waiting registrations' predicates), for their history

    def due(names: list[str], tail: list[Change]) -> None:
        for name in names:
            info, plan, seq, program = waiting.pop(name)
            predicates = program.predicates()
            history = insert_history(fold({q: c for q, c in graph.items() if q[1] in predicates}, tail, seq,
                                          predicates))
            routing.register(shard, info, program, plan, seq, history)
            if name in upto:
                shard.registered_at[name] = seq

    terms = evaluator.gate_predicates().union(*(_terms(_gate(shard, info, plan)) for info, plan, _s, _p
                                                in waiting.values()))
    folded = frozenset().union(*(program.predicates() for _i, _p, _s, program in waiting.values()))
    for offset, value in routing.reader(shard.partition, start, shard.position):
        frontier = codec.frontier_of(value)
        if frontier is not None:
            mark = frontier.get(shard.partition, -1)
            evaluator.advance(mark)
            if waiting and mark >= 0:  # (a registration's point: just after the first mark that reaches its seq)
                due([name for name, item in waiting.items() if mark >= item[2]], [])
            continue
        record = _probe_batch(value)
        if record is not None:  # silently: its outputs were committed before
            routing.on_batch(shard, record, lambda name: None if name in waiting else known(name))
            continue
        changes = list(routing.learning(shard, record_changes(value), terms))
        if not changes:
            continue
        if waiting:  # (or at the first record with a change past its seq)
            due([name for name, item in waiting.items() if changes[-1].seq > item[2]], changes)
            fold(graph, changes, changes[-1].seq, folded)
        wanted = evaluator.predicates
        for seq, diff, s, p, o, g, _time, role, _refresh in changes:
            if p in wanted:
                evaluator.apply(seq, diff, s, p, o, g, role)
            evaluator.advance(seq)
    due(list(waiting), [])
    shard.frontier = max(shard.frontier, evaluator.applied)


def _terms(gate: Any) -> frozenset[int]:
    """The predicates of the changes whose terms a gate's FILTERs read (none without a gate)."""
    return frozenset(gate.gates) if gate is not None else frozenset()


def _probe_batch(value: bytes) -> dict | None:
    try:
        return codec.probe_batch_of(value)
    except codec.CodecError:
        return None


def _gate(shard: Shard, info: QueryInfo, plan: Any) -> Any:
    """The gate of the FILTERs pushed into the patterns of ``plan`` when it is a leaf (part) of an operator
    query placed by centre (``LeafPart.pushed``), over the shard's dictionary; None otherwise."""
    part = next((p for p in info.operator_parts or () if p.plan is plan and p.pushed is not None), None)
    if part is None:
        return None
    from cbgp.algebra.continuous import FilterGate
    from cbgp.algebra.expressions import Terms

    dictionary = shard.engine.dictionary
    return FilterGate.of([part.pushed], dictionary, Terms(dictionary, part.prologue))


def record_changes(value: bytes) -> list[Change]:
    """The changes of a routed record (none in a mark or a probe record, nor in one that cannot be decoded: it
    was dead-lettered when it was read)."""
    try:
        return codec.routed_changes(value)
    except codec.CodecError:
        return []
