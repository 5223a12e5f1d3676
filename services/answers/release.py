"""Seq-ordered, consolidated release of by-centre queries' deltas (the answers service's first step; no Kafka).

How it works: docs/design/internals.md, services.answers.release.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field, replace
from itertools import count

from typing import TYPE_CHECKING, Callable, Iterable

from cbgp.algebra.paths import closure_pairs
from cbgp.engine.assembly import Assembler, GraphAssembler, assembler_for
from services import codec
from services.codec import PartDeltaColumns
from services.wire.idempotence import ORDERED_SOURCE_BELOW, PRODUCT_SOURCE_PARTITION
from services.wire.registrations import OPERATORS_CLASS, read_query
from services.answers.release_operators import HeldTerms, Operators

if TYPE_CHECKING:
    from cbgp.algebra.continuous import OperatorTree


@dataclass
class _Gate:
    ready: dict[int, int] = field(default_factory=dict)  # routed partition -> highest as_of of its ProbeReady
    items: list = field(default_factory=list)  # (offset, deltas, i) held until the gate opens
    marks: list[int] = field(default_factory=list)  # deltas.parts offsets of its ProbeReady records (commit pins)


@dataclass
class _Partition:
    frontiers: dict[int, int] = field(default_factory=dict)  # routed partition -> highest completed seq
    applied: dict[int, int] = field(default_factory=dict)  # routed partition -> highest applied seq (>= completed)
    released_end: int = 0  # restart: deltas of records before this offset with seq <= released_seq (a probed
    released_seq: int = -1  # query's; released_applied for the others) were released before the restart:
    released_applied: int = -1  # skipped when read again
    counts: dict[tuple[str, int], dict[tuple[int, ...], int]] = field(default_factory=dict)  # DISTINCT rows
    # Held deltas, (seq, source partition, source offset, index, tie, record, i): probed queries' (released at
    # the lowest completed frontier) and the others' (at the lowest applied frontier, often well before)
    heap: list = field(default_factory=list)
    fast: list = field(default_factory=list)
    # deltas.parts offset -> [deltas still held, frontiers before that record, origin ms]
    records: dict[int, list] = field(default_factory=dict)
    gates: dict[tuple[str, int], _Gate] = field(default_factory=dict)  # gated registrations not released yet
    # (as_of, query, version) of the gates every routed partition marked ready, lowest first: the ones the
    # frontiers may open (an entry whose gate opened, or whose as_of a later mark raised, is stale and skipped)
    ready_gates: list = field(default_factory=list)
    # products' assemblers, operator queries' operators
    assemblers: dict[tuple[str, int], Assembler | GraphAssembler | Operators] = field(default_factory=dict)
    # gated registrations released -> the seq their snapshot is as of
    opened: dict[tuple[str, int], int] = field(default_factory=dict)
    # The opened ones the commit metadata names: those a restore cannot tell from their plan's position
    # (SeqRelease.note_plan), a few, not one per registration (a Kafka broker keeps 4 KB of metadata at most)
    listed: dict[tuple[str, int], None] = field(default_factory=dict)
    # plans partition -> (offset, query, version) of the gated registrations of this partition not open yet, lowest
    # first (an entry that opened or ended meanwhile is dropped when it surfaces)
    pending: dict[int, list[tuple[int, str, int]]] = field(default_factory=dict)
    # Idempotence keys of the released deltas that the release counts, nets or multiplies (a product's parts,
    # DISTINCT rows, a gate's): a copy made by two workers that both held a routed partition for a moment
    # during a rebalance is released once.  (Plain deltas' repeated keys are dropped by the answers core.)
    released_keys: dict[tuple, None] = field(default_factory=dict)  # insertion-ordered: the oldest go first
    # Restored from a checkpoint: its commit (read position, watermark, opened gates), whose releases the
    # checkpoint's counts already hold
    checkpointed: _Partition | None = None


RELEASED_KEYS_KEPT = 200_000  # recent released delta keys remembered per partition (~40 MB at most)

Released = tuple[int, "int | None", PartDeltaColumns]  # (deltas.parts offset, origin ms, deltas)


class SeqRelease:
    """Holding, ordering and DISTINCT consolidation of the deltas of every held deltas.parts partition."""

    def __init__(self, routed_partitions: int, query_text: Callable[[str, int], str | None] | None = None,
                 terms: dict[int, str] | None = None,
                 query_class: Callable[[str, int], str | None] | None = None,
                 held: HeldTerms | None = None) -> None:
        """``query_text(query_id, version)``: a registration's query (what a product's assembler needs), None
        when unknown (its part deltas are then dropped as an unregistered query's).  ``terms``: the answers
        service's dictionary (id -> term), which an operator query's expressions read and its computed values
        are added to.  ``query_class(query_id, version)``: its plan's class, None when unknown; a registration
        known not to be an operator query is not parsed when its gate opens."""
        self.n_routed = routed_partitions
        self.partitions: dict[int, _Partition] = {}
        # queries.plans as read (note_plan): query id -> (version, deltas.parts partition, plans partition,
        # offset, whether the workers gate it), and the next offset to read of each plans partition
        self.plan_at: dict[str, tuple[int, int, int, int, bool]] = {}
        self.plans_read: dict[int, int] = {}
        self.ended: dict[str, int] = {}  # query id -> the highest version unregistered
        self._tie = count()
        self.query_text = query_text
        self.query_class = query_class
        self.terms: dict[int, str] = {} if terms is None else terms
        self.held_terms = HeldTerms(self.terms) if held is None else held  # (what operator queries compute, held)

    # -- partitions

    def restore(self, partition: int, metadata: str | None, keep_counts: bool = False,
                saved: dict | None = None) -> int:
        """Start (or restart) a partition at its committed offset with the frontiers and read position
        committed beside it; return that read position (``end``): the caller feeds the records before it to
        :meth:`restore_counts` unless ``keep_counts`` (this instance already holds the counts and assemblers it
        committed).  ``saved``: a :meth:`checkpoint` of this partition, whose released state is taken; the
        caller then feeds only the records from the checkpoint's committed offset to ``end`` (every record
        before it was released whole, or dropped, when it was taken: the commit never passes a held delta),
        and what the checkpoint had already released of them is not counted again."""
        old = self.partitions.get(partition)
        state = self.partitions[partition] = self._committed(metadata, partition)
        known_as_of: dict[tuple[str, int], int] = {}  # (the as_of of gates the metadata leaves to the plans' order)
        if keep_counts and old is not None:  # DISTINCT counts and product assemblers both are released state
            state.counts, state.assemblers = old.counts, old.assemblers
            state.released_keys = old.released_keys
            known_as_of = old.opened
        elif saved is not None:
            state.counts, state.assemblers = saved["counts"], saved["assemblers"]
            state.released_keys = saved["released_keys"]
            state.checkpointed = self._committed(saved["metadata"], partition)
            known_as_of = saved.get("opened", {})
            for assembler in state.assemblers.values():
                if isinstance(assembler, Operators):
                    assembler.rebind(self.terms, self.held_terms)
        for key, as_of in state.opened.items():
            if as_of == -1 and key in known_as_of:
                state.opened[key] = known_as_of[key]
        if old is not None and old.assemblers is not state.assemblers:
            kept = {id(assembler) for assembler in state.assemblers.values()}
            self._close(a for a in old.assemblers.values() if id(a) not in kept)
        self._forget_ended(state)
        return state.released_end

    def _committed(self, metadata: str | None, partition: int) -> _Partition:
        """A partition state with the frontiers, read position and opened gates of commit ``metadata``: those it
        names, and every gated registration of ``partition`` below its ``below`` offsets of queries.plans (as of
        unknown, -1)."""
        state = _Partition()
        below: dict[int, int] = {}
        try:
            stored = json.loads(metadata or "{}")
            state.frontiers = {int(p): int(s) for p, s in stored.get("frontiers", {}).items()}
            # (only where it is ahead of the completed frontier; none in metadata committed before it was kept)
            state.applied = {**state.frontiers, **{int(p): int(s) for p, s in stored.get("applied", {}).items()}}
            state.released_end = int(stored.get("end", 0))
            # ([query, version, as_of]; [query, version] as committed before as_of was kept: as of unknown)
            state.opened = {(entry[0], int(entry[1])): int(entry[2]) if len(entry) > 2 else -1
                            for entry in stored.get("opened", [])}
            below = {int(p): int(offset) for p, offset in stored.get("below", {}).items()}
        except (ValueError, AttributeError, TypeError, IndexError):
            state.frontiers, state.applied, state.released_end, state.opened, below = {}, {}, 0, {}, {}
        state.listed = dict.fromkeys(state.opened)
        for query_id, (version, part, plans_partition, offset, gated) in self.plan_at.items():
            if part != partition or not gated:
                continue
            if offset < below.get(plans_partition, -1):
                state.opened.setdefault((query_id, version), -1)
            elif (query_id, version) not in state.opened:
                state.pending.setdefault(plans_partition, []).append((offset, query_id, version))
        for heap in state.pending.values():
            heapq.heapify(heap)
        state.released_seq = self._lowest(state.frontiers)
        state.released_applied = max(state.released_seq, self._lowest(state.applied))
        return state

    def checkpoint(self, partition: int, metadata: str) -> dict:
        """The released state of ``partition`` (DISTINCT counts, assemblers and operators, released keys) just
        after a commit with ``metadata``: what :meth:`restore_counts` rebuilds from the records before its
        read position.  Pickled by the caller; it shares objects with the live state."""
        state = self.partitions[partition]
        return {"metadata": metadata, "counts": state.counts, "assemblers": state.assemblers,
                "released_keys": state.released_keys, "opened": dict(state.opened)}

    def drop(self, partition: int) -> None:
        state = self.partitions.pop(partition, None)
        if state is not None:
            self._close(state.assemblers.values())

    @staticmethod
    def _close(assemblers: Iterable) -> None:
        """Operators dropped: the terms they held are let go."""
        for assembler in assemblers:
            if isinstance(assembler, Operators):
                assembler.close()

    @staticmethod
    def _released_before(state: _Partition, offset: int, deltas: PartDeltaColumns) -> list[int]:
        """Which deltas of a record read again after a restart were released before it: those of records
        before the committed read position with seq up to the committed watermark -- except a gated
        registration's while its gate was still shut (nothing of it was released)."""
        if offset >= state.released_end or (deltas.gated and (deltas.query_id, deltas.version) not in state.opened):
            return []
        limit = state.released_seq if deltas.probed else state.released_applied
        return [i for i in range(len(deltas)) if deltas.seq[i] <= limit]

    def restore_counts(self, partition: int, offset: int, deltas: PartDeltaColumns) -> None:
        """Count the released rows of a DISTINCT batch read before the committed read position, or fold a
        product's released part deltas into its assembler (restore)."""
        state = self.partitions[partition]
        if not deltas.source_partition or min(deltas.source_partition) < ORDERED_SOURCE_BELOW:
            return
        if deltas.part < 0 and not deltas.distinct:
            return  # plain deltas: nothing of them is kept
        released = self._released_before(state, offset, deltas)
        if released and state.checkpointed is not None:
            before = set(self._released_before(state.checkpointed, offset, deltas))
            released = [i for i in released if i not in before]
        released = _first_release(state, deltas, released) if released else []  # two owners' copies: once
        if not released:
            return
        if deltas.part < 0:
            self._consolidate(state, _pick(deltas, released))
            return
        assembler = self._assembler(state, deltas)
        if assembler is not None:
            k = len(deltas.variables)
            if isinstance(assembler, Operators):
                variables = tuple(deltas.variables)
                for i in released:
                    assembler.note(deltas.seq[i], (deltas.source_partition[i], deltas.source_offset[i],
                                                   deltas.index[i]), deltas.part,
                                   deltas.diff[i],
                                   tuple(deltas.values[i * k:(i + 1) * k]), variables)
                return
            for i in released:
                assembler.absorb(deltas.part, deltas.diff[i],
                                 tuple(deltas.values[i * k:(i + 1) * k]))

    def commit_position(self, partition: int, next_offset: int) -> tuple[int, str]:
        """The offset to commit for ``partition`` (processed up to ``next_offset``) and its metadata."""
        state = self.partitions[partition]
        end = max(next_offset, state.released_end)
        stored: dict = {"frontiers": state.frontiers, "end": end}
        ahead = {p: seq for p, seq in state.applied.items() if seq > state.frontiers.get(p, -1)}
        if ahead:
            stored["applied"] = ahead
        if self.plans_read:
            below = self._below(partition, state)
            stored["below"] = {str(p): offset for p, offset in sorted(below.items())}
            state.listed = dict.fromkeys(key for key in state.listed
                                         if not self._derivable(key, partition, below) and not self._dead(key))
        if state.listed:
            stored["opened"] = sorted([q, v, state.opened.get((q, v), -1)] for q, v in state.listed)
        pins = [min(state.records)] if state.records else []
        pins += [offset for gate in state.gates.values() for offset in gate.marks]
        return (min(pins) if pins else next_offset), json.dumps(stored, separators=(",", ":"))

    # -- registrations

    def note_plan(self, query_id: str, version: int | None, part: int, plans_partition: int, offset: int,
                  gated: bool = True, ended: int | None = None) -> None:
        """One queries.plans record read at ``offset`` of ``plans_partition``: registration ``version`` of
        ``query_id``, whose deltas are on deltas.parts partition ``part`` (``gated``: the workers gate it; false
        only when its plan says they do not: windowed, or placed on a single owner), or (``version`` None) its
        tombstone, which ends ``ended`` (else the version known).

        The commit metadata then names only the opened gates a restore cannot tell from the plans' order: the
        rest are below its ``below`` offsets, under the lowest gated registration not opened yet.  What this
        release keeps of a registration the record ends goes with it (:meth:`_forget`)."""
        known = self.plan_at.get(query_id)
        if version is None:
            self.plan_at.pop(query_id, None)
            last = ended if ended is not None else known[0] if known is not None else None
            if last is not None:
                self.ended[query_id] = max(last, self.ended.get(query_id, 0))
                self._forget(part, (query_id, last))
            return
        if known is not None and known[0] > version:
            return
        if known is not None and known[0] < version:
            self._forget(known[1], (query_id, known[0]))
        self.plan_at[query_id] = (version, part, plans_partition, offset, gated)
        state = self.partitions.get(part)
        if gated and state is not None and (query_id, version) not in state.opened:
            heapq.heappush(state.pending.setdefault(plans_partition, []), (offset, query_id, version))

    def _forget(self, partition: int, key: tuple[str, int]) -> None:
        """Registration ``key`` has ended: its operators or product assembler, DISTINCT counts, gate (and the
        deltas it held) and opened mark go; its deltas still in flight are dropped as an ended registration's
        (the answers core drops them too).  Kept, an unregistered query's whole state stayed for good."""
        state = self.partitions.get(partition)
        if state is not None:
            self._drop_key(state, key)

    def _forget_ended(self, state: _Partition) -> None:
        """After a restore: what a checkpoint or the state kept holds of registrations ended meanwhile goes."""
        for key in [key for key in {**state.assemblers, **state.counts} if self._dead(key)]:
            self._drop_key(state, key)

    def _drop_key(self, state: _Partition, key: tuple[str, int]) -> None:
        assembler = state.assemblers.pop(key, None)
        if assembler is not None:
            self._close([assembler])
        state.counts.pop(key, None)
        state.opened.pop(key, None)
        state.listed.pop(key, None)
        gate = state.gates.pop(key, None)
        for offset, _deltas, _i in gate.items if gate is not None else ():
            self._done(state, offset)

    def _below(self, partition: int, state: _Partition) -> dict[int, int]:
        """Per plans partition read, an offset below which every gated registration of ``partition`` this
        service has read is open: the lowest one not open yet, else the next offset to read."""
        below = {}
        for plans_partition, read in self.plans_read.items():
            heap = state.pending.get(plans_partition)
            while heap:
                offset, query_id, version = heap[0]
                known = self.plan_at.get(query_id)
                if known is not None and known[0] == version and known[3] == offset and \
                        (query_id, version) not in state.opened:
                    break
                heapq.heappop(heap)
            below[plans_partition] = min(read, heap[0][0]) if heap else read
        return below

    def _derivable(self, key: tuple[str, int], partition: int, below: dict[int, int]) -> bool:
        """Whether a restore with ``below`` finds ``key`` open from its plan alone."""
        known = self.plan_at.get(key[0])
        return (known is not None and known[0] == key[1] and known[1] == partition and known[4]
                and known[3] < below.get(known[2], -1))

    def _dead(self, key: tuple[str, int]) -> bool:
        """A registration queries.plans has ended: registered again with a newer version, or unregistered."""
        known = self.plan_at.get(key[0])
        return known[0] > key[1] if known is not None else key[1] <= self.ended.get(key[0], -1)

    def stopped(self) -> list[tuple[str, int, str]]:
        """The operator queries that stopped (``OperatorTree.failed``): (query id, version, why)."""
        return [(key[0], key[1], assembler.assembler.tree.failed) for state in self.partitions.values()
                for key, assembler in state.assemblers.items()
                if isinstance(assembler, Operators) and assembler.assembler.tree.failed is not None]

    def path_trees(self) -> list[tuple[str, OperatorTree, int]]:
        """(query id, operator tree, pairs) of each by-centre operator query with property-path closures here."""
        found = []
        for state in self.partitions.values():
            for (query_id, _version), assembler in state.assemblers.items():
                if isinstance(assembler, Operators):
                    tree = assembler.assembler.tree
                    pairs = closure_pairs(tree.root)
                    if pairs is not None:
                        found.append((query_id, tree, pairs))
        return found

    def held(self) -> int:
        return sum(len(state.heap) + len(state.fast) + sum(len(g.items) for g in state.gates.values())
                   for state in self.partitions.values())

    def frontiers_seen(self) -> dict[int, int]:
        """Each routed partition's completed frontier, the lowest over the held deltas.parts partitions (-1: none
        seen yet): the one that stops moving while deltas are held is where a stalled stream stopped."""
        return {routed: min((state.frontiers.get(routed, -1) for state in self.partitions.values()), default=-1)
                for routed in range(self.n_routed)}

    def gates_waiting(self) -> dict[int, int]:
        """For each routed partition, the gated registrations still waiting for its ProbeReady mark: one that
        stays above 0 names the partition whose share of a registration never came."""
        waiting = dict.fromkeys(range(self.n_routed), 0)
        for state in self.partitions.values():
            for gate in state.gates.values():  # (none, but while registrations are being taken)
                if len(gate.ready) < self.n_routed:
                    for routed in range(self.n_routed):
                        waiting[routed] += routed not in gate.ready
        return waiting

    def watermark(self, partition: int) -> int:
        """The highest seq every routed partition has completed, as seen on this deltas.parts partition."""
        return self._lowest(self.partitions[partition].frontiers)

    def applied_watermark(self, partition: int) -> int:
        """The highest seq every routed partition has applied, as seen on this deltas.parts partition."""
        return self._lowest(self.partitions[partition].applied)

    def _lowest(self, frontiers: dict[int, int]) -> int:
        return min((frontiers.get(p, -1) for p in range(self.n_routed)), default=-1)

    # -- records

    def on_record(self, partition: int, offset: int, value: bytes, origin: int | None = None,
                  deltas: PartDeltaColumns | None = None) -> list[Released]:
        """One deltas.parts record, whichever it is (``deltas``: its PartDeltaColumns, if already decoded): a
        ProbeReady mark, a Frontier record or a batch of deltas.  Raises :class:`codec.CodecError` (what is wrong,
        in one line) when it is none of these or does not decode: the caller dead-letters it, nothing moved."""
        if deltas is not None:
            return self.on_deltas(partition, offset, origin, deltas)
        mark = codec.probe_ready_of(value)
        if mark is not None:  # a routed partition's share of a probed registration is in
            return self.on_ready(partition, offset, mark["query_id"], mark["version"], mark["partition"],
                                 mark["as_of"])
        frontier = codec.frontiers_of(value)
        if frontier is not None:
            return self.on_frontier(partition, *frontier)
        return self.on_deltas(partition, offset, origin, codec.part_delta_columns(value))

    def on_frontier(self, partition: int, frontiers: dict[int, int],
                    applied: dict[int, int] | None = None) -> list[Released]:
        """A Frontier record: raise the completed and applied frontiers it names (applied: as completed when it
        has none) and release what they allow."""
        state = self.partitions[partition]
        for routed, seq in frontiers.items():
            if seq > state.frontiers.get(routed, -1):
                state.frontiers[routed] = seq
        for routed, seq in (frontiers if applied is None else applied).items():
            if seq > state.applied.get(routed, -1):
                state.applied[routed] = seq
        return self._release(partition)

    def on_ready(self, partition: int, offset: int, query_id: str, version: int, routed: int,
                 as_of: int) -> list[Released]:
        """A ProbeReady record: routed partition ``routed`` has sent all of its share of the registration."""
        state = self.partitions[partition]
        key = (query_id, version)
        if self._dead(key):
            return self._release(partition)  # an ended registration's: its gate would never be read
        if key not in state.opened:
            gate = state.gates.setdefault(key, _Gate())
            gate.ready[routed] = max(as_of, gate.ready.get(routed, -1))  # two owners: the later snapshot
            gate.marks.append(offset)
            if len(gate.ready) >= self.n_routed:
                heapq.heappush(state.ready_gates, (max(gate.ready.values()), *key))
        return self._release(partition)

    def on_deltas(self, partition: int, offset: int, origin: int | None, deltas: PartDeltaColumns) -> list[Released]:
        """A batch of deltas: an ordered source's pass straight through; a by-centre query's are held."""
        if not deltas.source_partition or max(deltas.source_partition) < ORDERED_SOURCE_BELOW:
            return [(offset, origin, deltas)]
        state = self.partitions[partition]
        released = self._released_before(state, offset, deltas)  # read again after a restart: those are done
        if released:
            done = set(released)
            deltas = _pick(deltas, [i for i in range(len(deltas)) if i not in done])
            if not len(deltas):
                return self._release(partition)
        key = (deltas.query_id, deltas.version)
        if deltas.gated and key not in state.opened and key not in state.gates and self._dead(key):
            return self._release(partition)  # an ended registration's, read again: the answers core drops them too
        as_of = state.opened.get(key, -1) if deltas.gated else -1
        if as_of >= 0 and min(deltas.seq) <= as_of:
            # Its gate opened once every partition's frontier had passed as_of, so a registration's delta up to
            # as_of that comes now is a second owner's copy of one the gate already netted: dropped.
            deltas = _pick(deltas, [i for i in range(len(deltas)) if deltas.seq[i] > as_of])
            if not len(deltas):
                return self._release(partition)
        state.records[offset] = [len(deltas), origin]
        if deltas.gated and key not in state.opened:
            state.gates.setdefault(key, _Gate()).items.extend((offset, deltas, i) for i in range(len(deltas)))
            return self._release(partition)
        heap = state.heap if deltas.probed else state.fast
        for i in range(len(deltas)):
            heapq.heappush(heap, (deltas.seq[i], deltas.source_partition[i], deltas.source_offset[i],
                                  deltas.index[i], next(self._tie), offset, deltas, i))
        return self._release(partition)

    def _open(self, state: _Partition, limit: int) -> list[Released]:
        """Release the gates whose partitions are all ready and whose as_of the frontiers have passed."""
        out: list[Released] = []
        ready = state.ready_gates
        while ready and ready[0][0] <= limit:
            as_of, query_id, version = heapq.heappop(ready)
            key = (query_id, version)
            gate = state.gates.get(key)
            if gate is None or max(gate.ready.values()) != as_of:
                continue  # opened already, or a later mark raised its as_of (its own entry comes later)
            upto = as_of
            del state.gates[key]
            state.opened[key] = upto
            state.listed[key] = None
            # a bundle's origin: its earliest record's (the answers' latency counts from the oldest change in it)
            origins = {offset: state.records[offset][1] for offset, _d, _i in gate.items if offset in state.records}
            # The items up to as_of are netted here, a repeated key (two owners' copies) once; later ones join
            # the heap (where a product's or DISTINCT query's repeated keys are dropped too).
            repeated = {id(item) for item in gate.items
                        if item[1].seq[item[2]] <= upto and not _first_release(state, item[1], [item[2]])}
            if repeated:
                for item in gate.items:
                    if id(item) in repeated:
                        self._done(state, item[0])
                gate.items = [item for item in gate.items if id(item) not in repeated]
            # The deltas up to as_of, netted per stream (a product's parts are streams of their own): per
            # row its count of + deltas, the rest cancel.
            by_row: dict[tuple, dict[tuple, list]] = {}
            later = []
            for offset, deltas, i in gate.items:
                if deltas.seq[i] > upto:
                    later.append((offset, deltas, i))
                    continue
                k = len(deltas.variables)
                row = tuple(deltas.values[i * k:(i + 1) * k])
                entry = by_row.setdefault((deltas.part, tuple(deltas.variables)), {}).setdefault(row, [0, []])
                entry[0] += deltas.diff[i]
                if deltas.diff[i] > 0:
                    entry[1].append((deltas.source_partition[i], deltas.source_offset[i], deltas.index[i],
                                     offset, deltas, i))
            for offset, deltas, i in gate.items:
                self._done(state, offset)
            bundles: list[Released] = []
            for _stream, rows in sorted(by_row.items()):
                kept = sorted(item for count, pluses in rows.values() for item in pluses[:max(count, 0)])
                if not kept:
                    continue
                template = kept[0][4]
                bundle = _gather(template, [(deltas, i) for *_key, _offset, deltas, i in kept])
                bundle = replace(bundle, seq=[upto] * len(bundle), snapshot=[True] * len(bundle))
                if bundle.distinct:
                    bundle = replace(_pick(bundle, self._consolidate(state, bundle)), distinct=False)
                if len(bundle):
                    times = [origins[item[3]] for item in kept if origins.get(item[3]) is not None]
                    bundles.append((kept[0][3], min(times) if times else None, bundle))
            operators = self._operators_of(state, key)
            if operators is None:
                out.extend(bundles)
            else:  # the registration's answers: its operators' first rows and the leaves' snapshot through them
                operators.catch_up(upto)
                items = [(deltas.part, 1, tuple(deltas.values[i * len(deltas.variables):
                                                              (i + 1) * len(deltas.variables)]),
                          tuple(deltas.variables)) for _o, _origin, deltas in bundles for i in range(len(deltas))]
                answers, operators.initial = _net(operators.initial + operators.apply(items)), []
                times = [origin for _o, origin, _d in bundles if origin is not None]
                offset = min((o for o, _origin, _d in bundles), default=min(gate.marks, default=0))
                out.extend(_answer_batches(key[0], key[1], operators.columns, answers, upto, offset,
                                           min(times) if times else None, True))
            for offset, deltas, i in later:
                state.records.setdefault(offset, [0, origins.get(offset)])[0] += 1
                heapq.heappush(state.heap if deltas.probed else state.fast,
                               (deltas.seq[i], deltas.source_partition[i], deltas.source_offset[i], deltas.index[i],
                                next(self._tie), offset, deltas, i))
        return out

    @staticmethod
    def _done(state: _Partition, offset: int) -> None:
        record = state.records.get(offset)
        if record is not None:
            record[0] -= 1
            if record[0] <= 0:
                del state.records[offset]

    def _release(self, partition: int) -> list[Released]:
        """Release the held deltas the frontiers allow: a probed query's up to the lowest completed frontier, the
        others' up to the lowest applied one (each query's own deltas stay in seq order: they are all in one
        heap); a gate opens once every partition completed past its as_of."""
        state = self.partitions[partition]
        limit = self.watermark(partition)
        opened = self._open(state, limit) if state.ready_gates else []
        groups: list[tuple[int, int | None, PartDeltaColumns, list[tuple[PartDeltaColumns, int]]]] = []
        for heap, upto in ((state.heap, limit), (state.fast, self.applied_watermark(partition))):
            while heap and heap[0][0] <= upto:
                *_key, offset, deltas, i = heapq.heappop(heap)
                record = state.records[offset]
                record[0] -= 1
                if record[0] == 0:
                    del state.records[offset]
                if (deltas.part >= 0 or deltas.distinct) and not _first_release(state, deltas, [i]):
                    continue
                if groups and _same_stream(groups[-1][2], deltas):
                    groups[-1][3].append((deltas, i))
                else:
                    groups.append((offset, record[1], deltas, [(deltas, i)]))
        out: list[Released] = []
        for offset, origin, deltas, items in groups:
            picked = _gather(deltas, items)
            if picked.distinct:  # the counted rows go on as plain deltas: the transitions only
                picked = replace(_pick(picked, self._consolidate(state, picked)), distinct=False)
                if not len(picked):
                    continue
            out.append((offset, origin, picked))
        out = opened + out
        if any(deltas.part >= 0 for _o, _origin, deltas in out):
            out = self._multiply(state, out)
        return out

    def _operators_of(self, state: _Partition, key: tuple[str, int]) -> Operators | None:
        """The operators of ``key`` if it is an operator query placed by centre (else None)."""
        if key not in state.assemblers and self.query_class is not None:
            known = self.query_class(*key)
            if known is not None and known != OPERATORS_CLASS:
                return None  # a BGP: no text to parse (the first parse in a process takes a third of a second)
        found = self._assembler_of(state, key, operators_only=True)
        return found if isinstance(found, Operators) else None

    def _assembler(self, state: _Partition, deltas: PartDeltaColumns) -> Assembler | GraphAssembler | Operators | None:
        return self._assembler_of(state, (deltas.query_id, deltas.version))

    def _assembler_of(self, state: _Partition, key: tuple[str, int],
                      operators_only: bool = False) -> Assembler | GraphAssembler | Operators | None:
        """A product's assembler, or an operator query's operators (``Operators``), made from its text
        (``operators_only``: none is made for a BGP query)."""
        assembler = state.assemblers.get(key)
        if assembler is None:
            text = self.query_text(*key) if self.query_text is not None else None
            if text is None:
                return None
            parsed, operators = read_query(text, None)
            if operators is None and operators_only:
                return None
            for stale in [k for k in state.assemblers if k[0] == key[0] and k[1] < key[1]]:
                self._close([state.assemblers.pop(stale)])  # a re-registration starts from nothing
            assembler = state.assemblers[key] = (assembler_for(parsed) if operators is None
                                                 else Operators(operators, self.terms, self.held_terms))
        return assembler

    def _multiply(self, state: _Partition, released: list[Released]) -> list[Released]:
        """Replace a by-centre product's released part deltas (in seq order) by its answer deltas: one
        Assembler.apply per update."""
        out: list[Released] = []
        pending: dict[tuple[str, int], tuple[int, list, int, int | None, PartDeltaColumns]] = {}

        def flush(key: tuple[str, int]) -> None:
            seq, items, offset, origin, template = pending.pop(key)
            assembler = self._assembler(state, template)
            if assembler is None:
                return  # unregistered: dropped, as the answers service drops a stale stream
            if isinstance(assembler, Operators):
                assembler.catch_up(state.opened.get(key, -1))
                answers = assembler.apply(items)
            else:
                answers = assembler.apply([item[:3] for item in items])
            out.extend(_answer_batches(template.query_id, template.version, assembler.columns, answers, seq,
                                       offset, origin, False))

        for offset, origin, deltas in released:
            if deltas.part < 0:
                out.append((offset, origin, deltas))
                continue
            key = (deltas.query_id, deltas.version)
            k = len(deltas.variables)
            variables = tuple(deltas.variables)
            for i in range(len(deltas)):
                seq = deltas.seq[i]
                if key in pending and pending[key][0] != seq:
                    flush(key)
                if key not in pending:
                    pending[key] = (seq, [], offset, origin, deltas)
                pending[key][1].append((deltas.part, deltas.diff[i],
                                        tuple(deltas.values[i * k:(i + 1) * k]), variables))
        for key in list(pending):
            flush(key)
        return out

    @staticmethod
    def _consolidate(state: _Partition, deltas: PartDeltaColumns) -> list[int]:
        """DISTINCT over multiset rows: count them, and return the deltas whose row's count crossed 0 <-> 1."""
        key = (deltas.query_id, deltas.version)
        counts = state.counts.get(key)
        if counts is None:
            for stale in [k for k in state.counts if k[0] == deltas.query_id and k[1] < deltas.version]:
                del state.counts[stale]  # a re-registration starts from nothing
            counts = state.counts[key] = {}
        k = len(deltas.variables)
        kept: list[int] = []
        for i in range(len(deltas)):
            row = tuple(deltas.values[i * k:(i + 1) * k])
            before = counts.get(row, 0)
            after = before + deltas.diff[i]
            if after:
                counts[row] = after
            else:
                counts.pop(row, None)
            if (before == 0 and after == 1) or (before == 1 and after == 0):
                kept.append(i)
        return kept


