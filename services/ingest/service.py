"""The ingest service: raw updates -> the total order of effective, dictionary-encoded changes.

How it works: docs/design/internals.md, services.ingest.service.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from confluent_kafka import Consumer, Message, TopicPartition

from services.ingest.checkpoint import Capture, CheckpointWriter
from services.ingest.core import SERVICE, IngestProcessor, RawRecord
from services.ingest.retries import Retries
from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets, make_producer
from services.metrics.exposition import record_consumer_lag
from services.runtime.runner import Step, batch_deadline, run_processor
from services.wire.records import Output
from services.wire.loglines import kv
from services.wire.settings import ms_setting
from services.runtime.life import Stopper, checkpoint_at_stop, require_broker_kept, service_command
from services.kafka.fetch import IDLE_PAUSE_MAX_SECONDS, GroupInput
from services.kafka.checkpoint_log import CheckpointLog
from services.runtime import recovery
from services.state.checkpointing import Checkpoint, Checkpointer
from services.state.store import Store
from services.state import presence

log = logging.getLogger("cbgp.ingest")

KIND = "ingest"  # ingest's snapshots in Kafka: partition 0 of checkpoints.ingest
SPILL_CHANGES = 200_000  # --state-on-disk: a restore writes what its tail changed this often
# Nothing rings ingest for a producer other than cbgp publish and the gateway's /update (a user's own, the usual
# one in a deployment), so after a quiet minute it pauses this long between fetches, not the fleet's deep pause:
# such a producer's first update waits here up to 60 ms instead of 250 (docs/benchmarks.md).
DEEP_PAUSE_SECONDS = max(IDLE_PAUSE_MAX_SECONDS, ms_setting("CBGP_INGEST_IDLE_PAUSE_DEEP_MS", 60))


# ---------------------------------------------------------------------------------------- Kafka loop


def restore(processor: IngestProcessor, settings: KafkaSettings, store: Store | None = None,
            remote: CheckpointLog | None = None, on_disk: bool = False) -> dict[str, dict[int, int]]:
    """Rebuild the state: from the checkpoint in ``store`` or the snapshot in ``remote`` (``checkpoints.ingest``),
    the newer of those that can serve (:func:`services.state.unusable`), plus the tails of updates.encoded and
    dictionary after its positions; else from offset 0 of both logs.  Kafka is not asked when the store's
    checkpoint is at the logs' ends.  Returns the positions the restored state reflects (the logs' ends when the
    restore began).

    The logs are read from where the state needs them, never from their low watermarks: ``read_range`` refuses a
    log whose needed records were deleted (:class:`LogTruncated`), so with a checkpoint retention may delete what
    lies below its positions, and without one nothing may be deleted.  A checkpoint that cannot belong to these
    logs (beyond their ends, other topics, or a tail whose first seq does not follow it) is discarded with one
    log line and the restore starts again from offset 0 (:mod:`services.runtime.recovery`).

    ``on_disk`` (``--state-on-disk``, a ``store`` required): the state stays in the store, nothing is loaded;
    a long tail is checkpointed every ``SPILL_CHANGES`` changes as it is read (:func:`spill`).
    """
    started = time.monotonic()
    watermarks = {topic: end_offsets(settings, topic) for topic in (processor.t_encoded, processor.t_dictionary)}
    ends = {topic: {p: high for p, (_low, high) in parts.items()} for topic, parts in watermarks.items()}
    checkpoint = recovery.saved_checkpoint(store, watermarks, ("seq",)) if store is not None else None
    processor.track_changes = store is not None
    if on_disk:
        assert store is not None and remote is None
        facts = checkpoint.facts if checkpoint is not None else {}
        processor.use_disk(store, int(facts.get("present", 0)), int(facts.get("terms", 0)))
        processor.seq = int(facts.get("seq", 0))
    snapshot = _snapshot(remote, watermarks) if remote is not None and (
        checkpoint is None or checkpoint.positions != ends) else None
    if snapshot is not None and (checkpoint is None or _position(snapshot[0], processor) > _position(checkpoint,
                                                                                                      processor)):
        checkpoint, present, terms = snapshot
        processor.load_state(present, terms, int(checkpoint.facts["seq"]))
        if store is not None:  # the store held an older state: it is written whole by the next checkpoint
            recovery.discard(store, "Kafka holds a newer checkpoint")
            processor.changed, processor.new_terms = dict(present), list(terms)
        source = "kafka"
    elif checkpoint is not None:
        if not on_disk:  # (on disk: nothing to load, the store is the state)
            processor.load_state(presence.load_present(store), presence.load_terms(store), int(checkpoint.facts["seq"]))
        source = "store"
    if checkpoint is not None:
        log.info(kv(event="checkpoint-loaded", source=source, seq=processor.seq, present=len(processor.present),
                    terms=len(processor.published), positions=checkpoint.describe(),
                    seconds=round(time.monotonic() - started, 2)))
        starts = checkpoint.positions
    else:
        starts = {topic: {p: 0 for p in parts} for topic, parts in ends.items()}
    follows = [checkpoint is not None]  # the first encoded change read must follow the checkpoint's seq
    read = {topic: dict(parts) for topic, parts in starts.items()}  # how far the state reflects the logs now

    def apply(topic: str, partition: int, msg: Message) -> None:
        if topic == processor.t_encoded:
            saved_seq = processor.seq
            seq = processor.restore_encoded(msg.value())
            if follows[0] and seq >= 0:
                follows[0] = False
                if seq not in (saved_seq, saved_seq + 1):  # saved_seq: a refresh row; + 1: the next change
                    raise recovery.ForeignLog(f"{topic}[{partition}] has seq {seq} at offset {msg.offset()}, the first "
                                              f"record after the checkpoint, which ends at seq {saved_seq}")
        elif msg.value() is not None:
            processor.restore_dictionary(msg.value())
        read[topic][partition] = msg.offset() + 1
        if on_disk:
            assert store is not None
            spill(processor, store, read)

    try:
        tail = recovery.read_tails(settings, starts, ends, apply, label="0")  # the raw partition whose state it is
    except recovery.ForeignLog as exc:
        if store is not None:
            recovery.discard(store, str(exc))
        else:
            log.warning(kv(event="checkpoint-discarded", source="kafka", reason=str(exc)))
        processor.__init__(settings, processor.n_routed, processor.n_dictionary)  # type: ignore[misc]
        return restore(processor, settings, store, on_disk=on_disk)  # the store is empty now: from offset 0
    log.info(kv(event="restored", seq=processor.seq, present=len(processor.present), terms=len(processor.published),
                from_checkpoint=checkpoint is not None, tail_records=tail,
                seconds=round(time.monotonic() - started, 2)))
    return ends


def spill(processor: IngestProcessor, store: Store, read: dict[str, dict[int, int]],
          limit: int = SPILL_CHANGES) -> None:
    """With the state on disk, a restore checkpoints once ``limit`` changes are held (``read``: how far its state
    reflects the logs now; the logs are read one after the other, so a partition not reached yet is still at its
    start), so memory stays bounded whatever the tail, and a restore cut short goes on from there."""
    if len(processor.unsaved()[0]) >= limit:
        save_checkpoint(processor, store, {topic: dict(parts) for topic, parts in read.items()})


def _position(checkpoint: Checkpoint, processor: IngestProcessor) -> int:
    return checkpoint.positions[processor.t_encoded][0]


def _snapshot(remote: CheckpointLog, watermarks: dict) -> tuple[Checkpoint, set, list] | None:
    """Ingest's last snapshot in Kafka, if one can serve a restore from logs with these ``watermarks``."""
    saved = remote.get(KIND, 0)
    loaded = presence.load_snapshot(saved.blob) if saved is not None else None
    if loaded is None:
        return None
    record, present, terms = loaded
    checkpoint, reason = recovery.serving_checkpoint(record, watermarks, ("seq",))
    if checkpoint is None:
        log.warning(kv(event="checkpoint-discarded", source="kafka", reason=reason))
        return None
    return checkpoint, present, terms


