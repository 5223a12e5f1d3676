"""An embedded Kafka broker for tests, CI and local runs: the noida-db 0.2.3 binary as a child process.

Why noida-db: it is the only pip-installable broker that got
high watermarks, consumer groups, idempotence and read_committed transaction isolation right.  Limits to
respect: keep data small (it rewrites a JSON snapshot of everything ~1 s after each change), don't rely on
crash durability (a SIGKILL loses the last ~1 s of acknowledged writes) nor on compaction happening.

The binary is started directly (not through the ``noida-db`` console script, which would add a second
process to manage), in its own process group so that a Ctrl-C in the parent's terminal reaches only the
parent, which then stops the broker in order.  Its output goes to ``<data_dir>/noida-db.log``.
"""

from __future__ import annotations

import atexit
import os
import random
import signal
import socket
import subprocess
import time
from collections import deque
from pathlib import Path
from types import TracebackType
from typing import Callable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from services.kafka.config import KafkaSettings

__all__ = ["BrokerError", "EMBEDDED_REBALANCE_TIMEOUT_MS", "EmbeddedBroker", "noida_binary", "free_port",
           "wait_ready"]

LOG_NAME = "noida-db.log"
# noida-db 0.2.3 sometimes never answers the JoinGroup of a member that joins while a join round is
# completing (seen with 3-4 members joining within a second); the group then waits for that member, and
# librdkafka resends its JoinGroup only after the rebalance timeout + 3 s.  Clients of the embedded broker
# use 20 s instead of librdkafka's 300 s, so such a group forms after ~23 s.  Real Kafka keeps the default.
EMBEDDED_REBALANCE_TIMEOUT_MS = 20_000


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


def noida_binary() -> Path:
    """Path of the noida-db binary shipped inside the ``noida_db`` wheel."""
    try:
        import noida_db
    except ImportError:
        raise BrokerError("noida-db is not installed: pip install noida-db==0.2.3 (see requirements.lock)") from None
    path = Path(noida_db.__file__).with_name("noida-db")
    if not os.access(path, os.X_OK):
        raise BrokerError(f"noida-db binary missing or not executable: {path}")
    return path