def _net(deltas: list[tuple[int, tuple]]) -> list[tuple[int, tuple]]:
    """Deltas netted per row, ``-`` rows first."""
    total: dict[tuple, int] = {}
    for diff, row in deltas:
        total[row] = total.get(row, 0) + diff
    return ([(-1, row) for row, n in total.items() for _ in range(-n)]
            + [(1, row) for row, n in total.items() for _ in range(n)])


def _answer_batches(query_id: str, version: int, columns: tuple[str, ...] | list[str],
                    answers: list[tuple[int, tuple]], seq: int, offset: int, origin: int | None,
                    snapshot: bool) -> list[Released]:
    """A product's or an operator query's answer deltas of one seq as released batches, numbered 0, 1, ...
    within the seq (their idempotence keys); a row with unbound variables (None: OPTIONAL) goes in a batch of
    the variables it binds."""
    out: list[Released] = []
    index = 0
    start = 0
    while start < len(answers):
        bound = tuple(v is not None for v in answers[start][1])
        end = start + 1
        while end < len(answers) and tuple(v is not None for v in answers[end][1]) == bound:
            end += 1
        run = answers[start:end]
        n = len(run)
        keep = [j for j, is_bound in enumerate(bound) if is_bound]
        values = [row[j] for _diff, row in run for j in keep]
        out.append((offset, origin, PartDeltaColumns(
            query_id, -1, [columns[j] for j in keep], [seq] * n,
            [diff for diff, _row in run], values,
            [PRODUCT_SOURCE_PARTITION] * n, [seq] * n, list(range(index, index + n)), [snapshot] * n,
            [None] * n, version)))
        index += n
        start = end
    return out


