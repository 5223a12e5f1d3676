"""What a worker core writes (``services.worker.core``): answer deltas batched into PartDeltaColumns records per
transaction, a registration's netted snapshot, the Frontier marks after them,
derived streams' RDF Patch records and their retraction, and dead letters.  No Kafka here.

Derived streams (a CONSTRUCT registered with ``stream=<iri>``, ``QueryInfo.stream``): the owner
also writes the query's triple deltas to updates.raw, in the same transaction as its answers and offsets (exactly
once), as RDF Patch ``A``/``D`` lines of named graph ``<iri>`` -- one record per input record, snapshot included --
so every query can read them back through ingest (``GRAPH <iri> { ... }``).  A CONSTRUCT's answers are a set, so
with ingest's set semantics graph ``<iri>`` is always the CONSTRUCT of the base graph as of the input record the
owner last applied.  When the registration ends (unregistered or replaced) the owner of its routed partition writes
``DROP SILENT GRAPH <iri>`` (a SPARQL Update ingest applies atomically): the derived graph is retracted with no
state needed, also by a next owner that restores from a committed position before the ending plan record
(``ended_streams``, owed like snapshots by the commit metadata)."""

from __future__ import annotations

import logging
from collections import Counter as Multiset
from typing import Iterable

from cbgp.distributed.evaluator import Outputs as ProbeOutputs
from services import codec
from services.wire.idempotence import SNAPSHOT_INDEX_BASE, WHOLE_SOURCE_PARTITION
from services.wire.records import ORIGIN_HEADER, WHOLE_QUERY_PART, Output, dead_letter, query_partition
from services.wire.loglines import kv
from services.worker.probes import ProbeRouting
from services.worker.shard import QueryInfo, Shard

log = logging.getLogger("cbgp.worker")

# Idempotence keys (routed partition P, WHOLE_SOURCE_PARTITION for whole queries, SNAPSHOT_INDEX_BASE + i for
# snapshot deltas): see services.wire.idempotence.
MAX_BATCH_DELTAS = 2000  # answer deltas per PartDeltaColumns record (bindings of a few ids: well under 1 MB)
# Header of a derived stream's updates.raw records: "query@version" (which owner wrote it: see owner_of_output).
DERIVED_HEADER = "cbgp-derived"
MAX_DERIVED_BYTES = 512 * 1024  # a derived stream's patch record is split above this (the broker's limit is ~1 MB)


