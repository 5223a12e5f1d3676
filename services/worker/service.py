"""The state worker service (``cbgp worker``): routed/encoded changes + plans -> deltas.parts.

How it works: docs/design/internals.md, services.worker.service.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Iterable

from confluent_kafka import Consumer, Message, TopicPartition
from prometheus_client import Gauge

from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets, make_consumer, make_producer
from services.metrics.exposition import record_consumer_lag
from services.metrics.instruments import PATH_PAIRS, STATE_BYTES, STATE_ENTRIES, set_by_query
from services.runtime.runner import Step, run_processor
from services.runtime import recovery
from services.wire.records import Output
from services.wire.loglines import kv
from services.wire.stopped import StoppedQueries, pairs_by_query, stop_the_largest
from services.runtime.life import (checkpoint_at_stop, oldest_origin, oldest_produced, origin_ms, require_broker_kept,
                                   service_command)
from services.kafka.fetch import Fetcher, GroupInput, idle_pause
from services.kafka.replay import read_range, require_from
from services.kafka.fetch import WINDOW_POLL_SECONDS, read_window, record_ok
from cbgp.change import Change
from services.worker.shard import Shard, decode_changes, shard_label
from services.worker.checkpoint import make_checkpoints
from services.worker.core import WorkerCore
from services.state.forked import ForkedCheckpoint, ForkedJob
from services.worker.shard import changes_of
from services.worker.snapshots import IngestSnapshot
from services import codec
from cbgp.query.plan import BY_CENTRE, SINGLE_OWNER

log = logging.getLogger("cbgp.worker")

SERVICE = "worker"
QUERY_STATE = Gauge("cbgp_query_state_entries", "State entries a worker holds for one query (the largest; the rest as _other).",
                    ["query"])
FRONTIER = Gauge("cbgp_frontier_seq", "Highest seq a routed partition held by this worker has completed "
                 "(compare with ingest's seq for the frontier lag).", ["partition"])
PROBES_SENT = Gauge("cbgp_probes_sent", "Probes a routed partition held by this worker has sent to other partitions "
                    "(multi-centre queries; since the shard was opened).", ["partition"])
PROBES_RECEIVED = Gauge("cbgp_probes_received", "Probes a routed partition held by this worker has received "
                        "(since the shard was opened).", ["partition"])
PROBES_WAITING = Gauge("cbgp_probes_waiting", "Probes waiting at a routed partition for its frontier or for a "
                       "registration.", ["partition"])
STATE_REPORT_SECONDS = 1.0
# Plans read per turn of the loop: windows are read on while they bring plans, up to PLAN_BURST_RECORDS plans or
# PLAN_BURST_POINTS distinct registration offsets (each may replay its shards' logs: the bound keeps a burst of
# late registrations from holding the loop past max.poll.interval), so a burst registered at one offset is
# placed together: one replay of each shard's log for all of it.
PLAN_WINDOW_RECORDS = 1000
PLAN_BURST_RECORDS = 10_000
PLAN_BURST_POINTS = 100


def _registered_at(value: bytes | None) -> int | None:
    """The updates.encoded offset a plan was registered at (None: an unregistration, or a record on_plans will
    reject)."""
    if value is None:
        return None
    try:
        return codec.decode("QueryPlan", value).get("registered_at_seq")
    except codec.CodecError:
        return None


class DictionaryTerms:
    """The dictionary topic, read on demand for operator queries (FILTER, aggregates...: their whole shard
    evaluates expressions over terms, not ids).  Read forward from the start only while ids are missing, and
    unassigned otherwise (an idle assigned consumer fetches in a tight loop on noida-db); ingest commits a
    term before any update that uses it, so the ids of a change read from updates.encoded are there."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.topic = settings.topic("dictionary")
        self.terms: dict[int, str] = {}
        self.fetcher: Fetcher | None = None
        self.settings = settings
        self.start = {(self.topic, p): 0 for p in end_offsets(settings, self.topic)}

    def lookup(self, ids: set[int], timeout: float = 30.0) -> dict[int, str]:
        """``{id: term}`` of the ``ids`` found within ``timeout`` seconds."""
        missing = {i for i in ids if i not in self.terms}
        if missing:
            if self.fetcher is None:
                self.fetcher = Fetcher(self.settings, "worker.dictionary", 5000)
            if not self.fetcher.positions:
                self.fetcher.set_positions(self.start)
            deadline = time.monotonic() + timeout
            try:
                while missing and time.monotonic() < deadline:
                    for msg in self.fetcher.poll():
                        if msg.error() is None and msg.value() is not None:
                            try:
                                self.terms.update(codec.dictionary_entries(msg.value()))
                            except codec.CodecError:
                                continue
                    missing = {i for i in missing if i not in self.terms}
            finally:
                self.fetcher.park()  # fetch nothing until ids are missing again
        terms = self.terms
        return {i: terms[i] for i in ids if i in terms}

    def close(self) -> None:
        if self.fetcher is not None:
            self.fetcher.close()


