"""A worker's shards and what it knows of a query (``services.worker.core``): the changes of a shard's log,
:class:`QueryInfo` (how a registered query is placed and evaluated), :class:`Shard` (one engine -- and, routed,
one evaluator of multi-centre queries -- fed by one log) and the helpers of a restore.  No Kafka here."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable, Iterable, Iterator

from cbgp.engine.assembly import split_parts
from cbgp.distributed.evaluator import PartitionEvaluator
from cbgp.change import Change
from cbgp.query.plan import BY_CENTRE, SINGLE_OWNER, Plan, decompose
from cbgp.query.sparql import parse_query
from cbgp.windows.spec import WindowSpec
from services import codec
from services.wire.idempotence import WHOLE_SOURCE_PARTITION
from services.metrics.instruments import RESTORE_PROGRESS
from services.wire.records import WHOLE_QUERY_PART
from services.worker.shard_engine import ShardDictionary, WorkerEngine
from services.wire.registrations import multiplied_in_spark

# Reads log records of a shard: (kind, partition, start, end) -> changes in offset order.
LogReader = Callable[[str, int, int, int], Iterable[Change]]
# Looks term ids up on the dictionary topic: ids -> {id: canonical term} of those found (operator queries
# evaluate expressions over the terms themselves, not only their ids).
TermReader = Callable[[set[int]], dict[int, str]]
LEARN_CHUNK = 2000  # changes whose term ids are looked up at once when a log is replayed


def decode_changes(kind: str, value: bytes) -> list[Change]:
    """The changes of one routed (``kind="routed"``, each with its role) or encoded record (a batch, or a
    format-1 single change; role ``ROLE_BOTH``); raises ``codec.CodecError``.  Refreshes (ADDs of present
    triples, forwarded for event-time windows) change no match and are left out."""
    if kind == "routed":
        return codec.routed_changes(value)
    return [change for change in codec.encoded_changes(value) if not change.refresh]


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
    assemble_in_spark: bool = False  # the worker runs with --assembly spark
    single_owner: bool = False  # the fleet runs with --placement single-owner (for comparison)
    # An operator query (cbgp.algebra's OperatorQuerySpec: FILTER, OPTIONAL, aggregates, ASK, CONSTRUCT...):
    # evaluated whole by its single owner on the total order, the algebra in place of the BGP engine.
    operators: object | None = None
    # A derived stream (CONSTRUCT with stream=<iri>): the named graph its triple deltas are written to, N-Triples.
    stream: str | None = None
    # Where the registry placed it (plan_json's "placement"): the record, not this worker's own decomposition,
    # decides, so workers of another version place a query as the registry announced it (None: a record
    # without one, from an older registry: decided here).
    recorded_placement: str | None = None
    # The seq of the last change below registered_at_seq, as the registry wrote it into the plan (-1: a plan
    # written before that field; WorkerCore.registration_seq reads it in the log then).
    registered_at_change_seq: int = -1

    @property
    def placement(self) -> str:
        """``by-centre`` or ``single-owner`` (``--placement single-owner`` overrides the record, to compare)."""
        if self.single_owner:
            return SINGLE_OWNER
        return self.recorded_placement if self.recorded_placement is not None else self._own_placement()

    def _own_placement(self) -> str:
        """Where this worker's own decomposition would place the query."""
        if self.operators is not None:
            return BY_CENTRE if self._leaf_parts is not None and self.stream is None else SINGLE_OWNER
        return self.plan.placement if self.plan is not None else SINGLE_OWNER

    @cached_property
    def assembled(self) -> bool:
        """Parts published separately, for the Spark job to multiply (``multiplied_in_spark``)."""
        parsed = self.plan.query if self.plan is not None and self.operators is None else None
        return self.assemble_in_spark and multiplied_in_spark(parsed, self.window, self.placement)

    def placement_problem(self) -> str | None:
        """Why this worker cannot evaluate the query as the registry placed it (a by-centre record of a query
        it would not split: registry and workers of different versions), or None."""
        if self.recorded_placement != BY_CENTRE or self.window is not None or self._own_placement() == BY_CENTRE:
            return None
        return (f"query {self.query_id} (version {self.version}): the registry placed it by centre, which this "
                "worker cannot do; the registry and the workers run different versions: upgrade the workers, then "
                "register it again")

    @property
    def windowed(self) -> bool:
        """Windowed queries are evaluated by the Spark job alone (it owns expiry); workers hold nothing."""
        return self.window is not None

    @cached_property
    def operator_parts(self) -> tuple | None:
        """An operator query placed by centre: its BGP leaves' parts (``cbgp.algebra.by_centre.LeafPart``),
        each evaluated by centre like a product's part, the operators applied by the answers service over
        their seq-ordered deltas.  None: not an operator query, or one its single owner evaluates (a leaf with
        a variable predicate, a derived stream, ``--placement single-owner``)."""
        if (self.operators is None or self.stream is not None or self.window is not None
                or self.placement != BY_CENTRE):
            return None
        return self._leaf_parts

    @cached_property
    def _leaf_parts(self) -> tuple | None:
        from cbgp.algebra.by_centre import leaf_parts

        return leaf_parts(self.operators) if self.operators is not None else None

    def engine_queries(self) -> list[tuple[str, int, Plan | str]]:
        """``(engine name, PartDelta.part, query)`` this query registers in a shard's engine (none for a
        probed query: it lives in the shard's evaluator)."""
        if self.operator_parts is not None:  # (a leaf with pushed FILTERs: behind their gate, GatedLeafPart)
            return [(f"{self.query_id}#{part.index}", part.index,
                     part if part.pushed is not None or part.pattern is not None else part.plan)
                    for part in self.operator_parts if not part.probed]
        if self.operators is not None:
            return [(self.query_id, WHOLE_QUERY_PART, self.operators)]
        if self.probed:
            return []
        if self.partitioned and self.plan.product_by_centre:
            # Each part by centre; the answers service multiplies them in seq order.  (Multi-centre parts
            # live in the shard's evaluator: probe_programs.)
            probed = self.plan.probed_parts
            return [(f"{self.query_id}#{part.index}", part.index, part.sparql)
                    for part in split_parts(self.plan.query) if part.index not in probed]
        if self.counted_distinct:
            # Each partition sees only its centre values: it reports every solution's row and the answers
            # service, which sees them all in seq order, applies DISTINCT.
            return [(self.query_id, WHOLE_QUERY_PART, replace(self.plan, query=replace(self.plan.query,
                                                                                      distinct=False)))]
        if not self.assembled:
            return [(self.query_id, WHOLE_QUERY_PART, self.plan)]
        return [(f"{self.query_id}#{part.index}", part.index, part.sparql) for part in split_parts(self.plan.query)]

    @property
    def uses_probes(self) -> bool:
        """Evaluated at least in part by the routed shards' evaluators: a multi-centre query, or a by-centre
        product with multi-centre parts (the rest of it in the engine), or an operator query with such a leaf."""
        if self.operator_parts is not None:
            return any(part.probed for part in self.operator_parts)
        return self.probed or (self.partitioned and bool(self.plan.probed_parts))

    def probe_programs(self) -> list[tuple[str, int, Plan]]:
        """``(evaluator name, PartDelta.part, plan of one multi-centre component)`` this query registers in a
        routed shard's evaluator: a multi-centre query whole, or a product's multi-centre parts.  The name
        carries the version, so a re-registration's probes never meet the old state."""
        if self.probed:
            return [(f"{self.query_id}@{self.version}", WHOLE_QUERY_PART, self.plan)]
        if not self.uses_probes:
            return []
        if self.operator_parts is not None:
            return [(f"{self.query_id}@{self.version}/{part.index}", part.index, part.plan)
                    for part in self.operator_parts if part.probed]
        probed = self.plan.probed_parts
        return [(f"{self.query_id}@{self.version}/{part.index}", part.index, decompose(parse_query(part.sparql)))
                for part in split_parts(self.plan.query) if part.index in probed]

    @property
    def partitioned(self) -> bool:
        """Stars and single-centre components are evaluated per centre value on the routed partitions
        (``Plan.placement`` "by-centre"), and so are operator queries' leaves (``operator_parts``); everything
        else by one owner on the total order."""
        if self.operators is not None:
            return self.operator_parts is not None
        return self.placement == BY_CENTRE

    @property
    def probed(self) -> bool:
        """A multi-centre component placed by centre: evaluated with probes between the routed partitions
        (``services.worker.probes``)."""
        # (a product's or an operator query's multi-centre parts: probe_programs)
        return self.partitioned and self.plan is not None and self.plan.probed

    @property
    def gated(self) -> bool:
        """A registration the answers service releases as one snapshot, once every routed partition has sent
        its share (``PartDeltaColumns.gated``, ``services.answers.release``): every by-centre query's -- a multi-centre
        query's probes, a product's parts' snapshots as of each partition's own position (multiplied), a star's
        snapshots -- so its first answers are as of one seq, and a second owner's copy of them during a
        rebalance is released once (rule 5 there)."""
        return self.partitioned

    @property
    def counted_distinct(self) -> bool:  # (a product's DISTINCT is the assembler's)
        """A partitioned DISTINCT query: its deltas are rows with multiplicity, DISTINCT is applied by the
        answers service (PartDeltaColumns.distinct)."""
        return (self.partitioned and self.plan is not None and self.plan.query.distinct
                and not self.plan.product_by_centre)


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


