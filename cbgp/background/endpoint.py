"""Local SPARQL endpoints the project starts itself: Virtuoso where installed, else one served from pyoxigraph.

``start_endpoint()`` returns a running :class:`Endpoint` (``.query_url``, ``.update_url``, ``.stop()``; also a
context manager).  Both kinds speak the SPARQL 1.1 Protocol over HTTP on a free port of 127.0.0.1, accept
SPARQL Update (Virtuoso: the anonymous ``SPARQL`` user is granted ``SPARQL_UPDATE`` in the throw-away database;
pyoxigraph: POST ``update=``), and keep their data in a temporary directory removed by ``stop()``.

- **Virtuoso** (Debian ``virtuoso-opensource``, installed by ``.ci/install-virtuoso.sh``): ``virtuoso-t -f`` on
  its own ini and database directory, two free ports (SQL for ``isql-vt``, HTTP for ``/sparql``), never the
  package's system daemon.  A fresh database has the user ``dba`` with password ``dba``.
- **pyoxigraph** (fallback, and ``kind="oxigraph"``): a ``ThreadingHTTPServer`` in a thread of this process;
  the default graph is the union of all graphs, as in Virtuoso, so a query needs no ``FROM``.

No Kafka here (the algorithm layer): this module only starts processes and serves HTTP.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cbgp.query.limits import DEFAULT_MAX_UPDATE_BYTES, limit

VIRTUOSO = "virtuoso-t"
ISQL = "isql-vt"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def virtuoso_available() -> bool:
    return shutil.which(VIRTUOSO) is not None and shutil.which(ISQL) is not None


@dataclass
class Endpoint:
    kind: str  # "virtuoso" or "oxigraph"
    query_url: str
    update_url: str
    directory: str
    _stop: object = field(repr=False, default=None)
    _update: object = field(repr=False, default=None)  # the owner's own channel, not HTTP

    def update(self, text: str) -> None:
        """A SPARQL 1.1 Update by the process that started the endpoint (read-only endpoints take none over HTTP)."""
        self._update(text)  # type: ignore[misc]

    def stop(self) -> None:
        if self._stop is not None:
            stop, self._stop = self._stop, None
            stop()

    def __enter__(self) -> "Endpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_endpoint(kind: str = "auto", *, timeout: float = 60.0, writable: bool = False) -> Endpoint:
    """Start a local endpoint on 127.0.0.1: ``auto`` is Virtuoso when installed, else pyoxigraph.  Read-only over
    HTTP unless ``writable`` (tests and benchmarks that change it as a remote client would); its owner changes it
    with :meth:`Endpoint.update` either way."""
    if kind == "auto":
        kind = "virtuoso" if virtuoso_available() else "oxigraph"
    if kind == "virtuoso":
        return start_virtuoso(timeout=timeout, writable=writable)
    if kind == "oxigraph":
        return start_oxigraph(writable=writable)
    raise ValueError(f"unknown endpoint kind {kind!r} (auto, virtuoso, oxigraph)")


# ---------------------------------------------------------------------------------------------------------- Virtuoso

_INI = """\
[Database]
DatabaseFile = {d}/virtuoso.db
ErrorLogFile = {d}/virtuoso.log
LockFile = {d}/virtuoso.lck
TransactionFile = {d}/virtuoso.trx
xa_persistent_file = {d}/virtuoso.pxa
ErrorLogLevel = 7
FileExtend = 200
MaxCheckpointRemap = 2000
Striping = 0
TempStorage = TempDatabase

[TempDatabase]
DatabaseFile = {d}/virtuoso-temp.db
TransactionFile = {d}/virtuoso-temp.trx
MaxCheckpointRemap = 2000
Striping = 0

[Parameters]
ServerPort = 127.0.0.1:{sql_port}
LiteMode = 0
DisableUnixSocket = 1
DisableTcpSocket = 0
MaxClientConnections = 10
CheckpointInterval = 0
O_DIRECT = 0
CaseMode = 2
MaxStaticCursorRows = 5000
AllowOSCalls = 0
SchedulerInterval = 10
DirsAllowed = ., {d}
ThreadCleanupInterval = 0
ThreadThreshold = 10
ResourcesCleanupInterval = 0
SingleCPU = 0
NumberOfBuffers = 10000
MaxDirtyBuffers = 6000
ThreadsPerQuery = 1
AsyncQueueMaxThreads = 2
MaxQueryMem = 200M

[HTTPServer]
ServerPort = 127.0.0.1:{http_port}
ServerRoot = {d}
MaxClientConnections = 8
DavRoot = DAV
EnabledDavVSP = 0
HTTPProxyEnabled = 0
ServerThreads = 8
MaxKeepAlives = 8
KeepAliveTimeout = 10
HTTPThreadSize = 280000
Charset = UTF-8
EnabledGzipContent = 0

[Client]
SQL_PREFETCH_ROWS = 100
SQL_PREFETCH_BYTES = 16000
SQL_QUERY_TIMEOUT = 0
SQL_TXN_TIMEOUT = 0

