"""Operator queries placed by centre at the answers service (``services.answers.release``): the operators over their
BGP leaves' part deltas, released in seq order (``cbgp.algebra.by_centre``), with the fleet's term ids and its
way of reporting ASK.  No Kafka here."""

from __future__ import annotations

from cbgp.terms import TermDictionary
from services.worker.shard_engine import ASK_FALSE, ASK_TRUE, ASK_VARIABLE, ask_flip, ask_initial


class KnownTerms(TermDictionary):
    """The fleet's term ids (stable: every process agrees) for an operator query's expressions: a term it
    has not seen is read from ``known`` (the answers service's dictionary, which holds every id of a delta
    before the delta is released), and one it makes (a COUNT, a BIND value) is added there, so the answers
    that use it decode."""

    __slots__ = ("known",)

    def __init__(self, known: dict[int, str]) -> None:
        super().__init__(stable=True)
        self.known = known

    def __getstate__(self) -> tuple:
        # A checkpoint holds its own terms, not the service's dictionary: :meth:`Operators.rebind` gives the
        # restored operators the dictionary of the service that loads them.
        _none, slots = super().__getstate__()
        return None, {**slots, "known": {}}

    def decode(self, term_id: int) -> str:
        term = self._terms.get(term_id)
        if term is None:
            term = self.known[term_id]
            self.add(term_id, term)
        return term

    def encode(self, term: str) -> int:
        term_id = super().encode(term)
        self.known.setdefault(term_id, term)
        return term_id


class Operators:
    """An operator query placed by centre, at the answers service (``cbgp.algebra.by_centre``): its leaves'
    part deltas in, its answer deltas out, rows as the fleet reports them (ASK as ``?ask`` true/false).

    Its answers before any change (VALUES rows, ASK false, an aggregate's empty group) go out once, with the
    registration's snapshot when its gate opens.  A restarted service rebuilds the operators from the part
    deltas released before (:meth:`note`), replayed as they were released: the registration's netted, then
    per seq in order."""

    def __init__(self, spec: object, known: dict[int, str]) -> None:
        from cbgp.algebra.by_centre import OperatorAssembler

        dictionary = self.dictionary = KnownTerms(known)
        self.assembler = OperatorAssembler(spec, dictionary)  # type: ignore[arg-type]
        self.ask = self.assembler.form == "ASK"
        self.columns = (ASK_VARIABLE,) if self.ask else tuple(self.assembler.columns)
        self.true, self.false = (dictionary.encode(ASK_TRUE),), (dictionary.encode(ASK_FALSE),)
        rows = self.assembler.initial()
        self.initial = ask_initial(rows, self.true, self.false) if self.ask else rows
        self.restored: list[tuple] = []  # (seq, src, offset, index, part, sign, row, variables), see note()

    def rebind(self, known: dict[int, str]) -> None:
        """Read and add terms in ``known`` (restored from a checkpoint: the loading service's dictionary), with
        the terms the operators had made."""
        for term_id, term in self.dictionary._terms.items():
            known.setdefault(term_id, term)
        self.dictionary.known = known

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


__all__ = ["KnownTerms", "Operators"]
