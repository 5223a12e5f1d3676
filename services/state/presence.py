"""Ingest's state as store keys: the presence set (quads of term ids) and the published dictionary (id -> term).

``q`` + four big-endian int64 (s, p, o, g) -> empty value, one key per present quad; ``t`` + int64 id -> the
term's canonical string in UTF-8, one key per term ingest published.  Term ids are 63-bit and non-negative
(``cbgp.terms.stable_term_id``; the default graph is 0), so the keys sort like the ids.
"""

from __future__ import annotations

import pickle
import struct
import sys
from array import array
from itertools import chain
from typing import Iterable, Iterator, Mapping

from services.state.store import Store

__all__ = ["Quad", "load_present", "load_terms", "changes", "snapshot", "load_snapshot"]

Quad = tuple[int, int, int, int]

QUAD_PREFIX, TERM_PREFIX = b"q", b"t"
_QUAD = struct.Struct(">qqqq")
_QUAD_KEY = struct.Struct(">xqqqq")  # a quad key with its prefix byte skipped
_TERM_ID = struct.Struct(">q")


def quad_key(quad: Quad) -> bytes:
    return QUAD_PREFIX + _QUAD.pack(*quad)


def quad_of_key(key: bytes) -> Quad:
    """The quad of a :func:`quad_key`."""
    return _QUAD_KEY.unpack(key)


def term_key(term_id: int) -> bytes:
    return TERM_PREFIX + _TERM_ID.pack(term_id)


def load_present(store: Store) -> set[Quad]:
    """The saved presence set (one pass over the ``q`` keys; unpacked in bulk)."""
    return set(_QUAD_KEY.iter_unpack(b"".join(store.keys(QUAD_PREFIX))))


def load_terms(store: Store) -> Iterator[tuple[int, str]]:
    """The saved published terms, ``(id, term)``."""
    unpack = _TERM_ID.unpack_from
    for key, value in store.scan(TERM_PREFIX):
        yield unpack(key, 1)[0], value.decode("utf-8")


def changes(changed: Mapping[Quad, bool], new_terms: Iterable[tuple[int, str]]
            ) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
    """``(puts, deletes)`` that bring a saved state up to date: ``changed`` maps each quad whose presence changed
    since the last save to whether it is present now; ``new_terms`` are the terms published since."""
    puts = [(term_key(term_id), term.encode("utf-8")) for term_id, term in new_terms]
    deletes = []
    for quad, present in changed.items():
        if present:
            puts.append((quad_key(quad), b""))
        else:
            deletes.append(quad_key(quad))
    return puts, deletes


SNAPSHOT_FORMAT = 1


def snapshot(present: set[Quad], terms: Iterable[tuple[int, str]], record: Mapping) -> bytes:
    """The whole state as one blob (ingest's checkpoint in Kafka): the checkpoint record, the presence set packed
    32 bytes a quad, and the published terms."""
    packed = array("q", chain.from_iterable(present))  # (0.7 s a million quads; struct.pack per quad: 1.8 s)
    if sys.byteorder == "little":
        packed.byteswap()  # big-endian, as the store's keys
    return pickle.dumps({"format": SNAPSHOT_FORMAT, "checkpoint": dict(record), "present": packed.tobytes(),
                         "terms": list(terms)}, protocol=pickle.HIGHEST_PROTOCOL)


def load_snapshot(blob: bytes) -> tuple[dict, set[Quad], list[tuple[int, str]]] | None:
    """``(checkpoint record, presence set, terms)`` of a :func:`snapshot` blob; None for one of another format."""
    try:
        state = pickle.loads(blob)
    except Exception:  # noqa: BLE001 - a snapshot of older code: restore from the logs instead
        return None
    if not isinstance(state, dict) or state.get("format") != SNAPSHOT_FORMAT:
        return None
    return state["checkpoint"], set(_QUAD.iter_unpack(state["present"])), state["terms"]
