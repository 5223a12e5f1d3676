"""The state worker's transform, with no Kafka in it: plans + input records -> PartDelta outputs.

A *shard* is one engine fed by one input log:
- ``("routed", P)``: routed partition P, holding the single-star queries, partitioned by centre value (each
  change arrives with its role, only the star patterns centred there fire);
- ``("whole", P)``: updates.encoded (the total order) for the whole queries owned by routed partition P
  (``owner(q) = query_partition(q, N)``), evaluated with ROLE_ALL.

Every shard's state is a function of (its queries, its log up to its position), so it is *restored* by
replaying the log from offset 0 without emitting, and a query new to a shard gets its state the same way,
its replayed deltas netted into a snapshot (``snapshot=True``).  Which queries a shard had already
snapshotted is stored with its committed offset as commit metadata (the queries.plans positions applied),
so a restarted or rebalanced worker knows exactly which snapshots are still owed.

Operator queries (issue 18: FILTER, OPTIONAL, UNION, aggregates, ASK, CONSTRUCT...; ``QueryInfo.operators``) are
whole queries: their owner's whole shard evaluates them with ``cbgp.algebra`` in place of the BGP engine
(:class:`WorkerEngine` holds both), restored and snapshotted the same way.  Their expressions need the terms, so
the shard learns the terms of the changes it applies from the dictionary topic (``term_reader``), and publishes
the terms an operator makes (a COUNT, a BIND value, ASK's booleans) before the answers that use them.

Derived streams (issue 18 item 3: a CONSTRUCT registered with ``stream=<iri>``, ``QueryInfo.stream``): the owner
also writes the query's triple deltas to updates.raw, in the same transaction as its answers and offsets (exactly
once), as RDF Patch ``A``/``D`` lines of named graph ``<iri>`` -- one record per input record, snapshot included --
so every query can read them back through ingest (``GRAPH <iri> { ... }``).  A CONSTRUCT's answers are a set, so
with ingest's set semantics graph ``<iri>`` is always the CONSTRUCT of the base graph as of the input record the
owner last applied.  When the registration ends (unregistered or replaced) the owner of its routed partition writes
``DROP SILENT GRAPH <iri>`` (a SPARQL Update ingest applies atomically): the derived graph is retracted with no
state needed, also by a next owner that restores from a committed position before the ending plan record
(``ended_streams``, owed like snapshots by the commit metadata).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter as Multiset
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator

from cbgp.assembly import needs_assembly, split_parts
from cbgp.distributed import Outputs as ProbeOutputs, PartitionEvaluator
from cbgp.engine import ROLE_ALL, Engine, EngineError
from cbgp.plan import BY_CENTRE, ComponentPart, Plan, decompose
from cbgp.sparql import QueryError
from cbgp.terms import DEFAULT_GRAPH_ID, TermDictionary
from cbgp.windows import WindowSpec
from services import codec
from services.queries import read_query, read_registration, stream_iri
from services.instruments import RESTORE_PROGRESS
from services.idempotence import SNAPSHOT_INDEX_BASE, WHOLE_SOURCE_PARTITION
from services.records import ORIGIN_HEADER, WHOLE_QUERY_PART, Output, dead_letter, kv, query_partition
from services import worker_probes
from services.worker_probes import ProbeRouting, RecordReader, probe_name

log = logging.getLogger("cbgp.worker")

ROLES = {"SUBJECT": 1, "OBJECT": 2, "BOTH": ROLE_ALL}
# Idempotence keys (routed partition P, WHOLE_SOURCE_PARTITION for whole queries, SNAPSHOT_INDEX_BASE + i for
# snapshot deltas): see services.idempotence.
MAX_BATCH_DELTAS = 2000  # answer deltas per PartDeltaBatch record (bindings of a few ids: well under 1 MB)
# Header of a derived stream's updates.raw records: "query@version" (which owner wrote it: see owner_of_output).
DERIVED_HEADER = "cbgp-derived"
MAX_DERIVED_BYTES = 512 * 1024  # a derived stream's patch record is split above this (the broker's limit is ~1 MB)

# One input change as the engine needs it: (offset, sign, s, p, o, g, role, seq, origin_ms).
Change = tuple[int, int, int, int, int, int, int, int, "int | None"]
# Reads log records of a shard: (kind, partition, start, end) -> changes in offset order.
LogReader = Callable[[str, int, int, int], Iterable[Change]]
# Looks term ids up on the dictionary topic: ids -> {id: canonical term} of those found (operator queries
# evaluate expressions over the terms themselves, not only their ids).
TermReader = Callable[[set[int]], dict[int, str]]
LEARN_CHUNK = 2000  # changes whose term ids are looked up at once when a log is replayed


def decode_changes(kind: str, offset: int, value: bytes, origin: int | None) -> list[Change]:
    """The changes of one routed (``kind="routed"``) or encoded record (a batch, or a format-1 single change)
    as :data:`Change` tuples sharing ``offset``; raises ``codec.CodecError``.  Refreshes (ADDs of present
    triples, forwarded for event-time windows) change no match and are left out."""
    if kind == "routed":
        return [(offset, sign, s, p, o, g, ROLES[role], seq, origin)
                for seq, sign, s, p, o, g, _event_time, role in codec.routed_changes(value)]
    return [(offset, sign, s, p, o, g, ROLE_ALL, seq, origin)
            for seq, sign, s, p, o, g, _event_time, refresh in codec.encoded_changes(value) if not refresh]


@dataclass
class QueryInfo:
    """A registered query as the worker knows it (from one QueryPlan record)."""

    query_id: str
    version: int
    plan: Plan | None  # None: an operator query (``operators``)
    registered_at_seq: int
    plans_partition: int
    plans_offset: int
    window: WindowSpec | None = None
    assembled: bool = False  # parts published separately; the Spark job multiplies them
    single_owner: bool = False  # the fleet runs with --placement single-owner (for comparison)
    # An operator query (cbgp.algebra's OperatorQuerySpec: FILTER, OPTIONAL, aggregates, ASK, CONSTRUCT...):
    # evaluated whole by its single owner on the total order, the algebra in place of the BGP engine.
    operators: object | None = None
    # A derived stream (CONSTRUCT with stream=<iri>): the named graph its triple deltas are written to, N-Triples.
    stream: str | None = None

    @property
    def windowed(self) -> bool:
        """Windowed queries are evaluated by the Spark job alone (it owns expiry); workers hold nothing."""
        return self.window is not None

    def engine_queries(self) -> list[tuple[str, int, Plan | str]]:
        """``(engine name, PartDelta.part, query)`` this query registers in a shard's engine (none for a
        probed query: it lives in the shard's evaluator)."""
        if self.operators is not None:
            return [(self.query_id, WHOLE_QUERY_PART, self.operators)]
        if self.probed:
            return []
        if self.partitioned and self.plan.product_by_centre:
            # Each part by centre; the answers service multiplies them in seq order.
            return [(f"{self.query_id}#{part.index}", part.index, part.sparql)
                    for part in split_parts(self.plan.query)]
        if self.counted_distinct:
            # Each partition sees only its centre values: it reports every solution's row and the answers
            # service, which sees them all in seq order, applies DISTINCT.
            return [(self.query_id, WHOLE_QUERY_PART, replace(self.plan, query=replace(self.plan.query,
                                                                                      distinct=False)))]
        if not self.assembled:
            return [(self.query_id, WHOLE_QUERY_PART, self.plan)]
        return [(f"{self.query_id}#{part.index}", part.index, part.sparql) for part in split_parts(self.plan.query)]

    @property
    def partitioned(self) -> bool:
        """Stars and single-centre components are evaluated per centre value on the routed partitions
        (``Plan.placement`` "by-centre"); everything else by one owner on the total order."""
        return self.operators is None and self.plan.placement == BY_CENTRE and not self.single_owner

    @property
    def probed(self) -> bool:
        """A multi-centre component placed by centre: evaluated with probes between the routed partitions
        (``services.worker_probes``)."""
        if self.operators is not None:
            return False
        part = self.plan.parts[0]
        return self.partitioned and isinstance(part, ComponentPart) and part.centre is None

    @property
    def gated(self) -> bool:
        """A registration the answers service releases as one snapshot, once every routed partition has sent
        its share (``PartDeltaBatch.gated``, ``services.release``): a multi-centre query's (its probes) and a
        by-centre product's (its parts' snapshots as of each partition's own position, multiplied)."""
        return self.probed or (self.partitioned and self.plan.product_by_centre)

    @property
    def counted_distinct(self) -> bool:  # (a product's DISTINCT is the assembler's)
        """A partitioned DISTINCT query: its deltas are rows with multiplicity, DISTINCT is applied by the
        answers service (PartDeltaBatch.distinct)."""
        return self.partitioned and self.plan.query.distinct and not self.plan.product_by_centre


