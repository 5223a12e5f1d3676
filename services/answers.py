"""The answers service (``cbgp answers``): deltas.parts -> numbered answers + current answers.

Topology::

    deltas.parts (group <prefix>answers, key query id) --[AnswersCore]--> answers          (Answer, n = 1, 2, ...)
    dictionary (all partitions, read continuously)     ----^         --> answers.current  (CurrentAnswer | tombstone)

:class:`AnswersCore` is the transform (no Kafka): per query it numbers deltas in arrival order, drops
duplicates by idempotence key (per (query, source partition) the key (source_offset, index) must
increase), decodes term ids and maintains multiplicities.  Answers of a query go to the partition of
deltas.parts it came from (both keyed by query id), so a partition's state is restored by re-reading its
answers partition: n and multiplicities from the records, idempotence keys from their ``cbgp-src`` header --
from the partition's checkpoint's end offset when one serves (``services.answers_checkpoint``), else from 0.
The answers.current key is ``services.codec.current_key`` (canonical JSON ``["<query>", {binding}]``),
shared with the compaction job.

Registration versions: every registration of a query id is its own stream, numbered from n = 1 and told
apart by ``(query, version, n)``; idempotence keys are kept per stream.  queries.plans (read by :class:`Plans`)
and the versions of the deltas end a stream when its query is unregistered or registered again: its current
answers are retracted in it ("-" answers and answers.current tombstones), and its late deltas are dropped.
Restore keeps only each query's latest stream.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from confluent_kafka import Consumer, Message, TopicPartition
from prometheus_client import Gauge

from services import codec
from services.codec import canonical_binding, current_key, term_from_avro
from services.kafka import KafkaSettings, end_offsets, make_producer
from services import answers_checkpoint
from services.answers_inputs import Dictionary, Plans
from services.state import recovery
from services.release import SeqRelease
from services.metrics import ANSWER_LATENCY, DELTAS_EMITTED, record_consumer_lag
from services.idempotence import ORDERED_SOURCE_BELOW
from services.records import WHOLE_QUERY_PART, dead_letter
from services.runner import Step, run_processor
from services.runtime import (ORIGIN_HEADER, GroupInput, Output, kv, origin_ms, read_range, record_ok,
                              service_command)

log = logging.getLogger("cbgp.answers")

NOTHING_SEEN = (-(1 << 64),) * 3  # below every (seq, offset, index) key, whatever a source numbers from

SERVICE = "answers"
SOURCE_HEADER = "cbgp-src"  # "<source_partition>:<source_offset>:<index>" of the PartDelta behind an Answer
HELD_DELTAS = Gauge("cbgp_held_deltas", "By-centre answer deltas held until every routed partition's frontier "
                    "passes their seq (services.release).")
TERM_CACHE_MAX = 1 << 18


@dataclass
class QueryAnswers:
    """The answer stream of one registration (version) of one query."""

    n: int = 0
    current: dict[str, list] = field(default_factory=dict)  # binding json -> [multiplicity, last_n]
    # source partition -> its last idempotence key taken: (seq, offset, index) for routed sources, whose deltas
    # are released in seq order (probes make a partition's offsets and seqs disagree), (-1, offset, index) for
    # the ordered ones
    last_key: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    version: int = 0  # QueryPlan.version of the registration (0: unknown, written before versions: adopted)
    seq: int = 0  # highest seq of its answers (the seq of the retractions that end the stream)


class AnswersCore:
    """Numbering, deduplication, decoding and multiplicities of every query of the assigned partitions."""

    def __init__(self, answers_topic: str, current_topic: str, deadletter_topic: str, source_topic: str) -> None:
        self.t_answers = answers_topic
        self.t_current = current_topic
        self.t_deadletter = deadletter_topic
        self.t_source = source_topic
        self.queries: dict[str, QueryAnswers] = {}
        self.partition_of: dict[str, int] = {}
        self.duplicates = 0
        self.stale = 0  # deltas of a version older than the query's (or of an unregistered one), dropped
        # What queries.plans says (see on_plan): the version of each registered query, and per unregistered or
        # re-registered id the highest version whose stream has ended (its deltas are dropped from then on).
        self.plan_version: dict[str, int] = {}
        self.texts: dict[tuple[str, int], str] = {}  # (query id, version) -> its query (product assemblers)
        self.ended: dict[str, int] = {}
        self.unsettled = False  # a plan or a restore may have left a stream to end: call settle()
        self.emitted: dict[tuple[str, str], object] = {}  # (query, sign) -> its DELTAS_EMITTED child
        # term id -> (canonical JSON, Avro SparqlTerm body): answers repeat terms (ids are stable, so an entry
        # never goes stale; the cache is emptied when full)
        self._terms: dict[int, tuple[str, bytes]] = {}

    def drop_partition(self, partition: int) -> None:
        for name in [q for q, p in self.partition_of.items() if p == partition]:
            del self.queries[name]
            del self.partition_of[name]

    def restore(self, partition: int, value: bytes, headers: dict[str, bytes]) -> None:
        """Re-apply one Answer already produced (restore of the numbering, multiplicities and dedupe keys).

        Only the latest version's stream is kept: an answer of a newer version replaces the state (the older
        stream was ended, or is ended by :meth:`settle`), one of an older version is skipped."""
        record = codec.decode("Answer", value)
        name, version = record["query_id"], record["version"]
        state = self.queries.get(name)
        if state is None or (version > state.version and state.version != 0):
            state = self.queries[name] = QueryAnswers(version=version)
        elif version < state.version and version != 0:
            return
        elif state.version == 0:
            state.version = version  # records written before versions carry on in the first versioned stream
        self.partition_of[name] = partition
        self.unsettled = True
        state.n = max(state.n, record["n"])
        state.seq = max(state.seq, record["seq"])
        src = headers.get(SOURCE_HEADER)
        if src:
            p, offset, index = (int(x) for x in src.decode().split(":"))
            key = (record["seq"] if p >= ORDERED_SOURCE_BELOW else -1, offset, index)
            state.last_key[p] = max(state.last_key.get(p, NOTHING_SEEN), key)
        terms = {var: term_from_avro(t) for var, t in record["binding"].items()}
        key = canonical_binding(terms)
        entry = state.current.setdefault(key, [0, 0])
        entry[0] += 1 if record["sign"] == "+" else -1
        entry[1] = record["n"]
        if entry[0] <= 0:
            del state.current[key]

    def on_record(self, partition: int, offset: int, value: bytes, origin: int | None,
                  lookup: Callable[[int], str | None], deltas: codec.PartDeltaColumns | None = None) -> list[Output]:
        """The outputs of one deltas.parts record (a PartDeltaBatch or one PartDelta): per delta an Answer
        and the new CurrentAnswer (or tombstone); a dead letter for a record that does not decode or names a
        term id the dictionary does not have.  ``deltas``: ``value`` already decoded (``None``: decode here)."""
        if deltas is None:
            try:
                deltas = codec.part_delta_columns(value)
            except codec.CodecError as exc:
                return [self._dead(partition, offset, "schema-mismatch", str(exc), value)]
        if deltas.part != WHOLE_QUERY_PART:
            return []  # one part of a multi-part query: input of the Spark assembly, which sends the answers
        name = deltas.query_id
        out: list[Output] = []
        state = self.queries.get(name)
        # Deltas without a version (the Spark job's, records written before versions) belong to the version
        # the query has now.
        version = deltas.version or (state.version if state is not None else self.plan_version.get(name, 0))
        if self._stale(name, version, state):
            self.stale += len(deltas)  # an unregistered or replaced registration's deltas still in flight
            return out
        if state is None:
            state = self.queries[name] = QueryAnswers(version=version)
        elif version > state.version:
            if state.version:  # a new registration: its stream starts at n = 1, the old one ends
                out.extend(self._end(name, state))
                state = self.queries[name] = QueryAnswers(version=version)
            else:
                state.version = version
        self.partition_of[name] = partition
        variables = deltas.variables
        k = len(variables)
        # Canonical JSON and Avro maps list the variables sorted; terms are looked up once per id.
        order = sorted(range(k), key=variables.__getitem__)
        var_json = [codec.json_string(variables[j]) + ":" for j in order]
        writer = codec.BindingWriter([variables[j] for j in order])
        terms = self._terms
        now = int(time.time() * 1000)
        latency = max(0, now - origin) / 1000 if origin is not None else None
        origin_text = str(origin).encode()
        name_key = name.encode()
        version = state.version
        values, diffs, seqs, snapshots = deltas.values, deltas.diff, deltas.seq, deltas.snapshot
        emitted = {"+": 0, "-": 0}
        for i in range(len(deltas)):
            src = deltas.source_partition[i]
            key = (seqs[i] if src >= ORDERED_SOURCE_BELOW else -1, deltas.source_offset[i], deltas.index[i])
            if key <= state.last_key.get(src, NOTHING_SEEN):
                self.duplicates += 1
                continue
            row = values[i * k:(i + 1) * k]
            encoded: list[tuple[str, bytes]] = []  # (canonical JSON, Avro SparqlTerm body) per sorted variable
            for j in order:
                term = terms.get(row[j])
                if term is None:
                    text = lookup(row[j])
                    if text is None:
                        break
                    if len(terms) >= TERM_CACHE_MAX:
                        terms.clear()
                    term = terms[row[j]] = (codec.json_string(text), writer.term_body(text))
                encoded.append(term)
            if len(encoded) < k:
                missing = order[len(encoded)]
                out.append(self._dead(partition, offset, "unknown-term", f"query {name}: term id {row[missing]} "
                                      f"of ?{variables[missing]} is not in the dictionary", value))
                continue
            state.last_key[src] = key
            state.n += 1
            if seqs[i] > state.seq:
                state.seq = seqs[i]
            sign = "+" if diffs[i] > 0 else "-"  # the Answer record's sign
            emitted[sign] += 1
            headers = [(SOURCE_HEADER, f"{src}:{key[1]}:{key[2]}".encode())]
            if latency is not None:
                headers.append((ORIGIN_HEADER, origin_text))
                ANSWER_LATENCY.observe(latency)
            binding = writer.write([body for _json, body in encoded])
            out.append(Output(self.t_answers, codec.encode_answer_record(
                name, state.n, seqs[i], sign, binding, snapshots[i], now, version), name_key, partition, headers))
            binding_json = "{" + ",".join([vj + tj for vj, (tj, _body) in zip(var_json, encoded)]) + "}"
            entry = state.current.setdefault(binding_json, [0, 0])
            entry[0] += 1 if sign == "+" else -1
            entry[1] = state.n
            ckey = current_key(name, binding_json)
            if entry[0] <= 0:
                if entry[0] < 0:
                    log.warning(kv(event="negative-multiplicity", query=name, binding=binding_json))
                del state.current[binding_json]
                out.append(Output(self.t_current, None, ckey, partition))
            else:
                out.append(Output(self.t_current, codec.encode_current_answer_record(
                    name, binding, entry[0], state.n, version), ckey, partition))
        for sign, count in emitted.items():
            if count:
                counter = self.emitted.get((name, sign))
                if counter is None:  # labels() costs microseconds: once per query and sign
                    counter = self.emitted[(name, sign)] = DELTAS_EMITTED.labels(name, sign)
                counter.inc(count)
        return out

    def _stale(self, name: str, version: int, state: QueryAnswers | None) -> bool:
        """Deltas of ``version`` belong to an ended stream: an older registration, or an unregistered one."""
        if version == 0:  # unversioned, with no stream to join: only a registered query gets a new one
            return state is None and name in self.ended and name not in self.plan_version
        if version <= self.ended.get(name, 0):
            return True
        return state is not None and version < state.version

    def on_plan(self, query_id: str, version: int | None, ended: int | None = None) -> None:
        """One queries.plans record: a plan of ``version``, or (``version`` None) a tombstone, which ends the
        registration ``ended`` (its version when known, else every version this service has seen of the id).
        A stream it ends is retracted by the next :meth:`settle`."""
        if version is not None:
            self.plan_version[query_id] = max(version, self.plan_version.get(query_id, 0))
        else:
            last = self.plan_version.pop(query_id, None)
            if ended is None:
                ended = last
            if ended is None:
                state = self.queries.get(query_id)
                ended = state.version if state is not None else None
            if ended is not None:
                self.ended[query_id] = max(ended, self.ended.get(query_id, 0))
        self.unsettled = True

    def settle(self, partitions: set[int] | None = None) -> list[Output]:
        """End every held stream that queries.plans has left behind: its query was unregistered, or registered
        again with a newer version.  Its current answers are retracted (see :meth:`_end`) and its state is
        forgotten (the ended version is remembered, so its deltas still in flight are dropped).  Only streams
        of ``partitions`` (None: all) are ended; the others wait for a later call."""
        out: list[Output] = []
        if not self.unsettled:
            return out
        self.unsettled = False
        for name in list(self.queries):
            state = self.queries[name]
            if partitions is not None and self.partition_of[name] not in partitions:
                self.unsettled = True  # a revoked partition's state, kept for an unchanged re-assignment
                continue
            registered = self.plan_version.get(name)
            if state.version and (state.version <= self.ended.get(name, 0)
                                  or registered is not None and state.version < registered):
                out.extend(self._end(name, state))
                del self.queries[name]
                del self.partition_of[name]
            elif not state.version and name in self.ended and registered is None:
                out.extend(self._end(name, state))  # a stream from before versions, unregistered
                del self.queries[name]
                del self.partition_of[name]
        return out

    def _end(self, name: str, state: QueryAnswers) -> list[Output]:
        """The end of one registration's stream: a "-" Answer (numbered on in that stream, at the highest seq
        it reached) per unit of multiplicity of each current answer, and its answers.current tombstone; so
        the stream sums to nothing for any reader that folds it (restore, compaction, ``cbgp watch``)."""
        self.ended[name] = max(state.version, self.ended.get(name, 0))
        partition = self.partition_of[name]
        now = int(time.time() * 1000)
        out: list[Output] = []
        for binding_json, (multiplicity, _last_n) in sorted(state.current.items()):
            binding = codec.answer_binding(json.loads(binding_json))
            for _ in range(multiplicity):
                state.n += 1
                out.append(Output(self.t_answers, codec.encode_answer_record(
                    name, state.n, state.seq, "-", binding, False, now, state.version), name.encode(), partition))
            out.append(Output(self.t_current, None, current_key(name, binding_json), partition))
        if state.current:
            log.info(kv(event="stream-ended", query=name, version=state.version, retracted=len(state.current)))
        state.current.clear()
        return out

    def _dead(self, partition: int, offset: int, reason: str, message: str, value: bytes) -> Output:
        return dead_letter(self.t_deadletter, SERVICE, self.t_source, partition, offset, reason, message, value)


# ---------------------------------------------------------------------------------------- Kafka loop


class AnswersService:
    """One life of the answers service: clients, core and release, a processor of the one runner loop
    (:mod:`services.runner`)."""

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
        self.plans = Plans(settings, self.core)
        self.release = SeqRelease(len(end_offsets(settings, settings.topic("updates.routed"))), self._query_text,
                                  self.dictionary.terms)
        self.input: GroupInput | None = None
        self.consumer: Consumer | None = None  # the group member
        self.assigned: set[int] = set()  # partitions whose deltas are processed now
        self.held: set[int] = set()  # partitions whose state is in the core (assigned, or revoked and parked)
        # each held partition's last commit: the next deltas.parts offset and its metadata
        self.commits: dict[int, tuple[int, str]] = {}
        # Checkpoints (services.answers_checkpoint), with the last Answer written to each answers partition
        # (the proof a later restore reads the same log)
        self.checkpoints, self.checkpointer = recovery.shard_checkpoints(
            args, settings, SERVICE, {answers_checkpoint.KIND: "checkpoints.deltas"})
        self.last_answers: dict[int, bytes | None] = {}
        self.unpicklable: set[int] = set()

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
                                on_assign=self.on_assign, on_revoke=self.on_revoke)
        self.consumer = self.input.member

    def poll(self) -> list[Message]:
        assert self.input is not None
        msgs = [m for m in self.input.poll() if record_ok(m, log)]
        self.plans.poll()
        return msgs

    def process(self, msgs: list[Message]) -> Step | None:
        """Per batch:
        1. wait (bounded) for term ids not yet in the dictionary;
        2. release (services.release): Frontier records raise the watermark; a by-centre query's deltas are
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
        outputs: list[Output] = self._checkpoint_records() + self.core.settle(self.assigned)
        offsets: dict[int, int] = {}
        lookup = self.dictionary.terms.get
        release = self.release
        for msg, record in zip(msgs, records):
            partition, offset = msg.partition(), msg.offset()
            if partition not in self.assigned:
                continue
            offsets[partition] = offset + 1
            ready = release.on_record(partition, offset, msg.value(), origin_ms(msg), record)
            if ready is None:  # undecodable: the core dead-letters it
                outputs.extend(self.core.on_record(partition, offset, msg.value(), None, lookup))
                continue
            for source_offset, origin, deltas in ready:
                outputs.extend(self.core.on_record(partition, source_offset, msg.value(), origin, lookup, deltas))
        if not offsets:
            # every delta was of a partition revoked meanwhile
            return Step(outputs) if outputs else None
        # Never past a held delta: a restart re-reads it (see services.release).
        commits = {p: release.commit_position(p, o) for p, o in offsets.items()}
        tps = [TopicPartition(self.t_source, p, o, metadata=m) for p, (o, m) in commits.items()]
        assert self.consumer is not None
        return Step(outputs, [(tps, self.consumer.consumer_group_metadata())],
                    sum(len(deltas) for deltas in records if deltas is not None), commits)

    def committed(self, step: Step) -> None:
        if self.checkpoints is not None:
            self.checkpoints.committed()  # the checkpoint records the step carried: trim the older ones
            self._note_answers(step.outputs)
        if step.offsets or self.checkpoints is None or not self.checkpoints.only_checkpoints(step.outputs):
            self.checkpointer.committed()  # (a transaction of checkpoint records alone changed nothing)
        if step.detail is not None:
            self.commits.update(step.detail)
            HELD_DELTAS.set(self.release.held())
            assert self.input is not None
            record_consumer_lag(self.input.fetcher.consumer, self.input.fetcher.positions)
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
        outputs = self.core.settle(self.assigned)
        if not outputs and self.checkpointer.due():
            self.checkpoint()  # idle: save what the last transactions changed
        outputs += self._checkpoint_records()  # (a transaction of their own, or with the ended streams)
        return Step(outputs) if outputs else None

    def _checkpoint_records(self) -> list[Output]:
        return self.checkpoints.outputs() if self.checkpoints is not None else []

    def checkpoint(self) -> None:
        """Checkpoint every assigned partition (``services.answers_checkpoint``): called once every transaction
        committed, so each partition's state is exactly what its last commit and its answers describe."""
        if self.checkpoints is None or self.consumer is None:
            return
        started = time.monotonic()
        blobs = []
        for partition in sorted(self.assigned & set(self.commits)):
            position, metadata = self.commits[partition]
            _low, answers_end = self.consumer.get_watermark_offsets(TopicPartition(self.t_answers, partition),
                                                                    timeout=30)
            blob = answers_checkpoint.partition_blob(self.core, self.release, partition, position, metadata,
                                                     answers_end, self.last_answers.get(partition),
                                                     warn=partition not in self.unpicklable)
            if blob is not None:
                needs = {"answers": answers_checkpoint.answers_needed(answers_end)}  # (for `cbgp topics floor`)
                blobs.append((answers_checkpoint.KIND, partition, blob, position, needs))
            else:
                self.unpicklable.add(partition)  # (said once)
        saved = self.checkpoints.save(blobs)
        if saved is None:  # the store failed (said in one line): no more checkpoints
            self.checkpoints = None
            return
        self.checkpointer.saved()
        if saved:
            log.info(kv(event="checkpoint", partitions=saved, seconds=f"{time.monotonic() - started:.3f}"))

    def close(self, clean: bool = True) -> None:
        if clean and self.checkpointer.unsaved:
            self.checkpoint()  # a clean stop: every transaction committed
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
        text = self.core.texts.get((query_id, version))
        if text is None:
            self.plans.load()
            text = self.core.texts.get((query_id, version))
        return text


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
    """Add ``cbgp answers`` to the CLI (called by ``services.cli``, which assembles the commands)."""
    return service_command(commands, SERVICE, "number deltas and maintain current answers (service)",
                           lambda settings, args, stopper, ready: run_processor(AnswersService(settings, args), stopper, ready),
                           batch=1000,
                           batch_help="deltas.parts records per transaction (a worker's record holds many deltas)",
                           configure=lambda parser: recovery.add_state_flags(
                               parser, SERVICE, "each deltas.parts partition's answer streams and released state"))
