"""Prometheus metrics of the fleet, and the small HTTP server every service runs for them and its probes.

The metric names and labels below are an interface: dashboards, alerts and the Helm chart's probes use
them, so rename nothing.  Endpoints: ``/metrics`` (Prometheus text format), ``/healthz`` (200 while the
process serves HTTP: the liveness probe), ``/readyz`` (200 once the service says it is ready, e.g. state
restored and partitions assigned, else 503: the readiness probe).
"""

from __future__ import annotations

import logging
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs

from confluent_kafka import TopicPartition
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

# The metric objects are defined in services.metrics.instruments (no Kafka, so transforms can count through them).
from services.metrics.instruments import CONSUMER_LAG

__all__ = [
    "ListenError", "MetricsServer", "start_metrics_server", "record_consumer_lag", "forget_consumer_lag",
    "CONSUMER_LAG",
]

log = logging.getLogger(__name__)

def record_consumer_lag(consumer: Any, positions: dict[tuple[str, int], int] | None = None, *,
                        whole: bool = False) -> None:
    """Set ``cbgp_consumer_lag`` for the partitions ``consumer`` (a confluent-kafka Consumer) reads.

    Uses the watermarks cached from fetch responses when there are some (no broker round trip). A reader
    that tracks its own ``positions`` ((topic, partition) -> next offset) passes them: it may be
    unassigned between polls while idle, and then the broker is asked for the high watermark.  ``whole``: they
    are every partition this reader holds, and the series it set for any other partition are removed.
    """
    if positions is None:
        assignment = consumer.assignment()
        if not assignment:
            return
        positions = {(tp.topic, tp.partition): tp.offset for tp in consumer.position(assignment)}
    for (topic, partition), offset in positions.items():
        tp = TopicPartition(topic, partition)
        try:
            _low, high = consumer.get_watermark_offsets(tp, cached=True)
            if high < 0:
                _low, high = consumer.get_watermark_offsets(tp, timeout=1.0)
        except Exception:  # noqa: BLE001 - broker busy or partition unknown yet: report next time
            continue
        if high >= 0 and offset >= 0:
            CONSUMER_LAG.labels(topic, str(partition)).set(max(0, high - offset))
    shown = _LAG_SHOWN.setdefault(id(consumer), set())
    if not whole:
        shown.update(positions)
        return
    # A partition given up in a rebalance loses its series rather than show its last lag for ever
    for topic, partition in shown - positions.keys():
        try:
            CONSUMER_LAG.remove(topic, str(partition))
        except KeyError:
            pass
    _LAG_SHOWN[id(consumer)] = set(positions)


_LAG_SHOWN: dict[int, set[tuple[str, int]]] = {}  # id of a reader -> the partitions whose lag series it set


def forget_consumer_lag(consumer: Any) -> None:
    """A reader that closes: the lag series it set go, and so does what it was remembered by."""
    record_consumer_lag(consumer, {}, whole=True)
    del _LAG_SHOWN[id(consumer)]


# ------------------------------------------------------------------------------------ HTTP server


class MetricsServer:
    """A running ``/metrics`` + probes server on a daemon thread; :meth:`stop` frees the port."""

    def __init__(self, httpd: ThreadingHTTPServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread

    @property
    def port(self) -> int:
        """The bound port (the OS-chosen one when started with port 0)."""
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        host = self._httpd.server_address[0]
        return f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{self.port}"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ListenError(OSError):
    """A port this process was told to listen on could not be bound (taken, or not allowed); ``cbgp`` says it in
    one line."""


def start_metrics_server(port: int, ready: Callable[[], bool] = lambda: True, host: str | None = None,
                         registry: CollectorRegistry = REGISTRY) -> MetricsServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port`` (port 0 = any free port).  As the
    Prometheus client libraries do, ``/metrics?name[]=N&name[]=M`` serves only the series named N and M (a whole
    page of a busy service costs it milliseconds: a client that polls one counter asks for that one).  ``host`` is
    ``CBGP_METRICS_HOST``, else 127.0.0.1: nothing listens beyond this machine unless asked (the chart asks, for
    Prometheus and the kubelet's probes).

    ``ready`` is called on each ``/readyz`` request; if it raises, the answer is 503 with the error, so a
    broken readiness check never takes the metrics endpoint down with it.
    """

    host = host or os.environ.get("CBGP_METRICS_HOST") or "127.0.0.1"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path, _, query = self.path.partition("?")
            if path == "/metrics":
                names = parse_qs(query).get("name[]")
                self._send(200, generate_latest(registry.restricted_registry(names) if names else registry),
                           CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, b"ok\n")
            elif path == "/readyz":
                try:
                    ok, detail = bool(ready()), ""
                except Exception as exc:  # noqa: BLE001 - reported to the prober, not raised
                    ok, detail = False, f": {type(exc).__name__}: {exc}"
                self._send(200 if ok else 503, (b"ready\n" if ok else f"not ready{detail}\n".encode()))
            else:
                self._send(404, b"not found: try /metrics, /healthz or /readyz\n")

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: Any) -> None:
            # Probes hit these endpoints every few seconds: keep them out of the service's log.
            log.debug("metrics http: " + fmt, *args)

    try:
        httpd = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise ListenError(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc} "
                          "(--metrics-port, CBGP_METRICS_HOST)") from None
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, name=f"metrics-{httpd.server_address[1]}", daemon=True)
    thread.start()
    return MetricsServer(httpd, thread)