class WorkerService:
    """One life of a worker: clients and core, a processor of the one runner loop (:mod:`services.runtime.runner`)."""

    service = SERVICE

    def __init__(self, settings: KafkaSettings, args: argparse.Namespace) -> None:
        self.settings = settings
        self.args = args
        self.group = args.group or f"{settings.topic_prefix}workers"
        self.t_routed = settings.topic("updates.routed")
        self.t_encoded = settings.topic("updates.encoded")
        self.t_plans = settings.topic("queries.plans")
        n = {name: len(end_offsets(settings, settings.topic(name))) for name in
             ("updates.routed", "queries.plans", "deltas.parts")}
        topics = {name: settings.topic(name) for name in ("deltas.parts", "deadletter", "queries.plans",
                                                           "updates.routed", "updates.encoded", "dictionary",
                                                           "updates.raw")}  # updates.raw: derived streams
        self.terms = DictionaryTerms(settings)
        self.checkpoints, self.checkpointer = recovery.shard_checkpoints(
            args, settings, SERVICE, {"routed": "checkpoints.routed", "whole": "checkpoints.whole"})
        self.core = WorkerCore(topics, n["updates.routed"], n["queries.plans"], n["deltas.parts"], self._read_log,
                               assemble_in_spark=getattr(args, "assembly", "spark") == "spark",
                               placement=getattr(args, "placement", BY_CENTRE), record_reader=self._read_records,
                               term_reader=self.terms.lookup, dictionary_partitions=len(self.terms.start),
                               checkpoints=self.checkpoints, base_source=self._ingest_base,
                               log_start=lambda partition: end_offsets(settings, self.t_routed)[partition][0],
                               encoded_start=lambda: end_offsets(settings, self.t_encoded)[0][0])
        self.pending: list[Output] = []  # snapshots owed by restores/plans, produced in the next transaction
        self.forked = ForkedCheckpoint(log)  # a checkpoint being pickled in a child process
        self.stopped = StoppedQueries(settings.topic("queries.status"))
        self.dirty = False  # plan positions moved: commit the shard offsets with the new metadata
        self.encoded: dict[int, Consumer] = {}  # whole shard partition -> consumer of its group (commits only)
        self.encoded_metadata: dict[int, object] = {}  # whole shard partition -> that consumer's group metadata
        # The one fetching reader of updates.encoded, assigned at the lowest whole-shard position; its epoch
        # changes on every re-assignment so a batch fetched before a shard opened is never fed to it.
        self.encoded_reader = Fetcher(settings, "worker.encoded", args.batch)
        self.encoded_epoch = 0
        self.next_plans_poll = 0.0
        self.assigned: set[int] = set()
        # Routed shards of revoked partitions, with the plans positions they had: see on_assign.
        self.parked: dict[int, tuple[Shard, list[int]]] = {}
        self.producer = make_producer(settings, transactional_id=f"{self.group}.{args.instance_id}")
        self.plans = make_consumer(settings, f"{self.group}.plans", enable_partition_eof=True)
        self.routed_in: GroupInput | None = None
        self.consumer: Consumer | None = None  # the group member (committed offsets, group metadata)
        self.last_report = 0.0

    # -- log access for restores and late registrations

    def _read_log(self, kind: str, partition: int, start: int, end: int) -> Iterable[Change]:
        topic, part = (self.t_routed, partition) if kind == "routed" else (self.t_encoded, 0)
        records = ((m.offset(), m.value()) for m in read_range(self.settings, topic, part, start, end))
        return changes_of(kind, records)

    def _read_records(self, partition: int, start: int, end: int | None) -> Iterable[tuple[int, bytes]]:
        if end is None:
            end = end_offsets(self.settings, self.t_routed)[partition][1]
        return ((m.offset(), m.value()) for m in read_range(self.settings, self.t_routed, partition, start, end))

    def _ingest_base(self) -> IngestSnapshot | None:
        """Ingest's latest snapshot as the shards' base (``WorkerCore(base_source=)``): its presence set, the
        updates.encoded offset and seq it reflects and the routed offsets it matches, if it serves the logs as they
        are; None (read from 0) otherwise.  Without routed offsets (an older ingest's, or ahead of updates.routed)
        it is the whole shards' base alone."""
        loaded, why = recovery.ingest_snapshot(self.settings, SERVICE, ("updates.encoded", "dictionary"))
        if loaded is None:
            log.info(kv(event="no-base", why=why))
            return None
        checkpoint, present, _terms = loaded
        ends = {int(p): end for p, end in checkpoint.facts.get("routed_ends", {}).items()}
        highs = end_offsets(self.settings, self.t_routed)
        why = "it does not record the routed offsets it matches (an older ingest)" if not ends else \
            "it is ahead of updates.routed (another log)" if any(end > highs[p][1] for p, end in ends.items()
                                                                 if p in highs) else ""
        if why:
            log.info(kv(event="no-base", log="updates.routed", why=why))
            ends = {}
        return IngestSnapshot(present, ends, checkpoint.positions[self.t_encoded][0], int(checkpoint.facts["seq"]))

    # -- plans

    def load_plans(self) -> None:
        """Read queries.plans to its end before taking partitions, so restores know every query."""
        highs = {p: hi for p, (lo, hi) in end_offsets(self.settings, self.t_plans).items()}
        require_from(self.settings, self.t_plans, {p: 0 for p, hi in highs.items() if hi > 0})  # every plan is needed
        self.plans.assign([TopicPartition(self.t_plans, p, 0) for p in highs])
        pending = {p for p, hi in highs.items() if hi > 0}
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            self.poll_plans(0.2)
            for tp in self.plans.position([TopicPartition(self.t_plans, p) for p in list(pending)]):
                if tp.offset >= highs[tp.partition]:
                    pending.discard(tp.partition)
        if pending:
            raise TimeoutError(f"queries.plans partitions {sorted(pending)} not read to their end")

    def poll_plans_window(self) -> None:
        """Fetch queries.plans for a short window at most every WINDOW_POLL_SECONDS (``read_window``); keep it
        unassigned otherwise (an idle assigned partition is fetched in a tight loop by librdkafka on noida-db)."""
        now = time.monotonic()
        if now < self.next_plans_poll:
            return
        positions = dict(enumerate(self.core.plan_positions))
        msgs: list[Message] = []
        points: set = set()
        while True:
            window = read_window(self.plans, self.t_plans, positions, max_records=PLAN_WINDOW_RECORDS)
            for msg in window:
                if msg.error() is None:
                    positions[msg.partition()] = msg.offset() + 1
                    points.add(_registered_at(msg.value()))
            msgs += window
            if not window or len(msgs) >= PLAN_BURST_RECORDS or len(points) >= PLAN_BURST_POINTS:
                break
        # Stopped at a bound: more plans wait; read them at the next turn of the loop (after the data path and
        # the consumer's poll).
        self.next_plans_poll = now if window else now + WINDOW_POLL_SECONDS
        self._apply_plans(msgs)

    def poll_plans(self, timeout: float) -> None:
        self._apply_plans(self.plans.consume(500, timeout))

    def _apply_plans(self, msgs: list[Message]) -> None:
        records = [(msg.partition(), msg.offset(), msg.key(), msg.value()) for msg in msgs if msg.error() is None]
        if not records:
            return
        out, to_open = self.core.on_plans(records, self.assigned)
        self.pending.extend(out)
        self.dirty = True
        for partition in to_open:
            self._open_whole(partition)

    # -- shards

    def _committed(self, consumer: Consumer, topic: str, partition: int) -> tuple[int, str | None]:
        tp = consumer.committed([TopicPartition(topic, partition)], timeout=30)[0]
        return (tp.offset if tp.offset >= 0 else 0), tp.metadata

    def _open_whole(self, partition: int) -> None:
        committer = make_consumer(self.settings, f"{self.group}.encoded.{partition}")
        tp = committer.committed([TopicPartition(self.t_encoded, 0)], timeout=30)[0]
        # Never committed: start where its queries were registered (their answers over the log before that
        # are a snapshot, as for a query registered late in a shard already open).
        offset, metadata = (tp.offset, tp.metadata) if tp.offset >= 0 else (self.core.first_position(partition), None)
        self.pending.extend(self.core.open_shard("whole", partition, offset, metadata))
        self.encoded[partition] = committer
        # (a consumer that never joins its group: its metadata never changes, and asking costs a main-thread wait)
        self.encoded_metadata[partition] = committer.consumer_group_metadata()
        self._assign_encoded_reader()

    def _close_whole(self, partition: int) -> None:
        self.core.close_shard("whole", partition)
        committer = self.encoded.pop(partition, None)
        self.encoded_metadata.pop(partition, None)
        if committer is not None:
            committer.close()
        if not self.encoded:
            self._assign_encoded_reader()

    def _assign_encoded_reader(self) -> None:
        """(Re)start the shared encoded reader at the lowest whole-shard position (none: stop fetching)."""
        self.encoded_epoch += 1
        positions = [self.core.shards[("whole", p)].position for p in self.encoded]
        self.encoded_reader.set_positions({(self.t_encoded, 0): min(positions)} if positions else {})

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Restore every newly assigned partition before any of its records is processed (``partitions`` carry
        their committed offsets and metadata: see GroupInput).

        A routed shard this worker parked when the partition was revoked comes back as it was if nothing
        moved meanwhile: the committed offset is still its position and no plan arrived (eager rebalances
        revoke and re-assign everything; rebuilding unchanged state would be wasted work).  Otherwise another
        worker owned the partition in between, and the shard is restored from the log.
        """
        new = {tp.partition for tp in partitions}
        for partition in list(self.assigned - new):
            self.core.close_shard("routed", partition)
            self._close_whole(partition)
        for tp in sorted(partitions, key=lambda tp: tp.partition):  # with their committed offsets (GroupInput)
            partition, offset, metadata = tp.partition, max(tp.offset, 0), tp.metadata
            shard = self.core.shards.get(("routed", partition))
            parked = self.parked.pop(partition, None)
            if shard is None and parked is not None and parked[0].position == offset \
                    and parked[1] == self.core.plan_positions:
                self.core.shards[("routed", partition)] = shard = parked[0]
            if shard is None or shard.position != offset:
                self.pending.extend(self.core.open_shard("routed", partition, offset, metadata))
            whole = self.core.shards.get(("whole", partition))
            if any(not i.partitioned and self.core.holds(i, "whole", partition) for i in self.core.plans.values()):
                if whole is not None:
                    self._close_whole(partition)  # its committed position may have moved: restore it
                self._open_whole(partition)
        self.parked.clear()  # revoked and not given back: another worker owns them now
        self.assigned = new
        self.dirty = True
        log.info(kv(event="assigned", partitions=",".join(map(str, sorted(new))) or "-"))

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Stop every shard of the revoked partitions at once: no record of theirs is processed and no offset
        of theirs is committed from here on, however long the next assignment takes (noida-db can leave a
        JoinGroup unanswered for a minute while another worker already owns the partitions).

        Every batch of records is committed before the next poll, where this callback runs; what may be in
        flight are the snapshots of plans applied at the start of this iteration: those of the revoked
        partitions are dropped (the next owner owes them by the committed metadata; produced here they were
        duplicates), and a shard that had some is not parked but restored if it comes back.
        Routed shards are parked (kept for an unchanged re-assignment), whole shards closed.
        """
        for tp in partitions:
            dropped = self.core.drop_outputs_of(tp.partition)
            owner_of = self.core.owner_of_output
            kept = [o for o in self.pending if owner_of(o) != tp.partition]
            dropped += len(self.pending) - len(kept)
            self.pending = kept
            shard = self.core.shards.pop(("routed", tp.partition), None)
            if shard is not None and not dropped:
                self.parked[tp.partition] = (shard, list(self.core.plan_positions))
            self._close_whole(tp.partition)
            self.assigned.discard(tp.partition)
        log.info(kv(event="revoked", partitions=",".join(str(tp.partition) for tp in partitions) or "-"))

    # -- the loop

    def open(self) -> None:
        """Read every plan, then join the workers' group: its ``on_assign`` restores routed shards (in ``poll``)."""
        self.load_plans()
        self.plans.unassign()
        self.routed_in = GroupInput(self.settings, self.group, [self.t_routed], self.args.batch,
                                    on_assign=self.on_assign, on_revoke=self.on_revoke,
                                    member_name=f"{self.group}.{self.args.instance_id}")
        self.consumer = self.routed_in.member

    def poll(self) -> tuple[list[Message], tuple[int, list[Message]]]:
        """New plans first (late registrations replay their shard's log and queue snapshots), then routed
        records (rebalance callbacks restore new partitions here) and each whole shard's encoded records."""
        self.poll_plans_window()
        return self._poll_inputs()

    def process(self, polled: tuple[list[Message], tuple[int, list[Message]]]) -> Step | None:
        """Feed the batch to the core in offset order per shard: queued snapshots + deltas, and every shard's next
        offset with the plans positions as commit metadata (routed offsets in the worker group, encoded ones in
        each whole shard's own group)."""
        routed, encoded = polled
        outputs = self.pending + self._checkpoint_records()  # (the last checkpoint, to Kafka with this batch)
        self.pending = []
        count = self._process(routed, outputs)
        count += self._process_whole(encoded, outputs)
        outputs.extend(self.core.flush_batches())
        self.core.forget_bases()  # (loaded, if at all, for this poll's registrations and restores)
        if not (count or outputs or self.dirty):
            return None
        return Step(outputs, self._offsets(), count, origin_ms=oldest_origin(routed + encoded[1]),
                    input_ms=oldest_produced(routed + encoded[1]))

    def committed(self, step: Step) -> None:
        # (a transaction of checkpoint records alone changed nothing to checkpoint)
        changed = (self.checkpoints is None or step.inputs or self.dirty
                   or not self.checkpoints.only_checkpoints(step.outputs))
        self.dirty = False
        if self.checkpoints is not None:
            self.checkpoints.committed()  # the checkpoint records the step carried: trim the older ones
        if changed:
            self.checkpointer.committed()
        if self.checkpointer.due():
            self.checkpoint()
        self._report()

    def idle(self) -> Step | None:
        if self.checkpointer.due():
            self.checkpoint()  # idle: save what the last transactions changed
        self._report()
        records = self._checkpoint_records()
        return Step(records) if records else None  # (a transaction of their own: nothing else is pending)

    def _checkpoint_records(self) -> list[Output]:
        self._forked_done()  # (a checkpoint pickled meanwhile goes out now)
        return self.checkpoints.outputs() if self.checkpoints is not None else []

    def checkpoint(self, background: bool = True) -> None:
        """Save the held shards that moved since their last checkpoint: only after a committed transaction (or
        none pending), so each holds exactly its log below its position (``services.state.shards``).  Pickled in
        a forked child while the worker goes on (``services.state.forked``; ``CBGP_FORKED_CHECKPOINTS=0``, or
        ``background=False``: here), saved once it is done; none is taken meanwhile."""
        if self.checkpoints is None:
            return
        self._forked_done()
        if self.pending or self.forked.running():
            return
        started = time.monotonic()
        due = self.core.checkpoints_due(self._held())
        require_broker_kept(self.producer, "the worker's checkpoint")  # (its inputs may be gone from the broker)
        if due and background and self.forked.start(lambda: make_checkpoints(due)):
            self.checkpointer.saved(time.monotonic() - started)  # (commits from here on are the next one's)
            return
        self._save(self.core.checkpoints_made(make_checkpoints(due)), started)

    def _held(self) -> list[tuple[str, int]]:
        return [(kind, p) for kind, p in self.core.shards
                if (kind == "routed" and p in self.assigned) or (kind == "whole" and p in self.encoded)]

    def _forked_done(self, wait: bool = False) -> None:
        """Save what a forked checkpoint made, once its child has exited (``wait``: until it has); the shards
        given up meanwhile are left to their new owner."""
        finished = self.forked.done(wait)
        if finished is not None:
            made, job = finished
            held = set(self._held())
            self._save(self.core.checkpoints_made([(due, blob) for due, blob in made if due.key in held]),
                       job.started, forked=job)

    def _save(self, blobs: list, started: float, forked: ForkedJob | None = None) -> None:
        saved = self.checkpoints.save(blobs) if self.checkpoints is not None else None
        if saved is None:  # the store failed (said in one line): no more checkpoints
            self.checkpoints = self.core.checkpoints = None
            return
        took = time.monotonic() - started
        if forked is None:
            self.checkpointer.saved(took)
        else:
            self.checkpointer.took(took)
        if saved:
            log.info(kv(event="checkpoint", shards=saved, seconds=f"{took:.3f}",
                        **({"fork_s": f"{forked.fork_seconds:.3f}"} if forked is not None else {})))

    def _poll_inputs(self) -> tuple[list[Message], tuple[int, list[Message]]]:
        """Routed records and (epoch, encoded records) already fetched; when both inputs are idle, listen
        briefly on the routed consumer (where rebalance callbacks run), then pause both for a moment."""
        self.routed_in.serve()  # rebalance callbacks, then the restores they hand over, run here ...
        epoch = self.encoded_epoch  # ... so a batch read after this line matches the shards it is fed to
        routed_fetcher = self.routed_in.fetcher
        routed = routed_fetcher.take()
        encoded = self.encoded_reader.take()
        if not (routed or encoded):
            routed = routed_fetcher.wait(routed_fetcher.listen)  # (longer after a wait that ran out mid-fetch)
            encoded = self.encoded_reader.take()
        if routed or encoded:
            # An input with nothing fetched is caught up: park it too while the batch is processed.
            if not routed:
                routed_fetcher.park()
            if not encoded:
                self.encoded_reader.park()
            return routed, (epoch, encoded)
        idle_pause([routed_fetcher, self.encoded_reader])
        return [], (epoch, [])

    def _process(self, msgs: list[Message], outputs: list[Output]) -> int:
        count = 0
        shards = self.core.shards
        for msg in msgs:
            if not record_ok(msg, log):
                continue
            shard = shards.get(("routed", msg.partition()))
            if shard is None or msg.offset() < shard.position:
                continue  # revoked meanwhile, or already applied by a restore
            try:
                # A change batch, ingest's frontier mark, or probes from other partitions' workers.
                produced, changes = self.core.on_routed(shard, msg.offset(), msg.value(), origin_ms(msg))
            except (codec.CodecError, KeyError) as exc:
                outputs.extend(self.core.skip(shard, msg.offset(), msg.value(), str(exc)))
                count += 1
                continue
            if not changes:
                self.dirty = True  # the offset moved, and a frontier goes on to deltas.parts
            count += changes
            outputs.extend(produced)
        return count

    def _process_whole(self, polled: tuple[int, list[Message]], outputs: list[Output]) -> int:
        """Feed encoded records (decoded once) to every whole shard at or before their offset."""
        epoch, msgs = polled
        if epoch != self.encoded_epoch:
            return 0  # a shard opened after this batch was fetched: the re-assigned reader fetches it again
        count = 0
        shards = [self.core.shards[("whole", p)] for p in self.encoded]
        for msg in msgs:
            if not record_ok(msg, log):
                continue
            offset = msg.offset()
            targets = [shard for shard in shards if offset >= shard.position]
            if not targets:
                continue  # every shard already has it (restored, or the reader started lower)
            try:
                changes = decode_changes("whole", msg.value())
            except (codec.CodecError, KeyError) as exc:
                for shard in targets:
                    outputs.extend(self.core.skip(shard, offset, msg.value(), str(exc)))
                count += 1
                continue
            count += len(changes)
            self.dirty = self.dirty or not changes  # only refreshes: nothing to emit, but the offsets moved
            origin = origin_ms(msg)
            for shard in targets:
                outputs.extend(self.core.on_record(shard, offset, changes, origin))
        return count

    def _offsets(self) -> list:
        metadata = self.core.metadata()
        routed = [TopicPartition(self.t_routed, p, s.position, metadata=metadata)
                  for (kind, p), s in self.core.shards.items() if kind == "routed" and p in self.assigned]
        assert self.routed_in is not None
        offsets = [(routed, self.routed_in.consumer_group_metadata())]
        for partition, group_metadata in self.encoded_metadata.items():
            shard = self.core.shards[("whole", partition)]
            offsets.append(([TopicPartition(self.t_encoded, 0, shard.position, metadata=metadata)], group_metadata))
        return offsets

    def _report(self) -> None:
        """Per-partition and per-query state gauges, a log line when they change, and the statuses of queries
        that stopped (at most 1/s; every N s with N thousand queries)."""
        now = time.monotonic()
        # (summing every query's state costs in proportion to the queries: with thousands, less often)
        if now - self.last_report < STATE_REPORT_SECONDS * max(1, len(self.core.plans) // 1000):
            return
        self.last_report = now
        trees = self.core.path_trees()
        stop_the_largest((tree, pairs) for _query, tree, pairs in trees)
        told = self.stopped.statuses(self.core.stopped())  # (services.wire.stopped: once each)
        if told:
            self.pending.extend(told)
            self.dirty = True
        if self.routed_in is not None:
            record_consumer_lag(self.routed_in.fetcher.consumer, self.routed_in.fetcher.positions, whole=True)
        for (kind, partition), shard in self.core.shards.items():
            label = shard_label(kind, partition)
            if kind == "routed":
                FRONTIER.labels(label).set(shard.completed())
                if shard.evaluator is not None:
                    PROBES_SENT.labels(label).set(shard.evaluator.probes_sent)
                    PROBES_RECEIVED.labels(label).set(shard.evaluator.probes_received)
                    PROBES_WAITING.labels(label).set(len(shard.evaluator.held) + len(shard.evaluator.unknown))
            STATE_ENTRIES.labels(label).set(shard.state_entries())
            STATE_BYTES.labels(label).set(shard.engine.state_bytes())
        held = {shard_label(kind, p) for kind, p in self.core.shards if kind == "routed"}
        for gauge in (FRONTIER, PROBES_SENT, PROBES_RECEIVED, PROBES_WAITING):
            for labels in list(gauge._metrics):  # partitions no longer held: no stale values
                if labels[0] not in held:
                    gauge.remove(*labels)
        set_by_query(QUERY_STATE, self.core.state_by_query())  # the largest by themselves, the rest as _other
        set_by_query(PATH_PAIRS, pairs_by_query(trees))

    def close(self, clean: bool = True) -> None:
        if clean:
            self._forked_done(wait=True)
        self.forked.cancel()
        if clean and self.checkpointer.unsaved:
            checkpoint_at_stop(lambda: self.checkpoint(background=False))  # a clean stop: every transaction committed
        if self.routed_in is not None:
            self.routed_in.close()  # leave the group now, not after the session timeout
        for partition in list(self.encoded):
            self._close_whole(partition)
        self.encoded_reader.close()
        self.terms.close()
        self.plans.close()
        self.producer.flush(5)
        if self.checkpoints is not None:
            self.checkpoints.close()


def register(commands: argparse._SubParsersAction) -> dict:
    """Add ``cbgp worker`` to the CLI (called by ``services.commands.main``, which assembles the commands)."""
    return service_command(commands, SERVICE, "hold star state and emit per-query deltas (service)",
                           lambda settings, args, stopper, ready: run_processor(WorkerService(settings, args), stopper, ready),
                           batch=5000, batch_help="most records per input per transaction (batches grow with the backlog)",
                           group="workers", id_flag="--worker-id",
                           id_help="stable worker name, part of the transactional id (default: host name)",
                           configure=_worker_flags)


def _worker_flags(parser: argparse.ArgumentParser) -> None:
    recovery.add_state_flags(parser, SERVICE, "each shard's engine (and its multi-centre queries' evaluator)")
    parser.add_argument("--placement", choices=[BY_CENTRE, SINGLE_OWNER],
                        default=os.environ.get("CBGP_PLACEMENT", BY_CENTRE),
                        help="'by-centre' keeps stars and single-centre components (stars with attribute variables, "
                             "2-hop paths, 2-cycles) on the routed partition of their centre value; "
                             "'single-owner' evaluates every query whole on one worker (for comparison); every "
                             "worker of a fleet must use the same; env CBGP_PLACEMENT (default by-centre)")
    parser.add_argument("--assembly", choices=["spark", "worker"], default=os.environ.get("CBGP_ASSEMBLY", "spark"),
                        help="where multi-part queries (ground part, several stars/components) are multiplied: "
                             "'spark' publishes each part's deltas for the Spark job to assemble (the parts can "
                             "be spread later), 'worker' multiplies them here (lower latency, no Spark needed); "
                             "env CBGP_ASSEMBLY (default spark)")
