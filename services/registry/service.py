"""The registry service as a faust-streaming app: admin topic -> :class:`services.registry.core.Registry`.

How it works: docs/design/internals.md, services.registry.service.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import sys
import time
from pathlib import Path
from urllib.parse import quote
from typing import Any, Callable

import faust
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from services.codec import CodecError, decode, encode, encoded_changes
from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets, make_consumer, make_producer, read_all
from services.metrics.exposition import start_metrics_server
from services.metrics.instruments import UPDATES_IN, UPDATES_OUT
from services.wire.records import dead_letter
from services.wire.registrations import change_seq_before
from services.registry.core import VERSION_HEADER, Decision, Registry, tombstone_version
from services.kafka.truncation import LogTruncated
from services.runtime.life import Stopper, wait_for_topics
from services.wire.loglines import kv
from services.wire.pages import PageError, page, page_params
from services.kafka.replay import read_range

__all__ = ["RegistryService", "build_app", "describe", "run_service"]

log = logging.getLogger("cbgp.registry")
SERVICE = "registry"
ADMIN_BATCH = 500  # admin commands handled as one batch, at most
# How long a command waits for others to join its batch.  faust's take_events wakes the event loop at this
# period even while nothing comes: 0.02 s cost an idle registry 0.015-0.018 core (docs/benchmarks.md).
ADMIN_BATCH_WAIT_S = 0.1
ADMIN_BUFFER = 262_144  # admin commands fetched ahead of the one being handled, at most


def describe(settings: KafkaSettings) -> dict[str, Any]:
    """The service's topology as data (sources, sinks, stores, views), for docs and tests."""
    return {
        "sources": [settings.topic("admin")],
        "sinks": [settings.topic("queries.plans"), settings.topic("queries.status"), settings.topic("deadletter")],
        "stores": {},  # the registered set lives in queries.plans; the web views read it from memory
        "restores_from": settings.topic("queries.plans"),
        "views": ["GET /queries", "GET /queries/{id}"],
    }


