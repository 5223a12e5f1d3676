"""Ingest's state kept on disk instead of in memory (state larger than memory).

``cbgp ingest --state-on-disk`` keeps the presence set and the published terms in its RocksDB store
(:mod:`services.state.store`, the keys of :mod:`services.state.presence`) rather than loading them into Python
sets: a lookup that memory does not answer reads the store.  Memory then holds only what changed since the last
checkpoint (the *overlay*, which the next checkpoint writes) and a bounded cache of known terms, so the graph may
be larger than memory; a restore opens the store and reads the logs' tails, loading nothing.

:class:`DiskPresence` and :class:`DiskTerms` offer what :class:`services.ingest.core.IngestProcessor` asks of its
set and its :class:`cbgp.terms.TermDictionary`, so the transform is the same code either way.  Kafka-free.
"""

from __future__ import annotations

from typing import Iterator

from cbgp.terms import TermCollisionError, stable_term_id
from services.state.presence import QUAD_PREFIX, Quad, load_terms, quad_key, quad_of_key, seq_of_value, term_key
from services.state.store import Store

__all__ = ["DiskPresence", "DiskTerms", "DiskPublished", "TERM_CACHE"]

TERM_CACHE = 1 << 20  # known terms cached in memory (term -> id); beyond, the cache starts again


class DiskPresence:
    """The present quads, each with the seq of its insert: the overlay (quads whose presence changed since the
    last checkpoint -> that seq, or None when absent now) over the store's ``q`` keys.  ``size`` starts at the
    checkpoint's count.  Offers the part of a dict the ingest transform uses."""

    def __init__(self, store: Store, size: int) -> None:
        self.store = store
        self.overlay: dict[Quad, int | None] = {}
        self.size = size

    def get(self, quad: Quad) -> int | None:
        """The seq of the insert that made ``quad`` present, or None when it is absent."""
        if quad in self.overlay:
            return self.overlay[quad]
        value = self.store.get(quad_key(quad))
        return None if value is None else seq_of_value(value)

    def __contains__(self, quad: Quad) -> bool:
        return self.get(quad) is not None

    def __setitem__(self, quad: Quad, seq: int) -> None:
        if quad not in self:
            self.size += 1
        self.overlay[quad] = seq

    def pop(self, quad: Quad, default: int | None = None) -> int | None:
        seq = self.get(quad)
        if seq is None:
            return default
        self.size -= 1
        self.overlay[quad] = None
        return seq

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[Quad]:
        """Every present quad (the store's, as the overlay changes them): for the SPARQL Update mirror."""
        overlay = self.overlay
        for key in self.store.keys(QUAD_PREFIX):
            quad = quad_of_key(key)
            if overlay.get(quad, 0) is not None:
                yield quad
        for quad, seq in list(overlay.items()):
            if seq is not None and self.store.get(quad_key(quad)) is None:
                yield quad

    def saved(self) -> None:
        """The overlay is in the store now (a checkpoint committed it)."""
        self.overlay = {}


class DiskTerms:
    """Term <-> id for stable ids (:func:`cbgp.terms.stable_term_id`) of the terms published, in the store's ``t``
    keys plus those published since the last checkpoint (``pending``), with a bounded cache of term -> id that
    the transform's hot loop reads (``ids``).  Raises :class:`TermCollisionError` as the in-memory dictionary does."""

    def __init__(self, store: Store, count: int, cache: int = TERM_CACHE) -> None:
        self.store = store
        self.ids: dict[str, int] = {}  # the cache: never modified by callers
        self.pending: dict[int, str] = {}
        self.count = count
        self.cache = cache

    def stored(self, term_id: int) -> str | None:
        term = self.pending.get(term_id)
        if term is not None:
            return term
        raw = self.store.get(term_key(term_id))
        return None if raw is None else raw.decode("utf-8")

    def encode(self, term: str) -> int:
        found = self.ids.get(term)
        if found is not None:
            return found
        term_id = stable_term_id(term)
        other = self.stored(term_id)
        if other is not None and other != term:
            raise TermCollisionError(f"terms {other!r} and {term!r} share id {term_id}")
        self._cache(term, term_id)
        return term_id

    def add(self, term_id: int, term: str) -> None:
        """A term read from the dictionary topic (a restore's tail)."""
        other = self.stored(term_id)
        if other is not None and other != term:
            raise TermCollisionError(f"terms {other!r} and {term!r} share id {term_id}")
        self._cache(term, term_id)

    def decode(self, term_id: int) -> str:
        term = self.stored(term_id)
        if term is None:
            raise KeyError(term_id)
        return term

    def publish(self, term_id: int, term: str) -> None:
        self.pending[term_id] = term
        self.count += 1

    def published(self, term_id: int) -> bool:
        return term_id in self.pending or self.store.get(term_key(term_id)) is not None

    def terms(self) -> Iterator[tuple[int, str]]:
        yield from load_terms(self.store)
        yield from self.pending.items()

    def saved(self) -> None:
        self.pending = {}

    def __len__(self) -> int:
        return self.count

    def _cache(self, term: str, term_id: int) -> None:
        if len(self.ids) >= self.cache:
            self.ids.clear()  # (simplest bound: the hot terms come back at once)
        self.ids[term] = term_id


class DiskPublished:
    """``IngestProcessor.published`` on disk: the ids of :class:`DiskTerms`' terms (``DiskTerms.publish`` adds
    them)."""

    def __init__(self, terms: DiskTerms) -> None:
        self.terms = terms

    def __contains__(self, term_id: int) -> bool:
        return self.terms.published(term_id)

    def __len__(self) -> int:
        return len(self.terms)

    def __iter__(self) -> Iterator[int]:
        return (term_id for term_id, _term in self.terms.terms())
