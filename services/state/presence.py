"""Ingest's state as store keys: the presence set (quads of term ids, each with the seq of the insert that made it
present) and the published dictionary (id -> term).

``q`` + four big-endian int64 (s, p, o, g) -> the insert's seq, big-endian int64 (empty in stores written before
seqs were kept: read as -1, unknown), one key per present quad; ``t`` + int64 id -> the term's canonical string in
UTF-8, one key per term ingest published.  Term ids are 63-bit and non-negative (``cbgp.terms.stable_term_id``;
the default graph is 0), so the keys sort like the ids.

Why the insert seq: the presence set is the graph as of one seq, a *base* a worker can move to any other seq
along the change log, and a registration replayed from a base must see each quad inserted when it really was
(``docs/design/bounded-input-logs.md``).
"""

from __future__ import annotations

import pickle
import struct
import sys
from array import array
from itertools import chain, islice
from typing import Callable, Iterable, Iterator, Mapping

from services.state.store import Store
from services.wire.sealed import seal, unseal

__all__ = ["Quad", "Presence", "UNKNOWN_SEQ", "load_present", "load_terms", "changes", "snapshot", "load_snapshot",
           "TermChunks"]

Quad = tuple[int, int, int, int]
Presence = dict[Quad, int]  # each present quad -> the seq of the insert that made it present
UNKNOWN_SEQ = -1  # a quad saved before insert seqs were kept

QUAD_PREFIX, TERM_PREFIX = b"q", b"t"
_QUAD = struct.Struct(">qqqq")
_QUAD_SEQ = struct.Struct(">qqqqq")  # a quad and its insert seq, as the snapshot packs them
_QUAD_KEY = struct.Struct(">xqqqq")  # a quad key with its prefix byte skipped
_TERM_ID = struct.Struct(">q")
_SEQ = struct.Struct(">q")


def quad_key(quad: Quad) -> bytes:
    return QUAD_PREFIX + _QUAD.pack(*quad)


def quad_of_key(key: bytes) -> Quad:
    """The quad of a :func:`quad_key`."""
    return _QUAD_KEY.unpack(key)


def term_key(term_id: int) -> bytes:
    return TERM_PREFIX + _TERM_ID.pack(term_id)


def seq_value(seq: int) -> bytes:
    """A quad key's value: the seq of its insert."""
    return _SEQ.pack(seq)


def seq_of_value(value: bytes) -> int:
    return _SEQ.unpack(value)[0] if value else UNKNOWN_SEQ


def load_present(store: Store) -> Presence:
    """The saved presence set with each quad's insert seq (one pass over the ``q`` keys)."""
    unpack = _QUAD_KEY.unpack
    return {unpack(key): seq_of_value(value) for key, value in store.scan(QUAD_PREFIX)}


def load_terms(store: Store) -> Iterator[tuple[int, str]]:
    """The saved published terms, ``(id, term)``."""
    unpack = _TERM_ID.unpack_from
    for key, value in store.scan(TERM_PREFIX):
        yield unpack(key, 1)[0], value.decode("utf-8")


def changes(changed: Mapping[Quad, int | None], new_terms: Iterable[tuple[int, str]]
            ) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
    """``(puts, deletes)`` that bring a saved state up to date: ``changed`` maps each quad whose presence changed
    since the last save to the seq of the insert that made it present, or None when it is absent now;
    ``new_terms`` are the terms published since."""
    puts = [(term_key(term_id), term.encode("utf-8")) for term_id, term in new_terms]
    deletes = []
    for quad, seq in changed.items():
        if seq is not None:
            puts.append((quad_key(quad), seq_value(seq)))
        else:
            deletes.append(quad_key(quad))
    return puts, deletes


SNAPSHOT_FORMAT = 3  # 1: quads without their insert seqs (loaded with UNKNOWN_SEQ); 2: quads and seqs interleaved,
# the terms one pickled list


SLICE = 512  # quads between two calls of a snapshot's ``pause``
TERM_CHUNK = 16384  # most terms in one pickled chunk of a snapshot's terms