def tracking_seq(shard: Shard, changes: Iterable[Change]) -> Iterator[Change]:
    """Pass ``changes`` through, keeping the shard's last applied seq (restores replay its log)."""
    for change in changes:
        shard.last_seq = max(shard.last_seq, change.seq)
        shard.last_change = change
        yield change


def with_progress(changes: Iterable, total: int, label: str, every: int = 2000) -> Iterator:
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
    last_change: Change | None = None  # ... and that change (a checkpoint's proof of which log it belongs to)
    versions: dict[str, int] = field(default_factory=dict)  # query id -> registered plan version
    outputs: dict[str, tuple[str, int]] = field(default_factory=dict)  # engine name -> (query id, part)
    # Multi-centre queries (routed shards, services.worker.probes): the evaluator, its queries by probe name,
    # where each was registered here (its registration's updates) and which registrations were marked ready.
    evaluator: PartitionEvaluator | None = None
    probe_queries: dict[str, QueryInfo] = field(default_factory=dict)
    registered_at: dict[str, int] = field(default_factory=dict)
    ready_through: dict[str, int] = field(default_factory=dict)  # ... and the seq it replayed its log to then
    ready_sent: set[str] = field(default_factory=set)
    # (sender partition, query) -> the last (cause, chunk) probe segment taken from it (services.worker.probes:
    # a second owner's copy of a segment is dropped)
    probe_channels: dict[tuple[int, str | None], tuple[int, int]] = field(default_factory=dict)
    # By-centre registrations waiting for this routed partition's log to reach the seq they answer as of
    # (``WorkerCore.registration_seq``): (info, seq), applied at the first record past it.
    pending: list[tuple[QueryInfo, int]] = field(default_factory=list)
    # The offsets of the last change record and (routed shards) the last Frontier mark below the position (-1:
    # none seen), the records of its log below the position its checkpoint's restore reads.
    change_offset: int = -1
    mark_offset: int = -1

    def applied(self) -> int:
        """The seq this routed partition has applied every change of up to (its log is in seq order): every
        delta those changes caused without probes has been emitted."""
        return max(self.frontier, self.last_seq)

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


def parse_metadata(metadata: str | None, size: int) -> list[int]:
    """Plans positions from commit metadata; missing or unreadable -> zeros (every query owes a snapshot)."""
    try:
        positions = json.loads(metadata or "")["plans"]
        if isinstance(positions, list) and len(positions) == size:
            return [int(p) for p in positions]
    except (ValueError, KeyError, TypeError):
        pass
    return [0] * size


def changes_of(kind: str, records: Iterable[tuple[int, bytes]]) -> Iterator[Change]:
    """Decode ``(offset, value)`` records of a log, skipping undecodable ones (already dead-lettered)."""
    for _offset, value in records:
        try:
            changes = decode_changes(kind, value)
        except codec.CodecError:
            continue
        yield from changes
