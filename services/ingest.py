"""The ingest service: raw updates -> the total order of effective, dictionary-encoded changes.

Topology (``cbgp ingest``)::

    updates.raw (1 partition) --[IngestProcessor]--> dictionary      (key term id, partition id % N)
                                                 --> updates.encoded (the total order, seq 1, 2, 3 ...,
                                                                      in EncodedBatch records)
                                                 --> updates.routed  (partition id % N of subject/object,
                                                                      in RoutedBatch records)
                                                 --> deadletter      (one record per rejected statement)

:class:`IngestProcessor` is the whole transform, with no Kafka in it: it maps raw records to output
records and updates its state (presence set, next seq, dictionary cache).  Changes are batched: ``accept``
returns what must be produced at once (dictionary entries, dead letters) and buffers the changes, ``flush``
returns them as batch records (at most MAX_BATCH_CHANGES changes each) -- once per transaction.
:func:`run` wraps it in a transactional consume-process-produce loop.  Its state is a pure function of updates.encoded (presence
set, seq) and the dictionary topic: the two logs are its changelogs.  A local checkpoint (``--state-dir``, a RocksDB
store: :mod:`services.state`) saves the state with the positions in those logs that it reflects, so a restore loads
it and reads only the logs' tails (:func:`restore`); without one it reads them from offset 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from confluent_kafka import Consumer, Message, TopicPartition
from prometheus_client import Counter

from cbgp.inputs import FORMATS, InputError, detect_format, parse_input, parse_term
from cbgp.update import UPDATE_FORMAT, UpdateDelta, UpdateExtractor, UpdateRequestError
from cbgp.terms import DEFAULT_GRAPH_ID, TermCollisionError, TermDictionary, TermError, to_oxigraph
from services import codec
from services.kafka import KafkaSettings, end_offsets, make_producer
from services.metrics import PROCESSING_LATENCY, UPDATES_IN, UPDATES_OUT, record_consumer_lag
from services.records import dead_letter, routes
from services.runtime import (ORIGIN_HEADER, GroupInput, Output, Stopper, commit_transaction, kv, read_range,
                              service_command)
from services.state import Checkpoint, Checkpointer, Store, StoreError, presence, recovery

log = logging.getLogger("cbgp.ingest")

SERVICE = "ingest"
# Inserts of present quads and deletes of absent ones: not errors (users send them), but worth watching.
NOOP_UPDATES = Counter("cbgp_ingest_noop_updates", "Updates dropped by set semantics.", ["op"])
NOOP_ADD, NOOP_DEL = NOOP_UPDATES.labels("ADD"), NOOP_UPDATES.labels("DEL")  # hoisted: labels() is slow per call


@dataclass(slots=True)
class RawRecord:
    """What ingest needs of a consumed record (so the processor can be driven without Kafka)."""

    value: bytes | None
    headers: dict[str, bytes] = field(default_factory=dict)
    topic: str = "updates.raw"
    partition: int = 0
    offset: int = 0
    timestamp_ms: int = 0


class GraphMirror:
    """The current graph in a pyoxigraph store, for the WHERE clauses of SPARQL Update requests.

    Built from the presence set on the first request and then kept in step with every effective change,
    so a request sees exactly the graph the fleet has emitted -- and users who never send requests pay
    nothing.  It is derived state: a new service life rebuilds it from the restored log, so it cannot
    drift from updates.encoded (the durable copy of the graph).
    """

    def __init__(self, dictionary: TermDictionary) -> None:
        self.dictionary = dictionary
        self.store = None
        self.extractor = None
        self._terms: dict[int, object] = {}

    def _term(self, term_id: int):  # noqa: ANN202 - a pyoxigraph term
        found = self._terms.get(term_id)
        if found is None:
            found = self._terms[term_id] = to_oxigraph(self.dictionary.decode(term_id))
        return found

    def _quad(self, quad: tuple[int, int, int, int]):  # noqa: ANN202
        import pyoxigraph as ox

        s, p, o, g = quad
        graph = ox.DefaultGraph() if g == DEFAULT_GRAPH_ID else self._term(g)
        return ox.Quad(self._term(s), self._term(p), self._term(o), graph)

    @property
    def active(self) -> bool:
        return self.store is not None

    def build(self, present: set[tuple[int, int, int, int]]) -> None:
        import pyoxigraph as ox

        self.store = ox.Store()
        self.store.extend(self._quad(q) for q in present)
        self.extractor = UpdateExtractor(self.store)

    def apply(self, op: int, quad: tuple[int, int, int, int]) -> None:
        if op > 0:
            self.store.add(self._quad(quad))
        else:
            self.store.remove(self._quad(quad))

    def update(self, request: str) -> UpdateDelta:
        """Apply a request atomically (UpdateRequestError: nothing changed) and return its real delta."""
        return self.extractor.apply(request)


class IngestProcessor:
    """Raw record -> outputs, with set semantics, stable dictionary ids, seq numbering and routing."""

    def __init__(self, settings: KafkaSettings, routed_partitions: int, dictionary_partitions: int) -> None:
        self.settings = settings
        self.n_routed = routed_partitions
        self.n_dictionary = dictionary_partitions
        self.present: set[tuple[int, int, int, int]] = set()
        self.dictionary = TermDictionary(stable=True)
        self.known = self.dictionary.ids  # every term in it is published (_encode publishes it at once)
        self.published: set[int] = set()  # ids already on the dictionary topic
        self.seq = 0  # seq of the last effective change
        self.frontier_sent = 0  # seq of the last Frontier records written to updates.routed
        self.graph = GraphMirror(self.dictionary)
        self.t_dictionary = settings.topic("dictionary")
        self.t_encoded = settings.topic("updates.encoded")
        self.t_routed = settings.topic("updates.routed")
        self.t_deadletter = settings.topic("deadletter")
        self.t_raw = settings.topic("updates.raw")
        # Changes since the last flush(): encoded rows, routed rows per partition, earliest origin time.
        self.pending_encoded: list[tuple] = []
        self.pending_routed: dict[int, list[tuple]] = {}
        self.pending_origin: int | None = None
        # What changed since the last checkpoint (kept only when a store is used: ``track_changes``): each quad
        # whose presence changed -> present now, and the terms published.
        self.track_changes = False
        self.changed: dict[tuple[int, int, int, int], bool] = {}
        self.new_terms: list[tuple[int, str]] = []

    # -- restore

    def restore_encoded(self, value: bytes) -> int:
        """Re-apply one record of the changelog (updates.encoded) to the state; return its first seq (-1: none).

        Re-applying records the state already reflects changes nothing (each quad ends as its last change says),
        so a restore may start below the true position of a checkpoint, never above it."""
        changes = codec.encoded_changes(value)
        changed = self.changed if self.track_changes else None
        for seq, sign, s, p, o, g, _event_time, refresh in changes:
            if refresh:
                continue  # a repeated insert of a present quad: no change to the set
            quad = (s, p, o, g)
            if sign > 0:
                self.present.add(quad)
            else:
                self.present.discard(quad)
            if changed is not None:
                changed[quad] = sign > 0
            self.seq = max(self.seq, seq)
        return changes[0][0] if changes else -1

    def restore_dictionary(self, record: dict) -> None:
        self.dictionary.add(record["id"], record["term"])
        if record["id"] not in self.published:
            self.published.add(record["id"])
            if self.track_changes:
                self.new_terms.append((record["id"], record["term"]))

    def load_state(self, present: set[tuple[int, int, int, int]], terms: Iterable[tuple[int, str]], seq: int) -> None:
        """Start from a checkpoint's state (nothing of it counts as changed)."""
        self.present = present
        for term_id, term in terms:
            self.dictionary.add(term_id, term)
            self.published.add(term_id)
        self.seq = seq

    def take_changes(self) -> tuple[dict[tuple[int, int, int, int], bool], list[tuple[int, str]]]:
        """The changes since the last call (for a checkpoint), forgotten here."""
        changed, new_terms = self.changed, self.new_terms
        self.changed, self.new_terms = {}, []
        return changed, new_terms

    # -- transform

    def process(self, raw: RawRecord) -> list[Output]:
        """Every output of one raw record, its changes flushed (for tests and tools)."""
        return self.accept(raw) + self.flush()

    def flush(self) -> list[Output]:
        """The changes accepted since the last flush, as EncodedBatch and RoutedBatch records."""
        if not self.pending_encoded:
            return []
        if self.track_changes:
            changed = self.changed
            for row in self.pending_encoded:
                if not row[9]:  # a refresh row changes nothing
                    changed[row[2:6]] = row[1] > 0
        headers = [(ORIGIN_HEADER, str(self.pending_origin).encode())] if self.pending_origin is not None else []
        out = [Output(self.t_encoded, codec.encode_encoded_batch(rows, self.t_raw), None, 0, headers)
               for rows in _chunks(self.pending_encoded)]
        for partition, routed in sorted(self.pending_routed.items()):
            out.extend(Output(self.t_routed, codec.encode_routed_batch(rows), None, partition, headers)
                       for rows in _chunks(routed))
        if self.seq > self.frontier_sent:
            # Every routed partition, with changes or not, learns that it holds all changes up to self.seq:
            # idle partitions move too, so the answers service can release by-centre deltas in seq order.
            out.extend(Output(self.t_routed, codec.encode_frontier({partition: self.seq}), None, partition)
                       for partition in range(self.n_routed))
            self.frontier_sent = self.seq
        self.pending_encoded, self.pending_routed, self.pending_origin = [], {}, None
        return out

    def accept(self, raw: RawRecord) -> list[Output]:
        """Take one raw record: return what to produce now (dictionary entries before the batches that use
        them, dead letters); its changes wait for :meth:`flush`."""
        out: list[Output] = []
        if raw.value is None or raw.value == b"":
            self._dead(out, raw, "empty", "empty record value: nothing to ingest", None)
            return out
        origin = raw.timestamp_ms
        if raw.value[:2] == codec.MAGIC:
            self._avro(out, raw, origin)
            return out
        fmt = self._format(raw)
        if fmt is None:
            return self._dead(out, raw, "unknown-format", "cannot tell the input format from headers "
                              f"content-type={raw.headers.get('content-type', b'')!r} cbgp-format="
                              f"{raw.headers.get('cbgp-format', b'')!r}; use one of {', '.join(FORMATS)}", None)
        if fmt == UPDATE_FORMAT:
            self._update_request(out, raw, origin)
            return out
        for item in parse_input(raw.value, fmt):
            if isinstance(item, InputError):
                reason = "invalid-utf8" if item.message.startswith("invalid UTF-8") else "malformed-rdf"
                self._dead(out, raw, reason, f"line {item.line}: {item.message}", item.line)
                continue
            self._change(out, raw, origin, item.op, item.s, item.p, item.o, item.g, None, item.line)
        return out

    def _update_request(self, out: list[Output], raw: RawRecord, origin: int | None) -> None:
        """A SPARQL 1.1 Update request: apply it atomically to the current graph; emit the quads it really
        inserted and deleted (seed paper 004).  A failing request changes nothing and is dead-lettered."""
        try:
            request = raw.value.decode("utf-8")
        except UnicodeDecodeError as exc:
            self._dead(out, raw, "invalid-utf8", f"SPARQL Update request is not UTF-8 (byte {exc.start})", None)
            return
        if not self.graph.active:
            self.graph.build(self.present)
        try:
            delta = self.graph.update(request)
        except UpdateRequestError as exc:
            self._dead(out, raw, "invalid-update", str(exc), None)
            return
        for s, p, o, g in delta.deleted:
            self._change(out, raw, origin, -1, s, p, o, g, None, None, mirrored=True)
        for s, p, o, g in delta.inserted:
            self._change(out, raw, origin, 1, s, p, o, g, None, None, mirrored=True)

    def _format(self, raw: RawRecord) -> str | None:
        for header in ("cbgp-format", "content-type"):
            value = raw.headers.get(header)
            if value:
                media = value.decode("utf-8", "replace").split(";", 1)[0].strip().lower()
                if media in (UPDATE_FORMAT, "application/sparql-update"):
                    return UPDATE_FORMAT
                try:
                    return detect_format(value.decode("utf-8", "replace"))
                except ValueError:
                    return None
        return "jsonl" if raw.value.lstrip()[:1] == b"{" else "patch"

    def _avro(self, out: list[Output], raw: RawRecord, origin: int | None) -> None:
        try:
            record = codec.decode("RawUpdate", raw.value)
        except codec.CodecError as exc:
            self._dead(out, raw, "schema-mismatch", str(exc), None)
            return
        terms = []
        for name in ("s", "p", "o", "g"):
            text = record[name]
            if text is None:
                terms.append(None)
                continue
            try:
                terms.append(parse_term(text))
            except TermError as exc:
                self._dead(out, raw, "malformed-rdf", f"RawUpdate.{name}: {exc}", None)
                return
        op = 1 if record["op"] == "ADD" else -1
        self._change(out, raw, origin, op, *terms, record["event_time_ms"], None)

    def _change(self, out: list[Output], raw: RawRecord, origin: int | None, op: int, s: str, p: str,
                o: str, g: str | None, event_time_ms: int | None, line: int | None, mirrored: bool = False) -> None:
        """One parsed change: validate positions, encode, apply set semantics, emit encoded + routed.

        `mirrored`: the change is already in the graph mirror (it came from a SPARQL Update request).
        """
        problem = _position_problem(s, p, o, g)
        if problem:
            self._dead(out, raw, "malformed-rdf", (f"line {line}: " if line else "") + problem, line)
            return
        known = self.known
        s_id, p_id, o_id = known.get(s), known.get(p), known.get(o)
        if s_id is None or p_id is None or o_id is None or g is not None:
            # Some term is new (known terms were checked and published when first seen).
            longest = max(len(s), len(p), len(o), len(g or ""))
            if longest > MAX_TERM_CHARS:
                self._dead(out, raw, "term-too-large", (f"line {line}: " if line else "") +
                           f"a term of {longest:,} characters is over the {MAX_TERM_CHARS:,} limit "
                           "(answers carrying it would not fit in a Kafka record)", line)
                return
            try:
                s_id, p_id, o_id = (self._encode(out, term) for term in (s, p, o))
                gid = DEFAULT_GRAPH_ID if g is None else self._encode(out, g)
            except TermCollisionError as exc:
                self._dead(out, raw, "term-collision", str(exc), line)
                return
        else:
            gid = DEFAULT_GRAPH_ID
        quad = (s_id, p_id, o_id, gid)
        if event_time_ms is None and raw.timestamp_ms is not None and raw.timestamp_ms >= 0:
            event_time_ms = raw.timestamp_ms  # the Kafka record's time is the event time unless one was given
        if origin is not None and (self.pending_origin is None or origin < self.pending_origin):
            self.pending_origin = origin
        if op > 0:
            if quad in self.present:
                NOOP_ADD.inc()
                # no change to the graph, but event-time windows must see the newer time (spark.windows)
                self.pending_encoded.append((self.seq, 1, *quad, event_time_ms, raw.partition, raw.offset, True))
                return
            self.present.add(quad)
        else:
            if quad not in self.present:
                NOOP_DEL.inc()
                return
            self.present.discard(quad)
        if self.graph.active and not mirrored:
            self.graph.apply(op, quad)
        self.seq += 1
        seq = self.seq
        self.pending_encoded.append((seq, op, *quad, event_time_ms, raw.partition, raw.offset, False))
        pending = self.pending_routed
        for partition, role in routes(s_id, o_id, self.n_routed):
            pending.setdefault(partition, []).append((seq, op, *quad, event_time_ms, role))

    def routes(self, s: int, o: int) -> tuple[tuple[int, str], ...]:
        """``(routed partition, role)`` pairs of a change with subject ``s`` and object ``o``
        (:func:`services.records.routes`, which :meth:`process` runs)."""
        return routes(s, o, self.n_routed)

    def _encode(self, out: list[Output], term: str) -> int:
        term_id = self.dictionary.encode(term)
        if term_id not in self.published:
            self.published.add(term_id)
            if self.track_changes:
                self.new_terms.append((term_id, term))
            out.append(Output(self.t_dictionary, codec.encode("DictionaryEntry", {"id": term_id, "term": term}),
                              str(term_id).encode(), term_id % self.n_dictionary))
        return term_id

    def _dead(self, out: list[Output], raw: RawRecord, reason: str, message: str, line: int | None) -> list[Output]:
        out.append(dead_letter(self.t_deadletter, SERVICE, raw.topic, raw.partition, raw.offset, reason, message,
                               raw.value, line))
        return out


