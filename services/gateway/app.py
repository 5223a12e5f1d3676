"""``cbgp gateway``: live answers for people and programs, on one HTTP port (aiohttp).

How it works: docs/design/internals.md, services.gateway.app.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable
from urllib.parse import quote

from aiohttp import WSMsgType, web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from cbgp.results import NotAcceptable, content_type, negotiate, serialize, shape_of
from services.gateway.core import (ADMIN, READ, READ_WRITE, Grant, Subscriber, allows, net_change, problem,
                                   sepa_error, sepa_notification, sse_event, subscription_id)
from services.gateway.openapi import OPENAPI
from services.gateway.relay import RELAY_HEADER
from services.wire.pages import PageError, page, page_params
from services.gateway.query import QueryRefused, run_query
from services.gateway.service import (EVICTED, NOTIFICATION_LATENCY, NOTIFICATIONS, REFUSED, REQUESTS, SUBSCRIBERS,
                                      Gateway)

__all__ = ["make_app"]

STATIC = Path(__file__).with_name("static")

SSE_HEARTBEAT_S = 15.0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=json.dumps(data), status=status, content_type="application/json", headers=headers)


def _problem(status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> web.Response:
    """An error as RFC 9457 problem details: ``detail`` is the one line that says what and where."""
    return web.Response(text=json.dumps(problem(status, message, **extra)), status=status,
                        content_type="application/problem+json", headers=headers)


# Scope each route needs; None = public.  /subscribe checks each subscribe message instead (a SEPA client may
# send its token in the message's "authorization" field rather than on the upgrade request).
PUBLIC = {"/", "/console.js", "/console.css", "/openapi.json", "/healthz", "/readyz", "/metrics", "/subscribe"}


def _needed_scope(request: web.Request) -> str | None:
    path = request.path
    if path in PUBLIC:
        return None
    if path == "/update" or (path.startswith("/queries") and request.method in ("POST", "DELETE")):
        return READ_WRITE
    return READ


def make_app(gw: Gateway) -> web.Application:
    hub = gw.hub

    @web.middleware
    async def middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "other"
        needed = _needed_scope(request)
        if needed is not None:
            grant = gw.grant_of(request)
            if grant is None:
                REQUESTS.labels(route, request.method, "401").inc()
                return _problem(401, gw.token_problem(request), headers={"WWW-Authenticate": 'Bearer realm="cbgp"'})
            if not allows(grant.scope, needed):
                REQUESTS.labels(route, request.method, "403").inc()
                return _problem(403, f"this token's scope is {grant.scope!r}; {needed!r} is needed")
            request["grant"] = grant
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            REQUESTS.labels(route, request.method, str(exc.status)).inc()
            if exc.status >= 400:  # the router's 404/405 and aiohttp's 413 as JSON, like every other error
                return _problem(exc.status, exc.reason, headers={
                    k: v for k, v in exc.headers.items() if k.lower() == "allow"})
            raise
        REQUESTS.labels(route, request.method, str(response.status)).inc()
        return response

    app = web.Application(middlewares=[middleware], client_max_size=8 * 1024 * 1024)
    open_sockets: set[web.WebSocketResponse] = set()
    limits = gw.limits
    connections: dict[str, int] = {}  # client address -> open SSE and WebSocket connections

    def connection_refused(request: web.Request) -> web.Response | None:
        """A 503 when the gateway, or this client, holds as many long-lived connections as it may."""
        client = request.remote or "?"
        if sum(connections.values()) >= limits.max_connections:
            REFUSED.labels("max-connections").inc()
            return _problem(503, f"the gateway holds {limits.max_connections:,} connections (--max-connections)")
        if connections.get(client, 0) >= limits.max_connections_per_client:
            REFUSED.labels("max-connections-per-client").inc()
            return _problem(429, f"{limits.max_connections_per_client:,} connections from {client} are open "
                            "(--max-connections-per-client)")
        connections[client] = connections.get(client, 0) + 1
        return None

    def connection_closed(request: web.Request) -> None:
        client = request.remote or "?"
        connections[client] -= 1
        if connections[client] <= 0:
            del connections[client]

    async def write_or_evict(response: web.StreamResponse, data: bytes) -> None:
        """Write, or give up on a client that has not read for --slow-client-timeout (its buffer is bounded by
        one chunk: the write waits while the socket's buffer is full)."""
        try:
            await asyncio.wait_for(response.write(data), limits.slow_client_s)
        except asyncio.TimeoutError:
            EVICTED.labels("sse").inc()
            raise ConnectionResetError("slow client evicted") from None

    async def close_sockets(_app: web.Application) -> None:
        for ws in list(open_sockets):  # on shutdown: "going away", so clients reconnect elsewhere
            await ws.close(code=1001, message=b"gateway stopping")

    app.on_shutdown.append(close_sockets)

    # ------------------------------------------------------------------ static, probes

    async def index(_request: web.Request) -> web.Response:
        return web.FileResponse(STATIC / "index.html")

    async def console_js(_request: web.Request) -> web.Response:
        return web.FileResponse(STATIC / "console.js", headers={"Content-Type": "text/javascript"})

    async def openapi(_request: web.Request) -> web.Response:
        return _json(OPENAPI)

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_request: web.Request) -> web.Response:
        if gw.is_ready():
            return web.Response(text="ready\n")
        if gw.ready:
            return web.Response(status=503, text="not ready: the topic reader stopped (see the log)\n")
        return web.Response(status=503, text="not ready: reading queries.plans and answers\n")

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})

    # ------------------------------------------------------------------ queries

    async def list_queries(request: web.Request) -> web.Response:
        try:
            after, limit = page_params(request.query)
        except PageError as exc:
            return _problem(400, str(exc))
        ids, cursor = page(sorted(hub.plans), after, limit)
        body: dict[str, Any] = {"queries": [hub.describe(q) for q in ids]}
        if cursor is not None:
            body["next"] = f"/queries?limit={limit}&after={quote(cursor)}"
        return _json(body)

    async def get_query(request: web.Request) -> web.Response:
        query_id = request.match_info["id"]
        if hub.registered(query_id) is None:
            return _problem(404, f"no query with id {query_id!r} is registered")
        return _json(hub.describe(query_id))

    async def admin(command: dict[str, Any], grant: Grant | None) -> dict[str, Any] | web.Response:
        """An admin command on behalf of ``grant``: its owner name goes with it (the registry lets it change only
        that owner's queries), unless the grant is ``admin``."""
        from services.client.errors import UserError

        if grant is not None and grant.scope != ADMIN:
            command = {**command, "owner": grant.owner}
        try:
            return await asyncio.get_running_loop().run_in_executor(gw.admin_pool, gw.publisher.admin, command, 30.0)
        except UserError as exc:
            return _problem(504, str(exc))

    async def post_query(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _problem(400, "the body must be a JSON object {\"id\", \"sparql\", \"options\"}")
        if not isinstance(body, dict) or not isinstance(body.get("id"), str) or not isinstance(body.get("sparql"), str):
            return _problem(400, "the body must be a JSON object with string fields \"id\" and \"sparql\"")
        options = body.get("options") or {}
        if not isinstance(options, dict) or not all(isinstance(v, str) for v in options.values()):
            return _problem(400, "\"options\" must be an object of strings, e.g. {\"window\": \"sliding\"}")
        before = hub.registered(body["id"])
        status = await admin({"command": "REGISTER", "query_id": body["id"], "sparql": body["sparql"],
                              "options": options}, request.get("grant"))
        if isinstance(status, web.Response):
            return status
        reply = {k: status.get(k) for k in ("query_id", "status", "message", "line", "column")}
        if status["status"] != "ACCEPTED":
            code = 403 if "belongs to" in status["message"] else 429 if "_MAX_QUERIES" in status["message"] \
                else 409 if "already registered" in status["message"] else 400
            where = {"line": status["line"], "column": status["column"]} if status.get("line") else {}
            return _problem(code, status["message"], query_id=body["id"], **where)
        await gw.wait_plan(body["id"], True, before.version if before and before.sparql != body["sparql"] else 0)
        info = hub.registered(body["id"])
        if info is not None:
            reply["query"] = hub.describe(body["id"])
        return _json(reply, 201)

    async def delete_query(request: web.Request) -> web.Response:
        query_id = request.match_info["id"]
        status = await admin({"command": "UNREGISTER", "query_id": query_id}, request.get("grant"))
        if isinstance(status, web.Response):
            return status
        reply = {k: status.get(k) for k in ("query_id", "status", "message", "line", "column")}
        if status["status"] != "UNREGISTERED":
            return _problem(403 if "belongs to" in status["message"] else 404, status["message"], query_id=query_id)
        await gw.wait_plan(query_id, False)
        return _json(reply)

    async def query_here(request: web.Request) -> tuple[str, Any] | web.Response:
        """The requested query's id and registration, once its answers are on this replica (following the replica
        that holds them if need be); else the one-line error to send."""
        query_id = request.match_info["id"]
        info = hub.registered(query_id)
        if info is None:
            return _problem(404, f"no query with id {query_id!r} is registered")
        if gw.relays is None or gw.holds(query_id):
            return query_id, info
        if request.headers.get(RELAY_HEADER):  # another replica thinks this one holds it: never relay twice
            return _problem(421, f"replica {gw.share.index} of {gw.share.count} does not hold query {query_id!r} "
                            f"(replica {gw.owner(query_id)} does): check --share and --peers")
        failed = await gw.stream_here(query_id)
        return (query_id, info) if failed is None else _problem(502, failed)

    async def current(request: web.Request) -> web.Response:
        found = await query_here(request)
        if isinstance(found, web.Response):
            return found
        query_id, info = found
        shape = shape_of(info.sparql, tuple(info.projected))
        try:
            media = negotiate(shape.form, request.headers.get("Accept"), request.query.get("format"))
        except NotAcceptable as exc:
            return _problem(406, str(exc))
        stream = hub.stream(query_id)
        rows = stream.rows() if stream is not None and stream.version == info.version else []
        last = (stream.next_n - 1) if stream is not None and stream.version == info.version else 0
        body = await asyncio.get_running_loop().run_in_executor(gw.admin_pool, serialize, shape, rows, media)
        return web.Response(body=body, headers={"Content-Type": content_type(media), "Vary": "Accept",
                                                "X-CBGP-Version": str(info.version), "X-CBGP-Answer": str(last)})

    async def replica_copy(request: web.Request) -> web.Response:
        """What another replica needs to follow a query held here: its current answers with multiplicities, and
        the number of the last answer they reflect (then it reads the answers as SSE)."""
        found = await query_here(request)
        if isinstance(found, web.Response):
            return found
        query_id, info = found
        stream = hub.stream(query_id)
        if stream is None or stream.version != info.version:
            return _json({"query": query_id, "version": info.version, "last": 0, "rows": []})
        return _json({"query": query_id, "version": stream.version, "last": stream.next_n - 1,
                      "rows": [{"binding": b, "multiplicity": m} for b, m in stream.current.values()]})

    # ------------------------------------------------------------------ SSE

    async def answers_sse(request: web.Request) -> web.StreamResponse:
        found = await query_here(request)
        if isinstance(found, web.Response):
            return found
        query_id, info = found
        try:
            start = int(request.query.get("from", "1"))
            if start < 1:
                raise ValueError
        except ValueError:
            return _problem(400, "from must be an answer number >= 1")
        live = request.query.get("live", "true").lower() not in ("false", "0", "no")
        last_id = request.headers.get("Last-Event-ID", "").strip()
        if last_id:
            try:
                start = int(last_id) + 1
                if start < 1:
                    raise ValueError
            except ValueError:
                return _problem(400, "Last-Event-ID must be an answer number >= 0")
        refused = connection_refused(request)
        if refused is not None:
            return refused
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no", "X-CBGP-Version": str(info.version)})
        wake = asyncio.Event()
        sub = Subscriber(query_id, "sse", wake.set, version=info.version, cursor=start)
        sub.stream = hub.stream(query_id)
        hub.attach(sub)
        SUBSCRIBERS.labels("sse").inc()
        try:
            await response.prepare(request)
            await write_or_evict(response, b"retry: 1000\n\n")
            if sub.stream is not None and sub.cursor < sub.stream.base:
                # older answers were trimmed (--history): say so instead of starting silently later
                await write_or_evict(response, sse_event(json.dumps({"from": sub.cursor,
                                                                     "oldest_kept": sub.stream.base}), "gap"))
            while True:
                stream = sub.stream
                newest = hub.stream(query_id)
                if stream is None or (newest is not stream and stream.since(sub.cursor, 1) == []):
                    newer = newest.version if newest is not None else None
                    await write_or_evict(response, sse_event(json.dumps({"reason": "registered again",
                                                                         "version": newer}), "end"))
                    break
                items = stream.since(sub.cursor, limits.chunk)  # one chunk at a time: a client holds no more
                if items:
                    sub.cursor = items[-1].n + 1
                    await write_or_evict(response, b"".join(sse_event(a.encoded(), "answer", str(a.n))
                                                            for a in items))
                    NOTIFICATIONS.labels("sse").inc(len(items))
                    NOTIFICATION_LATENCY.labels("sse").observe(max(0.0, (_now_ms() - items[0].produced_at_ms) / 1000))
                    continue
                if not live:
                    break
                try:
                    await asyncio.wait_for(wake.wait(), SSE_HEARTBEAT_S)
                except asyncio.TimeoutError:
                    await write_or_evict(response, b": keep-alive\n\n")
                wake.clear()
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            hub.detach(sub)
            SUBSCRIBERS.labels("sse").dec()
            connection_closed(request)
        return response

    # ------------------------------------------------------------------ SPARQL protocol

    async def update(request: web.Request) -> web.Response:
        from cbgp.inputs.sparql_update import UPDATE_FORMAT, UpdateRequestError, check_request

        ctype = request.content_type
        if ctype == "application/sparql-update":
            text = await request.text()
        elif ctype == "application/x-www-form-urlencoded":
            text = (await request.post()).get("update")
            if not isinstance(text, str):
                return _problem(400, "the form needs an 'update' field")
        else:
            return _problem(415, "send application/sparql-update or an 'update' form field")
        try:  # (pyoxigraph parses it: on the admin pool, never on the event loop)
            await asyncio.get_running_loop().run_in_executor(gw.admin_pool, check_request, text)
        except UpdateRequestError as exc:
            return _problem(400, str(exc), line=exc.line, column=exc.column)
        except Exception as exc:  # noqa: BLE001 - pyoxigraph's own parse errors
            return _problem(400, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        try:
            await asyncio.get_running_loop().run_in_executor(gw.admin_pool, gw.publisher.publish, text.encode(),
                                                             UPDATE_FORMAT)
        except Exception as exc:  # noqa: BLE001 - the broker refused or did not answer
            return _problem(503, f"updates.raw: {exc}")
        return _json({"published_bytes": len(text.encode()), "topic": gw.settings.topic("updates.raw")})

    async def query(request: web.Request) -> web.Response:
        if request.method == "GET":
            text = request.query.get("query")
        elif request.content_type == "application/sparql-query":
            text = await request.text()
        elif request.content_type == "application/x-www-form-urlencoded":
            value = (await request.post()).get("query")
            text = value if isinstance(value, str) else None
        else:
            return _problem(415, "send application/sparql-query, a 'query' form field, or GET ?query=")
        if not text:
            return _problem(400, "no query")
        try:
            body, media, seq = await run_query(gw, text, request.headers.get("Accept"), request.query.get("format"))
        except QueryRefused as exc:
            return _problem(exc.status, str(exc), **({"line": exc.line, "column": exc.column} if exc.line else {}))
        return web.Response(body=body, headers={"Content-Type": content_type(media), "Vary": "Accept",
                                                "X-CBGP-Seq": str(seq)})

    async def fleet(_request: web.Request) -> web.Response:
        subs = hub.subscriber_count()
        state = await asyncio.get_running_loop().run_in_executor(gw.admin_pool, gw.fleet.current)
        return _json({**state, "gateway": {"ready": gw.ready, "queries": len(hub.plans),
                                               "answers_read": hub.answers_read,
                                               "subscribers": {"sse": subs.get("sse", 0), "ws": subs.get("ws", 0)}}})

    # ------------------------------------------------------------------ SEPA WebSocket

    async def subscribe_ws(request: web.Request) -> web.StreamResponse:
        refused = connection_refused(request)
        if refused is not None:
            return refused
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=256 * 1024)
        try:
            await ws.prepare(request)
        except Exception:
            connection_closed(request)
            raise
        open_sockets.add(ws)
        conn_grant = gw.grant_of(request)
        tasks: dict[str, tuple[asyncio.Task, Subscriber]] = {}

        async def send(message: dict[str, Any]) -> None:
            if not ws.closed:
                try:
                    await asyncio.wait_for(ws.send_str(json.dumps(message, separators=(",", ":"))),
                                           limits.slow_client_s)
                except asyncio.TimeoutError:
                    EVICTED.labels("ws").inc()
                    await ws.close(code=1008, message=b"slow client evicted")

        async def follow(spuid: str, alias: str | None, sub: Subscriber, wake: asyncio.Event,
                         variables: list[str]) -> None:
            while not ws.closed:
                await wake.wait()
                wake.clear()
                mine = sub.stream
                if mine is not None:
                    items = mine.since(sub.cursor, limits.chunk)  # a notification covers one chunk at most
                    if len(items) == limits.chunk:
                        wake.set()  # more to send after this one
                    if items:
                        sub.cursor = items[-1].n + 1
                        added, removed = net_change(items)
                        if added or removed:
                            note = sepa_notification(spuid, alias, sub.sequence, variables, added, removed)
                            note["notification"]["x-cbgp"] = {"query": sub.query_id, "version": mine.version,
                                                              "from": items[0].n, "to": items[-1].n,
                                                              "produced_at_ms": items[0].produced_at_ms}
                            await send(note)
                            sub.sequence += 1
                            NOTIFICATIONS.labels("ws").inc()
                            NOTIFICATION_LATENCY.labels("ws").observe(
                                max(0.0, (_now_ms() - items[0].produced_at_ms) / 1000))
                newer = hub.stream(sub.query_id)
                if newer is not None and newer is not mine and (mine is None or newer.version > mine.version):
                    # Registered again: retract what this subscriber was told (the old registration's answers)
                    # and follow the new registration from its n = 1.
                    old = mine.rows() if mine is not None else []
                    sub.stream, sub.version, sub.cursor = newer, newer.version, 1
                    if old:
                        await send(sepa_notification(spuid, alias, sub.sequence, variables, [], old))
                        sub.sequence += 1
                    wake.set()


        async def on_subscribe(body: dict[str, Any], top: dict[str, Any]) -> None:
            sparql, alias = body.get("sparql"), body.get("alias")
            token = body.get("authorization") or top.get("authorization")
            grant = conn_grant
            if token:
                token = str(token)
                grant = gw.grant_of(request, token[7:].strip() if token.lower().startswith("bearer ") else token)
            if grant is None:
                await send(sepa_error(401, "unauthorized", "the bearer token is not valid" if token
                                      else "a bearer token is required"))
                return
            scope = grant.scope
            if len(tasks) >= limits.max_subscriptions_per_socket:
                REFUSED.labels("max-subscriptions-per-socket").inc()
                await send(sepa_error(429, "too_many_subscriptions", f"{limits.max_subscriptions_per_socket} "
                                      "subscriptions on this socket (--max-subscriptions-per-socket)"))
                return
            if not isinstance(sparql, str) or not sparql.strip():
                await send(sepa_error(400, "invalid_request", "subscribe needs a 'sparql' string"))
                return
            info = hub.by_text(sparql)
            if info is None:
                if not allows(scope, READ_WRITE):
                    await send(sepa_error(403, "forbidden", "this query is not registered and registering it "
                                          "needs a read-write token"))
                    return
                query_id = subscription_id(sparql)
                status = await admin({"command": "REGISTER", "query_id": query_id, "sparql": sparql,
                                      "options": {"replace": "true"}}, None)  # (the gateway's own: shared by text)
                gw.sepa_registered.add(query_id)
                if isinstance(status, web.Response):
                    await send(sepa_error(504, "timeout", status.text or "no reply from the registry"))
                    return
                if status["status"] != "ACCEPTED":
                    where = f" (line {status['line']}, column {status['column']})" if status.get("line") else ""
                    await send(sepa_error(400, "invalid_query", status["message"] + where))
                    return
                if not await gw.wait_plan(query_id, True):
                    await send(sepa_error(504, "timeout", "the registered plan did not reach the gateway"))
                    return
                info = hub.registered(query_id)
                if info is None:
                    return
            failed = await gw.stream_here(info.query_id)
            if failed is not None:
                await send(sepa_error(502, "unavailable", failed))
                return
            stream = hub.stream(info.query_id)
            spuid = f"sepa://subscription/{uuid.uuid4().hex}"
            wake = asyncio.Event()
            sub = Subscriber(info.query_id, "ws", wake.set, version=info.version)
            rows: list = []
            if stream is not None and stream.version >= info.version:
                sub.stream, sub.version, sub.cursor = stream, stream.version, stream.next_n
                rows = stream.rows()
            await send(sepa_notification(spuid, alias, 0, info.projected, rows, []))
            sub.sequence = 1
            NOTIFICATIONS.labels("ws").inc()
            hub.attach(sub)
            SUBSCRIBERS.labels("ws").inc()
            tasks[spuid] = (asyncio.create_task(follow(spuid, alias, sub, wake, info.projected)), sub)
            wake.set()  # anything that arrived meanwhile

        def drop(spuid: str) -> bool:
            found = tasks.pop(spuid, None)
            if found is None:
                return False
            task, sub = found
            task.cancel()
            hub.detach(sub)
            SUBSCRIBERS.labels("ws").dec()
            gw.unused_since(sub.query_id)
            return True

        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                try:
                    message = json.loads(msg.data)
                    if not isinstance(message, dict):
                        raise ValueError
                except ValueError:
                    await send(sepa_error(400, "invalid_request", "messages are JSON objects"))
                    continue
                if isinstance(message.get("subscribe"), dict):
                    await on_subscribe(message["subscribe"], message)
                elif isinstance(message.get("unsubscribe"), dict):
                    spuid = str(message["unsubscribe"].get("spuid"))
                    if drop(spuid):
                        await send({"unsubscribed": {"spuid": spuid}})
                    else:
                        await send(sepa_error(404, "not_found", f"no subscription {spuid}"))
                else:
                    await send(sepa_error(400, "invalid_request", "expected a 'subscribe' or 'unsubscribe' message"))
        finally:
            for spuid in list(tasks):
                drop(spuid)
            open_sockets.discard(ws)
            connection_closed(request)
        return ws

    app.router.add_get("/", index)
    app.router.add_get("/console.js", console_js)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/queries", list_queries)
    app.router.add_post("/queries", post_query)
    app.router.add_get("/queries/{id}", get_query)
    app.router.add_delete("/queries/{id}", delete_query)
    app.router.add_get("/queries/{id}/current", current)
    app.router.add_get("/queries/{id}/answers", answers_sse)
    app.router.add_get("/replica/queries/{id}", replica_copy)
    app.router.add_post("/update", update)
    app.router.add_get("/query", query)
    app.router.add_post("/query", query)
    app.router.add_get("/fleet", fleet)
    app.router.add_get("/subscribe", subscribe_ws)
    return app