class TermChunks:
    """The published terms as a snapshot packs them: pickled lists, each pickled once and reused by every later
    snapshot, so a snapshot encodes only the terms published since the one before it.  A new chunk is merged
    with the one before it while that one is not larger (at most ``TERM_CHUNK`` terms): few chunks, each term
    pickled a few times in all.  Not thread-safe: one writer at a time (ingest's checkpoint thread)."""

    def __init__(self, terms: Iterable[tuple[int, str]] = ()) -> None:
        self._clear()
        self._add(list(terms))

    def _clear(self) -> None:
        self.ids: set[int] = set()
        self.chunks: list[bytes] = []
        self._sizes: list[int] = []  # each chunk's number of terms

    def update(self, published: set[int] | frozenset[int], decode: Callable[[int], str],
               pause: Callable[[], object] | None = None) -> None:
        """Hold exactly ``published``, decoding with ``decode`` the ids it does not hold yet (a set that lost ids,
        as after a restore to an older state, is packed again from nothing); ``pause`` after each chunk."""
        if not self.ids <= published:
            self._clear()
        self._add([(term_id, decode(term_id)) for term_id in published - self.ids], pause)

    def _add(self, terms: list[tuple[int, str]], pause: Callable[[], object] | None = None) -> None:
        for start in range(0, len(terms), TERM_CHUNK):
            chunk = terms[start: start + TERM_CHUNK]
            self.ids.update(term_id for term_id, _ in chunk)
            while self._sizes and self._sizes[-1] <= len(chunk) and self._sizes[-1] + len(chunk) <= TERM_CHUNK:
                self._sizes.pop()
                chunk = pickle.loads(self.chunks.pop()) + chunk
            self.chunks.append(pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL))
            self._sizes.append(len(chunk))
            if pause is not None:
                pause()


def snapshot(present: Presence, terms: TermChunks | Iterable[tuple[int, str]], record: Mapping,
             pause: Callable[[], object] | None = None) -> bytes:
    """The whole state as one blob (ingest's checkpoint in Kafka): the checkpoint record, the presence set packed
    as two arrays (four ids a quad, then each quad's insert seq) and the published terms (:class:`TermChunks`).
    ``pause``: called every ``SLICE`` quads (a background writer gives the interpreter's lock back there: see
    ``services.ingest.checkpoint``)."""
    if not isinstance(terms, TermChunks):
        terms = TermChunks(terms)
    quads, keys = array("q"), iter(present)
    for _ in range(0, len(present), SLICE):
        quads.extend(chain.from_iterable(islice(keys, SLICE)))
        if pause is not None:
            pause()
    seqs = array("q", present.values())
    if sys.byteorder == "little":
        quads.byteswap()  # big-endian, as the store's keys
        seqs.byteswap()
    return seal(pickle.dumps({"format": SNAPSHOT_FORMAT, "checkpoint": dict(record), "quads": quads.tobytes(),
                              "seqs": seqs.tobytes(), "term_chunks": terms.chunks}, protocol=pickle.HIGHEST_PROTOCOL))


def load_snapshot(blob: bytes) -> tuple[dict, Presence, list[tuple[int, str]]] | None:
    """``(checkpoint record, presence set, terms)`` of a :func:`snapshot` blob; None for one of another format or
    whose seal does not verify under this fleet's key (never unpickled then)."""
    state = _snapshot_state(blob)
    if state is None:
        return None
    if state["format"] == 1:
        present = dict.fromkeys(_QUAD.iter_unpack(state["present"]), UNKNOWN_SEQ)
    elif state["format"] == 2:
        present = {(s, p, o, g): seq for s, p, o, g, seq in _QUAD_SEQ.iter_unpack(state["present"])}
    else:
        present = dict(zip(_QUAD.iter_unpack(state["quads"]), (seq for seq, in _SEQ.iter_unpack(state["seqs"]))))
    terms = (state["terms"] if state["format"] < 3 else
             list(chain.from_iterable(pickle.loads(chunk) for chunk in state["term_chunks"])))
    return state["checkpoint"], present, terms


def snapshot_record(blob: bytes) -> dict | None:
    """The checkpoint record of a :func:`snapshot` blob alone (what a reader of its positions needs: the presence
    set, 130,000 quads after 150,000 LSBench updates, is not rebuilt); None as :func:`load_snapshot`."""
    state = _snapshot_state(blob)
    return state["checkpoint"] if state is not None else None


def _snapshot_state(blob: bytes) -> dict | None:
    data = unseal(blob)
    if data is None:
        return None
    try:
        state = pickle.loads(data)
    except Exception:  # noqa: BLE001 - a snapshot of older code: restore from the logs instead
        return None
    if not isinstance(state, dict) or state.get("format") not in (1, 2, SNAPSHOT_FORMAT):
        return None
    return state