class RegistryService:
    """The Kafka side of the registry: restore, decode, decide, publish (in that order), reply."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.registry = Registry()
        self.producer: Producer = make_producer(settings)
        # One long-lived consumer for watermarks of updates.encoded (registered_at_seq): a broker round trip,
        # not a group join, per REGISTER.
        self._watermarks = make_consumer(settings, f"{settings.topic_prefix}registry-watermarks")
        self.ready = False

    def restore(self) -> int:
        """Rebuild the registered set from ``queries.plans``; undecodable plan records are skipped with a warning."""
        records: list[tuple[str, dict[str, Any] | None]] = []
        retired: dict[str, int] = {}  # versions named by tombstones (their plans may be compacted away)
        for msg in read_all(self.settings, self.settings.topic("queries.plans"), timeout=60, restore=True):
            key = (msg.key() or b"").decode("utf-8", "replace")
            if msg.value() is None:
                records.append((key, None))
                version = tombstone_version(msg.headers())
                if version is not None:
                    retired[key] = max(version, retired.get(key, 0))
                continue
            try:
                records.append((key, decode("QueryPlan", msg.value())))
            except CodecError as exc:
                log.warning("queries.plans offset %d: skipping undecodable plan: %s", msg.offset(), exc)
        # read_all orders by partition then offset; one key lives in one partition, so per-key order holds.
        count = self.registry.restore(records)
        for key, version in retired.items():
            self.registry.retired[key] = max(version, self.registry.retired.get(key, 0))
        return count

    def encoded_end(self, patience_s: float = 60.0) -> int:
        """End offset of ``updates.encoded`` = number of changes ordered so far = seq of the last one.

        Transient broker errors (the topic not in this client's metadata yet right after the topics were
        created, a broker restart) are retried for ``patience_s``: they say nothing about the command.
        """
        tp = TopicPartition(self.settings.topic("updates.encoded"), 0)
        deadline = time.monotonic() + patience_s
        while True:
            try:
                _low, high = self._watermarks.get_watermark_offsets(tp, timeout=10)
                return max(high, 0)
            except KafkaException as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("end of %s not available yet (%s); retrying", tp.topic, exc)
                time.sleep(0.5)
                try:  # librdkafka keeps "unknown partition" until its next metadata refresh (minutes): ask now
                    self._watermarks.list_topics(tp.topic, timeout=10)
                except KafkaException:
                    pass

    def change_seq_before(self, end: int) -> int:
        """The seq of the last change in updates.encoded below offset ``end``, for the plan: workers then need
        not read the log next to every registration at every restore."""
        topic = self.settings.topic("updates.encoded")

        def changes_in(start: int, stop: int) -> list:
            changes = []
            for msg in read_range(self.settings, topic, 0, start, stop):
                try:
                    changes.extend(encoded_changes(msg.value() or b""))
                except CodecError:
                    continue  # (not ingest's: the workers skip it too)
            return changes

        try:
            return change_seq_before(changes_in, end, end_offsets(self.settings, topic)[0][0])
        except LogTruncated as exc:  # (deleted up to the end: the plan leaves it to its readers)
            log.warning("registered_at_change_seq left unknown: %s", exc)
            return -1

    def handle(self, records: list[tuple[bytes | None, int, int]]) -> list[Decision]:
        """Process admin records ``(value, partition, offset)`` in order, as one batch (run in an executor thread);
        return the applied decisions, whose statuses :meth:`reply` sends (errors are answered here).

        Each command is decided against the set the ones before it left; their plans are published together and
        acknowledged once (a registration is a broker round trip, not three).  If the broker does not take them,
        the set goes back to what it was and the error is raised: the agent handles the batch again."""
        before = self.registry.snapshot()
        ends: list[int] = []  # updates.encoded's end, read once per batch: every command of it is registered there
        seqs: dict[int, int] = {}
        errors: list[KafkaError] = []

        def encoded_end() -> int:
            if not ends:
                ends.append(self.encoded_end())
            return ends[0]

        def seq_before(end: int) -> int:
            if end not in seqs:
                seqs[end] = self.change_seq_before(end)
            return seqs[end]

        decisions: list[Decision] = []
        try:
            for value, partition, offset in records:
                decision = self._decide(value, partition, offset, encoded_end, seq_before)
                if decision is None:
                    continue
                # Step 1: the plan (or tombstone) is on its way before the set changes; durable before any reply.
                if decision.plan is not None:
                    key, plan = decision.plan
                    # A tombstone names the version it ends (VERSION_HEADER): compaction keeps it after the plan.
                    ended = self.registry.queries.get(key) if plan is None else None
                    self.producer.produce(
                        self.settings.topic("queries.plans"), value=None if plan is None else encode("QueryPlan", plan),
                        key=key.encode(), on_delivery=lambda err, _msg: errors.append(err) if err else None,
                        headers=[(VERSION_HEADER, str(ended.version).encode())] if ended is not None else None)
                    UPDATES_OUT.labels(SERVICE).inc()
                # Step 2: the registered set follows the plans (the next command of the batch sees this one).
                self.registry.commit(decision)
                decisions.append(decision)
            if self.producer.flush(30) or errors:
                raise RuntimeError(f"cannot publish to {self.settings.topic('queries.plans')}: "
                                   f"{errors[0] if errors else 'not acknowledged in 30s'}")
        except BaseException:
            self.registry.rollback(before)
            raise
        return decisions

    def _decide(self, value: bytes | None, partition: int, offset: int, encoded_end: Callable[[], int],
                change_seq_before: Callable[[int], int]) -> Decision | None:
        UPDATES_IN.labels(SERVICE).inc()
        try:
            if value is None:
                raise CodecError("empty record (null value)")
            command = decode("AdminCommand", value)
        except CodecError as exc:
            self._reject_record(value or b"", partition, offset, str(exc))
            return None
        try:
            return self.registry.decide(command, encoded_end, change_seq_before)
        except KafkaException as exc:
            # The broker, not the command: raise, and the agent handles the batch again (build_app).
            raise RuntimeError(f"admin offset {offset}: broker unavailable: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - an unexpected bug must answer the user, not kill the service
            log.exception("admin offset %d: internal error", offset)
            self._send(self.settings.topic("queries.status"),
                       encode("QueryStatus", self.registry.error(f"internal error: {type(exc).__name__}: {exc}",
                                                                 command.get("request_id"))))
            return None

    def committed_admin_offset(self) -> int:
        """The admin offset this registry's group committed (where a new life starts), 0 if none."""
        group = make_consumer(self.settings, f"{self.settings.topic_prefix}registry")
        try:
            tp = group.committed([TopicPartition(self.settings.topic("admin"), 0)], timeout=30)[0]
            return max(tp.offset, 0)
        finally:
            group.close()

    def missed_admin_records(self, start: int, end: int) -> list[tuple[bytes | None, int, int]]:
        """Admin records ``[start, end)`` of partition 0 as ``(value, partition, offset)``, read directly."""
        return [(m.value(), m.partition(), m.offset())
                for m in read_range(self.settings, self.settings.topic("admin"), 0, start, end)]

    def reply(self, decisions: list[Decision]) -> None:
        """Step 3 of :meth:`handle`, called once the web views show the decisions: ACCEPTED always means "the
        plan is on queries.plans and the web view lists it"."""
        errors: list[KafkaError] = []
        topic = self.settings.topic("queries.status")
        for decision in decisions:
            self.producer.produce(topic, encode("QueryStatus", decision.status),
                                  on_delivery=lambda err, _msg: errors.append(err) if err else None)
            UPDATES_OUT.labels(SERVICE).inc()
        if self.producer.flush(30) or errors:
            raise RuntimeError(f"cannot publish to {topic}: {errors[0] if errors else 'not acknowledged in 30s'}")

    def _reject_record(self, value: bytes, partition: int, offset: int, reason: str) -> None:
        message = f"undecodable admin record at offset {offset}: {reason}"
        log.warning(message)
        dead = dead_letter(self.settings.topic("deadletter"), SERVICE, self.settings.topic("admin"), partition,
                           offset, "schema-mismatch", message, bytes(value), at_ms=self.registry.error("")["at_ms"])
        self._send(dead.topic, dead.value)
        self._send(self.settings.topic("queries.status"), encode("QueryStatus", self.registry.error(message)))

    def _send(self, topic: str, value: bytes | None, key: str | None = None,
              headers: list[tuple[str, bytes]] | None = None) -> None:
        errors: list[KafkaError] = []
        self.producer.produce(topic, value=value, key=key.encode() if key is not None else None, headers=headers,
                              on_delivery=lambda err, _msg: errors.append(err) if err else None)
        if self.producer.flush(30) or errors:
            # Not acknowledged: raise so faust does not commit this admin offset; the command is replayed.
            raise RuntimeError(f"cannot publish to {topic}: {errors[0] if errors else 'not acknowledged in 30s'}")
        UPDATES_OUT.labels(SERVICE).inc()

    def close(self) -> None:
        self.producer.flush(10)
        self._watermarks.close()


