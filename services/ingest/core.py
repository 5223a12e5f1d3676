"""Ingest's record transform, with no Kafka client in it: raw records -> dictionary entries, the total order of
effective, dictionary-encoded changes, their routing, and dead letters (the service's loop is ``services.ingest.service``).

:class:`IngestProcessor` maps raw records to output records and updates its state (presence set, next seq,
dictionary cache).  Changes are batched: ``accept`` returns what must be produced at once (dictionary entries,
dead letters) and buffers the changes, ``flush`` returns them as batch records (at most MAX_BATCH_CHANGES changes
each) -- once per transaction.  Its state is a pure function of updates.encoded (presence set, seq) and the
dictionary topic, its changelogs; with ``track_changes`` it also keeps what changed since the last checkpoint.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Protocol

from prometheus_client import Counter

from cbgp.change import INSERT, ROLE_BOTH, Change, change_of, routes
from cbgp.inputs.formats import FORMATS, InputError, detect_format, parse_input, parse_term
from cbgp.inputs.sparql_update import UPDATE_FORMAT, UpdateDelta, UpdateExtractor, UpdateRequestError
from cbgp.query.limits import limit
from cbgp.terms import (DEFAULT_GRAPH_ID, DEFAULT_MAX_TERM_BYTES, MAX_TERM_SETTING, TermCollisionError,
                        TermDictionary, TermError, to_oxigraph)
from services import codec
from services.wire.failures import ConsecutiveFailures
from services.wire.records import ORIGIN_HEADER, Output, dead_letter
from services.state.ondisk import DiskPresence, DiskPublished, DiskTerms
from services.state.presence import Presence
from services.state.store import Store
from services.ingest.where import isolation

SERVICE = "ingest"
# Inserts of present quads and deletes of absent ones: not errors (users send them), but worth watching.
log = logging.getLogger("cbgp.ingest")
# At most this many dead letters per raw record, then one that says how many more (a record of 10,000 bad lines
# makes 101 dead letters, not 10,000).
DEAD_PER_RECORD_SETTING, DEFAULT_DEAD_PER_RECORD = "CBGP_MAX_DEAD_LETTERS_PER_RECORD", 100
NOOP_UPDATES = Counter("cbgp_ingest_noop_updates", "Updates dropped by set semantics.", ["op"])
NOOP_ADD, NOOP_DEL = NOOP_UPDATES.labels("ADD"), NOOP_UPDATES.labels("DEL")  # hoisted: labels() is slow per call


class TopicNames(Protocol):
    """What the core needs of the Kafka settings: the full name of a fleet topic (``KafkaSettings`` is one)."""

    def topic(self, name: str) -> str: ...


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

    TERM_CACHE = 1 << 20  # pyoxigraph terms kept for the next changes; the cache is emptied when full

    def __init__(self, dictionary: TermDictionary) -> None:
        self.dictionary = dictionary
        self.store = None
        self.extractor = None
        self.path: Path | None = None  # on disk (ingest --state-on-disk): a graph larger than memory
        self._terms: dict[int, object] = {}

    def _term(self, term_id: int):  # noqa: ANN202 - a pyoxigraph term
        found = self._terms.get(term_id)
        if found is None:
            if len(self._terms) >= self.TERM_CACHE:
                self._terms.clear()
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

    def build(self, present: Iterable[tuple[int, int, int, int]]) -> None:
        import pyoxigraph as ox

        if self.path is None:
            self.store = ox.Store()
        else:  # derived state: made again from the presence set, never restored
            shutil.rmtree(self.path, ignore_errors=True)
            self.store = ox.Store(str(self.path))
        self.store.bulk_extend(self._quad(q) for q in present)
        # A WHERE clause that may run away is read in a bounded child (services.ingest.where)
        self.extractor = UpdateExtractor(self.store, isolate=isolation(self.store, self.path))

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

    def __init__(self, settings: TopicNames, routed_partitions: int, dictionary_partitions: int) -> None:
        self.settings = settings
        self.n_routed = routed_partitions
        self.n_dictionary = dictionary_partitions
        self.present: Presence = {}  # each present quad -> the seq of the insert that made it present
        self.dictionary = TermDictionary(stable=True)
        self.known = self.dictionary.ids  # every term in it is published (_encode publishes it at once)
        self.published: set[int] = set()  # ids already on the dictionary topic
        self.seq = 0  # seq of the last effective change
        self.frontier_sent = 0  # seq of the last Frontier records written to updates.routed
        self.graph = GraphMirror(self.dictionary)
        self.failures = ConsecutiveFailures(SERVICE)
        self.max_term_bytes = limit(MAX_TERM_SETTING, DEFAULT_MAX_TERM_BYTES)
        self.max_dead_per_record = limit(DEAD_PER_RECORD_SETTING, DEFAULT_DEAD_PER_RECORD)
        self._record_dead, self._record_lines = 0, None
        self._source, self._record_time = (0, 0), None  # the record being taken: its place, its Kafka time
        self.t_dictionary = settings.topic("dictionary")
        self.t_encoded = settings.topic("updates.encoded")
        self.t_routed = settings.topic("updates.routed")
        self.t_deadletter = settings.topic("deadletter")
        self.t_raw = settings.topic("updates.raw")
        # Changes since the last flush(): encoded rows, routed rows per partition, earliest origin time.
        self.pending_encoded: list[Change] = []
        self.pending_sources: list[tuple[int, int]] = []  # (raw partition, offset) of each pending_encoded change
        # per routed partition: its changes (the encoded Change objects themselves) and each one's role there
        self.pending_routed: dict[int, tuple[list[Change], list[int]]] = {}
        self.pending_deleted: dict[int, int] = {}  # seq of each pending delete -> the seq of the insert it undoes
        self.pending_origin: int | None = None
        self.pending_terms: list[tuple[int, str]] = []  # (id, term) of each term published since the last flush
        # What changed since the last checkpoint (kept only when a store is used: ``track_changes``): each quad
        # whose presence changed -> the seq of its insert, or None when absent now, and the terms published.
        self.track_changes = False
        self.changed: dict[tuple[int, int, int, int], int | None] = {}
        self.new_terms: list[tuple[int, str]] = []
        self.disk_terms: DiskTerms | None = None  # --state-on-disk (use_disk): the state in the store

    def use_disk(self, store: Store, present: int, terms: int) -> None:
        """Keep the presence set and the published terms in ``store`` (holding ``present`` quads and ``terms``
        terms as of its checkpoint), not in memory: see :mod:`services.state.ondisk`."""
        self.present = DiskPresence(store, present)  # type: ignore[assignment]
        self.disk_terms = DiskTerms(store, terms)
        self.dictionary = self.graph.dictionary = self.disk_terms  # type: ignore[assignment]
        self.graph.path = Path(f"{store.path}.graph")
        self.known = self.disk_terms.ids
        self.published = DiskPublished(self.disk_terms)  # type: ignore[assignment]
        self.track_changes = False  # what changed is the overlay itself

    def unsaved(self) -> tuple[dict[tuple[int, int, int, int], int | None], list[tuple[int, str]]]:
        """What changed since the last checkpoint: quads -> insert seq or None, and the terms published."""
        if self.disk_terms is not None:
            return self.present.overlay, list(self.disk_terms.pending.items())  # type: ignore[attr-defined]
        return self.changed, self.new_terms

    def saved(self) -> None:
        """What :meth:`unsaved` returned is in the store now: forget it."""
        if self.disk_terms is not None:
            self.present.saved()  # type: ignore[attr-defined]
            self.disk_terms.saved()
        else:
            self.take_changes()

    def _published_now(self, term_id: int, term: str) -> None:
        if self.disk_terms is None:
            self.published.add(term_id)
        else:
            self.disk_terms.publish(term_id, term)
        if self.track_changes:
            self.new_terms.append((term_id, term))

    # -- restore

    def restore_encoded(self, value: bytes) -> int:
        """Re-apply one record of the changelog (updates.encoded) to the state; return its first seq (-1: none).

        Re-applying records the state already reflects changes nothing (each quad ends as its last change says),
        so a restore may start below the true position of a checkpoint, never above it."""
        changes = codec.encoded_changes(value)
        changed = self.changed if self.track_changes else None
        for seq, diff, s, p, o, g, _event_time, _role, refresh in changes:
            if refresh:
                continue  # a repeated insert of a present quad: no change to the set
            quad = (s, p, o, g)
            if diff > 0:
                self.present[quad] = seq
            else:
                self.present.pop(quad, None)
            if changed is not None:
                changed[quad] = seq if diff > 0 else None
            self.seq = max(self.seq, seq)
        return changes[0].seq if changes else -1

    def restore_dictionary(self, value: bytes) -> None:
        """Re-read one record of the dictionary topic (DictionaryColumns, or a DictionaryEntry)."""
        for term_id, term in codec.dictionary_entries(value):
            self.dictionary.add(term_id, term)
            if term_id not in self.published:
                self._published_now(term_id, term)

    def load_state(self, present: Presence, terms: Iterable[tuple[int, str]], seq: int) -> None:
        """Start from a checkpoint's state (nothing of it counts as changed)."""
        self.present = present
        for term_id, term in terms:
            self.dictionary.add(term_id, term)
            self.published.add(term_id)
        self.seq = seq

    def take_changes(self) -> tuple[dict[tuple[int, int, int, int], int | None], list[tuple[int, str]]]:
        """The changes since the last call (for a checkpoint), forgotten here."""
        changed, new_terms = self.changed, self.new_terms
        self.changed, self.new_terms = {}, []
        return changed, new_terms

    # -- transform

    def process(self, raw: RawRecord) -> list[Output]:
        """Every output of one raw record, its changes flushed (for tests and tools)."""
        return self.accept(raw) + self.flush()

    def flush(self) -> list[Output]:
        """The terms and changes accepted since the last flush, as DictionaryColumns, EncodedColumns and
        RoutedColumns records (one transaction: the terms are there for whoever reads the changes)."""
        terms = self._dictionary_records() if self.pending_terms else []
        if not self.pending_encoded:
            return terms
        if self.track_changes:
            changed = self.changed
            for change in self.pending_encoded:
                if not change.refresh:  # a refresh changes nothing
                    changed[change[2:6]] = change.seq if change.diff > 0 else None
        headers = [(ORIGIN_HEADER, str(self.pending_origin).encode())] if self.pending_origin is not None else []
        deleted = self.pending_deleted

        def inserted_at(rows: list[Change]) -> list[int]:  # (see the schemas' inserted_at; none: no delete)
            return [0 if change.diff > 0 else deleted[change.seq] for change in rows] if deleted else []

        out = terms + [Output(self.t_encoded, codec.encode_encoded_batch(rows, sources, self.t_raw, inserted_at(rows)),
                              None, 0, headers)
                       for rows, sources in zip(_chunks(self.pending_encoded), _chunks(self.pending_sources))]
        for partition, (routed, roles) in sorted(self.pending_routed.items()):
            out.extend(Output(self.t_routed, codec.encode_routed_batch(rows, chunk, inserted_at(rows)), None, partition,
                              headers)
                       for rows, chunk in zip(_chunks(routed), _chunks(roles)))
        if self.seq > self.frontier_sent:
            # Every routed partition, with changes or not, learns that it holds all changes up to self.seq:
            # idle partitions move too, so the answers service can release by-centre deltas in seq order.
            out.extend(Output(self.t_routed, codec.encode_frontier({partition: self.seq}), None, partition)
                       for partition in range(self.n_routed))
            self.frontier_sent = self.seq
        self.pending_encoded, self.pending_sources, self.pending_routed, self.pending_origin = [], [], {}, None
        self.pending_deleted = {}
        return out

    def accept(self, raw: RawRecord) -> list[Output]:
        """Take one raw record: return what to produce now (its dead letters); its new terms and changes wait
        for :meth:`flush`.  Nothing in a record stops the service: a line
        or a record that fails in a way no check foresaw is dead-lettered (``internal-error``), and the good
        lines around it go on."""
        out: list[Output] = []
        self._record_dead, self._record_lines = 0, None
        self._source = (raw.partition, raw.offset)  # (of each change taken from this record)
        self._record_time = raw.timestamp_ms if raw.timestamp_ms is not None and raw.timestamp_ms >= 0 else None
        try:
            self._accept(out, raw)
        except Exception as exc:  # noqa: BLE001 - see the docstring; the outputs made so far are kept
            log.exception("record %s[%d]@%d: internal error", raw.topic, raw.partition, raw.offset)
            self._dead(out, raw, "internal-error", f"{type(exc).__name__}: {exc}", None)
            self.failures.failed(f"{type(exc).__name__}: {exc}")
        else:
            self.failures.succeeded()
        if self._record_dead > self.max_dead_per_record:
            extra = self._record_dead - self.max_dead_per_record
            out.append(dead_letter(self.t_deadletter, SERVICE, raw.topic, raw.partition, raw.offset, "too-many-errors",
                                   f"{extra:,} more rejected line(s) in this record, not listed one by one (the "
                                   f"first {self.max_dead_per_record} are; {DEAD_PER_RECORD_SETTING})", None))
        return out

    def _accept(self, out: list[Output], raw: RawRecord) -> None:
        if raw.value is None or raw.value == b"":
            self._dead(out, raw, "empty", "empty record value: nothing to ingest", None)
            return
        origin = raw.timestamp_ms
        if raw.value[:2] == codec.MAGIC:
            self._avro(out, raw, origin)
            return
        fmt = self._format(raw)
        if fmt is None:
            self._dead(out, raw, "unknown-format", "cannot tell the input format from headers "
                       f"content-type={raw.headers.get('content-type', b'')!r:.80} cbgp-format="
                       f"{raw.headers.get('cbgp-format', b'')!r:.80}; use one of {', '.join(FORMATS)}", None)
            return
        if fmt == UPDATE_FORMAT:
            self._update_request(out, raw, origin)
            return
        change = self._change
        for item in parse_input(raw.value, fmt):
            if isinstance(item, InputError):
                reason = "invalid-utf8" if item.message.startswith("invalid UTF-8") else "malformed-rdf"
                self._dead(out, raw, reason, f"line {item.line}: {item.message}", item.line)
                continue
            op, s, p, o, g, line, _position = item  # (unpacked: a named tuple's fields are slower one by one)
            try:
                change(out, raw, origin, op, s, p, o, g, None, line)
            except Exception as exc:  # noqa: BLE001 - this line only (a change leaves no trace when it fails)
                log.exception("record %s[%d]@%d line %d: internal error", raw.topic, raw.partition, raw.offset,
                              line)
                self._dead(out, raw, "internal-error", f"line {line}: {type(exc).__name__}: {exc}", line)

    def _update_request(self, out: list[Output], raw: RawRecord, origin: int | None) -> None:
        """A SPARQL 1.1 Update request: apply it atomically to the current graph; emit the quads it really
        inserted and deleted (Aguzzi & Roffia).  A failing request changes nothing and is dead-lettered."""
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
        # (in quad order: the same request on the same graph gives the same seqs, however the mirror was built)
        for s, p, o, g in sorted(delta.deleted, key=_quad_order):
            self._change(out, raw, origin, -1, s, p, o, g, None, None, mirrored=True)
        for s, p, o, g in sorted(delta.inserted, key=_quad_order):
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
        if s[:1] == '"' or p[:1] != "<" or (g is not None and g[:1] == '"'):  # (the rare case, by the first character)
            problem = position_problem(s, p, o, g)
            if problem:
                self._dead(out, raw, "malformed-rdf", (f"line {line}: " if line else "") + problem, line)
                return
        known = self.known
        s_id, p_id, o_id = known.get(s), known.get(p), known.get(o)
        if s_id is None or p_id is None or o_id is None or g is not None:
            # Some term is new (known terms were checked and published when first seen).
            problem = oversized_term(s, p, o, g, self.max_term_bytes)
            if problem:
                self._dead(out, raw, "term-too-large", (f"line {line}: " if line else "") + problem, line)
                return
            try:
                s_id = self._encode(s) if s_id is None else s_id
                p_id = self._encode(p) if p_id is None else p_id
                o_id = self._encode(o) if o_id is None else o_id
                gid = DEFAULT_GRAPH_ID if g is None else self._encode(g)
            except TermCollisionError as exc:
                self._dead(out, raw, "term-collision", str(exc), line)
                return
        else:
            gid = DEFAULT_GRAPH_ID
        quad = (s_id, p_id, o_id, gid)
        if event_time_ms is None:
            event_time_ms = self._record_time  # the Kafka record's time is the event time unless one was given
        if origin is not None and (self.pending_origin is None or origin < self.pending_origin):
            self.pending_origin = origin
        if op > 0:
            if quad in self.present:
                NOOP_ADD.inc()
                # no change to the graph, but event-time windows must see the newer time (spark.window_stream)
                self.pending_encoded.append(change_of((self.seq, INSERT, *quad, event_time_ms, ROLE_BOTH, True)))
                self.pending_sources.append(self._source)
                return
            self.present[quad] = self.seq + 1  # (its seq, given below)
        else:
            inserted = self.present.pop(quad, None)
            if inserted is None:
                NOOP_DEL.inc()
                return
        if self.graph.active and not mirrored:
            try:
                self.graph.apply(op, quad)
            except Exception:
                if op > 0:  # the change did not happen: leave no trace of it
                    self.present.pop(quad, None)
                else:
                    self.present[quad] = inserted
                raise
        if op < 0:
            self.pending_deleted[self.seq + 1] = inserted
        self.seq += 1
        seq = self.seq
        change = change_of((seq, op, *quad, event_time_ms, ROLE_BOTH, False))
        self.pending_encoded.append(change)
        self.pending_sources.append(self._source)
        pending = self.pending_routed
        for partition, role in routes(s_id, o_id, self.n_routed):
            routed = pending.get(partition)
            if routed is None:
                routed = pending[partition] = ([], [])
            routed[0].append(change)  # one object for every copy: the role travels beside it
            routed[1].append(role)

    def routes(self, s: int, o: int) -> tuple[tuple[int, int], ...]:
        """``(routed partition, role)`` pairs of a change with subject ``s`` and object ``o``
        (:func:`cbgp.change.routes`, which :meth:`process` runs)."""
        return routes(s, o, self.n_routed)

    def _encode(self, term: str) -> int:
        term_id = self.dictionary.encode(term)
        if term_id not in self.published:
            self._published_now(term_id, term)
            self.pending_terms.append((term_id, term))
        return term_id

    def _dictionary_records(self) -> list[Output]:
        """The terms published since the last flush, as DictionaryColumns records: one per dictionary partition
        (term id modulo the partitions), in chunks of at most MAX_BATCH_CHANGES terms and MAX_TERM_BATCH_BYTES.
        A record's key is a hash of its value: the topic is compacted, and no other record has that key unless it
        holds the same terms."""
        by_partition: dict[int, list[tuple[int, str]]] = {}
        for term_id, term in self.pending_terms:
            by_partition.setdefault(term_id % self.n_dictionary, []).append((term_id, term))
        self.pending_terms = []
        out = []
        for partition, terms in sorted(by_partition.items()):
            for chunk in _term_chunks(terms):
                value = codec.encode_dictionary_columns(*zip(*chunk))
                out.append(Output(self.t_dictionary, value, hashlib.blake2b(value, digest_size=8).hexdigest().encode(),
                                  partition))
        return out

    def _dead(self, out: list[Output], raw: RawRecord, reason: str, message: str, line: int | None,
              text: bytes | None = None) -> list[Output]:
        """A dead letter for ``raw`` (its offending ``line`` as the excerpt when there is one), unless the record
        already had its share of them (:meth:`accept` then says how many more there were)."""
        self._record_dead += 1
        if self._record_dead <= self.max_dead_per_record:
            if text is None:
                text = self._line(raw, line) if line else raw.value
            out.append(dead_letter(self.t_deadletter, SERVICE, raw.topic, raw.partition, raw.offset, reason,
                                   message, text, line))
        return out

    def _line(self, raw: RawRecord, line: int) -> bytes:
        if self._record_lines is None:
            self._record_lines = (raw.value or b"").splitlines()
        return self._record_lines[line - 1] if 0 < line <= len(self._record_lines) else b""


