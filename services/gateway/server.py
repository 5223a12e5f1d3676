"""Running the gateway (``cbgp gateway``): bearer tokens and TLS from the flags, the listening socket, the
optional metrics port, and a clean stop on SIGTERM / SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import ssl
from pathlib import Path
from typing import Any

from aiohttp import web

from services.gateway.app import make_app
from services.gateway.core import Tokens
from services.gateway.service import Gateway, log

__all__ = ["serve"]

def _tokens(args: argparse.Namespace) -> Tokens:
    text = ""
    if args.tokens_file:
        text = Path(args.tokens_file).read_text(encoding="utf-8")
    elif os.environ.get("CBGP_GATEWAY_TOKENS"):
        text = os.environ["CBGP_GATEWAY_TOKENS"]
    return Tokens.parse(text)


def _ssl_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    if not args.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.tls_cert, args.tls_key)
    if args.tls_client_ca:
        context.load_verify_locations(args.tls_client_ca)
        context.verify_mode = ssl.CERT_OPTIONAL  # a verified certificate, or a bearer token
    return context


async def serve(args: argparse.Namespace, settings: Any) -> int:
    from services.metrics.exposition import start_metrics_server

    tokens = _tokens(args)
    gw = Gateway(settings, tokens, history=args.history, client_cert_scope=args.client_cert_scope)
    loop = asyncio.get_running_loop()
    gw.start(loop)
    app = make_app(gw)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=3.0)
    await runner.setup()
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    site = web.SockSite(runner, sock, ssl_context=_ssl_context(args), backlog=2048)
    await site.start()
    port = sock.getsockname()[1]
    metrics_server = None
    if args.metrics_port is not None:
        metrics_server = start_metrics_server(args.metrics_port, lambda: gw.ready and gw.follower.is_alive())
    scheme = "https" if args.tls_cert else "http"
    log.info("event=started port=%d metrics_port=%s url=%s://127.0.0.1:%d/ auth=%s topics=%s", port,
             metrics_server.port if metrics_server else port, scheme, port,
             "tokens" if tokens.enabled else "off", settings.topic_prefix)
    if not tokens.enabled:
        log.warning("event=auth-off reason='no tokens configured (--tokens-file / CBGP_GATEWAY_TOKENS)'")
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("event=stopping")
    await runner.cleanup()
    gw.stop()
    if metrics_server is not None:
        metrics_server.stop()
    return 0