# noida-db (the embedded broker) answers an empty Fetch at once instead of holding it for fetch.max.wait, and
# aiokafka sends the next Fetch as soon as the last one returned: an idle registry spun at 0.7-0.9 core (and
# kept the broker busy answering).  faust reads only the admin topic, a few records a day, so after a fetch that brought nothing aiokafka waits EMPTY_FETCH_BACKOFF_S before the next one (a
# command waits at most that much longer; a fetch that brings records is followed at once).
EMPTY_FETCH_BACKOFF_S = 0.25


def install_empty_fetch_backoff(backoff_s: float = EMPTY_FETCH_BACKOFF_S) -> None:
    """Make aiokafka's fetcher pause ``backoff_s`` after a fetch response with no records (idempotent)."""
    from aiokafka.consumer.fetcher import Fetcher

    original = Fetcher._proc_fetch_request
    if getattr(original, "_cbgp_backoff", None) is not None:
        original = original._cbgp_original  # type: ignore[attr-defined]

    async def proc_fetch_request(self: Any, assignment: Any, node_id: Any, request: Any) -> bool:
        records_before = len(self._records)
        woke = await original(self, assignment, node_id, request)
        if not woke and len(self._records) == records_before and assignment.active:
            # Still "in flight" for this node while we sleep, so the fetch loop sends nothing meanwhile;
            # an unassignment cancels the sleep with the task.
            try:
                await asyncio.sleep(backoff_s)
            except asyncio.CancelledError:  # close() or an unassignment: the result is of no interest
                return False
        return woke

    proc_fetch_request._cbgp_backoff = backoff_s  # type: ignore[attr-defined]
    proc_fetch_request._cbgp_original = original  # type: ignore[attr-defined]
    Fetcher._proc_fetch_request = proc_fetch_request  # type: ignore[method-assign]