[SPARQL]
ResultSetMaxRows = 1000000
MaxQueryCostEstimationTime = 400
MaxQueryExecutionTime = 60
"""


def isql(sql_port: int, statement: str, *, password: str = "dba", timeout: float = 30.0) -> str:
    """Run one SQL statement through ``isql-vt`` (as dba) and return its output; raise on an error."""
    result = subprocess.run(
        [ISQL, str(sql_port), "dba", password, f"exec={statement}"],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0 or "*** Error" in result.stdout or "*** Error" in result.stderr:
        raise RuntimeError(f"isql {statement!r} failed: {result.stdout.strip()} {result.stderr.strip()}")
    return result.stdout


def _http_ready(url: str) -> bool:
    query = urllib.parse.urlencode({"query": "ASK {}"})
    request = urllib.request.Request(f"{url}?{query}", headers={"Accept": "application/sparql-results+json"})
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_virtuoso(*, timeout: float = 60.0, writable: bool = False) -> Endpoint:
    directory = tempfile.mkdtemp(prefix="cbgp-virtuoso-")
    sql_port, http_port = free_port(), free_port()
    while http_port == sql_port:
        http_port = free_port()
    ini = os.path.join(directory, "virtuoso.ini")
    with open(ini, "w") as out:
        out.write(_INI.format(d=directory, sql_port=sql_port, http_port=http_port))
    log = open(os.path.join(directory, "stdout.log"), "w")
    process = subprocess.Popen(
        [VIRTUOSO, "-f", "-c", ini], cwd=directory, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )
    url = f"http://127.0.0.1:{http_port}/sparql"

    def stop() -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        log.close()
        shutil.rmtree(directory, ignore_errors=True)

    deadline = time.monotonic() + timeout
    try:
        while not _http_ready(url):
            if process.poll() is not None:
                raise RuntimeError(f"virtuoso-t exited with {process.returncode}: {_tail(directory)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"virtuoso did not answer on {url} within {timeout} s: {_tail(directory)}")
            time.sleep(0.2)
        if writable:  # the anonymous /sparql user may update this throw-away database over HTTP
            isql(sql_port, 'grant SPARQL_UPDATE to "SPARQL";')
            isql(sql_port, "grant execute on DB.DBA.SPARQL_INSERT_DICT_CONTENT to \"SPARQL\";")
            isql(sql_port, "grant execute on DB.DBA.SPARQL_DELETE_DICT_CONTENT to \"SPARQL\";")
    except BaseException:
        stop()
        raise
    endpoint = Endpoint("virtuoso", url, url, directory, stop, lambda text: isql(sql_port, f"SPARQL {text}"))
    endpoint.sql_port = sql_port  # type: ignore[attr-defined]
    return endpoint


def _tail(directory: str) -> str:
    for name in ("virtuoso.log", "stdout.log"):
        try:
            with open(os.path.join(directory, name)) as f:
                return f.read()[-1500:]
        except OSError:
            continue
    return ""


# --------------------------------------------------------------------------------------------------------- pyoxigraph


def start_oxigraph(*, writable: bool = False) -> Endpoint:
    import pyoxigraph

    directory = tempfile.mkdtemp(prefix="cbgp-oxigraph-")
    store = pyoxigraph.Store()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _params(self) -> dict[str, str]:
            parsed = urllib.parse.urlsplit(self.path)
            params = dict(urllib.parse.parse_qsl(parsed.query))
            if self.command == "POST":
                raw_length = (self.headers.get("Content-Length") or "0").strip()
                if not (raw_length.isascii() and raw_length.isdigit()):
                    raise ValueError(f"Content-Length {raw_length[:40]!r} is not a number of bytes")
                length, most = int(raw_length), limit("CBGP_MAX_UPDATE_BYTES", DEFAULT_MAX_UPDATE_BYTES)
                if length > most:
                    raise ValueError(f"a request body of {length:,} bytes, over the limit of {most:,} "
                                     "(CBGP_MAX_UPDATE_BYTES)")
                body = self.rfile.read(length).decode()
                content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                if content_type == "application/x-www-form-urlencoded":
                    params.update(urllib.parse.parse_qsl(body))
                elif content_type == "application/sparql-query":
                    params["query"] = body
                elif content_type == "application/sparql-update":
                    params["update"] = body
            return params

        def _handle(self) -> None:
            if urllib.parse.urlsplit(self.path).path != "/sparql":
                self._reply(404, b"not found", "text/plain")
                return
            try:
                params = self._params()
                if "update" in params:
                    if not writable:
                        self._reply(403, b"this endpoint is read-only", "text/plain")
                        return
                    with lock:
                        store.update(params["update"])
                    self._reply(200, b"", "text/plain")
                    return
                if "query" not in params:
                    self._reply(400, b"query or update expected", "text/plain")
                    return
                with lock:
                    result = store.query(params["query"], use_default_graph_as_union=True)
                    if isinstance(result, bool) or hasattr(result, "variables"):
                        fmt = pyoxigraph.QueryResultsFormat.JSON
                        body = result.serialize(format=fmt)
                        content_type = "application/sparql-results+json"
                    else:
                        body = result.serialize(format=pyoxigraph.RdfFormat.N_TRIPLES)
                        content_type = "application/n-triples"
                self._reply(200, body, content_type)
            except (SyntaxError, ValueError, OSError) as exc:
                self.close_connection = True  # (a body left unread must not be taken for the next request)
                self._reply(400, str(exc).encode(), "text/plain")

        do_GET = do_POST = _handle

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="oxigraph-sparql", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/sparql"

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        shutil.rmtree(directory, ignore_errors=True)

    def update(text: str) -> None:
        with lock:
            store.update(text)

    return Endpoint("oxigraph", url, url, directory, stop, update)
