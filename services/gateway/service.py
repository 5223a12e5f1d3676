"""The gateway's parts and live state (:class:`Gateway`): the hub on the event loop, fed by the topic reader's
thread; the publisher, the graph source and the fleet sampler; plans awaited by requests; the scope of a
request.  Also the gateway's Prometheus metrics, one definition each.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram

from services.gateway.core import READ_WRITE, Answer, Grant, Hub, Limits, Share, Tokens
from services.gateway.relay import Relays
from services.wire.records import query_partition

log = logging.getLogger("cbgp.gateway")

REQUESTS = Counter("cbgp_gateway_requests", "HTTP requests served by the gateway.", ["route", "method", "code"])
SUBSCRIBERS = Gauge("cbgp_gateway_subscribers", "Open subscriptions, by kind (sse, ws).", ["kind"])
NOTIFICATIONS = Counter("cbgp_gateway_notifications", "Notifications sent (SSE events, SEPA notifications).", ["kind"])
NOTIFICATION_LATENCY = Histogram(
    "cbgp_gateway_notification_latency_seconds",
    "From an answer's produced_at_ms (the answers service) to its notification written to the client.", ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))
ANSWERS_READ = Counter("cbgp_gateway_answers_read", "Answer records the gateway read from the answers topic.")
REFUSED = Counter("cbgp_gateway_refused", "Requests refused by a limit, by the limit's name.", ["limit"])
RELAYS = Gauge("cbgp_gateway_relays", "Queries this replica follows from the replica holding them (--share).")
RELAY_FAILURES = Counter("cbgp_gateway_relay_failures", "Failed reads from a replica holding a followed query.")
EVICTED = Counter("cbgp_gateway_evicted", "Clients dropped for not reading (--slow-client-timeout), by kind.", ["kind"])
LOOP_STALL_S = 5.0  # the event loop must tick within this long for /readyz (probes also run on another thread)


class Gateway:
    """The gateway's parts: the hub (event-loop side), the topic reader, the publisher, the graph source."""

    def __init__(self, settings: Any, tokens: Tokens, *, history: int = 100_000, client_cert_scope: str = READ_WRITE,
                 fleet_every: float = 2.0, limits: Limits = Limits(), share: Share = Share(),
                 peers: list[str] | None = None, peer_token: str | None = None,
                 peer_ssl: ssl.SSLContext | None = None) -> None:
        from services.gateway.kafka_io import FleetSampler, Follower, GraphSource, Publisher

        self.settings = settings
        self.tokens = tokens
        self.limits = limits
        # Blocking work off the event loop, each kind on its own bounded pool: /query cannot take the threads that
        # /update, registrations and the console's admin calls need.
        self.admin_pool = ThreadPoolExecutor(4, thread_name_prefix="gateway-admin")
        self.query_pool = ThreadPoolExecutor(limits.query_workers, thread_name_prefix="gateway-query")
        self.query_slots = threading.BoundedSemaphore(limits.query_workers + limits.query_queue)
        self.loop_tick = time.monotonic()
        self.sepa_registered: set[str] = set()  # queries this gateway registered for SEPA subscriptions
        self.unused: dict[str, float] = {}  # ... and since when nobody subscribes to them
        self.client_cert_scope = client_cert_scope
        self.hub = Hub(history)
        self.share = share
        self.answers_partitions = 1  # (read from the topic before any plan)
        self.relays: Relays | None = None
        if not share.whole:
            self.hub.held = self.holds
            self.relays = Relays(self.hub, peers or [], self.owner, peer_token, peer_ssl,
                                 on_change=RELAYS.set, on_failure=RELAY_FAILURES.inc)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.follower = Follower(settings, self._deliver, share)
        self.publisher = Publisher(settings)
        self.graph = GraphSource(settings)
        self.fleet = FleetSampler(settings, fleet_every)
        self.ready = False
        self.plan_waiters: dict[str, list[asyncio.Future]] = {}
        self.hub.plan_listeners.append(self._plan_arrived)

    # ------------------------------------------------------------------ shares (several replicas)

    def owner(self, query_id: str) -> int:
        """The replica holding ``query_id``'s answers (by its ``answers`` partition)."""
        return self.share.owner(query_partition(query_id, self.answers_partitions))

    def holds(self, query_id: str) -> bool:
        return self.owner(query_id) == self.share.index

    async def stream_here(self, query_id: str) -> str | None:
        """Make ``query_id``'s answers available here (following the replica that holds them if this one does
        not); None, or why they are not (one line)."""
        if self.relays is None or self.holds(query_id):
            return None
        return await self.relays.open(query_id)

    # ------------------------------------------------------------------ topic side -> loop

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.follower.start()
        self.fleet.start()
        loop.create_task(self._tick())

    async def _tick(self) -> None:
        """The loop's heartbeat (readiness); the SEPA queries nobody subscribes to any more, unregistered; the
        streams of unregistered queries, dropped (``Hub.sweep``)."""
        while True:
            self.loop_tick = time.monotonic()
            idle = [q for q, since in self.unused.items() if self.loop_tick - since > self.limits.sepa_idle_s
                    and not self.hub.subscribers.get(q)]
            for query_id in idle:
                del self.unused[query_id]
                self.sepa_registered.discard(query_id)
                self.loop.run_in_executor(self.admin_pool, self._unregister, query_id)  # type: ignore[union-attr]
            if self.ready:  # (every plan on the topic at start read: a stream's query is known to be gone)
                for query_id in self.hub.sweep(self.limits.ended_keep_s, self.loop_tick):
                    log.info("event=ended-stream-dropped query=%s", query_id)
            await asyncio.sleep(1.0)

    def _unregister(self, query_id: str) -> None:
        try:
            status = self.publisher.admin({"command": "UNREGISTER", "query_id": query_id}, 30.0)
            log.info("event=sepa-query-unregistered query=%s status=%s", query_id, status.get("status"))
        except Exception as exc:  # noqa: BLE001 - tried again when the next subscriber leaves
            log.warning("event=sepa-unregister-failed query=%s reason=%s", query_id, exc)

    def unused_since(self, query_id: str) -> None:
        """A SEPA subscription ended: a query this gateway registered for it is unregistered once nobody has
        subscribed to it for ``sepa_idle_s`` (a subscription id per text would otherwise stay for ever)."""
        if query_id in self.sepa_registered and not self.hub.subscribers.get(query_id):
            self.unused[query_id] = time.monotonic()

    def is_ready(self) -> bool:
        """Every plan and answer on the topics at start read, the reader alive, the event loop not stuck."""
        return self.ready and self.follower.is_alive() and time.monotonic() - self.loop_tick < LOOP_STALL_S

    def _deliver(self, batch: list[tuple[str, Any]]) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._apply, batch)

    def _apply(self, batch: list[tuple[str, Any]]) -> None:
        answers: list[Answer] = []
        for kind, item in batch:
            if kind == "answer":
                answers.append(item)
                continue
            if answers:
                ANSWERS_READ.inc(len(answers))
                self.hub.apply_answers(answers)
                answers = []
            if kind == "plan":
                self.hub.apply_plan(*item)
            elif kind == "partitions":
                self.answers_partitions = item
            elif kind == "seed":
                self.hub.seed(item)
            elif kind == "ready":
                self.ready = True
                log.info("event=ready queries=%d answers=%d share=%d/%d", len(self.hub.plans),
                         self.hub.answers_read, self.share.index, self.share.count)
        if answers:
            ANSWERS_READ.inc(len(answers))
            self.hub.apply_answers(answers)

    def _plan_arrived(self, query_id: str) -> None:
        for future in self.plan_waiters.pop(query_id, []):
            if not future.done():
                future.set_result(None)

    async def wait_plan(self, query_id: str, present: bool, version_above: int = 0, timeout: float = 10.0) -> bool:
        """Wait until the hub has (or no longer has) ``query_id``'s plan; False at the timeout."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.hub.registered(query_id)
            if (info is not None and info.version > version_above) if present else info is None:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            future = asyncio.get_running_loop().create_future()
            self.plan_waiters.setdefault(query_id, []).append(future)
            try:
                await asyncio.wait_for(future, left)
            except asyncio.TimeoutError:
                pass

    def stop(self) -> None:
        self.follower.stopping = True
        self.fleet.stop()
        self.follower.join(5)
        self.query_pool.shutdown(wait=False, cancel_futures=True)
        self.admin_pool.shutdown(wait=False, cancel_futures=True)
        self.publisher.close()
        self.graph.close()

    # ------------------------------------------------------------------ auth

    def grant_of(self, request: web.Request, token: str | None = None) -> Grant | None:
        """Who ``request`` is: by its bearer token (the header, ``?access_token=`` for clients that cannot set
        headers, or ``token``), else by a client certificate the TLS handshake verified; None: nobody known."""
        if token is None:
            header = request.headers.get("Authorization", "")
            if header[:7].lower() == "bearer ":
                token = header[7:].strip()
            else:
                token = request.query.get("access_token")
        grant = self.tokens.grant(token) if token or not self.tokens.required else None
        if grant is None and request.transport is not None:
            peer = request.transport.get_extra_info("peercert")
            if peer:  # verified against --tls-client-ca by the TLS handshake
                subject = dict(item[0] for item in peer.get("subject", ()) if item)
                grant = Grant(self.client_cert_scope, "cert-" + str(subject.get("commonName", "client")))
        return grant

    def token_problem(self, request: web.Request) -> str:
        """Why a request has no grant: no credentials at all, or ones that are not valid (for the 401's text)."""
        has_token = request.headers.get("Authorization", "")[:7].lower() == "bearer " or "access_token" in request.query
        return "the bearer token is not valid" if has_token else "a bearer token is required"
