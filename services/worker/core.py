"""The state worker's transform, with no Kafka in it: plans + input records -> PartDelta outputs.

How it works: docs/design/internals.md, services.worker.core.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from itertools import chain
from typing import Any, Callable, Iterable, Iterator

from cbgp.algebra.paths import closure_pairs
from cbgp.distributed.evaluator import Outputs as ProbeOutputs
from cbgp.query.plan import BY_CENTRE, decompose
from cbgp.query.sparql import QueryError
from services import codec
from services.worker import probes as worker_probes
from services.wire.idempotence import SNAPSHOT_INDEX_BASE
from services.metrics.instruments import RESTORE_PROGRESS
from services.wire.registrations import change_seq_before, read_query, read_registration, recorded_placement, stream_iri
from services.wire.records import Output, query_partition
from services.wire.loglines import kv
from services.worker.snapshots import Bases, BaseSource
from services.worker.points import Tail, log_tail, needed_below, passed, point_of
from services.worker.outputs import WorkerOutputs
from cbgp.change import Change
from services.worker.shard import LogReader, QueryInfo, Shard, TermReader, parse_metadata, tracking_seq, with_progress, decode_changes, info_mode, shard_label
from services.state.shards import ShardCheckpoints
from services.worker.checkpoint import Due, adopt, checkpointable, make_checkpoints, stale, usable
from services.worker.shard_terms import learn, learning
from services.worker.probes import ProbeRouting, RecordReader

log = logging.getLogger("cbgp.worker")


class WorkerCore:
    """Plans and shards of one worker; every method returns the records to produce."""

    def __init__(self, topics: dict[str, str], routed_partitions: int, plans_partitions: int,
                 deltas_partitions: int, reader: LogReader, assemble_in_spark: bool = True,
                 placement: str = BY_CENTRE, record_reader: RecordReader | None = None,
                 term_reader: TermReader | None = None, dictionary_partitions: int | None = None,
                 checkpoints: ShardCheckpoints | None = None, base_source: BaseSource | None = None,
                 log_start: Callable[[int], int] | None = None, encoded_start: Callable[[], int] | None = None
                 ) -> None:
        """``placement``: ``by-centre`` (the default: stars and single-centre components keyed by centre value
        over the routed partitions) or ``single-owner`` (every query whole on one worker, for comparison).
        Every worker of a fleet must use the same.  ``term_reader``: the dictionary topic, for operator queries
        (their shard learns the terms of the changes it applies; terms an operator makes are published to
        ``topics["dictionary"]``, ``dictionary_partitions`` partitions, as ingest does).  ``checkpoints``: saved
        shard states a restore starts from (``services.state.shards``; None: every restore reads its log from 0).
        ``base_source``: ingest's latest snapshot (``services.worker.snapshots.IngestSnapshot``) or None, from which
        a routed registration's state is moved to its point, and a whole shard's graph to its position, rather than
        read from offset 0 (``services.worker.snapshots``); ``log_start`` / ``encoded_start``: the first offset of a
        routed partition's log / of updates.encoded (records below it may have been deleted)."""
        self.checkpoints = checkpoints
        self._checkpointed: dict[tuple[str, int], tuple] = {}  # shard -> (position, versions) last checkpointed
        self._unpicklable: set[tuple[tuple[str, int], tuple]] = set()  # (shard, versions) pickle refused
        self.topics = topics  # logical name -> broker topic (deltas.parts, deadletter)
        self.assemble_in_spark = assemble_in_spark
        self.single_owner = placement != BY_CENTRE
        self.n_routed = routed_partitions
        self.n_deltas = deltas_partitions
        self.reader = reader
        self.encoded_changes = lambda start, end: reader("whole", 0, start, end)
        self.plans: dict[str, QueryInfo] = {}
        self.ended: dict[str, int] = {}  # query id -> the highest version unregistered or replaced (its probes die)
        self.plan_positions = [0] * plans_partitions  # next queries.plans offset to apply, per partition
        self.shards: dict[tuple[str, int], Shard] = {}
        self.term_reader = term_reader
        self.n_dictionary = dictionary_partitions or routed_partitions
        self.probes = ProbeRouting(topics, routed_partitions, deltas_partitions)
        self.outputs = WorkerOutputs(topics, self.plans, self.shards, self.probes, routed_partitions,
                                     deltas_partitions, self.n_dictionary)
        self.probes.learning = lambda shard, changes, predicates: learning(shard, changes, self.term_reader,
                                                                            predicates)
        self.record_reader = record_reader
        if record_reader is not None:
            self.probes.reader = record_reader
        self._registration_seqs: dict[tuple[str, int], int] = {}
        self.log_start = log_start or (lambda _partition: 0)
        self.encoded_start = encoded_start or (lambda: 0)
        self.bases = Bases(base_source, record_reader, self.log_start, routed_partitions)

    # -- outputs (queued by every method below, written once per transaction)

    def flush_batches(self) -> list[Output]:
        return self.outputs.flush_batches()

    def drop_outputs_of(self, partition: int) -> int:
        return self.outputs.drop_outputs_of(partition)

    def owner_of_output(self, output: Output) -> int | None:
        return self.outputs.owner_of_output(output)

    # -- ownership

    def holds(self, info: QueryInfo, kind: str, partition: int) -> bool:
        if info.windowed:
            return False
        if info.partitioned:
            return kind == "routed"
        return kind == "whole" and partition == query_partition(info.query_id, self.n_routed)

    def wanted(self, kind: str, partition: int) -> list[QueryInfo]:
        return [info for info in self.plans.values() if self.holds(info, kind, partition)]

    def metadata(self) -> str:
        """Commit metadata of every shard offset: the queries.plans positions applied to it."""
        return json.dumps({"plans": self.plan_positions}, separators=(",", ":"))

    # -- plans

    def on_plan(self, partition: int, offset: int, key: bytes | None, value: bytes | None,
                routed_assigned: Iterable[int]) -> tuple[list[Output], list[int]]:
        """Apply one queries.plans record.  Returns (outputs, whole-shard partitions that must be opened)."""
        return self.on_plans([(partition, offset, key, value)], routed_assigned)

    def on_plans(self, records: list[tuple[int, int, bytes | None, bytes | None]],
                 routed_assigned: Iterable[int]) -> tuple[list[Output], list[int]]:
        """Apply queries.plans records ``(partition, offset, key, value)`` in order; the registrations among them
        join each shard together (one snapshot of its log for those registered at the same point, not one each).
        Returns (outputs, whole-shard partitions that must be opened)."""
        routed_assigned = list(routed_assigned)
        out: list[Output] = []
        to_open: list[int] = []
        added: list[QueryInfo] = []
        for partition, offset, key, value in records:
            info = self._read_plan(partition, offset, key, value, routed_assigned, out)
            if info is None:
                continue
            added.append(info)
            if not info.partitioned and not info.windowed:
                owner = query_partition(info.query_id, self.n_routed)
                if owner in routed_assigned and ("whole", owner) not in self.shards and owner not in to_open:
                    to_open.append(owner)
        added = [info for info in added if self.plans.get(info.query_id) is info]  # (not ended or replaced since)
        if added:
            for shard in self.shards.values():
                held = [info for info in added if self.holds(info, shard.kind, shard.partition)]
                if held:
                    out.extend(self._add_queries(shard, held))
        return out, to_open

    def _read_plan(self, partition: int, offset: int, key: bytes | None, value: bytes | None,
                   routed_assigned: list[int], out: list[Output]) -> QueryInfo | None:
        """Take one plan record into ``plans`` (a tombstone ends its query everywhere); return a registration the
        shards must add, None for anything else."""
        self.plan_positions[partition] = offset + 1
        query_id = key.decode("utf-8", "replace") if key else None
        if value is None:
            if query_id and query_id in self.plans:
                out.extend(self.outputs.end_stream(self.plans[query_id], partition, offset, routed_assigned))
                ended = self.plans.pop(query_id)
                self._drop_everywhere(query_id)
                self._end(ended)
                log.info(kv(event="unregistered", query=query_id))
            return None
        try:
            record = codec.decode("QueryPlan", value)
            text, window = read_registration(record["sparql"], record["options"])
            parsed, operators = read_query(text, window)
            plan = decompose(parsed) if parsed is not None else None
            stream = stream_iri(record["options"]["stream"]) if "stream" in record["options"] else None
            placement = recorded_placement(record["plan_json"])
        except (codec.CodecError, QueryError, ValueError) as exc:  # WindowError is a QueryError
            out.append(self.outputs.dead("queries.plans", partition, offset, "invalid-plan", str(exc), value))
            return None
        info = QueryInfo(record["query_id"], record["version"], plan, record["registered_at_seq"], partition, offset,
                         window, self.assemble_in_spark, self.single_owner, operators,
                         stream if operators is not None else None, placement,
                         registered_at_change_seq=record.get("registered_at_change_seq", -1))
        problem = info.placement_problem()
        if problem is not None:
            out.append(self.outputs.dead("queries.plans", partition, offset, "invalid-plan", problem, value))
            return None
        old = self.plans.get(info.query_id)
        if old is not None and old.version == info.version and old.plans_offset == offset:
            return None
        if old is not None:
            out.extend(self.outputs.end_stream(old, partition, offset, routed_assigned))
        self.plans[info.query_id] = info
        self._drop_everywhere(info.query_id, pending=old is not None)  # a re-registration starts afresh
        if old is not None:
            self._end(old)
        log.info(kv(event="registered", query=info.query_id, version=info.version, mode=info_mode(info)))
        return info

    def _end(self, info: QueryInfo) -> None:
        """Registration ``info`` has ended (its shards dropped it): its probes die from now, and what shards that
        never applied it (it ended before their log reached its point) keep of them goes."""
        self.ended[info.query_id] = max(info.version, self.ended.get(info.query_id, 0))
        names = [name for name, _part, _plan in info.probe_programs()]
        for shard in self.shards.values():
            if shard.kind == "routed":
                for name in names:
                    self.probes.forget(shard, name)

    def _drop_everywhere(self, query_id: str, pending: bool = True) -> None:
        """``_drop`` in every shard (``pending``: the query may wait for its point in some; not when its plan is
        the first this worker reads: a burst of thousands must not scan every shard's pending list each)."""
        for shard in self.shards.values():
            self._drop(shard, query_id, pending)

    def _drop(self, shard: Shard, query_id: str, pending: bool = True) -> None:
        """Free what ``shard`` holds of ``query_id``: its engine queries, its evaluator queries (their waiting
        probes die), a registration waiting for its point."""
        if query_id not in shard.versions and not (
                pending and any(info.query_id == query_id for info, _seq in shard.pending)):
            return  # (a query the shard never held: every registration sets its version)
        probe_names = {name for name, info in shard.probe_queries.items() if info.query_id == query_id}
        for name, (owner, _part) in list(shard.outputs.items()):
            if owner != query_id:
                continue
            if shard.evaluator is not None and name in shard.evaluator.queries:
                probe_names.add(name)
            elif name in shard.engine.queries or name in shard.engine.operators:
                shard.engine.unregister(name)
            del shard.outputs[name]
        for name in sorted(probe_names):
            self.probes.unregister(shard, name)
        shard.pending = [(info, seq) for info, seq in shard.pending if info.query_id != query_id]
        shard.versions.pop(query_id, None)

    def _add_queries(self, shard: Shard, infos: list[QueryInfo]) -> list[Output]:
        """Register ``infos`` in a live shard: a routed one at their point of its log (``_place``: the snapshot
        as of the registration's seq, a multi-centre query's registration probes); a whole one by replaying
        its log into them alone and emitting the netted snapshot."""
        if self._placed_by_log(shard):
            return self._place(shard, infos)
        names = {name for info in infos for name in shard.register(info)}
        changes = self._learning(shard, self.bases.whole_below(self.encoded_changes, shard.position))
        net = shard.engine.replay(changes, names, only=True)
        return self.outputs.snapshot(shard, infos, net)

    # -- shards

    def open_shard(self, kind: str, partition: int, committed: int, metadata: str | None) -> list[Output]:
        """Restore a shard at its committed offset; emit the snapshots it still owes (see module doc)."""
        shard = Shard(kind, partition, position=max(committed, 0))
        self.shards[(kind, partition)] = shard
        seen = parse_metadata(metadata, len(self.plan_positions))
        drops = [self.outputs.drop_graph(query_id, version, graph) for plans_p, plans_offset, query_id, version, graph
                 in self.outputs.ended_streams if kind == "routed" and plans_offset >= seen[plans_p]
                 and query_partition(query_id, self.n_routed) == partition]
        infos = self.wanted(kind, partition)
        owed = [i for i in infos if i.plans_offset >= seen[i.plans_partition]]
        placed: list[QueryInfo] = []  # by-centre registrations applied at their point of the log (see _place)
        last_mark = -1
        if self._placed_by_log(shard):
            tail = log_tail(self.record_reader, partition, shard.position, start=self.log_start(partition))
            shard.change_offset, shard.mark_offset = tail.change_offset, tail.mark_offset
            last_mark = tail.mark_seq
            owing = {id(i) for i in owed}  # (by identity: thousands of registrations, compared field by field)
            placed = [i for i in infos if id(i) in owing
                      or not passed(self.registration_seq(i), tail.change_seq, last_mark)]
            placing = {id(i) for i in placed}
            infos = [i for i in infos if id(i) not in placing]
            owed = [i for i in owed if id(i) not in placing]
        started = time.monotonic()
        # From the shard's checkpoint when one serves (see services.state.shards), whatever queries it holds,
        # else from offset 0.
        saved, why = self._saved_state(shard)
        late = infos  # registrations the state does not hold yet: registered now, caught up below
        if saved is not None:
            start = adopt(shard, saved, infos)
            for partition_, floor in saved["floors"].items():  # (those read in its log before `start`)
                self.probes.floors.setdefault(partition_, floor)
            owing = {id(i) for i in owed}
            dropped = stale(shard, [i for i in infos if id(i) not in owing])
            for query_id in dropped:
                self._drop(shard, query_id)
            late = [i for i in infos if shard.versions.get(i.query_id) != i.version]
            if late or dropped:
                why += f", {len(dropped)} dropped, {len(late)} caught up"
            if late and self._placed_by_log(shard):
                # Applied at their point of the log, as when they were first read: the same snapshot, deltas and
                # probes with the same keys, which the answers service and the receivers take once.
                placed += late
                lacking = {id(i) for i in late}
                infos = [i for i in infos if id(i) not in lacking]
                late = []
        else:
            start = 0
        below: Iterable[Change] = ()  # a whole shard with no checkpoint: its graph at its position, from a base
        base = self.bases.whole() if start == 0 and kind == "whole" and shard.position > 0 else None
        if base is not None:
            below, shard.last_seq, shard.last_change = base.at(self.encoded_changes, shard.position)
            start = shard.position
            why += f", base at {base.offset}"
        for info in late:
            shard.register(info)
        owed_names = {name for i in owed for name, _p, _q in i.engine_queries()}
        net: dict = {}
        if start and late:  # the registrations it lacks replay the log below it alone (silently, but the owed)
            late_names = {name for i in late for name, _p, _q in i.engine_queries()}
            below_start = self.bases.whole_below(self.encoded_changes, start) if kind == "whole" \
                else self.reader(kind, partition, 0, start)
            caught_up = shard.engine.replay(self._learning(shard, below_start), late_names, only=True)
            net = {name: rows for name, rows in caught_up.items() if name in owed_names}
        label = shard_label(kind, partition)
        changes = with_progress(chain(self._learning(shard, below), tracking_seq(shard, self._learning(
            shard, self.reader(kind, partition, start, shard.position)))), shard.position - start, label)
        for name, rows in shard.engine.replay(changes, owed_names, only=False).items():
            net.setdefault(name, Counter()).update(rows)  # (added to what the catch-up made, if any)
        if kind == "routed":
            for info in infos:
                for name, part, _plan in info.probe_programs():
                    shard.versions[info.query_id] = info.version
                    shard.outputs[name] = (info.query_id, part)
            # The probes in the log for multi-centre queries (or parts) that apply at a later point (placed)
            # wait in the replay, as with the previous owner, until that registration answers them.
            shard.pending = [(i, -1) for i in placed if i.uses_probes]
            worker_probes.restore(self.probes, shard, infos, lambda name: self._known(shard, name), start)
            shard.pending = []
            # (the Frontier marks replayed: with no evaluator they move nothing else, and a checkpoint's is older)
            shard.frontier = max(shard.frontier, last_mark)
        RESTORE_PROGRESS.labels(label).set(1.0)
        log.info(kv(event="shard-restored", kind=kind, partition=partition, position=shard.position,
                    replayed_from=start, checkpoint=why,
                    queries=len(infos) + len(placed), snapshots_owed=len(owed) + len(placed),
                    restore_seconds=f"{time.monotonic() - started:.3f}"))
        return drops + self.outputs.snapshot(shard, owed, net) + self._place(shard, placed)

    def _saved_state(self, shard: Shard) -> tuple[dict | None, str]:
        """The checkpoint that restores ``shard``, and why there is none ("used" when there is)."""
        if self.checkpoints is None:
            return None, "checkpoints off"
        if not checkpointable(shard):
            return None, "not checkpointable"
        saved = self.checkpoints.get(shard.kind, shard.partition, shard.position)
        why = usable(saved, shard, self.reader,
                     self.log_start(shard.partition) if shard.kind == "routed" else self.encoded_start())
        return (saved, f"used-{saved['from']}") if why is None else (None, why)

    def checkpoint_blobs(self, held: Iterable[tuple[str, int]]) -> list[tuple[str, int, bytes, int, dict[str, int]]]:
        """``(kind, partition, checkpoint, position, needs)`` of the ``held`` shards that can be checkpointed and
        moved since the last call (called once a transaction committed: their state is exactly their log below
        their position; ``needs``: what a restore from it reads of other logs, :meth:`_needs`)."""
        return self.checkpoints_made(make_checkpoints(self.checkpoints_due(held)))

    def checkpoints_due(self, held: Iterable[tuple[str, int]]) -> list[Due]:
        """The ``held`` shards that moved since their last checkpoint (and whose queries pickle)."""
        due = []
        for key in held:
            shard = self.shards.get(key)
            if shard is None:
                continue
            versions = tuple(shard.versions.items())
            if self._checkpointed.get(key) == (shard.position, versions) or (key, versions) in self._unpicklable:
                continue
            due.append(Due(key, shard, shard.position, versions, self._needs(shard),
                           self.probes.floors if shard.evaluator is not None else {}, checkpointable(shard)))
        return due

    def checkpoints_made(self, made: list[tuple[Due, bytes | None]]
                         ) -> list[tuple[str, int, bytes, int, dict[str, int]]]:
        """The checkpoints :func:`make_checkpoints` made of :meth:`checkpoints_due`'s shards (here, or in a child
        process: then ``Due.shard`` is None), as ``checkpoint_blobs`` returns them, and what they cover noted."""
        blobs = []
        for due, blob in made:
            if blob is not None:
                blobs.append((*due.key, blob, due.position, due.needs))
                self._checkpointed[due.key] = (due.position, due.versions)
            elif due.checkpointable:
                self._unpicklable.add((due.key, due.versions))  # (logged once: an operator query's closures, say)
        return blobs

    def _needs(self, shard: Shard) -> dict[str, int]:
        """What a restore from ``shard``'s checkpoint reads below its position (``cbgp topics floor``, the
        checkpoint's ``needs``): of a routed log, the records of its last change and last mark; and the
        queries.plans offsets it reflects (``queries.plans/<partition>``): the registrations from there on may
        be missing from it, and are caught up at their point of the log."""
        if shard.kind != "routed":  # (the record of its last change: `usable` reads it)
            return {"updates.encoded": shard.change_offset if shard.change_offset >= 0 else max(shard.position - 1, 0)}
        tail = Tail(change_offset=shard.change_offset, mark_offset=shard.mark_offset)
        return {"updates.routed": needed_below(tail, shard.position),
                **{f"queries.plans/{p}": offset for p, offset in enumerate(self.plan_positions)}}

    # -- by-centre registrations at one point of each routed log

    def _placed_by_log(self, shard: Shard) -> bool:
        return shard.kind == "routed" and self.record_reader is not None

    def registration_seq(self, info: QueryInfo) -> int:
        """The seq a by-centre registration answers as of: the last change in updates.encoded before the
        offset the registry read when it registered the query (``registered_at_seq``).

        Every owner of a routed partition applies the registration at the same record of its log, the first
        past that seq (``services.worker.points.point_of``), whenever it reads the plan: a worker that
        reads it later rewinds (the snapshot of the log before that record, then the records after it replayed
        to the new query alone).
        So two workers that both hold a partition for a moment during a rebalance (a broker that does not
        fence the old owner) send the same snapshot and the same deltas with the same keys, and the answers
        service reads them once."""
        if info.registered_at_change_seq >= 0:
            return info.registered_at_change_seq  # (the registry wrote it into the plan)
        key = (info.query_id, info.version)
        seq = self._registration_seqs.get(key)
        if seq is None:  # a plan written before that field: read it in the log, next to registered_at_seq
            seq = change_seq_before(self.encoded_changes, info.registered_at_seq, self.encoded_start())
            self._registration_seqs[key] = seq
        return seq

    def _place(self, shard: Shard, infos: list[QueryInfo]) -> list[Output]:
        """Apply by-centre registrations at their point of the shard's log if it has passed it, else keep
        them pending until it does (``on_record``, ``on_frontier``)."""
        out: list[Output] = []
        points: dict[int, int | None] = {}
        # point -> the registrations applied there together (a multi-centre one alone, with its probes)
        at: dict[tuple[int, int], list[tuple[QueryInfo, int]]] = {}
        for info in infos:
            seq = self.registration_seq(info)
            if seq not in points:
                points[seq] = point_of(self.record_reader, shard.partition, seq, shard.position,
                                       start=self.log_start(shard.partition))
            point = points[seq]
            if point is None:
                shard.pending.append((info, seq))
            else:
                at.setdefault((point, len(at) if info.probe_programs() else -1), []).append((info, seq))
        for (point, _alone), registrations in sorted(at.items(), key=lambda item: item[0]):
            out += self._apply_at(shard, registrations, point)
        return out

    def _due(self, shard: Shard, point: int, past: int = -1, mark: int = -1,
             changes: Iterable[Change] = ()) -> list[Output]:
        """Apply the pending registrations whose point ``point`` is: a record with a change at seq ``past``
        comes (``changes``: its changes), or a Frontier mark of seq ``mark`` was read."""
        due, waiting = [], []
        for item in shard.pending:
            (due if past > item[1] or mark >= item[1] else waiting).append(item)
        if not due:
            return []
        shard.pending = waiting
        return self._apply_at(shard, due, point, changes)

    def _apply_at(self, shard: Shard, registrations: list[tuple[QueryInfo, int]], point: int,
                  point_changes: Iterable[Change] = ()) -> list[Output]:
        """Register queries in a routed shard as of log offset ``point`` (at most its position): the snapshot
        of the log before it, keyed by ``point - 1`` and labelled with the registration's seq, then the records
        from ``point`` to the shard's position replayed to these queries alone, as the live deltas any owner
        sends for them.  ``point_changes``: the changes of the record at ``point`` when it is the one the shard
        is reading now (a multi-centre registration's history takes those up to its seq)."""
        names = {name for info, _seq in registrations for name in shard.register(info)}
        out: list[Output] = []
        latest = max(seq for _info, seq in registrations)
        base = self.bases.get(shard.partition) if self.bases.serves(shard.partition, latest) else None
        moved = base.before(self.record_reader, point) if base is not None else None
        changes = self.reader("routed", shard.partition, 0, point) if moved is None else moved[0].values()
        net = shard.engine.replay(self._learning(shard, changes), names, only=True)
        for info, seq in registrations:
            out += self.outputs.snapshot(shard, [info], net, offset=point - 1, as_of=seq)
        out += self._replay_from(shard, names, point)
        for info, seq in registrations:
            # A multi-centre query or a product's multi-centre parts: registered in the evaluator as of the
            # same seq at the same point (the graph as of that seq replayed as the registration's probes; its
            # ProbeReady, once they are all in, opens the gate), then what the records since the point made.
            for name, part, plan in info.probe_programs():
                shard.outputs[name] = (info.query_id, part)
                for cause, made in self.probes.register_at(shard, info, name, plan, seq, point, point_changes,
                                                           self.bases.history(base, moved, point)):
                    self.outputs.probe_outputs(shard, made, cause, out, first=SNAPSHOT_INDEX_BASE if cause < point else 0)
        return out

    def forget_bases(self) -> None:
        """Drop the base loaded for a burst of registrations (it holds a copy of the partitions' graphs)."""
        self.bases.forget()

    def _replay_from(self, shard: Shard, names: set[str], point: int) -> list[Output]:
        """The live deltas of engine queries ``names`` over the shard's log records from ``point`` to its
        position, numbered as ``on_record`` numbers them."""
        out: list[Output] = []
        if point >= shard.position:
            return out
        targets = shard.engine.targets(names)
        apply_to = shard.engine.apply_to_targets
        for offset, value in self.record_reader(shard.partition, point, shard.position):
            try:
                changes = decode_changes("routed", value)
            except codec.CodecError:
                continue  # dead-lettered when it was read
            if shard.engine.operators:
                self._learn(shard, changes)  # (read before the query came: its FILTERs need their terms now)
            numbers: dict[str, int] = {}
            for seq, diff, s, p, o, g, _time, role, _refresh in changes:
                deltas = apply_to(targets, diff, s, p, o, g, role)
                if len(deltas) > 1:
                    deltas.sort()  # as on_record numbers them
                for name, d_diff, row in deltas:
                    number = numbers.get(name, 0)
                    numbers[name] = number + 1
                    self.outputs.part_delta(out, shard, name, d_diff, row, seq, offset, number, False, None)
        return out

    def first_position(self, partition: int) -> int:
        """Where whole shard ``partition`` starts when it never committed a position: the updates.encoded end
        offset at the earliest registration of its queries (the registry's ``registered_at_seq``), so that a
        query registered after data arrived gets its answers over that data as a snapshot, then live deltas."""
        return max(0, min((i.registered_at_seq for i in self.wanted("whole", partition)), default=0))

    def close_shard(self, kind: str, partition: int) -> None:
        self.shards.pop((kind, partition), None)

    # -- live records

    def on_record(self, shard: Shard, offset: int, changes: list[Change], origin: int | None = None) -> list[Output]:
        """Apply the changes of one input record (at ``offset``; its raw records were produced at ``origin``,
        epoch ms, for latency); each engine query's deltas are numbered
        0, 1, ... across the record, the ``index`` of the idempotence key ``(source partition, offset, index)``
        (a multi-centre query's probe deltas are numbered apart)."""
        out: list[Output] = self._due(shard, offset, past=changes[-1].seq, changes=changes) \
            if shard.pending and changes else []
        shard.position = offset + 1
        if changes:
            shard.change_offset = offset
        engine = shard.engine
        # (a routed shard holding only multi-centre queries has an idle engine: nothing to call per change)
        apply = engine.apply if engine.queries or engine.operators or engine.graph is not None else None
        if not changes:
            return self.outputs.derived_outputs(shard) if self.outputs.derived else out
        last = changes[-1].seq
        shard.last_seq = max(shard.last_seq, last)
        shard.last_change = changes[-1]
        evaluator = shard.evaluator if shard.kind == "routed" else None
        if engine.operators or evaluator is not None:
            self._learn(shard, changes)  # (what the operators' and the gates' FILTERs read)
        if evaluator is not None:
            # The record's changes into the evaluator, then its frontier once (the log is in seq order; reads are
            # versioned, so a probe held for seq k reads the same as of k - 1 after the whole record), then one
            # pass over what they made.
            probed = ProbeOutputs()
            wanted = evaluator.predicates
            evaluate = evaluator.apply
            for seq, diff, s, p, o, g, _time, role, _refresh in changes:
                if p in wanted:
                    evaluate(seq, diff, s, p, o, g, role, born_ms=origin or 0, out=probed)
            evaluator.advance(last, out=probed)
            self.outputs.probe_outputs(shard, probed, offset, out, origin)
        if apply is not None:
            # Numbered per engine query from 0, in a sorted order: two owners of a routed partition during a
            # rebalance may hold different sets of queries, and must still give a delta the same key.
            numbers: dict[str, int] = {}
            for seq, diff, s, p, o, g, _time, role, _refresh in changes:
                deltas = apply(diff, s, p, o, g, role)
                if not deltas:
                    continue
                if len(deltas) > 1:
                    deltas.sort()
                for name, d_diff, row in deltas:
                    number = numbers.get(name, 0)
                    numbers[name] = number + 1
                    self.outputs.part_delta(out, shard, name, d_diff, row, seq, offset, number, False, origin)
        if self.outputs.derived:
            out.extend(self.outputs.derived_outputs(shard))
        return out

    def on_frontier(self, shard: Shard, offset: int, frontiers: dict[int, int]) -> list[Output]:
        """Ingest's Frontier record at ``offset`` of a routed shard: every change up to its seq is applied
        (probes that waited for it are answered)."""
        shard.position = offset + 1
        shard.mark_offset = offset
        shard.frontier = max(shard.frontier, frontiers.get(shard.partition, -1))
        out: list[Output] = self._due(shard, offset + 1, mark=shard.frontier) if shard.pending else []
        if shard.evaluator is not None:
            self.outputs.probe_outputs(shard, shard.evaluator.advance(shard.frontier), offset, out)
        return out

    def on_probe_batch(self, shard: Shard, offset: int, record: dict) -> list[Output]:
        """A probe record at ``offset`` of a routed shard (probes and acks for it, floors)."""
        shard.position = offset + 1
        out: list[Output] = []
        self.outputs.probe_outputs(shard, self.probes.on_batch(shard, record, lambda name: self._known(shard, name)),
                            offset, out)
        return out

    def on_routed(self, shard: Shard, offset: int, value: bytes, origin: int | None) -> tuple[list[Output], int]:
        """One record of a routed shard's log, whatever it is; returns (outputs, changes in it)."""
        frontier = codec.frontier_of(value)
        if frontier is not None:
            return self.on_frontier(shard, offset, frontier), 0
        record = codec.probe_batch_of(value)
        if record is not None:
            return self.on_probe_batch(shard, offset, record), 0
        changes = decode_changes("routed", value)
        return self.on_record(shard, offset, changes, origin), len(changes)

    def _known(self, shard: Shard, name: str) -> bool | None:
        """Whether a probe's query is registered here (True), not read from queries.plans yet or not at its
        registration point in this log yet (None: it waits), or unregistered or replaced (False: it dies)."""
        if shard.evaluator is not None and name in shard.evaluator.queries:
            return True
        query_id, version = _query_of(name)
        info = self.plans.get(query_id)
        if info is None or info.version < version:
            return False if version <= self.ended.get(query_id, 0) else None
        if any(pending is info for pending, _seq in shard.pending):
            return None
        return False

    def skip(self, shard: Shard, offset: int, value: bytes, error: str) -> list[Output]:
        """A record of a shard's log that cannot be decoded: dead-letter it and move on."""
        shard.position = offset + 1
        topic = "updates.routed" if shard.kind == "routed" else "updates.encoded"
        return [self.outputs.dead(topic, shard.partition if shard.kind == "routed" else 0, offset, "schema-mismatch",
                           error, value)]

    def _learn(self, shard: Shard, changes: list[Change], predicates: frozenset[int] | None = None) -> None:
        learn(shard, changes, self.term_reader, predicates)

    def _learning(self, shard: Shard, changes: Iterable[Change]) -> Iterator[Change]:
        return learning(shard, changes, self.term_reader)

    def stopped(self) -> list[tuple[str, int, str]]:
        """The single-owner operator queries that stopped (``OperatorTree.failed``): (query id, version, why)."""
        out = []
        for shard in self.shards.values():
            for name, op in shard.engine.operators.items():
                failed = getattr(getattr(op, "query", None), "failed", None)
                if failed is not None:
                    query_id = shard.outputs[name][0]
                    out.append((query_id, shard.versions.get(query_id, 0), failed))
        return out

    def path_trees(self) -> list[tuple[str, Any, int]]:
        """(query id, operator query, pairs) of each query with property-path closures on this worker (its
        single-owner queries')."""
        found = []
        for shard in self.shards.values():
            for name, op in shard.engine.operators.items():
                query = getattr(op, "query", None)  # (a FleetOperatorQuery's; a gated leaf part has none)
                pairs = closure_pairs(query.root) if query is not None else None
                if pairs is not None:
                    found.append((shard.outputs[name][0], query, pairs))
        return found

    def state_by_query(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for shard in self.shards.values():
            for name, (query_id, _part) in shard.outputs.items():
                totals[query_id] = totals.get(query_id, 0) + shard.state_entries(name)
        return totals


__all__ = [ "Change", "LogReader", "QueryInfo", "Shard", "TermReader", "WorkerCore", "decode_changes",
           "info_mode", "shard_label"]


def _query_of(name: str) -> tuple[str, int]:
    """The query id and version of a probe name, ``<id>@<version>[/<part>]``."""
    query_id, _, version = name.partition("/")[0].rpartition("@")
    return query_id, int(version or 0)