def _first_release(state: _Partition, deltas: PartDeltaColumns, indices: list[int]) -> list[int]:
    """Those of ``indices`` whose idempotence key was not released before; they are now."""
    seen = state.released_keys
    fresh = []
    for i in indices:
        key = (deltas.query_id, deltas.version, deltas.part, deltas.source_partition[i], deltas.seq[i],
               deltas.source_offset[i], deltas.index[i])
        if key not in seen:
            seen[key] = None
            fresh.append(i)
    while len(seen) > RELEASED_KEYS_KEPT:
        del seen[next(iter(seen))]
    return fresh


def _same_stream(a: PartDeltaColumns, b: PartDeltaColumns) -> bool:
    return (a is b or (a.query_id == b.query_id and a.variables == b.variables and a.version == b.version
                       and a.distinct == b.distinct and a.part == b.part and a.gated == b.gated
                       and a.probed == b.probed))


def _pick(deltas: PartDeltaColumns, indices: list[int]) -> PartDeltaColumns:
    """The deltas at ``indices`` of one batch."""
    return _gather(deltas, [(deltas, i) for i in indices])


def _gather(template: PartDeltaColumns, items: list[tuple[PartDeltaColumns, int]]) -> PartDeltaColumns:
    """One batch of the deltas ``items`` (batch, index), all of ``template``'s stream (``_same_stream``)."""
    k = len(template.variables)
    seq, diff, src, offset, index, snapshot, event_time, values = [], [], [], [], [], [], [], []
    for source, i in items:
        seq.append(source.seq[i])
        diff.append(source.diff[i])
        src.append(source.source_partition[i])
        offset.append(source.source_offset[i])
        index.append(source.index[i])
        snapshot.append(source.snapshot[i])
        event_time.append(source.event_time_ms[i])
        values.extend(source.values[i * k:(i + 1) * k])
    return PartDeltaColumns(template.query_id, template.part, template.variables, seq, diff, values, src, offset,
                            index, snapshot, event_time, template.version, template.distinct, template.gated,
                            template.probed)