# ASK in the fleet: one variable ?ask, "false" from registration, flipped by a '-'/'+' pair when it changes.
ASK_VARIABLE = "ask"
ASK_TRUE = '"true"^^<http://www.w3.org/2001/XMLSchema#boolean>'
ASK_FALSE = '"false"^^<http://www.w3.org/2001/XMLSchema#boolean>'


class ShardDictionary(TermDictionary):
    """A shard's term dictionary: ids learnt from the dictionary topic (:meth:`add`) and ids made here
    (``made``: query constants, values an operator computes -- a COUNT, a BIND, a CONSTRUCT's blank node --
    which the worker publishes on the dictionary topic before the answers that use them)."""

    __slots__ = ("made",)

    def __init__(self) -> None:
        super().__init__(stable=True)
        self.made: set[int] = set()

    def encode(self, term: str) -> int:
        found = self._ids.get(term)
        if found is not None:
            return found
        term_id = super().encode(term)
        self.made.add(term_id)
        return term_id

    def add(self, term_id: int, term: str) -> None:
        super().add(term_id, term)
        self.made.discard(term_id)

    def knows(self, term_id: int) -> bool:
        return term_id in self._terms


class FleetOperatorQuery:
    """One operator query (``cbgp.algebra.OperatorQuery``) as the fleet reports it: rows in ``columns``
    order (None: unbound), and ASK as the boolean variable ``?ask`` (the algebra's one empty row while the
    pattern matches becomes ``false`` -> ``true``, a retraction and an assertion in the same update)."""

    def __init__(self, spec: object, dictionary: TermDictionary) -> None:
        from cbgp.algebra import OperatorQuery

        self.query = OperatorQuery(spec, dictionary)  # type: ignore[arg-type]
        self.ask = self.query.form == "ASK"
        if self.ask:
            self.columns: tuple[str, ...] = (ASK_VARIABLE,)
            self.true, self.false = (dictionary.encode(ASK_TRUE),), (dictionary.encode(ASK_FALSE),)
        else:
            self.columns = self.query.columns

    def initial(self) -> list[tuple[int, tuple]]:
        rows = self.query.initial()
        if not self.ask:
            return rows
        return [(1, self.true if sum(sign for sign, _row in rows) > 0 else self.false)]

    def apply(self, sign: int, s: int, p: int, o: int, g: int) -> list[tuple[int, tuple]]:
        deltas = self.query.apply(sign, s, p, o, g)
        if not self.ask or not deltas:
            return deltas
        net = sum(d_sign for d_sign, _row in deltas)
        if net > 0:
            return [(-1, self.false), (1, self.true)]
        if net < 0:
            return [(-1, self.true), (1, self.false)]
        return []

    def state_entries(self) -> int:
        return self.query.state_entries()

    def state_bytes(self) -> int:
        return self.query.state_bytes()

    def explain(self) -> str:
        return self.query.explain()


