"""Each data-path service's topology, as data: sources -> processor -> sinks (``cbgp describe SERVICE``).

In the spirit of Kafka Streams' ``Topology#describe()``: what a service reads, which transform it runs and
what it writes, with each topic's key and how records are placed on (or read from) its partitions.  No Kafka
in here, and no broker is needed to print it.  ``tests/services/wire/test_topology.py`` checks every topic named here
against the catalogue (``services.kafka.topics.TOPICS``: same key), that every catalogue topic is used, and
that the Helm chart creates exactly the catalogue's topics.  ``N`` is the configured partition count.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

__all__ = ["Edge", "Topology", "TOPOLOGIES", "describe", "describe_json"]


@dataclass(frozen=True)
class Edge:
    """One topic a service reads (a source) or writes (a sink)."""

    topic: str  # catalogue name, without the prefix
    key: str  # the record key, as the catalogue describes it
    partitioning: str  # where records go (sinks) or which partitions are read, and how (sources)


@dataclass(frozen=True)
class Topology:
    service: str  # the `cbgp` command that runs it
    processor: str  # the transform (module.Class or function)
    job: str
    sources: tuple[Edge, ...]
    sinks: tuple[Edge, ...]
    loop: str = ""  # what drives it: the one runner and its Processor, or the service's own loop, and why


    def topics(self) -> set[str]:
        return {edge.topic for edge in (*self.sources, *self.sinks)}


_ONE = "1 partition"
_BY_QUERY = "query_partition(query id, N)"
_RUNNER = "services.runtime.runner.run_processor"  # the one transactional poll -> process -> commit loop

TOPOLOGIES: dict[str, Topology] = {t.service: t for t in (
    Topology(
        "ingest", "services.ingest.core.IngestProcessor",
        "parse, deduplicate, number, dictionary-encode and route raw updates",
        sources=(
            Edge("updates.raw", "none", f"{_ONE}, the graph's change order; consumer group <prefix>ingest"),
            Edge("dictionary", "term id or value hash", "all partitions from the checkpoint's positions (offset 0 without one), "
                 "at start (restore the dictionary)"),
            Edge("updates.encoded", "none", f"{_ONE} from the checkpoint's position (offset 0 without one), at start "
                 "(restore the presence set and seq)"),
            Edge("checkpoints.ingest", "kind/partition", f"{_ONE}: the last snapshot, at start, when this "
                 "instance's disk holds no checkpoint at the logs' ends"),
        ),
        sinks=(
            Edge("updates.encoded", "none", f"{_ONE}: the total order, seq 1, 2, ... (EncodedColumns records)"),
            Edge("updates.routed", "centre term id",
                 "services.wire.records.routes: id % N of the subject and of the object (BOTH when equal); "
                 "RoutedColumns and Frontier records"),
            Edge("dictionary", "term id or value hash", "term id % N, each new term once, in one record per partition a transaction"),
            Edge("deadletter", "none", f"{_ONE}: a rejected statement"),
            Edge("checkpoints.ingest", "kind/partition", f"{_ONE}: the whole state, in the transaction after the "
                 "checkpoint; older snapshots deleted once it committed"),
        ),
        loop=f"{_RUNNER}(services.ingest.service.IngestService)",
    ),
    Topology(
        "worker", "services.worker.core.WorkerCore",
        "hold star state per routed partition and whole queries' state; emit per-query part deltas",
        sources=(
            Edge("queries.plans", "query id", "all partitions from offset 0, never committed"),
            Edge("updates.routed", "centre term id", "consumer group <prefix>workers: routed shards"),
            Edge("updates.encoded", "none",
                 f"{_ONE}, one group <group>.encoded.<P> per owned routed partition P: whole-query shards"),
            Edge("checkpoints.routed", "kind/partition", "partition P's last checkpoint, when routed shard P is "
                 "restored and this instance's disk holds none as new as its committed offset"),
            Edge("checkpoints.whole", "kind/partition", "partition P's last checkpoint, for whole shard P, likewise"),
        ),
        sinks=(
            Edge("deltas.parts", "query id", f"{_BY_QUERY}; idempotence keys of services.wire.idempotence"),
            Edge("updates.routed", "centre term id",
                 "ProbeColumns records (no key) of multi-centre queries, to the partition of the next centre value"),
            Edge("dictionary", "term id or value hash", "terms an operator query makes (counts, BIND values, booleans)"),
            Edge("updates.raw", "none", f"{_ONE}: a derived stream's triples (CONSTRUCT with stream=<iri>)"),
            Edge("deadletter", "none", f"{_ONE}: an undecodable input record"),
            Edge("checkpoints.routed", "kind/partition", "shard P's checkpoint to partition P, in the transaction "
                 "after the one it reflects; older ones deleted once it committed"),
            Edge("checkpoints.whole", "kind/partition", "whole shard P's checkpoint to partition P, likewise"),
        ),
        loop=f"{_RUNNER}(services.worker.service.WorkerService)",
    ),
    Topology(
        "answers", "services.answers.core.AnswersCore",
        "number each query's whole-query deltas, drop duplicates, decode terms, keep multiplicities",
        sources=(
            Edge("deltas.parts", "query id", "consumer group <prefix>answers (part = -1 records); at assignment, "
                 "from the checkpoint's position (offset 0 without one) to the committed offset (restore)"),
            Edge("queries.plans", "query id", "all partitions, read continuously (registration versions)"),
            Edge("dictionary", "term id or value hash", "all partitions, read continuously (term ids -> terms)"),
            Edge("answers", "query id", "the assigned partitions from the checkpoint's answers end (offset 0 "
                 "without one), at assignment (restore)"),
            Edge("checkpoints.deltas", "kind/partition", "partition P's last checkpoint, when P is assigned and "
                 "this instance's disk holds none as new as its committed offset"),
            Edge("updates.routed", "centre term id", "partition count only (routed frontiers to wait for)"),
        ),
        sinks=(
            Edge("answers", "query id", "the partition of the deltas.parts record (= query_partition(query id, N))"),
            Edge("answers.current", "query id + binding", "the same partition as the query's answers"),
            Edge("deadletter", "none", f"{_ONE}: an undecodable delta"),
            Edge("checkpoints.deltas", "kind/partition", "partition P's checkpoint to partition P, in the "
                 "transaction after the one it reflects; older ones deleted once it committed"),
        ),
        loop=f"{_RUNNER}(services.answers.service.AnswersService)",
    ),
    Topology(
        "registry", "services.registry.core.Registry",
        "decide admin commands: publish query plans (or tombstones) and status replies (a faust app)",
        sources=(
            Edge("admin", "none", f"{_ONE}, in the order users sent the commands (faust agent)"),
            Edge("queries.plans", "query id", "all partitions from offset 0, at start (restore the registered set)"),
            Edge("updates.encoded", "none", f"{_ONE}: end offset only (the seq a registration starts at)"),
        ),
        sinks=(
            Edge("queries.plans", "query id", "by key (compacted: the current plan per query id)"),
            Edge("queries.status", "none", f"{_ONE}: one reply per command"),
            Edge("deadletter", "none", f"{_ONE}: an undecodable admin record"),
        ),
        loop="faust's agent loop (services.registry.service): one admin command at a time, exactly once",
    ),
    Topology(
        "background", "services.background.core.BackgroundCore",
        "keep each SERVICE view graph equal to its endpoint's matches, refreshed within a budget",
        sources=(
            Edge("queries.plans", "query id", "all partitions from offset 0, then followed (the SERVICE views)"),
        ),
        sinks=(
            Edge("updates.raw", "none", f"{_ONE}: SPARQL Update requests on the view graphs (fill, refresh, drop)"),
            Edge("queries.status", "none", f"{_ONE}: an accuracy alert (estimate below service.alpha)"),
        ),
        loop="services.background.service.run: a timer loop (refreshes are due by time, not by input; nothing consumed "
             "is committed, so no transaction)",
    ),
    Topology(
        "spark-job", "spark.window_stream.window_group, spark.assembly_stream.assemble_group, spark.compaction.compact_batch",
        "event-time windows, multi-part assembly and answer compaction (PySpark Structured Streaming)",
        sources=(
            Edge("updates.encoded", "none", f"{_ONE} (windows)"),
            Edge("queries.plans", "query id", "all partitions, at every micro-batch (windows, assembly)"),
            Edge("deltas.parts", "query id", "all partitions, part >= 0 records (assembly)"),
            Edge("answers", "query id", "all partitions (compaction)"),
        ),
        sinks=(
            Edge("deltas.parts", "query id",
                 f"{_BY_QUERY}, part = -1: window answers (source -2) and assembled answers (source -100 - p)"),
            Edge("answers.current", "query id + binding", "the partition of the query's answers (compaction)"),
        ),
        loop="Spark Structured Streaming micro-batches (spark.job), checkpointed by Spark",
    ),
    Topology(
        "gateway", "services.gateway.service.Gateway",
        "serve live answers (SEPA WebSocket, SSE, REST, console) and forward updates and registrations; "
        "checkpoint-free: no group, nothing committed",
        sources=(
            Edge("queries.plans", "query id", "all partitions from offset 0, read continuously (registered queries)"),
            Edge("answers", "query id", "all partitions from offset 0, read continuously (streams, current answers)"),
            Edge("queries.status", "none", f"{_ONE}: the registry's reply to each admin command it sent"),
            Edge("dictionary", "term id or value hash", "all partitions, on POST /query (the current graph's terms)"),
            Edge("updates.encoded", "none", f"{_ONE}, on POST /query (the current graph, read up to its end)"),
        ),
        sinks=(
            Edge("updates.raw", "none", f"{_ONE}: one record per POST /update (header cbgp-format sparql-update)"),
            Edge("admin", "none", f"{_ONE}: REGISTER / UNREGISTER from POST/DELETE /queries and SEPA subscribe"),
        ),
        loop="aiohttp's event loop (services.gateway.app), readers in threads",
    ),
)}


def describe(service: str) -> str:
    """``service``'s topology as text, one line per topic: sources, then the processor, then sinks."""
    topology = TOPOLOGIES[service]
    width = max(len(edge.topic) for edge in (*topology.sources, *topology.sinks))

    def line(arrow: str, edge: Edge) -> str:
        return f"  {arrow} {edge.topic:<{width}}  key: {edge.key:<18}  {edge.partitioning}"

    lines = [f"Topology: cbgp {topology.service}", "  Sources:"]
    lines += [line("<-", edge) for edge in topology.sources]
    lines += ["  Processor:", f"     {topology.processor}", f"     ({topology.job})", "  Sinks:"]
    lines += [line("->", edge) for edge in topology.sinks]
    lines += ["  Loop:", f"     {topology.loop}"]
    return "\n".join(lines)


def describe_json(service: str) -> str:
    """``service``'s topology as JSON: ``{service, processor, job, sources: [...], sinks: [...]}``."""
    return json.dumps(asdict(TOPOLOGIES[service]), indent=2)
