"""The answers service (``cbgp answers``): deltas.parts -> numbered answers + current answers.

How it works: docs/design/internals.md, services.answers.service.
"""

from __future__ import annotations

import argparse
import logging
import time

from confluent_kafka import Consumer, Message, TopicPartition

from services import codec
from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets, make_producer
from services.answers import checkpoint as answers_checkpoint
from services.answers.side_inputs import Dictionary, Plans
from services.runtime import recovery
from services.answers.release import SeqRelease
from services.metrics.exposition import record_consumer_lag
from services.runtime.runner import Step, run_processor
from services.wire.records import Output
from services.wire.loglines import kv
from services.wire.stopped import StoppedQueries, pairs_by_query, stop_the_largest
from services.runtime.life import (checkpoint_at_stop, oldest_origin, oldest_produced, origin_ms, require_broker_kept,
                                   service_command)
from services.kafka.fetch import GroupInput
from services.kafka.replay import read_range
from services.kafka.fetch import record_ok

from services.answers.core import SERVICE, GATES_WAITING, HELD_DELTAS, RELEASE_FRONTIER, AnswersCore
from services.state.forked import ForkedCheckpoint, ForkedJob
from services.metrics.instruments import PATH_PAIRS, set_by_query

log = logging.getLogger("cbgp.answers")