def checkpoint_record(processor: IngestProcessor, ends: dict[str, dict[int, int]]) -> Checkpoint:
    return Checkpoint(ends, {"seq": processor.seq, "present": len(processor.present),
                             "terms": len(processor.published)}, int(time.time() * 1000))


def save_checkpoint(processor: IngestProcessor, store: Store, ends: dict[str, dict[int, int]],
                    checkpoint: Checkpoint | None = None) -> Checkpoint:
    """Write a checkpoint of ``processor``'s state reflecting the logs up to ``ends``.

    Steps, in order (the order is the guarantee):
    1. (the caller's) the transaction that produced the state's last changes is committed, and ``ends`` were
       read after it: ingest is the only writer of updates.encoded and has no open transaction, so every change
       in the state is below the ends and every record below them is in the state.  On the dictionary topic the
       end may also cover terms workers published meanwhile; ingest's running state never holds those (ids are
       stable, and publishing a term again writes the same record), so skipping them on restore loses nothing;
    2. the triples whose presence changed, the terms published and the checkpoint record are written in one
       atomic batch: a crash during the write leaves the previous checkpoint with the data it describes;
    3. the changes just saved are forgotten, so the next checkpoint writes only what changes after this one.
    """
    checkpoint = checkpoint or checkpoint_record(processor, ends)
    puts, deletes = presence.changes(*processor.unsaved())
    store.commit(puts, deletes, checkpoint.to_json())
    processor.saved()  # only once written: a failed write keeps them for the next attempt
    return checkpoint