def is_operator_spec(query: object) -> bool:
    """An operator query spec (``cbgp.algebra.OperatorQuerySpec``), told apart without importing rdflib."""
    return type(query).__name__ == "OperatorQuerySpec"


class WorkerEngine(Engine):
    """An :class:`Engine` that can replay a log into a subset of its queries (late registration), and that
    evaluates operator queries (:class:`FleetOperatorQuery`) beside its BGP queries."""

    def __init__(self, dictionary: TermDictionary | None = None) -> None:
        super().__init__(dictionary)
        self.operators: dict[str, FleetOperatorQuery] = {}
        self.initial_rows: dict[str, list[tuple[int, tuple]]] = {}  # an operator query's rows before any change

    def register(self, name: str, query, initial=None):  # noqa: ANN001, ANN201
        if not is_operator_spec(query):
            return super().register(name, query, initial)
        if name in self.queries or name in self.operators:
            raise EngineError(f"a query named {name!r} is already registered")
        op = self.operators[name] = FleetOperatorQuery(query, self.dictionary)
        self.initial_rows[name] = op.initial()
        self.apply = self._apply_with_operators  # type: ignore[method-assign]
        return []

    def unregister(self, name: str) -> None:
        if self.operators.pop(name, None) is not None:
            self.initial_rows.pop(name, None)
            if not self.operators:
                del self.apply  # back to Engine.apply
            return
        super().unregister(name)

    def columns(self, name: str) -> tuple[str, ...]:
        op = self.operators.get(name)
        return op.columns if op is not None else super().columns(name)

    def _apply_with_operators(self, sign: int, s: int, p: int, o: int, g: int = DEFAULT_GRAPH_ID,
                              role: int = ROLE_ALL) -> list:
        """``apply`` while operator queries are registered (installed on the instance: BGP-only shards keep
        ``Engine.apply`` with no extra call)."""
        out = Engine.apply(self, sign, s, p, o, g, role)
        for name, op in self.operators.items():
            for d_sign, row in op.apply(sign, s, p, o, g):
                out.append((name, d_sign, row))
        return out

    def apply_to(self, name: str, sign: int, s: int, p: int, o: int, g: int = DEFAULT_GRAPH_ID,
                 role: int = ROLE_ALL) -> list:
        op = self.operators.get(name)
        if op is None:
            return super().apply_to(name, sign, s, p, o, g, role)
        return [(name, d_sign, row) for d_sign, row in op.apply(sign, s, p, o, g)]

    def state_entries(self, name: str | None = None) -> int:
        if name is None:
            return super().state_entries() + sum(op.state_entries() for op in self.operators.values())
        op = self.operators.get(name)
        return op.state_entries() if op is not None else super().state_entries(name)

    def state_bytes(self, name: str | None = None) -> int:
        if name is None:
            return super().state_bytes() + sum(op.state_bytes() for op in self.operators.values())
        op = self.operators.get(name)
        return op.state_bytes() if op is not None else super().state_bytes(name)

    def replay(self, changes: Iterable[Change], collect: set[str], only: bool) -> dict[str, Multiset]:
        """Apply ``changes``; return the net deltas of the queries in ``collect`` (row -> multiplicity), an
        operator query's rows before any change included.

        ``only=True`` feeds the changes to the ``collect`` queries alone (the others already saw them).
        """
        net: dict[str, Multiset] = {name: Multiset() for name in collect}
        for name in collect:
            for sign, row in self.initial_rows.get(name, ()):
                net[name][row] += sign
        self.initial_rows.clear()  # every operator query registered so far is replayed now
        targets = sorted(collect)
        for _offset, sign, s, p, o, g, role, _seq, _origin in changes:
            if only:
                out: list = []
                for name in targets:
                    # Engine.register(initial=...) only inserts and ignores roles; a replay needs both.
                    out.extend(self.apply_to(name, sign, s, p, o, g, role))
            else:
                out = self.apply(sign, s, p, o, g, role)
            for name, delta_sign, row in out:
                if name in net:
                    net[name][row] += delta_sign
        return net


def info_mode(info: QueryInfo) -> str:
    """How a query is evaluated, for logs: windowed (Spark), partitioned, whole, or assembled (parts)."""
    if info.windowed:
        return "windowed"
    if info.partitioned:
        return "partitioned"
    if info.operators is not None:
        return "operators"
    return "assembled" if info.assembled else "whole"


def shard_label(kind: str, partition: int) -> str:
    """The `partition` label of a shard's metrics: the routed partition, or `whole-P` for whole queries."""
    return str(partition) if kind == "routed" else f"whole-{partition}"


