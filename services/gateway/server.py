"""Running the gateway (``cbgp gateway``): bearer tokens and TLS from the flags, the listening socket, the
optional metrics port, and a clean stop on SIGTERM / SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import secrets
import ssl
from dataclasses import fields
from pathlib import Path
from typing import Any

from aiohttp import web

from services.gateway.app import make_app
from services.gateway.core import ADMIN, READ, Limits, Share, Tokens
from services.gateway.service import Gateway, log

__all__ = ["serve"]

def _tokens(args: argparse.Namespace) -> Tokens:
    """The tokens the flags name; with none (and --auth token), one admin token generated for this run."""
    if args.auth == "none":
        log.warning("event=auth-off reason='--auth none: every request is admin; only for a machine nobody else "
                    "reaches'")
        return Tokens.none()
    text = ""
    if args.tokens_file:
        text = Path(args.tokens_file).read_text(encoding="utf-8")
    elif os.environ.get("CBGP_GATEWAY_TOKENS"):
        text = os.environ["CBGP_GATEWAY_TOKENS"]
    tokens = Tokens.parse(text)
    if not tokens.scopes and not args.tls_client_ca:
        token = secrets.token_hex(24)
        tokens.add(token, ADMIN, "admin")
        if args.token_out:
            out = Path(args.token_out)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.touch(mode=0o600)
            out.chmod(0o600)  # (an older file may have been readable by others)
            out.write_text(token + "\n")
            log.info("event=token-generated scope=admin file=%s", out)
        else:  # on the terminal once, as Jupyter prints its token
            log.warning("event=token-generated scope=admin token=%s reason='no --tokens-file; pass it as "
                        "Authorization: Bearer or ?access_token='", token)
    return tokens


def _share(args: argparse.Namespace, tokens: Tokens) -> tuple[Share, list[str], str | None]:
    """This replica's share, every replica's URL, and the token the replicas use with each other (accepted here
    with scope read)."""
    share, peers = args.share, args.peers  # (parsed and checked with the flags)
    if share.whole:
        return share, [], None
    token = None
    if args.peer_token_file:
        token = Path(args.peer_token_file).read_text(encoding="utf-8").strip()
        if len(token) < 16:
            raise SystemExit(f"cbgp gateway: the token in {args.peer_token_file} is shorter than 16 characters")
        if tokens.required:
            tokens.add(token, READ, "gateway-peer")
    elif tokens.required:
        raise SystemExit("cbgp gateway: --share with tokens needs --peer-token-file (the replicas' shared token)")
    log.info("event=share index=%d count=%d peers=%s", share.index, share.count, ",".join(peers))
    return share, peers, token


def _peer_ssl(args: argparse.Namespace) -> ssl.SSLContext | None:
    """How this replica verifies the others (``--peer-ca``, else the system's CAs) and, serving TLS, the
    certificate it shows them (its own: replicas requiring client certificates accept it if their CA signed it)."""
    if not args.peer_ca and not args.tls_cert:
        return None
    context = ssl.create_default_context(cafile=args.peer_ca)
    if args.tls_cert:
        context.load_cert_chain(args.tls_cert, args.tls_key)
    return context


def _ssl_context(args: argparse.Namespace, tokens: Tokens) -> ssl.SSLContext | None:
    if not args.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(args.tls_cert, args.tls_key)
    if args.tls_client_ca:
        context.load_verify_locations(args.tls_client_ca)
        # A verified certificate is required, unless tokens are configured too: then a request brings one or the
        # other (a certificate that is offered is always verified).
        context.verify_mode = ssl.CERT_OPTIONAL if tokens.scopes else ssl.CERT_REQUIRED
    return context


async def serve(args: argparse.Namespace, settings: Any) -> int:
    from services.metrics.exposition import ListenError, start_metrics_server

    tokens = _tokens(args)
    share, peers, peer_token = _share(args, tokens)
    limits = Limits(**{f.name: getattr(args, f.name) for f in fields(Limits) if hasattr(args, f.name)})
    gw = Gateway(settings, tokens, history=args.history, client_cert_scope=args.client_cert_scope, limits=limits,
                 share=share, peers=peers, peer_token=peer_token, peer_ssl=None if share.whole else _peer_ssl(args))
    loop = asyncio.get_running_loop()
    gw.start(loop)
    app = make_app(gw)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=3.0)
    await runner.setup()
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        sock.close()
        raise ListenError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc} (--host, --port)") from None
    site = web.SockSite(runner, sock, ssl_context=_ssl_context(args, tokens), backlog=2048)
    await site.start()
    port = sock.getsockname()[1]
    metrics_server = None
    if args.metrics_port is not None:
        metrics_server = start_metrics_server(args.metrics_port, gw.is_ready)
    scheme = "https" if args.tls_cert else "http"
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
    log.info("event=started port=%d host=%s metrics_port=%s url=%s://%s:%d/ auth=%s topics=%s", port, args.host,
             metrics_server.port if metrics_server else port, scheme, shown, port,
             "tokens" if tokens.required else "none", settings.topic_prefix)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("event=stopping")
    await runner.cleanup()
    if gw.relays is not None:
        await gw.relays.close()
    gw.stop()
    if metrics_server is not None:
        metrics_server.stop()
    return 0