def _faust_rebalance_options(settings: KafkaSettings) -> dict[str, float]:
    """``rebalance_timeout_ms`` (the embedded broker's JoinGroup workaround) in faust's terms, seconds."""
    if settings.rebalance_timeout_ms is None:
        return {}
    seconds = settings.rebalance_timeout_ms / 1000
    return {"broker_rebalance_timeout": seconds, "broker_max_poll_interval": seconds}


def _faust_broker_options(settings: KafkaSettings) -> dict[str, Any]:
    """faust (aiokafka) connection options from the shared settings (security included)."""
    servers = ";".join(f"kafka://{s.strip()}" for s in settings.bootstrap_servers.split(","))
    options: dict[str, Any] = {"broker": servers}
    proto = (settings.security_protocol or "PLAINTEXT").upper()
    ctx = ssl.create_default_context(cafile=settings.ssl_ca_location) if "SSL" in proto else None
    if proto.startswith("SASL"):
        options["broker_credentials"] = faust.SASLCredentials(
            username=settings.sasl_username, password=settings.sasl_password,
            mechanism=settings.sasl_mechanism or "PLAIN", ssl_context=ctx)
    elif ctx is not None:
        options["broker_credentials"] = faust.SSLCredentials(ctx)
    return options


def admin_gap(expected: int, offset: int) -> range | None:
    """What to do with admin ``offset`` when ``expected`` is the next one to process: None if it was processed
    already (skip it), else the offsets before it that the consumer skipped (read them directly first).

    Every admin offset must be processed exactly once and in order, whatever faust delivers: right after a
    registry restart with static membership on the embedded broker, faust (aiokafka) was seen to skip an
    offset and deliver the next one twice, so the skipped REGISTER was never answered
    (``bench/registry_gap_repro.py`` shows it; it happened in kill -9 fault runs with two commands sent
    while the registry restarted)."""
    if offset < expected:
        return None
    return range(expected, offset)


async def _until_done(loop: asyncio.AbstractEventLoop, step: Callable, *args: Any) -> Any:
    """``step(*args)`` in an executor thread, again after a second while the broker does not acknowledge."""
    while True:
        try:
            return await loop.run_in_executor(None, step, *args)
        except RuntimeError as exc:
            log.error(kv(event="retry", service=SERVICE, reason=str(exc).replace("\n", " ")))
            await asyncio.sleep(1.0)


