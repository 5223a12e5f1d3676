"""A wake-up call, on one host, from a stage that committed records to the stages that read them.

The embedded broker answers an empty fetch at once instead of holding it, so an idle reader sleeps between
fetches (``services.kafka.fetch.idle_pause``) and a record can wait out that pause at every hop.  With
``CBGP_DOORBELL_DIR`` set (``cbgp run`` sets it for the fleet it starts), a pausing reader listens on one Unix
datagram socket per input partition in that directory, and a committed transaction sends an empty datagram to
each socket of every partition it wrote: a reader in its deep pause (quiet for a minute) fetches then instead of
at the end of it (past the pause's first ``CBGP_IDLE_PAUSE_MS``: ``services.kafka.fetch.idle_pause``).

A ring carries nothing and nothing in one is read: a lost, late or extra ring only moves a fetch, so the pause
stays the bound on the wait and no answer depends on a ring.  The directory is the fleet's own (mode 0700).
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import select
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path
from typing import Iterable

from services.wire.loglines import kv

__all__ = ["DOORBELL_DIR_ENV", "Doorbell", "doorbell", "use_doorbell", "fresh_doorbell_dir"]

log = logging.getLogger("cbgp.runtime")

DOORBELL_DIR_ENV = "CBGP_DOORBELL_DIR"
RESCAN_SECONDS = 1.0  # a ringer lists the directory again at most this often (a reader started since is found)
MAX_DRAINED = 256  # rings read per wake at most (each is empty: the count does not matter, only that one came)
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with its NUL on Linux
MAX_NAME = 26  # <label>-<partition>.<pid>-<n>: a directory too long for both turns the doorbell off


def _fits(directory: str) -> bool:
    """Whether a socket's name fits under ``directory`` (sun_path's length)."""
    return len(os.path.join(directory, "x" * MAX_NAME)) <= MAX_SOCKET_PATH


def fresh_doorbell_dir(path: Path) -> Path:
    """``path`` emptied (a killed fleet's sockets gone) and private to this user; returns it.  A path too long for
    the sockets' names gives a new private directory under the system's temporary one instead."""
    if not _fits(str(path)):
        return Path(tempfile.mkdtemp(prefix="cbgp-bell-"))
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700, parents=True)
    return path


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _own_socket(path: str, uid: int) -> bool:
    """Whether ``path`` is a socket of this user's (not a link, nor anything another user put there)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISSOCK(info.st_mode) and info.st_uid == uid


def _label(topic: str) -> str:
    """A short, file-name-safe label for ``topic``: a socket's name is ``<label>-<partition>.<owner>``."""
    return hashlib.blake2s(topic.encode(), digest_size=4).hexdigest()


class Doorbell:
    """The ringing and the listening side for one process; off (every method a no-op) without a directory."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory or None
        self.listeners: dict[tuple[str, int], socket.socket] = {}  # (topic, partition) -> this process's socket
        self.paths: list[str] = []  # the sockets bound here, unlinked at exit
        self.sender: socket.socket | None = None
        self.scanned_at = float("-inf")
        # topic label -> partition -> socket paths of its readers (as last listed)
        self.peers: dict[str, dict[int, list[str]]] = {}
        if self.directory is not None and not _fits(self.directory):
            log.warning(kv(event="doorbell-off", directory=self.directory,
                           reason=f"a socket path there would be longer than {MAX_SOCKET_PATH} bytes"))
            self.directory = None

    @property
    def on(self) -> bool:
        return self.directory is not None

    # ------------------------------------------------------------------------------------------------ ringing

    def ring(self, partitions: Iterable[tuple[str, int | None]]) -> int:
        """Wake every reader listening now on one of ``partitions`` (``(topic, partition)``; partition None: all
        of the topic's); returns how many sockets were rung."""
        if self.directory is None:
            return 0
        now = time.monotonic()
        if now - self.scanned_at >= RESCAN_SECONDS:
            self._scan(now)
        if self.sender is None:
            try:
                self.sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            except OSError:  # (out of descriptors: the readers' pauses run out instead; never the writer's error)
                return 0
            self.sender.setblocking(False)
        rung = 0
        for topic, partition in set(partitions):
            readers = self.peers.get(_label(topic))
            if not readers:
                continue
            for paths in (readers.values() if partition is None else [readers.get(partition, [])]):
                for path in list(paths):
                    try:
                        self.sender.sendto(b"", path)
                        rung += 1
                    except BlockingIOError:
                        rung += 1  # its queue is full: it has been rung already
                    except OSError as exc:  # a reader that left (killed: its file stays, nobody bound to it)
                        paths.remove(path)
                        if isinstance(exc, ConnectionRefusedError):
                            _unlink(path)
        return rung

    def _scan(self, now: float) -> None:
        self.scanned_at = now
        self.peers = {}
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        uid = os.getuid()
        for name in names:
            label, _, rest = name.partition("-")
            partition, _, owner = rest.partition(".")
            path = os.path.join(self.directory, name)
            if owner and partition.isdigit() and _own_socket(path, uid):
                self.peers.setdefault(label, {}).setdefault(int(partition), []).append(path)

    # ---------------------------------------------------------------------------------------------- listening

    def wait(self, partitions: Iterable[tuple[str, int]], timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, less if a ring for one of ``partitions`` (``(topic, partition)``)
        comes (or came since the last wait); True when one did.  Without a directory, just sleeps."""
        socks = self.listen(partitions)
        if not socks:
            time.sleep(timeout)
            return False
        poller = select.poll()  # (not select(): a gateway with thousands of clients has descriptors past 1024)
        for sock in socks:
            poller.register(sock, select.POLLIN)
        readable = {fd for fd, _event in poller.poll(max(0, round(timeout * 1000)))}
        if readable:
            self.drain(key for key, sock in self.listeners.items() if sock.fileno() in readable)
        return bool(readable)

    def listen(self, partitions: Iterable[tuple[str, int]]) -> list[socket.socket]:
        """This process's sockets for ``partitions``, bound now if they were not: a ring sent from then on
        waits for the next :meth:`wait` (or :meth:`drain`)."""
        return [s for s in (self._listener(key) for key in partitions) if s is not None]

    def drain(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Take the rings waiting for ``partitions``: a reader about to fetch them calls it, so that a ring for
        what that fetch reads does not wake its next pause for nothing."""
        for key in partitions:
            sock = self.listeners.get(key)
            for _ in range(MAX_DRAINED if sock is not None else 0):
                try:
                    sock.recv(1)
                except BlockingIOError:
                    break

    def _listener(self, key: tuple[str, int]) -> socket.socket | None:
        sock = self.listeners.get(key)
        if sock is not None or self.directory is None:
            return sock
        topic, partition = key
        path = os.path.join(self.directory, f"{_label(topic)}-{partition}.{os.getpid()}-{len(self.paths)}")
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        except OSError:
            return None  # (out of descriptors: this wait is a plain pause)
        try:
            sock.bind(path)
        except OSError as exc:
            sock.close()
            log.warning(kv(event="doorbell-off", directory=self.directory, reason=str(exc)))
            self.directory = None
            return None
        sock.setblocking(False)
        if not self.paths:
            atexit.register(self.close)
        self.paths.append(path)
        self.listeners[key] = sock
        return sock

    def close(self) -> None:
        """Stop listening (the sockets' files removed)."""
        for sock in self.listeners.values():
            sock.close()
        for path in self.paths:
            _unlink(path)
        self.listeners, self.paths = {}, []


_PROCESS: list[Doorbell] = []  # this process's doorbell, made on first use


def doorbell() -> Doorbell:
    """This process's doorbell, from ``CBGP_DOORBELL_DIR`` as it is at the first use (a ``cbgp`` command reads
    the run file into the environment first)."""
    if not _PROCESS:
        _PROCESS.append(Doorbell(os.environ.get(DOORBELL_DIR_ENV)))
    return _PROCESS[0]


def use_doorbell(bell: Doorbell) -> None:
    """Make ``bell`` this process's doorbell (a test's own directory)."""
    _PROCESS[:] = [bell]
