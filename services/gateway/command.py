"""The ``cbgp gateway`` command's flags (the server itself, and aiohttp, load only when it runs)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
from typing import Callable

__all__ = ["register"]


def register(commands: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    from services.gateway.core import Limits
    from services.kafka.config import add_kafka_flags
    from services.runtime.life import port_number

    p = add_kafka_flags(commands.add_parser(
        "gateway", help="serve live answers: SEPA WebSocket, SPARQL protocol, SSE, REST and the web console"))
    p.add_argument("--host", default=os.environ.get("CBGP_GATEWAY_HOST", "127.0.0.1"),
                   help="bind address (default 127.0.0.1, env CBGP_GATEWAY_HOST; 0.0.0.0 to serve other machines)")
    p.add_argument("--port", type=port_number("CBGP_GATEWAY_PORT"),
                   default=os.environ.get("CBGP_GATEWAY_PORT", "8080"),
                   help="HTTP port (default 8080, env CBGP_GATEWAY_PORT; 0 = any free port)")
    p.add_argument("--metrics-port", type=port_number("CBGP_METRICS_PORT"),
                   default=os.environ.get("CBGP_METRICS_PORT"),
                   help="also serve /metrics /healthz /readyz on this port (env CBGP_METRICS_PORT; they are on --port "
                        "too)")
    p.add_argument("--tokens-file", default=os.environ.get("CBGP_GATEWAY_TOKENS_FILE"),
                   help="bearer tokens, 'TOKEN read|read-write|admin [OWNER]' per line (env CBGP_GATEWAY_TOKENS_FILE, or "
                        "the tokens themselves in CBGP_GATEWAY_TOKENS as TOKEN:SCOPE,...)")
    p.add_argument("--auth", choices=["token", "none"], default=os.environ.get("CBGP_GATEWAY_AUTH", "token"),
                   help="token (the default: every request but the console page and the probes needs a token) or none "
                        "(anyone is admin: only on a machine nobody else reaches); env CBGP_GATEWAY_AUTH")
    p.add_argument("--token-out", default=os.environ.get("CBGP_GATEWAY_TOKEN_OUT"),
                   help="with no token configured, an admin token is generated and written to this file (mode 600); "
                        "env CBGP_GATEWAY_TOKEN_OUT")
    p.add_argument("--tls-cert", default=os.environ.get("CBGP_GATEWAY_TLS_CERT"), help="serve HTTPS with this cert")
    p.add_argument("--tls-key", default=os.environ.get("CBGP_GATEWAY_TLS_KEY"))
    p.add_argument("--tls-client-ca", default=os.environ.get("CBGP_GATEWAY_TLS_CLIENT_CA"),
                   help="accept client certificates signed by this CA (mTLS)")
    p.add_argument("--client-cert-scope", choices=["read", "read-write", "admin"], default="read-write",
                   help="scope of a verified client certificate (default read-write)")
    defaults = Limits()
    for flag, field, kind, text in [
            ("--query-timeout", "query_timeout_s", float, "seconds one /query may run"),
            ("--query-max-rows", "query_max_rows", int, "rows (or triples) of one /query result"),
            ("--query-workers", "query_workers", int, "/query evaluations at once, on their own threads"),
            ("--query-queue", "query_queue", int, "/query requests waiting for a worker before 503"),
            ("--query-max-memory", "query_max_memory_mb", int, "MB one /query's evaluation may allocate, in a "
             "child process it runs in (Linux; 0: in a thread of the gateway, unbounded)"),
            ("--max-connections", "max_connections", int, "open SSE and WebSocket connections"),
            ("--max-connections-per-client", "max_connections_per_client", int, "... from one address"),
            ("--max-subscriptions-per-socket", "max_subscriptions_per_socket", int, "SEPA subscriptions per socket"),
            ("--slow-client-timeout", "slow_client_s", float, "seconds a client may not read before it is dropped"),
            ("--unregistered-keep", "ended_keep_s", float, "seconds an unregistered query's answers stay after its "
             "last one while nobody subscribes (for ?from=N)")]:
        env = "CBGP_GATEWAY_" + flag[2:].upper().replace("-", "_")
        p.add_argument(flag, dest=field, type=kind, default=kind(os.environ.get(env, getattr(defaults, field))),
                       help=f"{text} (default {getattr(defaults, field)}, env {env})")
    p.add_argument("--share", default=os.environ.get("CBGP_GATEWAY_SHARE", "0/1"),
                   help="with several replicas: INDEX/COUNT, or host/COUNT (the index the host name ends with, a "
                        "StatefulSet's ordinal); this replica holds the answers of the queries on its share of the "
                        "answers partitions and follows the others from their replicas (default 0/1: all; env "
                        "CBGP_GATEWAY_SHARE)")
    p.add_argument("--peers", default=os.environ.get("CBGP_GATEWAY_PEERS", ""),
                   help="with --share: every replica's URL, comma-separated in index order, or one with {i} for the "
                        "index (env CBGP_GATEWAY_PEERS)")
    p.add_argument("--peer-token-file", default=os.environ.get("CBGP_GATEWAY_PEER_TOKEN_FILE"),
                   help="a token the replicas share: sent to, and accepted (scope read) from, the other replicas "
                        "(env CBGP_GATEWAY_PEER_TOKEN_FILE)")
    p.add_argument("--peer-ca", default=os.environ.get("CBGP_GATEWAY_PEER_CA"),
                   help="verify https --peers against this CA (default: the system's)")
    p.add_argument("--history", type=int, default=int(os.environ.get("CBGP_GATEWAY_HISTORY", 100_000)),
                   help="answers kept per query for ?from=N / Last-Event-ID (default 100000; 0 = all; env "
                        "CBGP_GATEWAY_HISTORY)")
    p.add_argument("--log-level", default=os.environ.get("CBGP_LOG_LEVEL", "INFO"),
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"])

    def run(args: argparse.Namespace) -> int:
        from services.gateway.core import Share
        from services.gateway.server import serve
        from services.kafka.config import KafkaSettings
        from services.kafka.client import quiet_librdkafka
        from services.runtime.life import setup_logging

        try:  # (one line for a bad --share or --peers, as argparse gives for the other flags)
            args.share = Share.parse(args.share, socket.gethostname())
            args.peers = [] if args.share.whole else args.share.peers(args.peers)
        except ValueError as exc:
            p.error(str(exc))
        setup_logging("gateway", args.log_level)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
        settings = quiet_librdkafka(KafkaSettings.from_args(args))
        return asyncio.run(serve(args, settings))

    return {"gateway": run}