class AnswersService:
    """One life of the answers service: clients, core and release, a processor of the one runner loop
    (:mod:`services.runtime.runner`)."""

    service = SERVICE

    def __init__(self, settings: KafkaSettings, args: argparse.Namespace) -> None:
        self.settings = settings
        self.args = args
        self.group = args.group or f"{settings.topic_prefix}answers"
        self.t_source = settings.topic("deltas.parts")
        self.t_answers = settings.topic("answers")
        self.core = AnswersCore(self.t_answers, settings.topic("answers.current"), settings.topic("deadletter"),
                                self.t_source)
        self.producer = make_producer(settings, transactional_id=f"{self.group}.{args.instance_id}")
        self.dictionary = Dictionary(settings)
        self.release = SeqRelease(len(end_offsets(settings, settings.topic("updates.routed"))), self._query_text,
                                  self.dictionary.terms, self._query_class, self.dictionary.held)
        self.plans = Plans(settings, self.core, self.release, len(end_offsets(settings, self.t_source)))
        self.input: GroupInput | None = None
        self.consumer: Consumer | None = None  # the group member
        self.assigned: set[int] = set()  # partitions whose deltas are processed now
        self.held: set[int] = set()  # partitions whose state is in the core (assigned, or revoked and parked)
        # each held partition's last commit: the next deltas.parts offset and its metadata
        self.commits: dict[int, tuple[int, str]] = {}
        # Checkpoints (services.answers.checkpoint), with the last Answer written to each answers partition
        # (the proof a later restore reads the same log)
        self.checkpoints, self.checkpointer = recovery.shard_checkpoints(
            args, settings, SERVICE, {answers_checkpoint.KIND: "checkpoints.deltas"})
        self.last_answers: dict[int, bytes | None] = {}
        self.unpicklable: set[int] = set()
        self.forked = ForkedCheckpoint(log)  # a checkpoint being pickled in a child process
        self.stopped = StoppedQueries(settings.topic("queries.status"))

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Restore each newly assigned partition from its answers partition (the service's changelog).

        A partition whose state this instance still holds keeps it only if its committed offset is where
        this instance left it: otherwise another instance numbered its deltas in between."""
        new = {tp.partition for tp in partitions}
        committed = {tp.partition: tp.offset for tp in partitions}  # GroupInput passes the committed offsets
        for partition in sorted(self.held):
            if partition not in new or self.commits.get(partition, (None,))[0] != committed[partition]:
                self.core.drop_partition(partition)
                self.release.drop(partition)
                self.held.discard(partition)
        answers_ends = end_offsets(self.settings, self.t_answers) if new - self.held else {}
        # Every plan first: a commit's metadata leaves the gates it opened to their place in queries.plans, up to
        # where its writer had read (SeqRelease.note_plan).
        self.plans.load()
        for tp in partitions:
            # Held deltas are re-read from the committed offset: restart the release from what was committed
            # with it (an unchanged re-assignment keeps its DISTINCT counts; a new partition rebuilds them, from
            # its checkpoint where one serves).
            partition = tp.partition
            if partition in self.held:
                self.release.restore(partition, tp.metadata, keep_counts=True)
                continue
            started = time.monotonic()
            low, high = answers_ends[partition]
            saved, why = self._saved(partition, committed[partition], low, high)
            answers_from = counts_from = 0
            if saved is not None:
                answers_checkpoint.adopt(self.core, partition, saved)
                answers_from, counts_from = saved["answers_end"], saved["position"]
                self.last_answers[partition] = saved["last_answer"]
            end = self.release.restore(partition, tp.metadata, saved=saved["release"] if saved else None)
            if end > counts_from:
                for msg in read_range(self.settings, self.t_source, partition, counts_from, end):
                    deltas = _decoded([msg])[0]
                    if deltas is not None:
                        self.release.restore_counts(partition, msg.offset(), deltas)
            # (read_range refuses a truncated log: without a checkpoint, from offset 0)
            for msg in read_range(self.settings, self.t_answers, partition, answers_from, high):
                headers = {k: v for k, v in (msg.headers() or ()) if v is not None}
                self.core.restore(partition, msg.value(), headers)
                self.last_answers[partition] = msg.value()
            self.commits[partition] = (committed[partition], tp.metadata or "")
            log.info(kv(event="partition-restored", partition=partition, checkpoint=why, answers_from=answers_from,
                        answers_end=high, deltas_from=counts_from, deltas_end=end,
                        restore_seconds=f"{time.monotonic() - started:.3f}"))
        self.held = set(new)
        self.assigned = new
        log.info(kv(event="assigned", partitions=",".join(map(str, sorted(new))) or "-",
                    queries=len(self.core.queries)))

    def _saved(self, partition: int, committed: int, answers_low: int,
               answers_high: int) -> tuple[dict | None, str]:
        """The checkpoint that restores ``partition`` and why there is none ("used" when there is)."""
        if self.checkpoints is None:
            return None, "checkpoints off"
        saved = self.checkpoints.get(answers_checkpoint.KIND, partition, committed)
        last = None
        if saved is not None and answers_low <= saved["answers_end"] <= answers_high:
            def read(start: int, end: int) -> list[bytes | None]:
                return [m.value() for m in read_range(self.settings, self.t_answers, partition, start, end)]

            last = answers_checkpoint.last_answer_before(read, saved["answers_end"], answers_low,
                                                         saved["last_answer"])
        why = answers_checkpoint.unusable(saved, committed, answers_high, last)
        return (saved, f"used-{saved['from']}") if why is None else (None, why)

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """No delta of a revoked partition is processed or committed from here on (its state is kept for an
        unchanged re-assignment: see on_assign)."""
        self.assigned -= {tp.partition for tp in partitions}

    def open(self) -> None:
        """Read every plan (a restored stream of an unregistered query is then ended), then join the group: its
        ``on_assign`` restores the partitions assigned (in ``poll``)."""
        self.plans.load()
        self.input = GroupInput(self.settings, self.group, [self.t_source], self.args.batch,
                                on_assign=self.on_assign, on_revoke=self.on_revoke,
                                member_name=f"{self.group}.{self.args.instance_id}")
        self.consumer = self.input.member

    def poll(self) -> list[Message]:
        assert self.input is not None
        msgs = [m for m in self.input.poll() if record_ok(m, log)]
        self.plans.poll()
        if msgs:
            self.dictionary.follow()  # (ahead of the deltas that will need the terms: see Dictionary)
        return msgs

    def process(self, msgs: list[Message]) -> Step | None:
        """Per batch:
        1. wait (bounded) for term ids not yet in the dictionary;
        2. release (services.answers.release): Frontier records raise the watermark; a by-centre query's deltas are
           held until every routed partition passed their seq, then released in seq order, DISTINCT applied;
        3. number, deduplicate and decode each released delta (state changes in memory);
        4. the step: answers + answers.current records, then the deltas.parts offsets, never past a held delta,
           with the frontiers and the read position as commit metadata (a new life restores from the answers
           topic and that metadata).
        """
        if not msgs:
            return None
        records = _decoded(msgs)
        self.dictionary.wait_for({i for deltas in records if deltas is not None for i in deltas.values})
        # the last checkpoint, to Kafka with this batch; then the streams queries.plans ended
        outputs: list[Output] = self._checkpoint_records() + self.core.settle(self.assigned) + self._stopped()
        offsets: dict[int, int] = {}
        lookup = self.dictionary.terms.get
        release = self.release
        for msg, record in zip(msgs, records):
            partition, offset = msg.partition(), msg.offset()
            if partition not in self.assigned:
                continue
            offsets[partition] = offset + 1
            try:
                ready = release.on_record(partition, offset, msg.value(), origin_ms(msg), record)
            except codec.CodecError as exc:  # undecodable (a corrupt Frontier, say): dead-lettered, saying why
                outputs.append(self.core.refused(partition, offset, str(exc), msg.value()))
                continue
            for source_offset, origin, deltas in ready:
                outputs.extend(self.core.on_record(partition, source_offset, msg.value(), origin, lookup, deltas))
        self.dictionary.held.collect()  # (the values operators let go: every answer naming them is decoded)
        if not offsets:
            # every delta was of a partition revoked meanwhile
            return Step(outputs) if outputs else None
        # Never past a held delta: a restart re-reads it (see services.answers.release).
        commits = {p: release.commit_position(p, o) for p, o in offsets.items()}
        tps = [TopicPartition(self.t_source, p, o, metadata=m) for p, (o, m) in commits.items()]
        assert self.input is not None
        return Step(outputs, [(tps, self.input.consumer_group_metadata())],
                    sum(len(deltas) for deltas in records if deltas is not None), commits, oldest_origin(msgs),
                    oldest_produced(msgs))

    def committed(self, step: Step) -> None:
        if self.checkpoints is not None:
            self.checkpoints.committed()  # the checkpoint records the step carried: trim the older ones
            self._note_answers(step.outputs)
        if step.offsets or self.checkpoints is None or not self.checkpoints.only_checkpoints(step.outputs):
            self.checkpointer.committed()  # (a transaction of checkpoint records alone changed nothing)
        if step.detail is not None:
            self.commits.update(step.detail)
            HELD_DELTAS.set(self.release.held())
            for routed, seq in self.release.frontiers_seen().items():
                RELEASE_FRONTIER.labels(partition=str(routed)).set(seq)
            for routed, gates in self.release.gates_waiting().items():
                GATES_WAITING.labels(partition=str(routed)).set(gates)
            assert self.input is not None
            record_consumer_lag(self.input.fetcher.consumer, self.input.fetcher.positions, whole=True)
        if self.checkpointer.due():
            self.checkpoint()

    def _note_answers(self, outputs: list[Output]) -> None:
        """Remember the last Answer each partition got in a committed transaction."""
        wanted = set(self.held)
        for out in reversed(outputs):
            if out.topic == self.t_answers and out.partition in wanted:
                self.last_answers[out.partition] = out.value
                wanted.discard(out.partition)
                if not wanted:
                    return

    def idle(self) -> Step | None:
        """End the streams queries.plans has left behind (unregistered or re-registered queries) in a transaction
        of their own: nothing is consumed, so nothing else commits with them.  Otherwise a checkpoint, if due."""
        outputs = self.core.settle(self.assigned) + self._stopped()
        if not outputs and self.checkpointer.due():
            self.checkpoint()  # idle: save what the last transactions changed
        outputs += self._checkpoint_records()  # (a transaction of their own, or with the ended streams)
        return Step(outputs) if outputs else None

    def _stopped(self) -> list[Output]:
        """An ERROR status for each operator query that stopped since the last scan (services.wire.stopped)."""
        if not self.stopped.due():
            return []
        trees = self.release.path_trees()  # (the scan's cadence: about once a second)
        stop_the_largest((tree, pairs) for _query, tree, pairs in trees)
        set_by_query(PATH_PAIRS, pairs_by_query(trees))
        return self.stopped.statuses(self.release.stopped())

    def _checkpoint_records(self) -> list[Output]:
        self._forked_done()  # (a checkpoint pickled meanwhile goes out now)
        return self.checkpoints.outputs() if self.checkpoints is not None else []

    def checkpoint(self, background: bool = True) -> None:
        """Checkpoint every assigned partition (``services.answers.checkpoint``): called once every transaction
        committed, so each partition's state is exactly what its last commit and its answers describe.  Pickled
        in a forked child, as the workers' are (``services.state.forked``; ``CBGP_FORKED_CHECKPOINTS=0``, or
        ``background=False``: here), saved once it is done; none is taken meanwhile."""
        if self.checkpoints is None or self.consumer is None:
            return
        self._forked_done()
        if self.forked.running():
            return
        started = time.monotonic()
        due = []
        for partition in sorted(self.assigned & set(self.commits)):
            position, metadata = self.commits[partition]
            _low, answers_end = self.consumer.get_watermark_offsets(TopicPartition(self.t_answers, partition),
                                                                    timeout=30)
            due.append((partition, position, metadata, answers_end, self.last_answers.get(partition),
                        partition not in self.unpicklable))
        require_broker_kept(self.producer, "the answers service's checkpoint")  # (answers_end: of the log it wrote)
        core, release = self.core, self.release
        if due and background and self.forked.start(lambda: answers_checkpoint.partition_blobs(core, release, due)):
            self.checkpointer.saved(time.monotonic() - started)  # (commits from here on are the next one's)
            return
        self._save(answers_checkpoint.partition_blobs(core, release, due), started)

    def _forked_done(self, wait: bool = False) -> None:
        """Save what a forked checkpoint made, once its child has exited (``wait``: until it has); the partitions
        given up meanwhile are left to their new owner."""
        finished = self.forked.done(wait)
        if finished is not None:
            made, job = finished
            self._save([item for item in made if item[0] in self.assigned], job.started, forked=job)

    def _save(self, made: list[tuple[int, int, int, bytes | None]], started: float,
              forked: ForkedJob | None = None) -> None:
        blobs = []
        for partition, position, answers_end, blob in made:
            if blob is not None:
                needs = {"answers": answers_checkpoint.answers_needed(answers_end)}  # (for `cbgp topics floor`)
                blobs.append((answers_checkpoint.KIND, partition, blob, position, needs))
            else:
                self.unpicklable.add(partition)  # (said once)
        saved = self.checkpoints.save(blobs) if self.checkpoints is not None else None
        if saved is None:  # the store failed (said in one line): no more checkpoints
            self.checkpoints = None
            return
        took = time.monotonic() - started
        if forked is None:
            self.checkpointer.saved(took)
        else:
            self.checkpointer.took(took)
        if saved:
            log.info(kv(event="checkpoint", partitions=saved, seconds=f"{took:.3f}",
                        **({"fork_s": f"{forked.fork_seconds:.3f}"} if forked is not None else {})))

    def close(self, clean: bool = True) -> None:
        if clean:
            self._forked_done(wait=True)
        self.forked.cancel()
        if clean and self.checkpointer.unsaved:
            checkpoint_at_stop(lambda: self.checkpoint(background=False))  # a clean stop: every transaction committed
        if self.checkpoints is not None:
            self.checkpoints.close()
        if self.input is not None:
            self.input.close()
        self.dictionary.close()
        self.plans.close()
        self.producer.flush(5)

    def _query_text(self, query_id: str, version: int) -> str | None:
        """A registration's query, for a by-centre product's assembler: its plan is in queries.plans before any
        of its deltas, so a miss means this service has not polled that far yet."""
        text = self.core.text_of(query_id, version)
        if text is None and not self.core.superseded(query_id, version):
            self.plans.load()
            text = self.core.text_of(query_id, version)
        return text

    def _query_class(self, query_id: str, version: int) -> str | None:
        """A registration's query class, as its plan says (None: not read yet)."""
        return self.core.class_of(query_id, version)


def _decoded(msgs: list[Message]) -> list[codec.PartDeltaColumns | None]:
    """Each message's deltas, or None where it does not decode (on_record then dead-letters it)."""
    records: list[codec.PartDeltaColumns | None] = []
    for msg in msgs:
        try:
            records.append(codec.part_delta_columns(msg.value()))
        except codec.CodecError:
            records.append(None)
    return records


def register(commands: argparse._SubParsersAction) -> dict:
    """Add ``cbgp answers`` to the CLI (called by ``services.commands.main``, which assembles the commands)."""
    return service_command(commands, SERVICE, "number deltas and maintain current answers (service)",
                           lambda settings, args, stopper, ready: run_processor(AnswersService(settings, args), stopper, ready),
                           batch=1000,
                           batch_help="deltas.parts records per transaction (a worker's record holds many deltas)",
                           configure=lambda parser: recovery.add_state_flags(
                               parser, SERVICE, "each deltas.parts partition's answer streams and released state"))
