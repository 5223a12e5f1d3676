"""Checkpoints are sealed: a saved state is a pickle, and a pickle is code, so every blob a service saves (on its
disk or in Kafka) carries an HMAC-SHA256 under the fleet's key and is unpickled only when it verifies.  The key
(``CBGP_CHECKPOINT_SECRET``) is required: a service that would checkpoint without one refuses to start."""

from __future__ import annotations

import hashlib
import hmac
import os

KEY_SETTING = "CBGP_CHECKPOINT_SECRET"
MIN_KEY_CHARS = 16
_MAGIC = b"CBGS1"  # sealed blob, format 1: magic | 32-byte HMAC-SHA256 | data
_MAC_BYTES = 32


class CheckpointKeyMissing(RuntimeError):
    """No usable checkpoint key: what to set, in one line."""


def key() -> bytes:
    """The checkpoint key; :class:`CheckpointKeyMissing` when it is unset or too short."""
    value = os.environ.get(KEY_SETTING, "")
    if len(value) < MIN_KEY_CHARS:
        raise CheckpointKeyMissing(
            f"checkpoints need a key of at least {MIN_KEY_CHARS} characters in {KEY_SETTING}, the same for every "
            "service of the fleet (e.g. openssl rand -hex 32), or no checkpoints (--checkpoint-interval -1)")
    return value.encode()


def mac(data: bytes, key_bytes: bytes | None = None) -> bytes:
    return hmac.new(key_bytes if key_bytes is not None else key(), data, hashlib.sha256).digest()


def seal(data: bytes) -> bytes:
    return _MAGIC + mac(data) + data


def unseal(blob: bytes) -> bytes | None:
    """The data of a sealed ``blob`` if its HMAC verifies under this fleet's key, else None (never unpickle it)."""
    if not blob.startswith(_MAGIC) or len(blob) < len(_MAGIC) + _MAC_BYTES:
        return None
    try:
        expected = mac(blob[len(_MAGIC) + _MAC_BYTES:])
    except CheckpointKeyMissing:
        return None
    given = blob[len(_MAGIC):len(_MAGIC) + _MAC_BYTES]
    return blob[len(_MAGIC) + _MAC_BYTES:] if hmac.compare_digest(given, expected) else None
