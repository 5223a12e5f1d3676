"""Operator queries placed by centre at the answers service (``services.answers.release``): the operators over their
BGP leaves' part deltas, released in seq order (``cbgp.algebra.by_centre``), with the fleet's term ids and its
way of reporting ASK.  No Kafka here."""

from __future__ import annotations

from cbgp.terms import TermDictionary
from services.worker.shard_engine import ASK_FALSE, ASK_TRUE, ASK_VARIABLE, ask_flip, ask_initial


class HeldTerms:
    """The answers service's share of the terms its operator queries compute and hold (``TermDictionary.hold``:
    an aggregate's current values): in the service's dictionary, for the answers that name them, while some query
    holds them, then removed (unless the dictionary topic brought the same term: :meth:`pin`).  Each query keeps
    its own counts (:class:`KnownTerms`); here, how many queries hold each term."""

    def __init__(self, known: dict[int, str]) -> None:
        self.known = known
        self.queries: dict[int, int] = {}  # term id -> queries holding it (none for a term the topic brought)
        self.dirty: set[KnownTerms] = set()  # the queries that let terms go since collect()

    def hold(self, term_id: int, term: str) -> None:
        """A query holds ``term_id`` now (it did not)."""
        queries = self.queries
        if term_id in queries:
            queries[term_id] += 1
        elif term_id not in self.known:  # (else read from the topic, or kept for good: nothing to count)
            self.known[term_id] = term
            queries[term_id] = 1

    def let_go(self, freed: list[int]) -> None:
        """A query holds these no more."""
        queries = self.queries
        for term_id in freed:
            n = queries.get(term_id)
            if n is None:
                continue
            if n > 1:
                queries[term_id] = n - 1
            else:
                del queries[term_id]
                self.known.pop(term_id, None)

    def pin(self, entries: list[tuple[int, str]]) -> None:
        """Terms read from the dictionary topic: kept for good (a delta from a worker may name them)."""
        if self.queries:
            for term_id, _term in entries:
                self.queries.pop(term_id, None)

    def collect(self) -> None:
        """Free what the queries let go: call it once the answers released so far were decoded."""
        for terms in self.dirty:
            terms.collect()
        self.dirty.clear()


class KnownTerms(TermDictionary):
    """The fleet's term ids (stable: every process agrees) for an operator query's expressions: a term it
    has not seen is read from ``known`` (the answers service's dictionary, which holds every id of a delta
    before the delta is released), and one it makes (a COUNT, a BIND value) is added there, so the answers
    that use it decode; one it holds (an aggregate's value) stays there while held (:class:`HeldTerms`)."""

    __slots__ = ("known", "shared")

    def __init__(self, known: dict[int, str], shared: HeldTerms | None = None) -> None:
        super().__init__(stable=True)
        self.known = known
        self.shared = HeldTerms(known) if shared is None else shared

    def __getstate__(self) -> tuple:
        # A checkpoint holds its own terms, not the service's dictionary: :meth:`Operators.rebind` gives the
        # restored operators the dictionary of the service that loads them.
        _none, slots = super().__getstate__()
        return None, {**slots, "known": {}, "shared": None}

    def decode(self, term_id: int) -> str:
        term = self._terms.get(term_id)
        if term is None:
            entry = self._held.get(term_id)
            if entry is not None:
                return entry[0]
            term = self.known[term_id]
            self.add(term_id, term)
        return term

    def encode(self, term: str) -> int:
        term_id = super().encode(term)  # (a term this query held is kept for good from now on)
        self.known.setdefault(term_id, term)
        if self.shared.queries:
            self.shared.queries.pop(term_id, None)  # ... by the service too
        return term_id

    def hold(self, term: str) -> int:
        term_id = super().hold(term)
        entry = self._held.get(term_id)
        if entry is not None and entry[1] == 1:  # (held by this query from now)
            self.shared.hold(term_id, term)
        return term_id

    def release(self, term_id: int) -> None:
        super().release(term_id)
        self.shared.dirty.add(self)

    def collect(self) -> list[int]:
        freed = super().collect()
        if freed:
            self.shared.let_go(freed)
        return freed

    def let_go_all(self) -> None:
        """The query ends here: every term it holds is let go (freed at the next collect)."""
        for term_id, (_term, holds) in self._held.items():
            self._let_go.extend([term_id] * holds)
        if self._let_go:
            self.shared.dirty.add(self)

    def rebind(self, known: dict[int, str], shared: HeldTerms) -> None:
        """Join the loading service's dictionary (a restored checkpoint): its terms, and the terms it holds."""
        for term_id, term in self._terms.items():
            known.setdefault(term_id, term)
        self.known, self.shared = known, shared
        for term_id, (term, _holds) in self._held.items():
            shared.hold(term_id, term)
        if self._let_go:
            shared.dirty.add(self)


