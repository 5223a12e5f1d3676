"""Following, from the replica that holds it, a query this gateway replica does not hold (``--share``).

A replica reads only its share of ``answers``; a subscriber of another query may still arrive here (a Service
spreads clients over the replicas).  While somebody here subscribes, one relay per query copies the holder's
stream: its current answers with their multiplicities (``GET /replica/queries/ID``), then its numbered answers as
server-sent events from answer 1 (the holder's history), and live after that.  Answer numbers are the answers
service's, so a relay that loses its holder resumes from the next number it lacks.  Nobody subscribing for
``linger`` seconds: the relay stops and the stream is dropped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from typing import Any, Callable
from urllib.parse import quote

import aiohttp
import aiohttp.http_exceptions

from services.gateway.core import Answer, Hub

__all__ = ["RELAY_HEADER", "RelayError", "Relays"]

log = logging.getLogger("cbgp.gateway")

RELAY_HEADER = "X-CBGP-Relay"  # a replica's request to another: answered only by the holder, never relayed again
MAX_SNAPSHOT_BYTES = 512 * 1024 * 1024
MAX_EVENT_BYTES = 16 * 1024 * 1024


class RelayError(Exception):
    """The holding replica refused or sent something that is not its stream (the message is one line)."""


class _Relay:
    def __init__(self) -> None:
        self.task: asyncio.Task | None = None
        self.started = asyncio.Event()  # the copy reached the holder's fold (or failed first: error then)
        self.error: str | None = None
        self.idle_handle: asyncio.TimerHandle | None = None


class Relays:
    """The queries this replica follows from their holders, one task each (used on the event loop only)."""

    def __init__(self, hub: Hub, peers: list[str], owner: Callable[[str], int], token: str | None,
                 ssl_context: ssl.SSLContext | None = None, linger: float = 30.0, timeout: float = 10.0,
                 on_change: Callable[[int], None] = lambda _n: None, on_failure: Callable[[], None] = lambda: None
                 ) -> None:
        self.hub, self.peers, self.owner = hub, peers, owner
        self.on_change, self.on_failure = on_change, on_failure  # (metrics: relays open, failed reads)
        self.headers = {RELAY_HEADER: "1", **({"Authorization": f"Bearer {token}"} if token else {})}
        self.ssl_context = ssl_context
        self.linger, self.timeout = linger, timeout
        self.relays: dict[str, _Relay] = {}
        self.session: aiohttp.ClientSession | None = None
        hub.idle_listeners.append(self._idle)

    def holder_url(self, query_id: str) -> str:
        return self.peers[self.owner(query_id)]

    async def open(self, query_id: str) -> str | None:
        """Follow ``query_id`` (if not yet) and wait until its stream is here; None, or why it is not (one line)."""
        relay = self.relays.get(query_id)
        if relay is None:
            relay = self.relays[query_id] = _Relay()
            relay.task = asyncio.get_running_loop().create_task(self._run(query_id, relay))
            self.on_change(len(self.relays))
        if relay.idle_handle is not None:
            relay.idle_handle.cancel()
            relay.idle_handle = None
        try:
            await asyncio.wait_for(relay.started.wait(), self.timeout)
        except asyncio.TimeoutError:
            return f"the replica holding query {query_id!r} ({self.holder_url(query_id)}) did not answer within " \
                   f"{self.timeout:g} s"
        if self.hub.stream(query_id) is None:
            if not self.hub.subscribers.get(query_id):
                self._idle(query_id)  # (it retries meanwhile; a subscriber that comes back finds it running)
            return relay.error or f"query {query_id!r} has no answers at its replica"
        return None

    def _idle(self, query_id: str) -> None:
        relay = self.relays.get(query_id)
        if relay is not None and relay.idle_handle is None:
            relay.idle_handle = asyncio.get_running_loop().call_later(self.linger, self._close, query_id)

    def _close(self, query_id: str) -> None:
        relay = self.relays.pop(query_id, None)
        if relay is not None and relay.task is not None:
            relay.task.cancel()
        if not self.hub.subscribers.get(query_id):
            self.hub.forget(query_id)
        self.on_change(len(self.relays))
        log.info("event=relay-closed query=%s", query_id)

    async def close(self) -> None:
        for query_id in list(self.relays):
            self._close(query_id)
        if self.session is not None:
            await self.session.close()

    # ------------------------------------------------------------------ one relay

    async def _run(self, query_id: str, relay: _Relay) -> None:
        backoff = 0.5
        while True:
            try:
                await self._follow(query_id, relay)
                backoff = 0.5
                await asyncio.sleep(0.05)
                continue  # registered again, or the holder's history no longer reaches back: seed anew
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, RelayError, ValueError, KeyError,
                    TypeError) as exc:
                relay.error = f"the replica holding query {query_id!r} ({self.holder_url(query_id)}) failed: " \
                              f"{str(exc) or type(exc).__name__}"
                log.warning("event=relay-failed query=%s reason=%r retry_s=%.1f", query_id, relay.error, backoff)
                self.on_failure()
            relay.started.set()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                headers=self.headers, connector=aiohttp.TCPConnector(ssl=self.ssl_context or True, limit=0),
                timeout=aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_read=60.0))
        return self.session

    async def _follow(self, query_id: str, relay: _Relay) -> None:
        """Seed (unless resuming), then copy answers until the holder's stream ends."""
        base = self.holder_url(query_id)
        session = self._session()
        stream = self.hub.stream(query_id)
        resume = stream is not None and stream.answers
        if not resume:
            relay.started.clear()  # (subscribers wait until the new copy reaches the holder's fold)
            async with session.get(f"{base}/replica/queries/{quote(query_id, safe='')}") as reply:
                body = await _read_json(reply, MAX_SNAPSHOT_BYTES)
            version, folded_through = int(body["version"]), int(body["last"])
            rows = [(row["binding"], int(row["multiplicity"])) for row in body["rows"]]
            if not all(isinstance(b, dict) and m > 0 for b, m in rows):
                raise RelayError("the holder's current answers are not bindings with multiplicities")
            stream = self.hub.follow(query_id, version, rows)
            start = 1
        else:
            assert stream is not None
            version, folded_through, start = stream.version, 0, stream.next_n
        relay.error = None
        if resume or folded_through == 0:
            relay.started.set()  # (else once the copy reaches the answer its current answers reflect)
        url = f"{base}/queries/{quote(query_id, safe='')}/answers?from={start}"
        async with session.get(url) as reply:
            if reply.status != 200:
                await _read_json(reply, 64 * 1024)  # raises with the holder's one line
            if int(reply.headers.get("X-CBGP-Version", "0")) != version:
                self.hub.forget(query_id)
                return
            event, data = "", []
            while True:
                try:
                    raw = await reply.content.readline(max_line_length=MAX_EVENT_BYTES)
                except aiohttp.http_exceptions.LineTooLong:
                    raise RelayError(f"a line longer than {MAX_EVENT_BYTES:,} bytes") from None
                if not raw:
                    break
                line = raw.decode("utf-8").rstrip("\r\n")
                if line:
                    field, _sep, value = line.partition(":")
                    if field == "event":
                        event = value.strip()
                    elif field == "data":
                        data.append(value[1:] if value.startswith(" ") else value)
                    continue
                if event == "answer" and data:
                    answer = Answer.from_json(json.loads("\n".join(data)))
                    if answer.query_id != query_id or answer.version != version:
                        raise RelayError("the holder sent an answer of another query or version")
                    answer.folded = answer.n > folded_through
                    self.hub.apply_answers([answer])
                    if answer.n >= folded_through:
                        relay.started.set()
                elif event == "gap" and resume:
                    self.hub.forget(query_id)  # answers this copy lacks are gone from the holder: seed anew
                    return
                elif event == "end":
                    self.hub.forget(query_id)  # registered again: follow the new registration from its start
                    return
                event, data = "", []
        raise RelayError("the holder closed the stream")


async def _read_json(reply: aiohttp.ClientResponse, limit: int) -> Any:
    """The reply's JSON body, at most ``limit`` bytes; RelayError with the holder's one line if it is an error."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await reply.content.read(1 << 20):
        size += len(chunk)
        if size > limit:
            raise RelayError(f"a reply larger than {limit:,} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    try:
        data = json.loads(body)
    except ValueError:
        raise RelayError(f"HTTP {reply.status}: not JSON") from None
    if reply.status != 200:
        detail = data.get("detail") if isinstance(data, dict) else None
        raise RelayError(f"HTTP {reply.status}: {detail or 'no detail'}")
    if not isinstance(data, dict):
        raise RelayError("a reply that is not a JSON object")
    return data