class IngestService:
    """One life of the ingest service, as :func:`services.runtime.runner.run_processor` drives it.

    Per batch: up to ``--batch`` raw records, and no more once ``CBGP_MAX_BATCH_MS`` has passed (the rest is given
    back for the next batch), are transformed by :class:`IngestProcessor` (state changes in memory only); the
    runner commits dictionary entries, encoded, routed and dead letters with the raw offsets in one transaction;
    only then (``committed``), at most every ``--checkpoint-interval`` seconds (and when idle or
    stopping), is the state checkpointed to the store under ``--state-dir`` (:func:`save_checkpoint`), so a
    checkpoint never holds a change the logs lack.
    """

    service = SERVICE

    def __init__(self, settings: KafkaSettings, args: argparse.Namespace) -> None:
        # Partition counts come from the broker, not the flags: routing must match the topics as they exist.
        self.partitions = (len(end_offsets(settings, settings.topic("updates.routed"))),
                           len(end_offsets(settings, settings.topic("dictionary"))))
        self.settings, self.args = settings, args
        self.processor = IngestProcessor(settings, *self.partitions)
        self.retries = Retries()  # (cbgp publish's records taken per raw partition: a retried copy is dropped)
        self.raw_topic = settings.topic("updates.raw")
        self.group = args.group or f"{settings.topic_prefix}ingest"
        self.producer = make_producer(settings, transactional_id=f"{self.group}.{args.instance_id}")
        self.consumer: GroupInput | None = None
        self.on_disk = bool(getattr(args, "state_on_disk", False))
        if self.on_disk and (args.checkpoint_interval < 0 or not args.state_dir):
            raise SystemExit("ingest: --state-on-disk keeps the state in the store under --state-dir: give a state "
                             "dir and a --checkpoint-interval of 0 or more")
        self.store = (recovery.open_store(args.state_dir, f"{settings.topic_prefix}{SERVICE}-{args.instance_id}")
                      if args.checkpoint_interval >= 0 else None)
        if self.on_disk and self.store is None:
            raise SystemExit(f"ingest: --state-on-disk: the state store under {args.state_dir} does not open (see "
                             "the line above)")
        # the whole state, in Kafka as well: a standby or rescheduled ingest without this disk restores from it
        # (not with the state on disk: a snapshot of it would have to fit in memory)
        self.remote = (CheckpointLog(settings, {KIND: settings.topic("checkpoints.ingest")}, args.instance_id)
                       if args.checkpoint_interval >= 0 and not self.on_disk else None)
        self.checkpointer = Checkpointer(max(args.checkpoint_interval, 0.0), budget=recovery.checkpoint_budget(args))
        self.logs = {self.processor.t_encoded: sorted(end_offsets(settings, self.processor.t_encoded)),
                     self.processor.t_dictionary: list(range(self.partitions[1]))}
        self.watermarks = (Consumer(settings.consumer_config(f"{settings.topic_prefix}watermarks"))
                           if self.store or self.remote else None)
        self.writer = CheckpointWriter()  # checkpoints are written in its background thread
        self.positions: dict[int, int] = {}  # next raw offset per partition that the processor's state includes
        self.owned: set[int] = set()  # raw partitions assigned now

    def open(self) -> None:
        self.consumer = GroupInput(self.settings, self.group, [self.raw_topic], self.args.batch,
                                   on_assign=self.on_assign, on_revoke=self.on_revoke,
                                   member_name=f"{self.group}.{self.args.instance_id}", deep_pause=DEEP_PAUSE_SECONDS)

    def on_assign(self, _member: Consumer, assigned: list[TopicPartition]) -> None:
        # The state is global (one order, one presence set), so it is rebuilt whenever any assigned raw
        # partition was processed elsewhere since this life last saw it: at the start of every life, and when
        # a standby replica takes over.  An unchanged re-assignment keeps it.
        committed = {tp.partition: tp.offset for tp in assigned}  # GroupInput passes the committed offsets
        if any(self.positions.get(p) != offset for p, offset in committed.items()):
            self._written(wait=True)  # (the store is read next: no write of the old state may be in progress)
            self.processor = IngestProcessor(self.settings, *self.partitions)
            ends = restore(self.processor, self.settings, self.store, self.remote, self.on_disk)
            if any(self.processor.unsaved()):
                self.checkpoint(ends)  # what the tail added: the next restore need not read it again
            self.positions.clear()
            self.positions.update(committed)
            for tp in assigned:
                self.retries.restore(tp.partition, tp.metadata)
        self.owned.clear()
        self.owned.update(committed)

    def on_revoke(self, _member: Consumer, revoked: list[TopicPartition]) -> None:
        self.owned.difference_update(tp.partition for tp in revoked)  # nothing of theirs is processed from here on

    def poll(self) -> list[Message]:
        assert self.consumer is not None
        return [m for m in self.consumer.poll() if m.error() is None]

    def process(self, msgs: list[Message]) -> Step | None:
        outputs: list[Output] = self._checkpoint_records()  # (the last snapshot, to Kafka with this batch)
        offsets: dict[int, int] = {}
        oldest: int | None = None
        deadline = batch_deadline()
        for i, msg in enumerate(msgs):
            if offsets and time.monotonic() > deadline:
                assert self.consumer is not None
                self.consumer.give_back(msgs[i:])  # (the next transaction's)
                msgs = msgs[:i]
                break
            if msg.partition() not in self.owned:
                continue  # revoked meanwhile
            ts_type, ts = msg.timestamp()
            if ts > 0 and (oldest is None or ts < oldest):
                oldest = ts
            headers = msg.headers()
            fields = {k: v for k, v in headers if v is not None} if headers else {}
            offsets[msg.partition()] = msg.offset() + 1
            if self.retries.is_copy(msg.partition(), msg.offset(), fields):
                continue
            raw = RawRecord(msg.value(), fields, msg.topic(), msg.partition(), msg.offset(),
                            ts if ts > 0 else int(time.time() * 1000))
            outputs.extend(self.processor.accept(raw))
        if not offsets:
            return Step(outputs) if outputs else None
        outputs.extend(self.processor.flush())
        assert self.consumer is not None
        tps = [TopicPartition(self.raw_topic, p, o, metadata=self.retries.metadata(p)) for p, o in offsets.items()]
        # (a raw record's produce time is both the update's and the input's)
        return Step(outputs, [(tps, self.consumer.consumer_group_metadata())], len(msgs), offsets,
                    origin_ms=oldest, input_ms=oldest)

    def committed(self, step: Step) -> None:
        if self.remote is not None:
            self.remote.committed()  # the snapshot records the step carried: trim the older ones
        if step.offsets:  # (a transaction of snapshot records alone changed nothing to checkpoint)
            self.checkpointer.committed()
        if self.checkpointer.due():
            self.checkpoint()
        if step.detail is not None:
            self.positions.update(step.detail)
        assert self.consumer is not None
        record_consumer_lag(self.consumer.fetcher.consumer, self.consumer.fetcher.positions, whole=True)

    def idle(self) -> Step | None:
        if self.checkpointer.due():
            self.checkpoint()  # idle: save what the last transactions changed
        records = self._checkpoint_records()
        return Step(records) if records else None  # (a transaction of their own)

    def _checkpoint_records(self) -> list[Output]:
        self._written()  # (a snapshot finished meanwhile goes out now)
        return self.remote.take() if self.remote is not None else []

    def checkpoint(self, ends: dict[str, dict[int, int]] | None = None, wait: bool = False) -> None:
        """Take a checkpoint of the state as of the logs' ends: the changes since the last one for the store, and
        the whole state as a snapshot for Kafka, both written in the background (:mod:`services.ingest.checkpoint`;
        the snapshot goes out with the first transaction after it is ready).  None is taken while the previous one
        is being written; ``wait``: wait for that one, and for this one (a clean stop)."""
        if self.store is None and self.remote is None:
            return
        self._written(wait)
        if self.writer.busy():
            return  # (due again once the one being written is done)
        started = time.monotonic()
        processor = self.processor
        ends = ends or recovery.log_ends(self.watermarks, self.logs)
        routed = (recovery.log_ends(self.watermarks, {processor.t_routed: range(processor.n_routed)})
                  if self.remote is not None else None)
        require_broker_kept(self.producer, "ingest's checkpoint")  # (the ends above must be of the log it wrote)
        saved = checkpoint_record(processor, ends)
        if self.on_disk:  # the state is the store's: written here (no snapshot to Kafka then)
            assert self.store is not None
            save_checkpoint(processor, self.store, ends, saved)
            self.checkpointer.saved(time.monotonic() - started)
            log.info(kv(event="checkpoint", seq=saved.facts["seq"], present=saved.facts["present"],
                        terms=saved.facts["terms"], positions=saved.describe(),
                        seconds=f"{time.monotonic() - started:.3f}"))
            return
        capture = Capture(saved, ends[processor.t_encoded][0], taken_at=started)
        if self.store is not None:
            capture.changed, capture.new_terms = processor.take_changes()
        if self.remote is not None:
            # Where updates.routed stands (no transaction of ingest is open): below each end, every change up to
            # the snapshot's seq; above it, none. So the snapshot is each routed partition's graph at that offset,
            # a base a worker can move along the partition's log (docs/design/bounded-input-logs.md).
            assert routed is not None
            saved.facts["routed_ends"] = {str(p): end for p, end in routed[processor.t_routed].items()}
            capture.present, capture.published = dict(processor.present), set(processor.published)
        capture.capture_seconds = time.monotonic() - started
        self.checkpointer.saved(capture.capture_seconds)  # (commits from here on are the next one's)
        self.writer.start(capture, self.store, processor.dictionary.decode)
        if wait:
            self._written(wait=True)

    def wait_for_checkpoint(self) -> None:
        """Until the checkpoint being written (if any) is in the store and queued for Kafka."""
        self._written(wait=True)

    def _written(self, wait: bool = False) -> None:
        """Take a checkpoint the background finished writing: queue its snapshot for the next transaction; a
        store that failed is given up (restores then read more of the logs) while Kafka's snapshots go on."""
        written = self.writer.done(wait)
        if written is None:
            return
        saved = written.capture.checkpoint
        if written.store_error is not None and self.store is not None:
            log.warning(kv(event="checkpoints-off", store="disk", reason=str(written.store_error)))
            self.store.close()
            self.store, self.processor.track_changes = None, False
            self.processor.take_changes()
        if written.blob is not None and self.remote is not None:
            self.remote.queue([(KIND, 0, written.blob, written.capture.position)])
        self.checkpointer.took(written.capture.capture_seconds + written.seconds)
        log.info(kv(event="checkpoint", seq=saved.facts["seq"], present=saved.facts["present"],
                    terms=saved.facts["terms"], positions=saved.describe(),
                    seconds=f"{time.monotonic() - written.capture.taken_at:.3f}",
                    capture_s=f"{written.capture.capture_seconds:.3f}", background_s=f"{written.seconds:.3f}"))

    def close(self, clean: bool) -> None:
        if clean and self.checkpointer.unsaved:  # every transaction committed: the next life starts from here
            checkpoint_at_stop(lambda: self.checkpoint(wait=True))
        self.writer.close()  # (a write in progress ends before its store is closed)
        if self.consumer is not None:
            self.consumer.close()  # leaves the group now rather than after the session timeout
        self.producer.flush(5)
        if self.watermarks is not None:
            self.watermarks.close()
        if self.store is not None:
            self.store.close()
        if self.remote is not None:
            self.remote.close()


def run(settings: KafkaSettings, args: argparse.Namespace, stopper: Stopper, ready: list[bool]) -> None:
    """One life of the service (see :class:`IngestService`)."""
    run_processor(IngestService(settings, args), stopper, ready)


def _configure(parser: argparse.ArgumentParser) -> None:
    recovery.add_state_flags(parser, SERVICE, "the state (presence set, seq, published terms)")
    parser.add_argument("--state-on-disk", action="store_true",
                        default=os.environ.get("CBGP_INGEST_STATE_ON_DISK", "") not in ("", "0", "false"),
                        help="keep the presence set and the published terms in the store under --state-dir, not "
                             "in memory: the graph may be larger than memory, each change costs a store lookup, "
                             "and no snapshot goes to checkpoints.ingest (default $CBGP_INGEST_STATE_ON_DISK)")


def register(commands: argparse._SubParsersAction) -> dict:
    """Add ``cbgp ingest`` to the CLI (called by ``services.commands.main``, which assembles the commands)."""
    return service_command(commands, SERVICE, "parse, deduplicate, encode and route raw updates (service)", run,
                           batch=500, batch_help="raw records per transaction", configure=_configure)