class WorkerOutputs:
    """The output side of a worker core (see the module doc): what it queues between two transactions.

    It reads the core's plans, shards and probe routing (shared, never replaced) and owns the queues."""

    def __init__(self, topics: dict[str, str], plans: dict[str, QueryInfo], shards: dict[tuple[str, int], Shard],
                 probes: ProbeRouting, n_routed: int, n_deltas: int, n_dictionary: int) -> None:
        self.topics, self.plans, self.shards, self.probes = topics, plans, shards, probes
        self.n_routed, self.n_deltas, self.n_dictionary = n_routed, n_deltas, n_dictionary
        # Answer deltas (part -1; a by-centre product's part deltas, part >= 0) since the last flush_batches(),
        # per query, its variables (a replaced plan may bind others) and part.
        # Keyed (query, variables, part, run): an operator query's rows leave unbound variables out, and a run
        # starts whenever a query's variables change, so its records keep the order of its deltas.
        self.batched: dict[tuple[str, tuple[str, ...], int, int], list[tuple]] = {}
        self.batch_runs: dict[tuple[str, int], tuple[tuple[str, ...], int]] = {}  # (query, part) -> last key's
        self.published_terms: set[int] = set()  # made terms already written to the dictionary topic
        self.term_outputs: list[Output] = []  # ... and those to write in this transaction, before the deltas
        # ... and each batch's latency origin: the earliest produce time (epoch ms) of the raw updates behind its
        # live deltas, so a query's answers are timed from their own updates, not from the oldest of the turn
        self.batch_origins: dict[tuple[str, tuple[str, ...], int, int], int] = {}
        # routed partition -> (completed, applied) frontiers last written to deltas.parts
        self.frontier_sent: dict[int, tuple[int, int]] = {}
        # ProbeReady marks owed after this transaction's deltas: (query, version, routed partition, as_of) of the
        # gated registrations a routed shard snapshotted (a multi-centre query's come from the probe routing).
        self.ready_due: list[tuple[str, int, int, int]] = []
        # Derived streams: triple deltas made since the last derived_outputs() (query -> (sign, (s, p, o))), and
        # the registrations that fed one and ended, (plans partition, offset of the ending record, query, version,
        # graph), for a restored routed partition to retract what its previous owner may not have.
        self.derived: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
        self.ended_streams: list[tuple[int, int, str, int, str]] = []

    def end_stream(self, info: QueryInfo, partition: int, offset: int, routed_assigned: Iterable[int]) -> list[Output]:
        """A registration ends at queries.plans ``partition``/``offset`` (tombstone or new version): if it fed a
        derived stream, remember it (a next owner restored from before this record owes the retraction) and,
        when this worker owns its routed partition, retract the graph now."""
        if info.stream is None:
            return []
        owner = query_partition(info.query_id, self.n_routed)
        self.ended_streams.append((partition, offset, info.query_id, info.version, info.stream))
        return [self.drop_graph(info.query_id, info.version, info.stream)] if owner in set(routed_assigned) else []

    def drop_graph(self, query_id: str, version: int, graph: str) -> Output:
        log.info(kv(event="derived-stream-ended", query=query_id, version=version, graph=graph))
        return Output(self.topics.get("updates.raw", "updates.raw"), f"DROP SILENT GRAPH {graph}".encode(), None, 0,
                      [("content-type", b"application/sparql-update"),
                       (DERIVED_HEADER, f"{query_id}@{version}".encode())])

    def derived_outputs(self, shard: Shard) -> list[Output]:
        """The triple deltas of derived streams collected since the last call (:meth:`part_delta`), as RDF Patch
        records of their named graphs on updates.raw, in the order they were made."""
        if not self.derived:
            return []
        out: list[Output] = []
        decode = shard.engine.dictionary.decode
        topic = self.topics.get("updates.raw", "updates.raw")
        for query_id, rows in self.derived.items():
            info = self.plans.get(query_id)
            if info is None or info.stream is None:
                continue
            headers = [("cbgp-format", b"patch"), (DERIVED_HEADER, f"{query_id}@{info.version}".encode())]
            lines: list[str] = []
            size = 0
            for diff, triple in rows:
                line = f"{'A' if diff > 0 else 'D'} {' '.join(decode(t) for t in triple)} {info.stream} ."
                if size + len(line) > MAX_DERIVED_BYTES and lines:
                    out.append(Output(topic, ("\n".join(lines) + "\n").encode(), None, 0, headers))
                    lines, size = [], 0
                lines.append(line)
                size += len(line) + 1
            if lines:
                out.append(Output(topic, ("\n".join(lines) + "\n").encode(), None, 0, headers))
        self.derived = {}
        return out

    def flush_batches(self) -> list[Output]:
        """The answer deltas collected since the last call, as one PartDeltaColumns record per query (at most
        MAX_BATCH_DELTAS deltas each), in the order they were made; once per transaction."""
        out: list[Output] = []
        out.extend(self.term_outputs)
        self.term_outputs = []
        for batch, rows in self.batched.items():
            query_id, variables, part, _run = batch
            origin = self.batch_origins.get(batch)
            headers = [(ORIGIN_HEADER, str(origin).encode())] if origin is not None else []
            key, partition = query_id.encode(), query_partition(query_id, self.n_deltas)
            info = self.plans.get(query_id)
            version, distinct, gated, probed = ((info.version, info.counted_distinct, info.gated, info.uses_probes)
                                                if info is not None else (0, False, False, True))
            for start in range(0, len(rows), MAX_BATCH_DELTAS):
                value = codec.encode_part_delta_batch(query_id, part, variables, rows[start:start + MAX_BATCH_DELTAS],
                                                      version, distinct, gated, probed)
                out.append(Output(self.topics["deltas.parts"], value, key, partition, headers))
        self.batched, self.batch_origins, self.batch_runs = {}, {}, {}
        for query_id, version, routed, as_of in self.ready_due:  # after the snapshot deltas they mark complete
            out.append(Output(self.topics["deltas.parts"], codec.encode_probe_ready(query_id, version, routed, as_of),
                              query_id.encode(), query_partition(query_id, self.n_deltas)))
        self.ready_due = []
        out.extend(self.probes.flush(s for (kind, _p), s in self.shards.items() if kind == "routed"))
        out.extend(self._frontiers())
        for shard in self.shards.values():  # the values operators let go (all published, none read again)
            freed = shard.engine.dictionary.collect()
            if freed:
                self.published_terms.difference_update(freed)
        return out

    def drop_outputs_of(self, partition: int) -> int:
        """Forget the answer deltas not yet flushed of routed partition ``partition`` and of the whole queries
        it owns (the partition was revoked: they belong to its next owner); return how many were dropped."""
        dropped = self.probes.drop_from(partition)
        kept_marks = [due for due in self.ready_due if due[2] != partition]
        dropped += len(self.ready_due) - len(kept_marks)  # (a snapshot with no rows still owes its ProbeReady)
        self.ready_due = kept_marks
        for key, rows in list(self.batched.items()):
            whole_owner = query_partition(key[0], self.n_routed)
            kept = [r for r in rows if not (r[3] == partition or (r[3] == WHOLE_SOURCE_PARTITION
                                                                   and whole_owner == partition))]
            dropped += len(rows) - len(kept)
            if kept:
                self.batched[key] = kept
            else:
                del self.batched[key]
        # the next delta of a query joins or follows its last kept run
        self.batch_runs = {(q, part): (variables, run) for q, variables, part, run in self.batched}
        return dropped

    def owner_of_output(self, output: Output) -> int | None:
        """The routed partition whose shard made a queued part delta (None: not a part delta)."""
        if output.topic == self.topics.get("updates.raw", "updates.raw"):
            for name, value in output.headers or ():
                if name == DERIVED_HEADER:
                    return query_partition(value.decode().rpartition("@")[0], self.n_routed)
            return None
        if output.topic != self.topics["deltas.parts"] or output.value is None or output.key is None:
            return None
        try:
            record = codec.decode("PartDelta", output.value)
        except codec.CodecError:
            return None
        source = record["source_partition"]
        return query_partition(record["query_id"], self.n_routed) if source == WHOLE_SOURCE_PARTITION else source

    def probe_outputs(self, shard: Shard, probed: ProbeOutputs, offset: int, out: list[Output],
                       origin: int | None = None, first: int = 0) -> None:
        """Queue a probe step's probes and acks (see ``ProbeRouting.flush``), made by the record at ``offset``
        (a registration: the record before its point), and batch its deltas, keyed by ``offset`` and numbered
        per query from ``first``: two owners of the partition, one of which applied a registration later,
        give each of its deltas the same key (call once per record)."""
        numbers: dict[str, int] = {}
        for delta in self.probes.take(shard, probed, offset):
            if delta.query not in shard.outputs:
                continue  # unregistered meanwhile
            born = delta.born_ms or origin
            number = numbers.get(delta.query, first)
            numbers[delta.query] = number + 1
            self.part_delta(out, shard, delta.query, delta.diff, delta.row, delta.seq, offset, number,
                             delta.snapshot, born)

    def _frontiers(self) -> list[Output]:
        """After this transaction's deltas, a Frontier record on every deltas.parts partition for the routed
        shards that moved: every delta they caused up to the completed seq precedes it, and every delta they
        caused without probes up to the applied seq (the answers service's release rule).  Nothing when nothing
        moved, so an idle worker writes nothing."""
        moved = {}
        for (kind, p), shard in self.shards.items():
            if kind == "routed":
                marks = (shard.completed(), shard.applied())
                sent = self.frontier_sent.get(p, (-1, -1))
                if marks[0] > sent[0] or marks[1] > sent[1]:
                    moved[p] = marks
        if not moved:
            return []
        self.frontier_sent.update(moved)
        value = codec.encode_frontier({p: c for p, (c, _a) in moved.items()}, {p: a for p, (_c, a) in moved.items()})
        return [Output(self.topics["deltas.parts"], value, None, partition) for partition in range(self.n_deltas)]

    def snapshot(self, shard: Shard, infos: list[QueryInfo], net: dict[str, Multiset], offset: int | None = None,
                  as_of: int | None = None) -> list[Output]:
        """The netted answers of ``infos`` over the shard's log so far (up to ``offset``, keyed by it), labelled
        with the seq they are as of (by default the last change the shard applied; the registry's
        registered_at_seq counts updates.encoded records, which hold many changes each, so it lags far behind)."""
        out: list[Output] = []
        if as_of is None:
            as_of = max(shard.last_seq, shard.frontier)
        if offset is None:
            offset = shard.position - 1
        for info in infos:
            index = SNAPSHOT_INDEX_BASE  # per query, as live deltas: two owners' snapshots of it have one key
            if info.gated and shard.kind == "routed" and not info.uses_probes:
                # (a query with multi-centre parts is marked ready by its probes: worker_probes.flush)
                self.ready_due.append((info.query_id, info.version, shard.partition, as_of))
            for name, _part, _query in info.engine_queries():
                for row, count in sorted(net.get(name, {}).items()):
                    for _ in range(max(count, 0)):
                        # A routed shard's answers are deduplicated by (seq, offset, index): never label
                        # them past what the shard applied, or its next live deltas would look older.
                        label = as_of if shard.kind == "routed" else max(info.registered_at_seq, as_of)
                        self.part_delta(out, shard, name, 1, row, label, offset, index, True, None)
                        index += 1
        if self.derived:
            out.extend(self.derived_outputs(shard))
        return out

    def part_delta(self, out: list[Output], shard: Shard, name: str, diff: int, row: tuple[int, ...], seq: int,
                    offset: int, index: int, snapshot: bool, origin: int | None) -> None:
        """A query's answer delta joins its batch (see flush_batches); a part's delta (for the Spark assembly,
        which takes one PartDelta per record) goes to ``out``."""
        columns = shard.columns(name)
        query_id, part = shard.outputs[name]
        if part == WHOLE_QUERY_PART or shard.kind == "routed":
            # A routed shard's part deltas (a by-centre product) are batched too: the answers service
            # releases them in seq order and multiplies them.
            if name in shard.engine.operators:
                info = self.plans.get(query_id)
                if info is not None and info.stream is not None:
                    at = dict(zip(columns, row))
                    self.derived.setdefault(query_id, []).append(
                        (diff, (at["subject"], at["predicate"], at["object"])))
                columns, row = self._operator_row(shard, columns, row)
            runs = self.batch_runs
            last = runs.get((query_id, part))
            if last is None or last[0] != columns:
                last = runs[(query_id, part)] = (columns, 0 if last is None else last[1] + 1)
            batch = (query_id, columns, part, last[1])
            self.batched.setdefault(batch, []).append(
                (seq, diff, row, shard.source_partition, offset, index, snapshot, None))
            if origin and not snapshot:
                earliest = self.batch_origins.get(batch)
                if earliest is None or origin < earliest:
                    self.batch_origins[batch] = origin
            return
        value = codec.encode_part_delta(query_id, part, seq, diff, dict(zip(columns, row)),
                                        shard.source_partition, offset, index, snapshot, None)
        headers = [(ORIGIN_HEADER, str(origin).encode())] if origin is not None else []
        out.append(Output(self.topics["deltas.parts"], value, query_id.encode(),
                          query_partition(query_id, self.n_deltas), headers))

    def _operator_row(self, shard: Shard, columns: tuple[str, ...], row: tuple) -> tuple[tuple[str, ...], tuple]:
        """An operator query's row as the fleet writes it: unbound variables left out of the binding (SPARQL
        JSON results), and every term the shard made (a COUNT, a BIND value...) queued for the dictionary
        topic, so the answers service can decode it."""
        if None in row:
            columns = tuple(c for c, v in zip(columns, row) if v is not None)
            row = tuple(v for v in row if v is not None)
        dictionary = shard.engine.dictionary
        made = getattr(dictionary, "made", ())
        topic = self.topics.get("dictionary")
        for term_id in row:
            if term_id in made and term_id not in self.published_terms and topic is not None:
                self.published_terms.add(term_id)
                value = codec.encode_dictionary_entry(term_id, dictionary.decode(term_id))
                self.term_outputs.append(Output(topic, value, str(term_id).encode(), term_id % self.n_dictionary))
        return columns, row

    def dead(self, topic: str, partition: int, offset: int, reason: str, message: str, value: bytes) -> Output:
        return dead_letter(self.topics["deadletter"], "worker", self.topics.get(topic, topic), partition, offset,
                           reason, message, value)