MAX_BATCH_CHANGES = 2000  # changes per batch record (~80 KB): far below Kafka's 1 MB default record limit


def _chunks(rows: list[tuple]) -> Iterator[list[tuple]]:
    for start in range(0, len(rows), MAX_BATCH_CHANGES):
        yield rows[start:start + MAX_BATCH_CHANGES]


# Downstream records (answers, current answers) carry terms whole and Kafka's default record limit is ~1 MB:
# a larger term would make the answers service's transaction fail forever, so it is refused here instead.
MAX_TERM_CHARS = 512 * 1024


def _position_problem(s: str, p: str, o: str, g: str | None) -> str | None:
    """Why a parsed quad is not RDF (Avro RawUpdate terms are parsed one by one, so check positions)."""
    if s.startswith('"'):
        return f"subject must be an IRI or blank node, got literal {s[:80]}"
    if not p.startswith("<"):
        return f"predicate must be an IRI, got {p[:80]}"
    if g is not None and g.startswith('"'):
        return f"graph name must be an IRI or blank node, got literal {g[:80]}"
    return None


# ---------------------------------------------------------------------------------------- Kafka loop


def restore(processor: IngestProcessor, settings: KafkaSettings, store: Store | None = None) -> dict[str, dict[int, int]]:
    """Rebuild the state: from the checkpoint in ``store`` when it can serve (:func:`services.state.unusable`)
    plus the tails of updates.encoded and dictionary after its positions, else from offset 0 of both logs.
    Returns the positions the restored state reflects (the logs' ends when the restore began).

    The logs are read from where the state needs them, never from their low watermarks: ``read_range`` refuses a
    log whose needed records were deleted (:class:`LogTruncated`), so with a checkpoint retention may delete what
    lies below its positions, and without one nothing may be deleted.  A checkpoint that cannot belong to these
    logs (beyond their ends, other topics, or a tail whose first seq does not follow it) is discarded with one
    log line and the restore starts again from offset 0 (:mod:`services.state.recovery`).
    """
    started = time.monotonic()
    watermarks = {topic: end_offsets(settings, topic) for topic in (processor.t_encoded, processor.t_dictionary)}
    ends = {topic: {p: high for p, (_low, high) in parts.items()} for topic, parts in watermarks.items()}
    checkpoint = recovery.saved_checkpoint(store, watermarks, ("seq",)) if store is not None else None
    processor.track_changes = store is not None
    if checkpoint is not None:
        processor.load_state(presence.load_present(store), presence.load_terms(store), int(checkpoint.facts["seq"]))
        log.info(kv(event="checkpoint-loaded", seq=processor.seq, present=len(processor.present),
                    terms=len(processor.published), positions=checkpoint.describe(),
                    seconds=round(time.monotonic() - started, 2)))
        starts = checkpoint.positions
    else:
        starts = {topic: {p: 0 for p in parts} for topic, parts in ends.items()}
    follows = [checkpoint is not None]  # the first encoded change read must follow the checkpoint's seq

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
            processor.restore_dictionary(codec.decode("DictionaryEntry", msg.value()))

    try:
        tail = recovery.read_tails(settings, starts, ends, apply, label="0")  # the raw partition whose state it is
    except recovery.ForeignLog as exc:
        recovery.discard(store, str(exc))  # type: ignore[arg-type]
        processor.__init__(settings, processor.n_routed, processor.n_dictionary)  # type: ignore[misc]
        return restore(processor, settings, store)  # the store is empty now: from offset 0
    log.info(kv(event="restored", seq=processor.seq, present=len(processor.present), terms=len(processor.published),
                from_checkpoint=checkpoint is not None, tail_records=tail,
                seconds=round(time.monotonic() - started, 2)))
    return ends


