"""The gateway's parts and live state (:class:`Gateway`): the hub on the event loop, fed by the topic reader's
thread; the publisher, the graph source and the fleet sampler; plans awaited by requests; the scope of a
request.  Also the gateway's Prometheus metrics, one definition each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiohttp import web
from prometheus_client import Counter, Gauge, Histogram

from services.gateway.core import READ_WRITE, Answer, Hub, Tokens

log = logging.getLogger("cbgp.gateway")

REQUESTS = Counter("cbgp_gateway_requests", "HTTP requests served by the gateway.", ["route", "method", "code"])
SUBSCRIBERS = Gauge("cbgp_gateway_subscribers", "Open subscriptions, by kind (sse, ws).", ["kind"])
NOTIFICATIONS = Counter("cbgp_gateway_notifications", "Notifications sent (SSE events, SEPA notifications).", ["kind"])
NOTIFICATION_LATENCY = Histogram(
    "cbgp_gateway_notification_latency_seconds",
    "From an answer's produced_at_ms (the answers service) to its notification written to the client.", ["kind"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))
ANSWERS_READ = Counter("cbgp_gateway_answers_read", "Answer records the gateway read from the answers topic.")


class Gateway:
    """The gateway's parts: the hub (event-loop side), the topic reader, the publisher, the graph source."""

    def __init__(self, settings: Any, tokens: Tokens, *, history: int = 100_000, client_cert_scope: str = READ_WRITE,
                 fleet_every: float = 2.0) -> None:
        from services.gateway.kafka_io import FleetSampler, Follower, GraphSource, Publisher

        self.settings = settings
        self.tokens = tokens
        self.client_cert_scope = client_cert_scope
        self.hub = Hub(history)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.follower = Follower(settings, self._deliver)
        self.publisher = Publisher(settings)
        self.graph = GraphSource(settings)
        self.fleet = FleetSampler(settings, fleet_every)
        self.ready = False
        self.plan_waiters: dict[str, list[asyncio.Future]] = {}
        self.hub.plan_listeners.append(self._plan_arrived)

    # ------------------------------------------------------------------ topic side -> loop

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.follower.start()
        self.fleet.start()

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
                self.hub.apply_answers(answers)
                answers = []
            if kind == "plan":
                self.hub.apply_plan(*item)
            elif kind == "seed":
                self.hub.seed(item)
            elif kind == "ready":
                self.ready = True
                log.info("event=ready queries=%d answers=%d", len(self.hub.plans), self.hub.answers_read)
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
        self.fleet.stopping = True
        self.follower.join(5)
        self.publisher.close()
        self.graph.close()

    # ------------------------------------------------------------------ auth

    def scope_of(self, request: web.Request, token: str | None = None) -> str | None:
        if not self.tokens.enabled:
            return READ_WRITE
        if token is None:
            header = request.headers.get("Authorization", "")
            if header[:7].lower() == "bearer ":
                token = header[7:].strip()
            else:
                token = request.query.get("access_token")
        scope = self.tokens.scope(token) if token else None
        if scope is None and request.transport is not None:
            peer = request.transport.get_extra_info("peercert")
            if peer:  # verified against --tls-client-ca by the TLS handshake
                scope = self.client_cert_scope
        return scope
