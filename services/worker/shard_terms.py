"""The terms a shard reads (``services.worker.core``): an operator query's expressions and the FILTERs pushed
into its leaves compare terms, not ids, so a shard looks up the terms of the changes they read in the dictionary
topic (``TermReader``) before applying them -- live, in restores and in a late registration's replay.  No Kafka
here."""

from __future__ import annotations

from typing import Iterable, Iterator

from cbgp.terms import DEFAULT_GRAPH_ID
from services.worker.shard import LEARN_CHUNK, Shard, TermReader
from cbgp.change import Change


def term_predicates(shard: Shard) -> frozenset[int] | None:
    """The predicates of the changes whose terms ``shard`` reads: its operator queries' (None: every change's),
    and those of the FILTERs gating its multi-centre leaves (``PartitionEvaluator.gate_predicates``)."""
    engine = shard.engine
    wanted = engine.term_predicates() if engine.operators else frozenset()
    if wanted is None or shard.evaluator is None:
        return wanted
    return wanted | shard.evaluator.gate_predicates()


def learn(shard: Shard, changes: list[Change], reader: TermReader | None,
          predicates: frozenset[int] | None = None) -> None:
    """Look up the terms of ``changes`` the shard does not know yet (``predicates``: only those of changes with
    these; default :func:`term_predicates`)."""
    dictionary = shard.engine.dictionary
    known = getattr(dictionary, "knows", None)
    if known is None or reader is None:
        return
    wanted = predicates if predicates is not None else term_predicates(shard)
    if wanted is not None and not wanted:
        return
    missing = {x for c in changes if wanted is None or c.p in wanted
               for x in (c.s, c.p, c.o, c.g) if x != DEFAULT_GRAPH_ID and not known(x)}
    if not missing:
        return
    found = reader(missing)
    for term_id, term in found.items():
        if term_id in missing:
            dictionary.add(term_id, term)
    lost = missing - found.keys()
    if lost:
        raise LookupError(f"term ids {sorted(lost)[:5]} of updates.encoded are not on the dictionary topic")


def learning(shard: Shard, changes: Iterable[Change], reader: TermReader | None,
             predicates: frozenset[int] | None = None) -> Iterator[Change]:
    """Pass ``changes`` through, their terms learnt first in chunks (see :func:`learn`) when the shard reads
    any."""
    wanted = predicates if predicates is not None else term_predicates(shard)
    if reader is None or wanted == frozenset():
        yield from changes
        return
    chunk: list[Change] = []
    for change in changes:
        chunk.append(change)
        if len(chunk) >= LEARN_CHUNK:
            learn(shard, chunk, reader, wanted)
            yield from chunk
            chunk = []
    learn(shard, chunk, reader, wanted)
    yield from chunk