def _tracking_seq(shard: Shard, changes: Iterable[Change]) -> Iterator[Change]:
    """Pass ``changes`` through, keeping the shard's last applied seq (restores replay its log)."""
    for change in changes:
        shard.last_seq = max(shard.last_seq, change[7])
        yield change


def _with_progress(changes: Iterable, total: int, label: str, every: int = 2000) -> Iterator:
    """Pass `changes` through, publishing the share of the log replayed so far (restore progress)."""
    gauge = RESTORE_PROGRESS.labels(label)
    gauge.set(0.0 if total else 1.0)
    for count, change in enumerate(changes, 1):
        if count % every == 0:
            gauge.set(min(count / total, 1.0))
        yield change


@dataclass
class Shard:
    kind: str  # "routed" or "whole"
    partition: int
    engine: WorkerEngine = field(default_factory=lambda: WorkerEngine(ShardDictionary()))
    position: int = 0  # next offset of its log to apply
    frontier: int = -1  # routed shards: highest seq the partition has completed (ingest's Frontier records)
    last_seq: int = 0  # seq of the last change applied (a snapshot is labelled with the seq it is "as of")
    versions: dict[str, int] = field(default_factory=dict)  # query id -> registered plan version
    outputs: dict[str, tuple[str, int]] = field(default_factory=dict)  # engine name -> (query id, part)
    # Multi-centre queries (routed shards, services.worker_probes): the evaluator, its queries by probe name,
    # where each was registered here (its registration's updates) and which registrations were marked ready.
    evaluator: PartitionEvaluator | None = None
    probe_queries: dict[str, QueryInfo] = field(default_factory=dict)
    registered_at: dict[str, int] = field(default_factory=dict)
    ready_sent: set[str] = field(default_factory=set)

    def completed(self) -> int:
        """The seq every answer delta of this routed partition's changes has been emitted up to: its frontier,
        held below the oldest change whose probes are still travelling."""
        if self.evaluator is None:
            return self.frontier
        return min(self.frontier, self.evaluator.completed_live())

    def state_entries(self, name: str | None = None) -> int:
        """State entries of one engine or evaluator query (by its name here), or of the whole shard."""
        if name is None:
            extra = self.evaluator.state_entries() if self.evaluator is not None else 0
            return self.engine.state_entries() + extra
        if name in self.probe_queries:
            return self.evaluator.state_entries(name)
        return self.engine.state_entries(name)

    def columns(self, name: str) -> tuple[str, ...]:
        if name in self.probe_queries:
            return self.evaluator.queries[name].program.columns
        return self.engine.columns(name)

    def register(self, info: QueryInfo) -> list[str]:
        """Register ``info``'s engine queries (the query, or its parts); return their engine names."""
        names = []
        for name, part, query in info.engine_queries():
            self.engine.register(name, query)
            self.outputs[name] = (info.query_id, part)
            names.append(name)
        self.versions[info.query_id] = info.version
        return names

    @property
    def source_partition(self) -> int:
        return self.partition if self.kind == "routed" else WHOLE_SOURCE_PARTITION


