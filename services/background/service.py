"""``cbgp background``: SERVICE view graphs kept in step with their endpoints, the Kafka loop.

Sources: ``queries.plans`` (every registration, read from the start at each life, then followed in short
windows).  Sinks: ``updates.raw`` (SPARQL Update requests on the view graphs, keyed by the graph so that one
view's requests stay in order on one partition) and ``queries.status`` (accuracy alerts).  The transform is
:class:`services.background.core.BackgroundCore`.

Order per round: 1. read new plans; 2. publish the drops they cause; 3. read updates.encoded for the join keys
of windowed queries on window-join (WSJ) views (:class:`StreamKeys`, only while there are such); 4. fill and
refresh what is due and publish it; 5. wait until every request is acknowledged (``flush``) before the next
round.  No transaction:
a request applied twice changes nothing more (set semantics), and a restart re-fills every view.  One
instance is enough (a Deployment with one replica): two would refresh the same views twice, harmlessly.
"""

from __future__ import annotations

import argparse
import logging
import time

from confluent_kafka import TopicPartition

from services import codec
from services.background.core import BackgroundCore
from services.metrics.instruments import UPDATES_OUT
from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets, make_consumer, make_producer
from services.runtime.life import Stopper, service_command
from services.wire.records import query_error
from services.wire.loglines import kv
from services.kafka.replay import require_from
from services.kafka.fetch import WINDOW_POLL_SECONDS, read_window, record_ok

log = logging.getLogger("cbgp.background")

SERVICE = "background"
UPDATE_CONTENT_TYPE = b"application/sparql-update"
PATCH_CONTENT_TYPE = b"application/rdf-patch"
VIEW_HEADER = "cbgp-view"  # the view graph a request maintains (provenance, for `cbgp deadletter`)
PLANS_POLL_SECONDS = 1.0  # a new SERVICE registration is filled at most about this late


def run(settings: KafkaSettings, args: argparse.Namespace, stopper: Stopper, ready: list[bool]) -> None:
    core = BackgroundCore()
    t_plans, t_raw, t_status = (settings.topic(t) for t in ("queries.plans", "updates.raw", "queries.status"))
    producer = make_producer(settings)
    plans = make_consumer(settings, f"{settings.topic_prefix}background.plans", enable_partition_eof=True)
    published = UPDATES_OUT.labels(SERVICE)

    def publish(topic: str, value: bytes, headers: list[tuple[str, bytes]]) -> None:
        producer.produce(topic, value, None, headers=headers)  # both topics have one partition: one order
        published.inc()

    def publish_requests(requests: list[tuple[str, str]]) -> None:
        for graph, text in requests:
            # (a view's re-added triples are an RDF Patch transaction, ViewGraph.refresh_patch; the rest SPARQL Update)
            media = PATCH_CONTENT_TYPE if text.startswith("TX .") else UPDATE_CONTENT_TYPE
            publish(t_raw, text.encode(), [("content-type", media), (VIEW_HEADER, graph.encode())])

    stream = StreamKeys(settings)
    try:
        highs = {p: hi for p, (_lo, hi) in end_offsets(settings, t_plans).items()}
        require_from(settings, t_plans, {p: 0 for p, hi in highs.items() if hi > 0})  # every plan is needed
        positions = {p: 0 for p in highs}
        # Every registration before the first fill.  Progress is the consumer's position, not the last record's
        # offset: a transaction marker or a compacted-away record may end a partition.
        plans.assign([TopicPartition(t_plans, p, 0) for p in highs])
        pending = {p for p, hi in highs.items() if hi > 0}
        deadline = time.monotonic() + 60
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"queries.plans partitions {sorted(pending)} not read to their end")
            _apply(core, plans.consume(500, 0.2), positions, publish_requests)
            for tp in plans.position([TopicPartition(t_plans, p) for p in sorted(pending)]):
                if tp.offset >= highs[tp.partition]:
                    positions[tp.partition] = max(positions[tp.partition], tp.offset)
                    pending.discard(tp.partition)
        plans.unassign()  # from here on read in short windows (read_window): an assigned idle partition spins
        ready[0] = True
        log.info(kv(event="plans-read", views=len(core.views)))
        next_plans = 0.0
        while not stopper.stopping:
            now = time.monotonic()
            if now >= next_plans:
                _apply(core, read_window(plans, t_plans, positions), positions, publish_requests)
                next_plans = now + PLANS_POLL_SECONDS
            stream.follow(core)  # (windowed queries on a WSJ view: their windows' join keys)
            publish_requests(core.due())
            for alert in core.alerts:
                for query_id in alert.query_ids:
                    publish(t_status, query_error(query_id, alert.message), [])
                log.warning(kv(event="accuracy-alert", queries=",".join(alert.query_ids), message=alert.message))
            core.alerts.clear()
            if producer.flush(30) > 0:
                raise TimeoutError("view requests not acknowledged within 30 s")
            due = core.next_due()
            wait = next_plans - time.monotonic()
            if due is not None:
                wait = min(wait, due / 1000.0 - time.time())
            time.sleep(min(max(wait, 0.0), WINDOW_POLL_SECONDS * 5))  # idle costs a plans window a second
    finally:
        ready[0] = False
        plans.close()
        stream.close()
        producer.flush(5)