MAX_BATCH_CHANGES = 2000  # changes per batch record (~80 KB): far below Kafka's 1 MB default record limit
MAX_TERM_BATCH_BYTES = 512 * 1024  # UTF-8 bytes of terms per DictionaryColumns record at most (a term: 64 KB)


def _quad_order(quad: tuple[str, str, str, str | None]) -> tuple[str, str, str, str]:
    return quad[0], quad[1], quad[2], quad[3] or ""


def _chunks(rows: list) -> Iterator[list]:
    for start in range(0, len(rows), MAX_BATCH_CHANGES):
        yield rows[start:start + MAX_BATCH_CHANGES]


def _term_chunks(terms: list[tuple[int, str]]) -> Iterator[list[tuple[int, str]]]:
    """``terms`` in runs of at most MAX_BATCH_CHANGES terms and MAX_TERM_BATCH_BYTES (counted as 4 bytes a
    character, UTF-8's most, so that no term is encoded twice)."""
    chunk: list[tuple[int, str]] = []
    size = 0
    for entry in terms:
        if chunk and (len(chunk) == MAX_BATCH_CHANGES or size + 4 * len(entry[1]) > MAX_TERM_BATCH_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += 4 * len(entry[1])
    if chunk:
        yield chunk


# Downstream records (answers, current answers) carry terms whole and Kafka's default record limit is ~1 MB:
# a larger term would make the answers service's transaction fail forever, so it is refused here instead.
def oversized_term(s: str, p: str, o: str, g: str | None, maximum: int | None = None) -> str | None:
    """Why one of the terms is too large for the fleet (one line), or None; ``maximum`` defaults to the setting
    (a service reads it once: this runs for every change with a new term)."""
    if maximum is None:
        maximum = limit(MAX_TERM_SETTING, DEFAULT_MAX_TERM_BYTES)
    longest = max(len(s), len(p), len(o), len(g) if g is not None else 0)
    if longest * 4 <= maximum:  # (a character is at most 4 bytes: no encoding needed)
        return None
    terms = (s, p, o, g)
    size = max(len(term.encode("utf-8")) for term in terms if term is not None)
    if size <= maximum:
        return None
    return (f"a term of {size:,} bytes is over the limit of {maximum:,} ({MAX_TERM_SETTING}): answers carrying it "
            "must fit in a Kafka record")


def position_problem(s: str, p: str, o: str, g: str | None) -> str | None:
    """Why a parsed quad is not RDF (Avro RawUpdate terms are parsed one by one, so check positions)."""
    if s.startswith('"'):
        return f"subject must be an IRI or blank node, got literal {s[:80]}"
    if not p.startswith("<"):
        return f"predicate must be an IRI, got {p[:80]}"
    if g is not None and g.startswith('"'):
        return f"graph name must be an IRI or blank node, got literal {g[:80]}"
    return None


def replay_outputs(processor: IngestProcessor, records: Iterable[RawRecord]) -> list[Output]:
    """Drive the processor over ``records`` (for tests and tools: the TopologyTestDriver idea)."""
    out: list[Output] = []
    for record in records:
        out.extend(processor.accept(record))
    return out + processor.flush()