class WorkerCore:
    """Plans and shards of one worker; every method returns the records to produce."""

    def __init__(self, topics: dict[str, str], routed_partitions: int, plans_partitions: int,
                 deltas_partitions: int, reader: LogReader, assemble_in_spark: bool = True,
                 placement: str = BY_CENTRE, record_reader: RecordReader | None = None,
                 term_reader: TermReader | None = None, dictionary_partitions: int | None = None) -> None:
        """``placement``: ``by-centre`` (the default: stars and single-centre components keyed by centre value
        over the routed partitions) or ``single-owner`` (every query whole on one worker, for comparison).
        Every worker of a fleet must use the same.  ``term_reader``: the dictionary topic, for operator queries
        (their shard learns the terms of the changes it applies; terms an operator makes are published to
        ``topics["dictionary"]``, ``dictionary_partitions`` partitions, as ingest does)."""
        self.topics = topics  # logical name -> broker topic (deltas.parts, deadletter)
        self.assemble_in_spark = assemble_in_spark
        self.single_owner = placement != BY_CENTRE
        self.n_routed = routed_partitions
        self.n_deltas = deltas_partitions
        self.reader = reader
        self.plans: dict[str, QueryInfo] = {}
        self.plan_positions = [0] * plans_partitions  # next queries.plans offset to apply, per partition
        self.shards: dict[tuple[str, int], Shard] = {}
        # Answer deltas (part -1; a by-centre product's part deltas, part >= 0) since the last flush_batches(),
        # per query, its variables (a replaced plan may bind others) and part, with the earliest origin time.
        # Keyed (query, variables, part, run): an operator query's rows leave unbound variables out, and a run
        # starts whenever a query's variables change, so its records keep the order of its deltas.
        self.batched: dict[tuple[str, tuple[str, ...], int, int], list[tuple]] = {}
        self.batch_runs: dict[tuple[str, int], tuple[tuple[str, ...], int]] = {}  # (query, part) -> last key's
        self.term_reader = term_reader
        self.n_dictionary = dictionary_partitions or routed_partitions
        self.published_terms: set[int] = set()  # made terms already written to the dictionary topic
        self.term_outputs: list[Output] = []  # ... and those to write in this transaction, before the deltas
        self.batched_origin: int | None = None
        self.frontier_sent: dict[int, int] = {}  # routed partition -> frontier last written to deltas.parts
        # ProbeReady marks owed after this transaction's deltas: (query, version, routed partition, as_of) of the
        # gated registrations a routed shard snapshotted (a multi-centre query's come from worker_probes).
        self.ready_due: list[tuple[str, int, int, int]] = []
        # Derived streams: triple deltas made since the last _derived_outputs() (query -> (sign, (s, p, o))), and
        # the registrations that fed one and ended, (plans partition, offset of the ending record, query, version,
        # graph), for a restored routed partition to retract what its previous owner may not have.
        self.derived: dict[str, list[tuple[int, tuple[int, ...]]]] = {}
        self.ended_streams: list[tuple[int, int, str, int, str]] = []
        self.probes = ProbeRouting(topics, routed_partitions, deltas_partitions)
        if record_reader is not None:
            self.probes.reader = record_reader

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
        self.plan_positions[partition] = offset + 1
        out: list[Output] = []
        query_id = key.decode("utf-8", "replace") if key else None
        if value is None:
            if query_id and query_id in self.plans:
                out.extend(self._end_stream(self.plans[query_id], partition, offset, routed_assigned))
                del self.plans[query_id]
                self._drop_everywhere(query_id)
                log.info(kv(event="unregistered", query=query_id))
            return out, []
        try:
            record = codec.decode("QueryPlan", value)
            text, window = read_registration(record["sparql"], record["options"])
            parsed, operators = read_query(text, window)
            plan = decompose(parsed) if parsed is not None else None
            stream = stream_iri(record["options"]["stream"]) if "stream" in record["options"] else None
        except (codec.CodecError, QueryError) as exc:  # WindowError is a QueryError
            out.append(self._dead("queries.plans", partition, offset, "invalid-plan", str(exc), value))
            return out, []
        info = QueryInfo(record["query_id"], record["version"], plan, record["registered_at_seq"], partition, offset,
                         window, plan is not None and self.assemble_in_spark and window is None
                         and needs_assembly(plan.query), self.single_owner, operators,
                         stream if operators is not None else None)
        old = self.plans.get(info.query_id)
        if old is not None and old.version == info.version and old.plans_offset == offset:
            return out, []
        if old is not None:
            out.extend(self._end_stream(old, partition, offset, routed_assigned))
        self.plans[info.query_id] = info
        self._drop_everywhere(info.query_id)  # a re-registration starts from a fresh snapshot
        for shard in self.shards.values():
            if self.holds(info, shard.kind, shard.partition):
                out.extend(self._add_queries(shard, [info]))
        log.info(kv(event="registered", query=info.query_id, version=info.version, mode=info_mode(info)))
        to_open = []
        if not info.partitioned and not info.windowed:
            owner = query_partition(info.query_id, self.n_routed)
            if owner in set(routed_assigned) and ("whole", owner) not in self.shards:
                to_open.append(owner)
        return out, to_open

    def _end_stream(self, info: QueryInfo, partition: int, offset: int, routed_assigned: Iterable[int]) -> list[Output]:
        """A registration ends at queries.plans ``partition``/``offset`` (tombstone or new version): if it fed a
        derived stream, remember it (a next owner restored from before this record owes the retraction) and,
        when this worker owns its routed partition, retract the graph now."""
        if info.stream is None:
            return []
        owner = query_partition(info.query_id, self.n_routed)
        self.ended_streams.append((partition, offset, info.query_id, info.version, info.stream))
        return [self._drop_graph(info.query_id, info.version, info.stream)] if owner in set(routed_assigned) else []

    def _drop_graph(self, query_id: str, version: int, graph: str) -> Output:
        log.info(kv(event="derived-stream-ended", query=query_id, version=version, graph=graph))
        return Output(self.topics.get("updates.raw", "updates.raw"), f"DROP SILENT GRAPH {graph}".encode(), None, 0,
                      [("content-type", b"application/sparql-update"),
                       (DERIVED_HEADER, f"{query_id}@{version}".encode())])

    def _derived_outputs(self, shard: Shard) -> list[Output]:
        """The triple deltas of derived streams collected since the last call (:meth:`_part_delta`), as RDF Patch
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
            for sign, triple in rows:
                line = f"{'A' if sign > 0 else 'D'} {' '.join(decode(t) for t in triple)} {info.stream} ."
                if size + len(line) > MAX_DERIVED_BYTES and lines:
                    out.append(Output(topic, ("\n".join(lines) + "\n").encode(), None, 0, headers))
                    lines, size = [], 0
                lines.append(line)
                size += len(line) + 1
            if lines:
                out.append(Output(topic, ("\n".join(lines) + "\n").encode(), None, 0, headers))
        self.derived = {}
        return out

    def _drop_everywhere(self, query_id: str) -> None:
        for shard in self.shards.values():
            for name in [n for n, i in shard.probe_queries.items() if i.query_id == query_id]:
                self.probes.unregister(shard, name)
                shard.outputs.pop(name, None)
            if query_id in shard.versions:
                for name in [n for n, (q, _part) in shard.outputs.items() if q == query_id]:
                    shard.engine.unregister(name)
                    del shard.outputs[name]
                del shard.versions[query_id]

    def _add_queries(self, shard: Shard, infos: list[QueryInfo]) -> list[Output]:
        """Register ``infos`` in a live shard: replay its log into them alone, emit the netted snapshot (a
        probed query: its registration's probes and deltas, see ``services.worker_probes``)."""
        out: list[Output] = []
        for info in [i for i in infos if i.probed]:
            shard.versions[info.query_id] = info.version
            shard.outputs[probe_name(info)] = (info.query_id, WHOLE_QUERY_PART)
            self._probe_outputs(shard, self.probes.register(shard, info, live=True), shard.position - 1,
                                SNAPSHOT_INDEX_BASE, out)
        infos = [i for i in infos if not i.probed]
        if not infos:
            return out
        names = {name for info in infos for name in shard.register(info)}
        changes = self._learning(shard, self.reader(shard.kind, shard.partition, 0, shard.position))
        net = shard.engine.replay(changes, names, only=True)
        return out + self._snapshot(shard, infos, net)

    # -- shards

    def open_shard(self, kind: str, partition: int, committed: int, metadata: str | None) -> list[Output]:
        """Restore a shard at its committed offset; emit the snapshots it still owes (see module doc)."""
        shard = Shard(kind, partition, position=max(committed, 0))
        self.shards[(kind, partition)] = shard
        seen = _parse_metadata(metadata, len(self.plan_positions))
        drops = [self._drop_graph(query_id, version, graph) for plans_p, plans_offset, query_id, version, graph
                 in self.ended_streams if kind == "routed" and plans_offset >= seen[plans_p]
                 and query_partition(query_id, self.n_routed) == partition]
        infos = self.wanted(kind, partition)
        owed = [i for i in infos if i.plans_offset >= seen[i.plans_partition]]
        for info in infos:
            shard.register(info)
        started = time.monotonic()
        label = shard_label(kind, partition)
        changes = _with_progress(_tracking_seq(shard, self._learning(
            shard, self.reader(kind, partition, 0, shard.position))), shard.position, label)
        net = shard.engine.replay(changes, {name for i in owed for name, _p, _q in i.engine_queries()}, only=False)
        probe_out: list[Output] = []
        if kind == "routed":
            for info in infos:
                if info.probed:
                    shard.versions[info.query_id] = info.version
                    shard.outputs[probe_name(info)] = (info.query_id, WHOLE_QUERY_PART)
            restored = worker_probes.restore(self.probes, shard, owed, infos, lambda name: self._known(shard, name))
            self._probe_outputs(shard, restored, shard.position - 1, SNAPSHOT_INDEX_BASE, probe_out)
        RESTORE_PROGRESS.labels(label).set(1.0)
        log.info(kv(event="shard-restored", kind=kind, partition=partition, position=shard.position,
                    queries=len(infos), snapshots_owed=len(owed),
                    restore_seconds=f"{time.monotonic() - started:.3f}"))
        return drops + probe_out + self._snapshot(shard, [i for i in owed if not i.probed], net)

    def first_position(self, partition: int) -> int:
        """Where whole shard ``partition`` starts when it never committed a position: the updates.encoded end
        offset at the earliest registration of its queries (the registry's ``registered_at_seq``), so that a
        query registered after data arrived gets its answers over that data as a snapshot, then live deltas."""
        return max(0, min((i.registered_at_seq for i in self.wanted("whole", partition)), default=0))

    def close_shard(self, kind: str, partition: int) -> None:
        self.shards.pop((kind, partition), None)

    # -- live records

    def on_record(self, shard: Shard, offset: int, changes: list[Change]) -> list[Output]:
        """Apply the changes of one input record (at ``offset``); their deltas are numbered 0, 1, ... across
        the record, the ``index`` of the idempotence key ``(source partition, offset, index)``."""
        shard.position = offset + 1
        out: list[Output] = []
        index = 0
        engine = shard.engine
        # (a routed shard holding only multi-centre queries has an idle engine: nothing to call per change)
        apply = engine.apply if engine.queries or engine.operators or engine.graph is not None else None
        if not changes:
            return self._derived_outputs(shard) if self.derived else out
        last = changes[-1][7]
        shard.last_seq = max(shard.last_seq, last)
        evaluator = shard.evaluator if shard.kind == "routed" else None
        if engine.operators:
            self._learn(shard, changes)
        if evaluator is not None:
            # The record's changes into the evaluator, then its frontier once (the log is in seq order; reads are
            # versioned, so a probe held for seq k reads the same as of k - 1 after the whole record), then one
            # pass over what they made.
            probed = ProbeOutputs()
            wanted = evaluator.predicates
            evaluate = evaluator.apply
            origin = changes[0][8]
            for _offset, sign, s, p, o, g, role, seq, _origin in changes:
                if p in wanted:
                    evaluate(seq, sign, s, p, o, g, role, born_ms=origin or 0, out=probed)
            evaluator.advance(last, out=probed)
            index = self._probe_outputs(shard, probed, offset, index, out, origin)
        if apply is not None:
            for _offset, sign, s, p, o, g, role, seq, origin in changes:
                deltas = apply(sign, s, p, o, g, role)
                if not deltas:
                    continue
                self._note_origin(origin)
                for name, d_sign, row in deltas:
                    self._part_delta(out, shard, name, d_sign, row, seq, offset, index, False, origin)
                    index += 1
        if self.derived:
            out.extend(self._derived_outputs(shard))
        return out

    def _note_origin(self, origin: int | None) -> None:
        """The batch's latency origin is its oldest update's (ORIGIN_HEADER of the flushed records)."""
        if origin and (self.batched_origin is None or origin < self.batched_origin):
            self.batched_origin = origin

    def flush_batches(self) -> list[Output]:
        """The answer deltas collected since the last call, as one PartDeltaBatch record per query (at most
        MAX_BATCH_DELTAS deltas each), in the order they were made; once per transaction."""
        out: list[Output] = []
        headers = [(ORIGIN_HEADER, str(self.batched_origin).encode())] if self.batched_origin is not None else []
        out.extend(self.term_outputs)
        self.term_outputs = []
        for (query_id, variables, part, _run), rows in self.batched.items():
            key, partition = query_id.encode(), query_partition(query_id, self.n_deltas)
            info = self.plans.get(query_id)
            version, distinct, gated = ((info.version, info.counted_distinct, info.gated) if info is not None
                                        else (0, False, False))
            for start in range(0, len(rows), MAX_BATCH_DELTAS):
                value = codec.encode_part_delta_batch(query_id, part, variables,
                                                      rows[start:start + MAX_BATCH_DELTAS], version, distinct, gated)
                out.append(Output(self.topics["deltas.parts"], value, key, partition, headers))
        self.batched, self.batched_origin, self.batch_runs = {}, None, {}
        for query_id, version, routed, as_of in self.ready_due:  # after the snapshot deltas they mark complete
            out.append(Output(self.topics["deltas.parts"], codec.encode_probe_ready(query_id, version, routed, as_of),
                              query_id.encode(), query_partition(query_id, self.n_deltas)))
        self.ready_due = []
        out.extend(self.probes.flush(s for (kind, _p), s in self.shards.items() if kind == "routed"))
        out.extend(self._frontiers())
        return out

    def drop_outputs_of(self, partition: int) -> int:
        """Forget the answer deltas not yet flushed of routed partition ``partition`` and of the whole queries
        it owns (the partition was revoked: they belong to its next owner); return how many were dropped."""
        dropped = self.probes.drop_from(partition)
        self.ready_due = [due for due in self.ready_due if due[2] != partition]
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

    def on_frontier(self, shard: Shard, offset: int, frontiers: dict[int, int]) -> list[Output]:
        """Ingest's Frontier record at ``offset`` of a routed shard: every change up to its seq is applied
        (probes that waited for it are answered)."""
        shard.position = offset + 1
        shard.frontier = max(shard.frontier, frontiers.get(shard.partition, -1))
        out: list[Output] = []
        if shard.evaluator is not None:
            self._probe_outputs(shard, shard.evaluator.advance(shard.frontier), offset, 0, out)
        return out

    def on_probe_batch(self, shard: Shard, offset: int, record: dict) -> list[Output]:
        """A ProbeBatch record at ``offset`` of a routed shard (probes and acks for it, floors)."""
        shard.position = offset + 1
        out: list[Output] = []
        self._probe_outputs(shard, self.probes.on_batch(shard, record, lambda name: self._known(shard, name)),
                            offset, 0, out)
        return out

    def on_routed(self, shard: Shard, offset: int, value: bytes, origin: int | None) -> tuple[list[Output], int]:
        """One record of a routed shard's log, whatever it is; returns (outputs, changes in it)."""
        frontier = codec.frontier_of(value)
        if frontier is not None:
            return self.on_frontier(shard, offset, frontier), 0
        record = codec.probe_batch_of(value)
        if record is not None:
            return self.on_probe_batch(shard, offset, record), 0
        changes = decode_changes("routed", offset, value, origin)
        return self.on_record(shard, offset, changes), len(changes)

    def _known(self, shard: Shard, name: str) -> bool | None:
        """Whether a probe's query is registered here (True), not read from queries.plans yet (None: it
        waits), or unregistered or replaced (False: it dies)."""
        if shard.evaluator is not None and name in shard.evaluator.queries:
            return True
        query_id, _, version = name.rpartition("@")
        info = self.plans.get(query_id)
        if info is None or info.version < int(version or 0):
            return None
        return False

    def _probe_outputs(self, shard: Shard, probed: ProbeOutputs, offset: int, index: int, out: list[Output],
                       origin: int | None = None) -> int:
        """Queue a probe step's probes and acks (see ``ProbeRouting.flush``) and batch its deltas, numbered
        from ``index`` at ``offset``; return the next index."""
        for delta in self.probes.take(shard, probed):
            if delta.query not in shard.outputs:
                continue  # unregistered meanwhile
            born = delta.born_ms or origin
            if not delta.snapshot:
                self._note_origin(born)
            self._part_delta(out, shard, delta.query, delta.sign, delta.row, delta.seq, offset, index,
                             delta.snapshot, born)
            index += 1
        return index

    def _frontiers(self) -> list[Output]:
        """After this transaction's deltas, a Frontier record on every deltas.parts partition for the routed
        shards that moved: every delta they caused up to that seq precedes it (the answers service's release
        rule).  Nothing when nothing moved, so an idle worker writes nothing."""
        moved = {p: s.completed() for (kind, p), s in self.shards.items()
                 if kind == "routed" and s.completed() > self.frontier_sent.get(p, -1)}
        if not moved:
            return []
        self.frontier_sent.update(moved)
        value = codec.encode_frontier(moved)
        return [Output(self.topics["deltas.parts"], value, None, partition) for partition in range(self.n_deltas)]

    def skip(self, shard: Shard, offset: int, value: bytes, error: str) -> list[Output]:
        """A record of a shard's log that cannot be decoded: dead-letter it and move on."""
        shard.position = offset + 1
        topic = "updates.routed" if shard.kind == "routed" else "updates.encoded"
        return [self._dead(topic, shard.partition if shard.kind == "routed" else 0, offset, "schema-mismatch",
                           error, value)]

    # -- output records

    def _snapshot(self, shard: Shard, infos: list[QueryInfo], net: dict[str, Multiset]) -> list[Output]:
        """The netted answers of ``infos`` over the shard's log so far, labelled with the seq they are as of
        (the last change the shard applied; the registry's registered_at_seq counts updates.encoded records,
        which hold many changes each, so it lags far behind)."""
        out: list[Output] = []
        index = SNAPSHOT_INDEX_BASE
        as_of = max(shard.last_seq, shard.frontier)
        for info in infos:
            if info.gated and shard.kind == "routed":
                self.ready_due.append((info.query_id, info.version, shard.partition, as_of))
            for name, _part, _query in info.engine_queries():
                for row, count in sorted(net.get(name, {}).items()):
                    for _ in range(max(count, 0)):
                        # A routed shard's answers are deduplicated by (seq, offset, index): never label
                        # them past what the shard applied, or its next live deltas would look older.
                        label = as_of if shard.kind == "routed" else max(info.registered_at_seq, as_of)
                        self._part_delta(out, shard, name, 1, row, label,
                                         shard.position - 1,
                                         index, True, None)
                        index += 1
        if self.derived:
            out.extend(self._derived_outputs(shard))
        return out

    def _part_delta(self, out: list[Output], shard: Shard, name: str, sign: int, row: tuple[int, ...], seq: int,
                    offset: int, index: int, snapshot: bool, origin: int | None) -> None:
        """A query's answer delta joins its batch (see flush_batches); a part's delta (for the Spark assembly,
        which takes one PartDelta per record) goes to ``out``."""
        columns = shard.columns(name)
        query_id, part = shard.outputs[name]
        sign_name = "PLUS" if sign > 0 else "MINUS"
        if part == WHOLE_QUERY_PART or shard.kind == "routed":
            # A routed shard's part deltas (a by-centre product) are batched too: the answers service
            # releases them in seq order and multiplies them.
            if name in shard.engine.operators:
                info = self.plans.get(query_id)
                if info is not None and info.stream is not None:
                    at = dict(zip(columns, row))
                    self.derived.setdefault(query_id, []).append(
                        (sign, (at["subject"], at["predicate"], at["object"])))
                columns, row = self._operator_row(shard, columns, row)
            runs = self.batch_runs
            last = runs.get((query_id, part))
            if last is None or last[0] != columns:
                last = runs[(query_id, part)] = (columns, 0 if last is None else last[1] + 1)
            self.batched.setdefault((query_id, columns, part, last[1]), []).append(
                (seq, sign_name, row, shard.source_partition, offset, index, snapshot, None))
            return
        value = codec.encode_part_delta(query_id, part, seq, sign_name, dict(zip(columns, row)),
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
                value = codec.encode("DictionaryEntry", {"id": term_id, "term": dictionary.decode(term_id)})
                self.term_outputs.append(Output(topic, value, str(term_id).encode(), term_id % self.n_dictionary))
        return columns, row

    def _learn(self, shard: Shard, changes: list[Change]) -> None:
        """Look up the terms of ``changes`` the shard does not know yet (its operator queries read them)."""
        dictionary = shard.engine.dictionary
        known = getattr(dictionary, "knows", None)
        if known is None or self.term_reader is None:
            return
        missing = {x for c in changes for x in (c[2], c[3], c[4], c[5]) if x != DEFAULT_GRAPH_ID and not known(x)}
        if not missing:
            return
        found = self.term_reader(missing)
        for term_id, term in found.items():
            if term_id in missing:
                dictionary.add(term_id, term)
        lost = missing - found.keys()
        if lost:
            raise LookupError(f"term ids {sorted(lost)[:5]} of updates.encoded are not on the dictionary topic")

    def _learning(self, shard: Shard, changes: Iterable[Change]) -> Iterator[Change]:
        """Pass ``changes`` through, their terms learnt (in chunks) when the shard has operator queries."""
        if not shard.engine.operators or self.term_reader is None:
            yield from changes
            return
        chunk: list[Change] = []
        for change in changes:
            chunk.append(change)
            if len(chunk) >= LEARN_CHUNK:
                self._learn(shard, chunk)
                yield from chunk
                chunk = []
        self._learn(shard, chunk)
        yield from chunk

    def _dead(self, topic: str, partition: int, offset: int, reason: str, message: str, value: bytes) -> Output:
        return dead_letter(self.topics["deadletter"], "worker", self.topics.get(topic, topic), partition, offset,
                           reason, message, value)

    def state_by_query(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for shard in self.shards.values():
            for name, (query_id, _part) in shard.outputs.items():
                totals[query_id] = totals.get(query_id, 0) + shard.state_entries(name)
        return totals


def _parse_metadata(metadata: str | None, size: int) -> list[int]:
    """Plans positions from commit metadata; missing or unreadable -> zeros (every query owes a snapshot)."""
    try:
        positions = json.loads(metadata or "")["plans"]
        if isinstance(positions, list) and len(positions) == size:
            return [int(p) for p in positions]
    except (ValueError, KeyError, TypeError):
        pass
    return [0] * size


def changes_of(kind: str, records: Iterable[tuple[int, bytes, int | None]]) -> Iterator[Change]:
    """Decode ``(offset, value, origin)`` records of a log, skipping undecodable ones (already dead-lettered)."""
    for offset, value, origin in records:
        try:
            changes = decode_changes(kind, offset, value, origin)
        except codec.CodecError:
            continue
        yield from changes
