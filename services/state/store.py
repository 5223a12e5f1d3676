"""An on-disk key-value store whose writes are atomic batches that carry their checkpoint.

RocksDB through ``rocksdict``, as Quix Streams, faust and Kafka Streams keep their state: the data keys a
checkpoint changes and the checkpoint record itself (the input positions the data reflects, as JSON) are
written in one ``WriteBatch``.  RocksDB applies a batch whole or not at all, also across a kill -9 (its
write-ahead log is replayed up to the last complete batch), so after any crash the store holds one
checkpoint and exactly the data it describes: the previous one if the process died while writing.

Keys are bytes chosen by the caller; the byte ``0x00`` starts the store's own keys (the checkpoint record),
so a caller's key prefixes must start with another byte.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any, Iterable, Iterator

from rocksdict import Options, Rdict, WriteBatch

__all__ = ["Store", "StoreError", "StoreLocked"]

log = logging.getLogger("cbgp.state")

_CHECKPOINT_KEY = b"\x00checkpoint"


class StoreError(RuntimeError):
    """The store cannot be opened or written (disk full, permissions, corruption)."""


class StoreLocked(StoreError):
    """Another process has the store open: give each instance its own ``--state-dir`` or instance id."""


def _options() -> Options:
    options = Options(raw_mode=True)  # bytes in, bytes out: no pickling
    options.create_if_missing(True)
    options.set_keep_log_file_num(2)  # RocksDB's own info log, not the write-ahead log
    return options


class Store:
    """One RocksDB directory: ``checkpoint()`` reads the saved checkpoint record, ``scan(prefix)`` the data,
    ``commit(puts, deletes, checkpoint)`` writes both in one atomic batch, ``clear()`` forgets everything."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = Rdict(str(self.path), _options())
        except Exception as exc:  # noqa: BLE001 - rocksdict raises plain Exception with RocksDB's message
            message = str(exc)
            if "lock" in message.lower():
                raise StoreLocked(f"state store {self.path} is in use by another process ({message}); give each "
                                  "instance its own --state-dir or --instance-id") from None
            raise StoreError(f"cannot open the state store {self.path}: {message}") from None

    def checkpoint(self) -> dict[str, Any] | None:
        """The checkpoint record of the last commit (None: nothing was ever committed)."""
        raw = self._db.get(_CHECKPOINT_KEY)
        return None if raw is None else json.loads(raw)

    def get(self, key: bytes) -> bytes | None:
        """The value of one data key (None: absent)."""
        return self._db.get(key)

    def put_data(self, puts: Iterable[tuple[bytes, bytes]], deletes: Iterable[bytes]) -> None:
        """Write data keys as one atomic batch, leaving the checkpoint record as it is: only for data whose
        re-derivation from the checkpoint's positions gives the same values (an idempotent replay runs ahead)."""
        batch = WriteBatch(raw_mode=True)
        for key, value in puts:
            batch.put(key, value)
        for key in deletes:
            batch.delete(key)
        try:
            self._db.write(batch)
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"cannot write the state store {self.path}: {exc}") from None

    def scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """``(key, value)`` of every key starting with ``prefix``, in key order."""
        if not prefix or prefix[:1] == b"\x00":
            raise ValueError("a data prefix is a non-empty byte string not starting with 0x00")
        for key, value in self._db.items(from_key=prefix):
            if not key.startswith(prefix):
                return
            yield key, value

    def keys(self, prefix: bytes) -> Iterator[bytes]:
        """Every key starting with ``prefix``, in key order (cheaper than :meth:`scan` for sets)."""
        if not prefix or prefix[:1] == b"\x00":
            raise ValueError("a data prefix is a non-empty byte string not starting with 0x00")
        for key in self._db.keys(from_key=prefix):
            if not key.startswith(prefix):
                return
            yield key

    def commit(self, puts: Iterable[tuple[bytes, bytes]], deletes: Iterable[bytes], checkpoint: dict[str, Any]) -> None:
        """Write ``puts`` and ``deletes`` and the new ``checkpoint`` record as one atomic batch."""
        batch = WriteBatch(raw_mode=True)
        for key, value in puts:
            batch.put(key, value)
        for key in deletes:
            batch.delete(key)
        batch.put(_CHECKPOINT_KEY, json.dumps(checkpoint, sort_keys=True).encode())
        try:
            self._db.write(batch)
        except Exception as exc:  # noqa: BLE001
            raise StoreError(f"cannot write the state store {self.path}: {exc}") from None

    def clear(self) -> None:
        """Forget every key and the checkpoint (the store belonged to other logs)."""
        self._db.close()
        Rdict.destroy(str(self.path), _options())
        shutil.rmtree(self.path, ignore_errors=True)
        self._db = Rdict(str(self.path), _options())

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