class Operators:
    """An operator query placed by centre, at the answers service (``cbgp.algebra.by_centre``): its leaves'
    part deltas in, its answer deltas out, rows as the fleet reports them (ASK as ``?ask`` true/false).

    Its answers before any change (VALUES rows, ASK false, an aggregate's empty group) go out once, with the
    registration's snapshot when its gate opens.  A restarted service rebuilds the operators from the part
    deltas released before (:meth:`note`), replayed as they were released: the registration's netted, then
    per seq in order."""

    def __init__(self, spec: object, known: dict[int, str], held: HeldTerms | None = None) -> None:
        from cbgp.algebra.by_centre import OperatorAssembler

        dictionary = self.dictionary = KnownTerms(known, held)
        self.assembler = OperatorAssembler(spec, dictionary)  # type: ignore[arg-type]
        self.ask = self.assembler.form == "ASK"
        self.columns = (ASK_VARIABLE,) if self.ask else tuple(self.assembler.columns)
        self.true, self.false = (dictionary.encode(ASK_TRUE),), (dictionary.encode(ASK_FALSE),)
        rows = self.assembler.initial()
        self.initial = ask_initial(rows, self.true, self.false) if self.ask else rows
        self.restored: list[tuple] = []  # (seq, src, offset, index, part, sign, row, variables), see note()

    def rebind(self, known: dict[int, str], held: HeldTerms) -> None:
        """Read and add terms in ``known`` (restored from a checkpoint: the loading service's dictionary), with
        the terms the operators had made and those they hold."""
        self.dictionary.rebind(known, held)

    def close(self) -> None:
        """Dropped (re-registered, or its partition went elsewhere): the terms it holds are let go."""
        if self.dictionary.shared is not None:
            self.dictionary.let_go_all()

    def note(self, seq: int, key: tuple, part: int, diff: int, row: tuple, variables: tuple[str, ...]) -> None:
        """A part delta released before a restart (read again by the restore, in any order)."""
        self.restored.append((seq, *key, part, diff, row, variables))

    def catch_up(self, as_of: int) -> None:
        """Apply the noted deltas: those up to the registration's ``as_of`` netted (the gate released them
        so), then per seq in release order; their answers were sent before the restart."""
        if not self.restored:
            return
        noted, self.restored = sorted(self.restored, key=lambda d: d[:4]), []
        netted: dict[tuple, int] = {}
        for seq, *_key, part, diff, row, variables in noted:
            if seq <= as_of:
                netted[(part, row, variables)] = netted.get((part, row, variables), 0) + diff
        batch = [(part, 1, row, variables) for (part, row, variables), n in netted.items() for _ in range(n)]
        if batch:
            self.assembler.apply(batch)
        later = [d for d in noted if d[0] > as_of]
        start = 0
        for end in range(1, len(later) + 1):
            if end == len(later) or later[end][0] != later[start][0]:
                self.assembler.apply([(part, diff, row, variables)
                                      for _seq, *_key, part, diff, row, variables in later[start:end]])
                start = end

    def apply(self, items: list[tuple[int, int, tuple, tuple[str, ...]]]) -> list[tuple[int, tuple]]:
        deltas = self.assembler.apply(items)
        return ask_flip(deltas, self.true, self.false) if self.ask and deltas else deltas


__all__ = ["HeldTerms", "KnownTerms", "Operators"]