class StreamKeys:
    """updates.encoded for the join keys of windowed queries that read a view with a window-join (WSJ) policy
    (``BackgroundCore.on_changes``): opened when the first such view appears, from the offsets of the records
    written since the windows' horizon (``offsets_for_times``: no state to restore), then followed in short
    windows like the plans; closed again when none is left."""

    MAX_RECORDS = 2000  # per read window
    MAX_WINDOWS = 20  # per round: a backlog is read over several rounds, the refreshes go on meanwhile

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.topic = settings.topic("updates.encoded")
        self.consumer = None
        self.positions: dict[int, int] = {}

    def follow(self, core: BackgroundCore) -> None:
        horizon = core.stream_horizon_ms()
        if horizon is None:
            self.close()
            return
        if self.consumer is None:
            self.consumer = make_consumer(self.settings, f"{self.settings.topic_prefix}background.encoded",
                                          enable_partition_eof=True)
            since = int(time.time() * 1000 - horizon)
            highs = end_offsets(self.settings, self.topic)
            found = self.consumer.offsets_for_times([TopicPartition(self.topic, p, since) for p in highs], 10)
            self.positions = {tp.partition: tp.offset if tp.offset >= 0 else highs[tp.partition][1] for tp in found}
            log.info(kv(event="window-keys-followed", topic=self.topic, since_ms=since,
                        positions=",".join(f"{p}:{o}" for p, o in sorted(self.positions.items()))))
        for _ in range(self.MAX_WINDOWS):
            msgs = read_window(self.consumer, self.topic, self.positions, self.MAX_RECORDS)
            changes: list = []
            for msg in msgs:
                if not record_ok(msg, log):
                    continue
                self.positions[msg.partition()] = msg.offset() + 1
                try:
                    changes.extend(codec.encoded_changes(msg.value()))
                except codec.CodecError:
                    continue  # (the workers dead-letter it)
            core.on_changes(changes)
            if len(msgs) < self.MAX_RECORDS:
                break

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
            self.consumer = None


def _apply(core: BackgroundCore, msgs: list, positions: dict[int, int], publish_requests) -> None:  # noqa: ANN001
    for msg in msgs:
        if not record_ok(msg, log):
            continue
        positions[msg.partition()] = msg.offset() + 1
        query_id = msg.key().decode("utf-8", "replace") if msg.key() else None
        if query_id is None:
            continue
        try:
            record = None if msg.value() is None else codec.decode("QueryPlan", msg.value())
        except codec.CodecError as exc:
            log.warning(kv(event="plan-skipped", query=query_id, reason=str(exc)))
            continue
        publish_requests(core.on_plan(query_id, record))


def register(commands: argparse._SubParsersAction) -> dict:
    return service_command(commands, SERVICE, "keep SERVICE view graphs in step with their endpoints (service)",
                           run, batch=1, batch_help="unused (the service publishes per refresh round)")