LOWEST_PICKED_PORT = 10_000
recent_ports: deque[int] = deque(maxlen=1024)  # the ports free_port returned last (a plan picks several in a row)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, below the kernel's ephemeral range when there is room, so that
    nothing the kernel hands out between the pick and the bind (a port-0 listener such as another service's
    metrics server, an outgoing connection such as a Kafka client's) can take it; never one of the last ports it
    returned, which their users may not have bound yet.  A process binding that very port on purpose remains a
    possible race."""
    low = ephemeral_low()
    if low > LOWEST_PICKED_PORT:
        for _ in range(64):
            port = random.randrange(LOWEST_PICKED_PORT, low)
            if port in recent_ports:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            recent_ports.append(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The lowest port of the kernel's ephemeral range (0 when it cannot be read: the kernel then picks)."""
    try:
        with open(path) as handle:
            return int(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def wait_ready(bootstrap: str, timeout: float = 30.0, alive: Callable[[], bool] | None = None) -> None:
    """Two-phase readiness: (1) the port accepts TCP, (2) the broker answers a Metadata request.

    Phase 1 alone is not enough: the listener may accept before the Kafka protocol handler is up.
    ``alive`` (optional) is polled so a broker that died on start-up fails fast instead of timing out.
    """
    host, _, port = bootstrap.rpartition(":")
    deadline = time.monotonic() + timeout
    while True:  # phase 1: TCP accept
        if alive is not None and not alive():
            raise BrokerError(f"broker at {bootstrap} exited during start-up")
        try:
            socket.create_connection((host, int(port)), 0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise BrokerError(f"nothing accepts TCP connections on {bootstrap} after {timeout:.0f}s") from None
            time.sleep(0.02)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    while True:  # phase 2: Metadata answers
        if alive is not None and not alive():
            raise BrokerError(f"broker at {bootstrap} exited during start-up")
        try:
            admin.list_topics(timeout=2)
            return
        except KafkaException:
            if time.monotonic() > deadline:
                raise BrokerError(f"{bootstrap} accepts TCP but does not answer Kafka Metadata after {timeout:.0f}s") from None
            time.sleep(0.05)


class EmbeddedBroker:
    """A noida-db Kafka broker on ``127.0.0.1:<port>`` with its data in ``data_dir``.

    ``with EmbeddedBroker(tmp) as broker: ...`` starts it and stops it (SIGTERM, which writes the final
    snapshot, then SIGKILL after ``stop_timeout``).  :meth:`kill` simulates a crash; :meth:`start` after
    :meth:`stop` or :meth:`kill` restarts it on the same data dir and port, so clients reconnect.
    """

    def __init__(self, data_dir: str | os.PathLike[str], port: int | None = None,
                 start_timeout: float = 30.0, stop_timeout: float = 20.0) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        # A port we picked may be taken by someone else before the broker binds it: then pick another,
        # but only until the first successful start (a restart must keep its port for the clients).
        self._may_move = port is None
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        atexit.register(self._atexit)

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``."""
        return f"127.0.0.1:{self.port}"

    def settings(self, **fields: object) -> KafkaSettings:
        """Settings for this broker (``fields`` as :class:`KafkaSettings`'), with the rebalance workaround."""
        return KafkaSettings(**{"bootstrap_servers": self.bootstrap,
                                "rebalance_timeout_ms": EMBEDDED_REBALANCE_TIMEOUT_MS, **fields})

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_NAME

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> "EmbeddedBroker":
        """Start the broker (no-op if running) and return once it answers Metadata."""
        for _attempt in range(3):
            try:
                self._start_once()
                self._may_move = False
                return self
            except BrokerError as exc:
                if not (self._may_move and "already in use" in str(exc)):
                    raise
                self.port = free_port()
        raise BrokerError(f"no free port found for the embedded broker after 3 attempts (last: {self.port})")

    def _start_once(self) -> None:
        if self.running():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [str(noida_binary()), "start", "--only", "kafka", "--kafka-port", str(self.port),
               "--host", "127.0.0.1", "--data-dir", str(self.data_dir)]
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} start: {' '.join(cmd)}\n".encode())
            log.flush()
            # start_new_session: own process group, so the terminal's SIGINT goes to the parent only.
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        try:
            wait_ready(self.bootstrap, self.start_timeout, alive=self.running)
        except BrokerError as exc:
            self._terminate(signal.SIGKILL)
            raise BrokerError(f"{exc}: {self._last_error()} (log: {self.log_path})") from None

    def stop(self) -> int | None:
        """Graceful stop: SIGTERM (noida writes its snapshot), SIGKILL after ``stop_timeout``.  Returns the exit code."""
        return self._terminate(signal.SIGTERM)

    def kill(self) -> int | None:
        """Crash the broker (SIGKILL): the last ~1 s of acknowledged writes may be lost, as in the notes."""
        return self._terminate(signal.SIGKILL)

    def restart(self) -> "EmbeddedBroker":
        """Graceful stop, then start on the same data dir and port."""
        self.stop()
        return self.start()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _last_error(self) -> str:
        """The broker's own error line (e.g. "error: kafka: port 19092 is already in use"), for a one-line message."""
        lines = [ln for ln in self.log_tail(10).splitlines() if "error" in ln.lower() and "GLIBC" not in ln]
        return lines[-1].strip() if lines else "no error line in the log"

    def _terminate(self, sig: signal.Signals) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                return proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
        return proc.wait()

    def _atexit(self) -> None:
        # Safety net: an interpreter exiting without stop() must not leave a broker behind.
        if self.running():
            self._terminate(signal.SIGTERM)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running() else "stopped"
        return f"EmbeddedBroker({self.bootstrap}, {self.data_dir}, {state})"