def build_app(service: RegistryService, *, web_port: int, web_host: str, state_dir: str | os.PathLike[str]) -> faust.App:
    """The faust app: agent on ``admin``, web views of the published registrations, the task that fills them."""
    settings = service.settings
    datadir = Path(state_dir) / f"{settings.topic_prefix}registry"
    datadir.parent.mkdir(parents=True, exist_ok=True)  # faust creates only the last level
    app = faust.App(
        f"{settings.topic_prefix}registry",
        **_faust_broker_options(settings),
        store="memory://",
        topic_partitions=1,
        topic_replication_factor=settings.replication_factor,
        broker_session_timeout=6,
        broker_heartbeat_interval=2,
        **_faust_rebalance_options(settings),
        consumer_auto_offset_reset="earliest",
        web_enabled=True, web_port=web_port, web_host=web_host, web_bind=web_host,
        datadir=str(datadir),
        producer_acks=-1,
        # faust stops fetching a partition whose stream buffer is 80% full and should resume it once drained; under
        # a loaded fleet and a burst of registrations that resume can fail to come.  Commands are small: let them
        # wait here.
        stream_buffer_maxsize=ADMIN_BUFFER,
    )
    admin = app.topic(settings.topic("admin"), partitions=1, key_type=bytes, value_type=bytes,
                      key_serializer="raw", value_serializer="raw", internal=False)
    # What the web views show: the registrations whose plans are durable (filled from the set restored from
    # queries.plans, then each decision once its plans are acknowledged).  Not a faust Table: its changelog
    # would repeat queries.plans, one more write per registration, and faust's producer can stall on it under
    # thousands of registrations at once.
    table: dict[str, dict[str, Any]] = {}

    def mirror(decision: Decision) -> None:
        if decision.entry is not None:
            table[decision.entry.query_id] = decision.entry.view()
        if decision.removed is not None:
            table.pop(decision.removed, None)

    @app.agent(admin)
    async def handle_admin(stream: faust.StreamT) -> None:
        loop = asyncio.get_running_loop()
        expected: int | None = None  # the next admin offset this life must process
        # Commands that arrive together are handled as one batch (a thousand registrations at once: one broker
        # round trip for their plans, one for their replies); a lone command waits ADMIN_BATCH_WAIT_S at most.
        async for events in stream.take_events(ADMIN_BATCH, within=ADMIN_BATCH_WAIT_S):
            records: list[tuple[bytes | None, int, int]] = []
            for event in events:
                msg = event.message
                if expected is None:
                    expected = await loop.run_in_executor(None, service.committed_admin_offset)
                missed = admin_gap(expected, msg.offset)
                if missed is None:
                    continue  # delivered again: already processed in this life
                if missed:
                    log.warning("admin offsets %d-%d skipped by the consumer: reading them directly",
                                missed.start, missed.stop - 1)
                    records += await loop.run_in_executor(None, service.missed_admin_records, missed.start,
                                                          missed.stop)
                records.append((msg.value, msg.partition, msg.offset))
                expected = msg.offset + 1
            if not records:
                continue
            # Producing waits for acks: keep it off the event loop so faust's heartbeats keep flowing.  faust acks a
            # batch's offsets even when its handling raised, so a broker that does not take the plans or replies is
            # waited for here, the batch handled again (the set was rolled back), rather than the commands lost.
            decisions = await _until_done(loop, service.handle, records)
            for decision in decisions:
                mirror(decision)
            await _until_done(loop, service.reply, decisions)

    @app.task
    async def fill() -> None:
        table.update((qid, entry.view()) for qid, entry in service.registry.queries.items())
        service.ready = True
        log.info("registry ready: %d queries registered", len(table))

    @app.page("/queries")
    async def list_queries(web: faust.web.View, request: faust.web.Request) -> faust.web.Response:
        try:
            after, limit = page_params(request.query)
        except PageError as exc:
            return web.json({"type": "about:blank", "title": "Bad Request", "status": 400, "detail": str(exc)},
                            status=400, content_type="application/problem+json")
        ids, cursor = page(sorted(table), after, limit)
        body: dict[str, Any] = {"queries": [table[k] for k in ids]}
        if cursor is not None:
            body["next"] = f"/queries?limit={limit}&after={quote(cursor)}"
        return web.json(body)

    @app.page("/queries/{query_id}")
    async def get_query(web: faust.web.View, request: faust.web.Request, query_id: str) -> faust.web.Response:
        view = table.get(query_id)
        if view is None:
            return web.json({"type": "about:blank", "title": "Not Found", "status": 404,  # RFC 9457
                             "detail": f"no query with id {query_id!r} is registered"}, status=404,
                            content_type="application/problem+json")
        return web.json(view)

    return app