def save_checkpoint(processor: IngestProcessor, store: Store, ends: dict[str, dict[int, int]]) -> Checkpoint:
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
    checkpoint = Checkpoint(ends, {"seq": processor.seq, "present": len(processor.present),
                                   "terms": len(processor.published)}, int(time.time() * 1000))
    puts, deletes = presence.changes(processor.changed, processor.new_terms)
    store.commit(puts, deletes, checkpoint.to_json())
    processor.take_changes()  # only once written: a failed write keeps them for the next attempt
    return checkpoint


def run(settings: KafkaSettings, args: argparse.Namespace, stopper: Stopper, ready: list[bool]) -> None:
    """One life of the service: consume-process-produce until stopped, with the state restored from the logs
    when partitions are assigned (``on_assign``).

    Steps per batch (exactly-once):
    1. poll up to ``--batch`` raw records;
    2. transform them with the processor (state changes in memory only);
    3. one transaction: dictionary entries, encoded, routed and dead letters, then the raw offsets;
    4. on failure the transaction is aborted and :class:`TransactionFailed` propagates: ``run_service``
       starts a new life, which restores the state from the committed logs, so nothing half-done survives;
    5. after a commit, at most every ``--checkpoint-interval`` seconds (and when idle or stopping), the state is
       checkpointed to the store under ``--state-dir`` (:func:`save_checkpoint`): never before its transaction
       committed, so a checkpoint never holds a change the logs lack.
    """
    # Partition counts come from the broker, not the flags: routing must match the topics as they exist.
    partitions = (len(end_offsets(settings, settings.topic("updates.routed"))),
                  len(end_offsets(settings, settings.topic("dictionary"))))
    processor = IngestProcessor(settings, *partitions)
    raw_topic = settings.topic("updates.raw")
    group = args.group or f"{settings.topic_prefix}ingest"
    producer = make_producer(settings, transactional_id=f"{group}.{args.instance_id}")
    consumer: GroupInput | None = None
    store = (recovery.open_store(args.state_dir, f"{settings.topic_prefix}{SERVICE}-{args.instance_id}")
             if args.checkpoint_interval >= 0 else None)
    checkpointer = Checkpointer(max(args.checkpoint_interval, 0.0))
    logs = {processor.t_encoded: sorted(end_offsets(settings, processor.t_encoded)),
            processor.t_dictionary: list(range(partitions[1]))}
    watermarks = Consumer(settings.consumer_config(f"{settings.topic_prefix}watermarks")) if store else None

    def checkpoint(ends: dict[str, dict[int, int]] | None = None) -> None:
        nonlocal store
        if store is None:
            return
        try:
            saved = save_checkpoint(processor, store, ends or recovery.log_ends(watermarks, logs))
        except StoreError as exc:  # a full or broken disk: keep serving, restores will read more of the logs
            log.warning(kv(event="checkpoints-off", reason=str(exc)))
            store.close()
            store, processor.track_changes = None, False
            processor.take_changes()
            return
        checkpointer.saved()
        log.info(kv(event="checkpoint", seq=saved.facts["seq"], present=saved.facts["present"],
                    terms=saved.facts["terms"], positions=saved.describe()))
    positions: dict[int, int] = {}  # next raw offset per partition that the processor's state includes
    owned: set[int] = set()  # raw partitions assigned now

    def on_assign(_member: Consumer, assigned: list[TopicPartition]) -> None:
        # The state is global (one order, one presence set), so it is rebuilt whenever any assigned raw
        # partition was processed elsewhere since this life last saw it: at the start of every life, and when
        # a standby replica takes over.  An unchanged re-assignment keeps it.
        nonlocal processor
        committed = {tp.partition: tp.offset for tp in assigned}  # GroupInput passes the committed offsets
        if any(positions.get(p) != offset for p, offset in committed.items()):
            processor = IngestProcessor(settings, *partitions)
            ends = restore(processor, settings, store)
            if processor.changed or processor.new_terms:
                checkpoint(ends)  # what the tail added: the next restore need not read it again
            positions.clear()
            positions.update(committed)
        owned.clear()
        owned.update(committed)

    def on_revoke(_member: Consumer, revoked: list[TopicPartition]) -> None:
        owned.difference_update(tp.partition for tp in revoked)  # nothing of theirs is processed from here on

    try:
        consumer = GroupInput(settings, group, [raw_topic], args.batch, on_assign=on_assign, on_revoke=on_revoke)
        ready[0] = True
        updates_in, updates_out = UPDATES_IN.labels(SERVICE), UPDATES_OUT.labels(SERVICE)
        latency = PROCESSING_LATENCY.labels(SERVICE)
        while not stopper.stopping:
            msgs = [m for m in consumer.poll() if m.error() is None]
            if not msgs:
                if checkpointer.due():
                    checkpoint()  # idle: save what the last transactions changed
                continue
            started = time.monotonic()
            outputs: list[Output] = []
            offsets: dict[int, int] = {}
            for msg in msgs:
                if msg.partition() not in owned:
                    continue  # revoked meanwhile
                ts_type, ts = msg.timestamp()
                headers = msg.headers()
                raw = RawRecord(msg.value(), {k: v for k, v in headers if v is not None} if headers else {},
                                msg.topic(), msg.partition(), msg.offset(), ts if ts > 0 else int(time.time() * 1000))
                outputs.extend(processor.accept(raw))
                offsets[msg.partition()] = msg.offset() + 1
            if not offsets:
                continue
            outputs.extend(processor.flush())
            tps = [TopicPartition(raw_topic, p, o) for p, o in offsets.items()]
            commit_transaction(producer, outputs, [(tps, consumer.consumer_group_metadata())])
            checkpointer.committed()
            if checkpointer.due():
                checkpoint()
            positions.update(offsets)
            updates_in.inc(len(msgs))
            updates_out.inc(len(outputs))
            latency.observe(time.monotonic() - started)
            record_consumer_lag(consumer.fetcher.consumer, consumer.fetcher.positions)
        if checkpointer.unsaved:
            checkpoint()  # a clean stop: every transaction committed, so the next life starts from here
    finally:
        ready[0] = False
        if consumer is not None:
            consumer.close()  # leaves the group now rather than after the session timeout
        producer.flush(5)
        if watermarks is not None:
            watermarks.close()
        if store is not None:
            store.close()


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", default=os.environ.get("CBGP_STATE_DIR", ".run/state"), metavar="DIR",
                        help="where the state checkpoint is kept, in <prefix>ingest-<instance-id> (default "
                             "$CBGP_STATE_DIR or .run/state; empty: no checkpoints, restores read the logs from 0)")
    parser.add_argument("--checkpoint-interval", type=float, default=10.0, metavar="SECONDS",
                        help="at most this often under load, checkpoint the state after a committed transaction "
                             "(default 10; 0: after every transaction; negative: never)")


def register(commands: argparse._SubParsersAction) -> dict:
    """Add ``cbgp ingest`` to the CLI (called by ``services.cli``, which assembles the commands)."""
    return service_command(commands, SERVICE, "parse, deduplicate, encode and route raw updates (service)", run,
                           batch=500, batch_help="raw records per transaction", configure=_configure)


def replay_outputs(processor: IngestProcessor, records: Iterable[RawRecord]) -> list[Output]:
    """Drive the processor over ``records`` (for tests and tools: the TopologyTestDriver idea)."""
    out: list[Output] = []
    for record in records:
        out.extend(processor.accept(record))
    return out + processor.flush()
