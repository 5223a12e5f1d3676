"""The schema registry: the current schema per record name and every writer schema by fingerprint.

Schemas are ``schemas/*.avsc`` (current) and ``schemas/history/<Name>.v<N>.avsc`` (earlier versions); a
message's 8-byte CRC-64-AVRO fingerprint names the one that wrote it.  The registry is read once per process
(:func:`reg`) and shared by every other module of this package.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastavro import parse_schema
from fastavro.schema import to_parsing_canonical_form

MAGIC = b"\xc3\x01"
HEADER_LEN = 10
NAMESPACE = "org.cbgp"


def _schema_dir() -> Path:
    """``$CBGP_SCHEMA_DIR``, else ``schemas/`` next to the package (a checkout), else ``./schemas`` (the image's
    working directory holds them, since a non-editable install puts the package in site-packages)."""
    if os.environ.get("CBGP_SCHEMA_DIR"):
        return Path(os.environ["CBGP_SCHEMA_DIR"])
    beside = Path(__file__).resolve().parents[2] / "schemas"
    return beside if beside.is_dir() else Path.cwd() / "schemas"


SCHEMA_DIR = _schema_dir()


class CodecError(ValueError):
    """Bytes that are not a record of the expected schema, or a record that does not fit its schema."""


# ---------------------------------------------------------------------------------------- fingerprints

_EMPTY64 = 0xC15D213AA4D7A795


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY64 & -(fp & 1))
        table.append(fp)
    return table


_TABLE = _crc_table()


def crc64_avro(data: bytes) -> int:
    """The Rabin CRC-64 the Avro spec defines for schema fingerprints ("CRC-64-AVRO")."""
    fp = _EMPTY64
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp


# ---------------------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Writer:
    name: str  # short record name, e.g. "RawUpdate"
    version: str  # "current" or "v1", "v2", ...
    parsed: dict[str, Any]
    fingerprint: bytes  # 8 bytes, little-endian


class _Registry:
    """Current schema per record name, and every known writer schema by fingerprint."""

    def __init__(self, schema_dir: Path) -> None:
        self.current: dict[str, Writer] = {}
        self.by_fingerprint: dict[bytes, Writer] = {}
        if not schema_dir.is_dir():
            raise CodecError(f"schema directory not found: {schema_dir} (set CBGP_SCHEMA_DIR)")
        for path in sorted(schema_dir.glob("*.avsc")):
            writer = self._load(path, "current")
            self.current[writer.name] = writer
            self.by_fingerprint[writer.fingerprint] = writer
        for path in sorted((schema_dir / "history").glob("*.v*.avsc")):
            version = path.name.split(".")[-2]
            writer = self._load(path, version)
            if writer.name not in self.current:
                raise CodecError(f"{path}: history of {writer.name}, which has no current schema")
            # An unchanged schema kept in history has the current fingerprint; the current entry wins.
            self.by_fingerprint.setdefault(writer.fingerprint, writer)

    @staticmethod
    def _load(path: Path, version: str) -> Writer:
        try:
            raw = json.loads(path.read_text())
            parsed = parse_schema(raw)
        except Exception as exc:  # a broken schema file is a deployment error: say which file
            raise CodecError(f"{path}: invalid Avro schema: {exc}") from None
        canonical = to_parsing_canonical_form(parsed)
        fp = struct.pack("<Q", crc64_avro(canonical.encode()))
        return Writer(parsed["name"].rsplit(".", 1)[-1], version, parsed, fp)


_registry: _Registry | None = None


def reg() -> _Registry:
    global _registry
    if _registry is None:
        _registry = _Registry(SCHEMA_DIR)
    return _registry


def current_writer(record_name: str) -> Writer:
    name = record_name.rsplit(".", 1)[-1] if record_name.startswith(NAMESPACE + ".") else record_name
    try:
        return reg().current[name]
    except KeyError:
        raise CodecError(f"unknown record {record_name!r}; known: {', '.join(sorted(reg().current))}") from None


def record_names() -> list[str]:
    """Short names of every current record schema."""
    return sorted(reg().current)


def fingerprint(record_name: str) -> bytes:
    """The 8-byte (little-endian) CRC-64-AVRO fingerprint of ``record_name``'s current schema."""
    return current_writer(record_name).fingerprint


def schema(record_name: str) -> dict[str, Any]:
    """The parsed current schema of ``record_name`` (fastavro form)."""
    return current_writer(record_name).parsed


def writer_name(data: bytes) -> str | None:
    if not isinstance(data, (bytes, bytearray)) or len(data) < HEADER_LEN:
        return None
    writer = reg().by_fingerprint.get(bytes(data[2:HEADER_LEN])) if data[:2] == MAGIC else None
    return writer.name if writer is not None else None