def run_service(settings: KafkaSettings, *, metrics_port: int | None = None, web_port: int = 6066,
                web_host: str = "127.0.0.1", state_dir: str = ".cbgp-state", log_level: str = "warning") -> int:
    """``cbgp registry``: create topics, restore, run faust until SIGTERM/SIGINT; return the exit code.

    Like the data-path services, the registry waits for a broker that is not up yet, and after a life
    that ended on an error (faust's clients give up when the broker goes away while they start) it starts
    a new one: fresh clients, the registered set restored again from ``queries.plans``.
    """
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The registry's own lines (start, restore, ready, restarts) at INFO whatever faust's level: faust's INFO
    # is a hundred lines per start, and at its default WARNING an idle registry's log said nothing at all.
    own = logging.StreamHandler(sys.stderr)
    own.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.handlers[:] = [own]
    log.setLevel(min(logging.INFO, logging.getLevelName(log_level.upper())))
    log.propagate = False
    current: list[RegistryService | None] = [None]
    metrics = (start_metrics_server(metrics_port, ready=lambda: current[0] is not None and current[0].ready)
               if metrics_port is not None else None)
    log.info("starting: broker %s, web view http://%s:%d/queries, metrics %s, state in %s",
             settings.bootstrap_servers, web_host, web_port,
             f"{metrics.url}/metrics" if metrics is not None else "off", state_dir)
    try:
        while True:
            stopper = Stopper()  # faust's own handlers replace it during a life and are gone after one
            if not wait_for_topics(settings, SERVICE, stopper):
                return 0
            try:
                code = _life(settings, current, stopper, web_port=web_port, web_host=web_host,
                             state_dir=state_dir, log_level=log_level)
                reason = f"the faust worker stopped with exit code {code} (its error is logged above)"
            except (KafkaException, TimeoutError) as exc:
                code, reason = 1, str(exc).replace("\n", " ")
            if code == 0 or stopper.stopping:
                return code
            log.error(kv(event="restart", service=SERVICE, reason=reason))
            time.sleep(1.0)
            # mode's worker closed the event loop of the life that ended; the next app needs a new one.
            asyncio.set_event_loop(asyncio.new_event_loop())
    finally:
        if metrics is not None:
            metrics.stop()


def _life(settings: KafkaSettings, current: list[RegistryService | None], stopper: Stopper, *, web_port: int,
          web_host: str, state_dir: str, log_level: str) -> int:
    install_empty_fetch_backoff()
    service = RegistryService(settings)
    try:
        count = service.restore()
        log.info("restored %d registered queries from %s", count, settings.topic("queries.plans"))
        if stopper.stopping:
            return 0
        current[0] = service
        app = build_app(service, web_port=web_port, web_host=web_host, state_dir=state_dir)
        worker = faust.Worker(app, loglevel=log_level.upper(), quiet=True, redirect_stdouts=False)
        if not sys.stdout.isatty():
            # faust's progress spinner writes cursor control codes; in a log file that is all one saw
            worker.spinner = None
        try:
            worker.execute_from_commandline()
        except SystemExit as exc:
            return int(exc.code or 0)
        return 0
    finally:
        service.ready = False
        service.close()
