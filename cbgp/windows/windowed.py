"""Event-time windows for continuous BGP queries (RSP-QL style), exact and incremental.

How it works: docs/design/internals.md, cbgp.windows.windowed.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace

from cbgp.query.plan import decompose
from cbgp.windows.rspql import check_event_query
from cbgp.query.sparql import ParsedQuery, is_var
from cbgp.terms import DEFAULT_GRAPH_ID, TermDictionary
from cbgp.windows.contents import Event, Record, WakeQueue
# The spec and the parser are re-exported: callers keep importing them from cbgp.windows.windowed.
from cbgp.windows.spec import WindowError, WindowSpec

STATE_FORMAT = 1

_QUERY = "q"  # the one query name inside our engines
_ANY_NAMED = -1  # graph slot of a `GRAPH ?g` pattern: any named graph (term ids are > 0, default graph 0)
_UNKNOWN_GRAPH = -2  # a graph no pattern names: only `GRAPH ?g` reads it
# A background graph (a SERVICE clause's local view, ``cbgp.background.view_graphs``) is not windowed: its quads are
# in the content from their ADD to their DEL, as if the range were endless.
BACKGROUND_RANGE = 1 << 62


# --- evaluation --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowReport:
    instant_ms: int
    deltas: list[tuple[int, tuple[int, ...]]]  # (sign, row): the change of the answers since the last report


class WindowedQuery:
    """A query evaluated over event-time windows; see the module docstring.

    A BGP runs on the BGP engine; a query with operators (FILTER, OPTIONAL, UNION, aggregates, ASK, ...:
    ``cbgp.algebra``) on the same engine under its operators, maintained incrementally as the window's
    content changes, so an instant's report is still the exact difference of the answers over C(tau).  Answers
    a query has over no data (an aggregate's 0) are in the first report of a time window; a per-event window
    refuses such a query (it would answer for every event, also those with none of its triples)."""

    def __init__(self, sparql: str, spec: WindowSpec, dictionary: TermDictionary | None = None) -> None:
        if not isinstance(spec, WindowSpec):
            raise TypeError(f"spec must be a WindowSpec, not {type(spec).__name__}")
        self.sparql = sparql
        self.spec = spec
        self.dictionary = dictionary if dictionary is not None else TermDictionary(stable=True)
        from cbgp.algebra import ContinuousEngine, analyse  # (rdflib: imported by those that evaluate windows)

        self.query = analyse(sparql)  # (cached: restarts and per-key evaluators reuse it)
        self._event_model = spec.kind == "event"
        self._plan: object = decompose(self.query) if isinstance(self.query, ParsedQuery) else self.query
        self._engine = ContinuousEngine(dictionary=self.dictionary)  # time windows: holds C(last_instant)
        # the answers over an empty window, owed to the first report (none for a BGP)
        self._initial: Counter = Counter()
        for _name, diff, row in self._engine.register(_QUERY, self._plan):
            self._initial[row] += diff
        patterns, any_predicate = self._patterns()
        self.patterns = tuple(patterns)  # the triple patterns it reads (a variable-predicate BGP's: graph only)
        if self._event_model:
            check_event_query(SimpleNamespace(patterns=patterns, text=sparql))
            if self._initial:  # (only the events holding triples it reads are seen; the others would answer too)
                raise WindowError("a query with answers over no triples (an aggregate without GROUP BY, say) "
                                  "cannot run in a per-event window: use a time window")
        from cbgp.background.view_graphs import VIEW_PREFIX

        encode = self.dictionary.encode
        # the graphs of SERVICE views the query reads: background data, not windowed (see BACKGROUND_RANGE)
        self._background = frozenset(encode(p.g) for p in patterns if getattr(p, "g", None)
                                     and p.g.startswith("<" + VIEW_PREFIX))
        # predicate id -> graph ids its patterns read; None: any quad may match (a variable predicate)
        self._relevant: dict[int, set[int]] | None = None if any_predicate else {}
        for pattern in patterns if self._relevant is not None else ():
            if pattern.g is None:
                graph = DEFAULT_GRAPH_ID
            elif is_var(pattern.g):
                graph = _ANY_NAMED
            else:
                graph = encode(pattern.g)
            self._relevant.setdefault(encode(pattern.p), set()).add(graph)
        self._range = spec.range_ms
        self._step = spec.step_ms
        self._admit = spec.late_policy == "admit"
        self._seq = 0
        self._max_event: int | None = None
        self._watermark: int | None = None
        self._last: int | None = None
        self._records: dict[tuple[int, int, int, int], Record] = {}
        self._events: dict[int, Event] = {}
        self._wakes = WakeQueue()  # instant -> the quads (or event times) to look at then; stale ones skipped

    @property
    def initial(self) -> Counter:
        """The answers over an empty window (an aggregate's 0, VALUES rows; none for a BGP): a time window's
        first report carries them."""
        return Counter(self._initial)

    @property
    def predicates(self) -> frozenset[int] | None:
        """The predicate ids of the quads the query may read (None: any, a variable predicate)."""
        return None if self._relevant is None else frozenset(self._relevant)

    @property
    def form(self) -> str:
        """SELECT, ASK or CONSTRUCT (an ASK reports one empty row while it holds, as ``cbgp.algebra``)."""
        return getattr(self.query, "form", "SELECT")

    def _patterns(self) -> tuple[list, bool]:
        """The triple patterns the query reads, and whether one has a variable predicate (any quad may match)."""
        if isinstance(self.query, ParsedQuery):
            return list(self.query.patterns), False
        operators = self._engine.operator_queries[_QUERY]
        patterns = [pattern for leaf in operators.engine_leaves for pattern in leaf.query.patterns]
        # (a variable-predicate BGP's patterns, as far as a GRAPH check needs them: ("default", None) last)
        patterns += [SimpleNamespace(g=None if spec[-1][0] == "default" else "?g")
                     for leaf in operators.pattern_leaves for spec in leaf.patterns]
        return patterns, bool(operators.pattern_leaves)

    def _reads(self, p: int | None, g: int | None) -> bool:
        """Whether a quad with predicate id ``p`` and graph id ``g`` (None: not in the dictionary) may match."""
        if self._relevant is None:
            return True
        graphs = self._relevant.get(p)  # type: ignore[arg-type]
        return graphs is not None and (g in graphs or (g != DEFAULT_GRAPH_ID and _ANY_NAMED in graphs))

    # -- public properties --

    @property
    def columns(self) -> tuple[str, ...]:
        return self._engine.columns(_QUERY)

    @property
    def watermark(self) -> int | None:
        return self._watermark

    @property
    def last_instant(self) -> int | None:
        return self._last

    def decode_row(self, row: tuple[int, ...]) -> dict[str, str]:
        return self._engine.decode_row(_QUERY, row)

    def state_entries(self) -> int:
        """Stored history: quad updates (time windows) or event triples plus kept answer rows (per-event)."""
        if self._event_model:
            return sum(len(e.triples or ()) + len(e.rows) for e in self._events.values())
        return sum(len(r.history) for r in self._records.values())

    # -- input --

    def add_terms(self, op: int, s: str, p: str, o: str, g: str | None, event_time_ms: int) -> bool:
        # Relevance is decided on terms already known (the query's), so irrelevant data never enters the dictionary.
        lookup = self.dictionary.lookup
        if self._relevant is not None and not self._reads(lookup(p), DEFAULT_GRAPH_ID if g is None else
                                                          (lookup(g) or _UNKNOWN_GRAPH)):
            return self._late_check(event_time_ms)
        encode = self.dictionary.encode
        graph = DEFAULT_GRAPH_ID if g is None else encode(g)
        return self.add(op, encode(s), encode(p), encode(o), graph, event_time_ms)

    def _late_check(self, t: int) -> bool:
        self._see(t)
        return not (self._last is not None and t < self._last and not self._admit)

    def _see(self, t: int) -> None:
        if self._max_event is None or t > self._max_event:
            self._max_event = t

    def add(self, op: int, s: int, p: int, o: int, g: int, event_time_ms: int) -> bool:
        """Record one update (op +1 ADD / -1 DEL); False iff it is late and the policy drops it.

        Irrelevant updates (no pattern can match them), updates too old for any future window and, per
        event, DELs are accepted (True) and simply have no effect; they still move the default watermark.
        """
        if op not in (1, -1):
            raise ValueError(f"op must be +1 (ADD) or -1 (DEL), not {op!r}")
        t = int(event_time_ms)
        if not self._late_check(t):
            return False
        if not self._reads(p, g):
            return True
        last = self._last
        if last is not None and t < last + self._step - self._range and g not in self._background:
            return True  # no future window reaches back to t: no effect
        self._seq += 1
        if self._event_model:
            if op > 0:
                self._add_event_triple((s, p, o, g), t)
        else:
            self._add_update((s, p, o, g), (t, self._seq, op))
        return True

    def _add_update(self, quad: tuple[int, int, int, int], update: tuple[int, int, int]) -> None:
        record = self._records.get(quad)
        if record is None:
            record = self._records[quad] = self._record(quad)
        history = record.history
        step = self._step
        cell = update[0] // step
        index = bisect_left(history, update)
        # Keep one update per step cell: at every grid instant the later one shadows the earlier.
        if index < len(history) and history[index][0] // step == cell:
            pass  # a later update in the same cell already shadows this one
        elif index > 0 and history[index - 1][0] // step == cell:
            history[index - 1] = update
        else:
            insort(history, update)
        self._settle(quad, record)

    def _add_event_triple(self, quad: tuple[int, int, int, int], t: int) -> None:
        event = self._events.get(t)
        if event is None:
            event = self._events[t] = Event()
        if event.triples is None or quad in event.triples:
            return  # duplicate (triples are freed only once no triple of the event can be admitted)
        event.triples.add(quad)
        if event.entered:
            event.dirty = True
        self._settle_event(t, event)

    # -- the clock --

    def advance(self, watermark_ms: int | None = None) -> list[WindowReport]:
        """Move the watermark (never backwards) and report every changing instant up to it."""
        if watermark_ms is None:
            if self._max_event is None:
                return []
            watermark_ms = self._max_event - self.spec.lateness_ms
        watermark_ms = int(watermark_ms)
        if self._watermark is not None and watermark_ms <= self._watermark:
            return []
        self._watermark = watermark_ms
        target = (watermark_ms // self._step) * self._step
        if self._last is not None and target <= self._last:
            return []
        reports: list[WindowReport] = []
        wakes = self._wakes
        while True:
            instant = wakes.first()
            if instant is None or instant > target:
                break
            keys = wakes.pop(instant)
            first = self._last is None
            self._last = instant  # pruning and the next wake-ups are relative to this instant
            if self._event_model:
                changes = self._process_events(instant, keys)
            else:
                changes = self._process_quads(instant, keys)
            if first and not self._event_model:
                changes.update(self._initial)
            deltas = _consolidate(changes)
            if deltas:
                reports.append(WindowReport(instant, deltas))
        if self._last is None and self._initial and not self._event_model:
            reports.append(WindowReport(target, _consolidate(self._initial)))  # no change came before it
        self._last = target
        if len(wakes) > 2 * (len(self._records) + len(self._events)) + 64:
            self._rebuild_wakes()
        return reports

    def _rebuild_wakes(self) -> None:
        """Drop the stale entries (a record whose wake moved leaves its old one behind)."""
        items = self._events.items() if self._event_model else self._records.items()
        self._wakes = WakeQueue()
        for key, item in items:
            if item.wake is not None:
                self._wakes.push(item.wake, key)

    def _next_grid(self, value: int) -> int:
        """The first instant strictly after `value`."""
        return (value // self._step + 1) * self._step

    # -- time windows --

    def _record(self, quad: tuple[int, int, int, int]) -> Record:
        return Record(BACKGROUND_RANGE if quad[3] in self._background else self._range)

    @staticmethod
    def _member(history: list[tuple[int, int, int]], instant: int, range_ms: int) -> bool:
        index = bisect_left(history, (instant,))
        if index == 0:
            return False
        t, _seq, op = history[index - 1]
        return op > 0 and t >= instant - range_ms

    def _prune(self, history: list[tuple[int, int, int]], range_ms: int) -> None:
        last = self._last
        if last is None:
            return
        cut = last + self._step - range_ms  # an update before this is in no future window
        old = bisect_left(history, (cut,))
        if old:
            del history[:old]
        before = bisect_left(history, (last,))
        if before:
            # Future instants see at most the last update before last_instant (a late one either shadows it
            # or is shadowed); a DEL there only matters if a late ADD before it may still be admitted.
            kept = history[before - 1]
            if kept[2] < 0 and not self._admit:
                del history[:before]
            else:
                del history[: before - 1]

    def _next_change(self, record: Record) -> int | None:
        """The first grid instant still to come at which the record's membership differs from what the engine
        holds (``record.present``); else, for a record with history, when it can all be pruned."""
        history = record.history
        step, after, range_ms, present = self._step, self._last, record.range_ms, record.present
        n = len(history)
        # An instant I sees the last update before it (t < I, i.e. I >= the next grid instant after t): update
        # i rules the grid instants [enter_i, enter_{i+1}); an ADD is a member there up to t + range.
        if not n:  # (a record that left the window and has not been removed yet)
            return after + step if present else None
        enter = (history[0][0] // step + 1) * step
        first = after + step if after is not None else enter  # (no instant yet: nothing is present)
        if present and first < enter:
            return first
        for i in range(n):
            t, _seq, op = history[i]
            start = (t // step + 1) * step
            end = (history[i + 1][0] // step + 1) * step if i + 1 < n else None
            if end is not None and end <= first:
                continue
            lo = start if start > first else first
            if end is not None and lo >= end:
                continue  # (two updates in one step cell: the later one rules)
            if op < 0:
                if present:
                    return lo
                continue
            leave = ((t + range_ms) // step + 1) * step  # the first instant past t + range
            if present:
                out = leave if leave > lo else lo
                if end is None or out < end:
                    return out
            elif lo < leave and (end is None or lo < end):
                return lo
        # wake up once the history can all be pruned, so that idle records go away
        cleanup = ((history[-1][0] + range_ms - step) // step + 1) * step
        return cleanup if after is None or cleanup > after else after + step

    def _settle(self, quad: tuple[int, int, int, int], record: Record) -> None:
        self._prune(record.history, record.range_ms)
        if not record.history and not record.present:
            del self._records[quad]
            return
        wake = self._next_change(record)
        if wake != record.wake:
            record.wake = wake
            if wake is not None:
                self._wakes.push(wake, quad)

    def _process_quads(self, instant: int, keys: list) -> Counter:
        touched = []
        for quad in sorted(set(keys)):
            record = self._records.get(quad)
            if record is None or record.wake != instant:
                continue  # stale wake-up
            record.wake = None
            touched.append((quad, record, self._member(record.history, instant, record.range_ms)))
        changes: Counter = Counter()
        apply = self._engine.apply
        for wanted in (False, True):  # leaving quads first, then entering ones
            for quad, record, member in touched:
                if member == wanted and record.present != member:
                    for _name, diff, row in apply(1 if member else -1, *quad):
                        changes[row] += diff
                    record.present = member
        for quad, record, _member in touched:
            self._settle(quad, record)
        return changes

    # -- per-event windows --

    def _event_wake(self, t: int, event: Event) -> int | None:
        after = self._last
        soonest = after + self._step if after is not None else None
        if event.dirty:
            return soonest
        leave = self._next_grid(t + self._range)
        if event.entered:
            return leave
        enter = self._next_grid(t)
        if soonest is not None and soonest > enter:
            enter = soonest
        return enter if enter < leave else None

    def _settle_event(self, t: int, event: Event) -> None:
        wake = self._event_wake(t, event)
        if wake is None and not event.entered:
            del self._events[t]
            return
        if wake != event.wake:
            event.wake = wake
            if wake is not None:
                self._wakes.push(wake, t)

    def _evaluate(self, triples: set[tuple[int, int, int, int]]) -> tuple[Counter, list[int]]:
        """An event's answers, evaluated alone in an engine of its own, and the computed values they name, held
        for them; what that engine held is let go with it."""
        engine = type(self._engine)(dictionary=self.dictionary)  # (a ContinuousEngine)
        rows: Counter = Counter()
        taken: list[int] = []
        self.dictionary.record_holds(taken)
        try:
            for _name, diff, row in engine.register(_QUERY, self._plan):
                rows[row] += diff
            for quad in sorted(triples):
                for _name, diff, row in engine.apply(1, *quad):
                    rows[row] += diff
        finally:
            self.dictionary.record_holds(None)
        rows = +rows
        held = self._hold(rows)
        release = self.dictionary.release
        for term_id in taken:
            release(term_id)
        return rows, held

    def _hold(self, rows: Counter) -> list[int]:
        """Hold once each computed value ``rows`` name (a term kept for good needs nothing): the ids held."""
        hold = self.dictionary.hold_id
        return [term_id for term_id in {value for row in rows for value in row if value is not None}
                if hold(term_id)]

    def _release(self, event: Event) -> None:
        release = self.dictionary.release
        for term_id in event.held:
            release(term_id)
        event.held = []

    def _process_events(self, instant: int, keys: list) -> Counter:
        changes: Counter = Counter()
        for t in sorted(set(keys)):
            event = self._events.get(t)
            if event is None or event.wake != instant:
                continue
            event.wake = None
            inside = instant - self._range <= t < instant
            if inside and event.entered and not event.dirty:
                rows, held = event.rows, event.held
            elif inside:
                rows, held = self._evaluate(event.triples or set())
            else:
                rows, held = Counter(), []
            changes.update(rows)
            changes.subtract(event.rows)
            if held is not event.held:
                self._release(event)  # (read by the caller before it collects: the retractions still decode)
            event.rows, event.held = rows, held
            event.entered = inside
            event.dirty = False
            if inside and not self._admit:
                event.triples = None  # every further triple of this event is late and dropped
            self._settle_event(t, event)
        return changes

    # -- checkpoints --

    def to_state(self) -> dict:
        """Everything needed to continue identically, as plain JSON-able values."""
        state: dict = {
            "format": STATE_FORMAT,
            "spec": self.spec.to_json(),
            "seq": self._seq,
            "max_event": self._max_event,
            "watermark": self._watermark,
            "last_instant": self._last,
        }
        if self._event_model:
            state["events"] = [
                [t, int(e.entered), int(e.dirty),
                 None if e.triples is None else [list(q) for q in sorted(e.triples)],
                 [[list(row), count] for row, count in sorted(e.rows.items())]]
                for t, e in sorted(self._events.items())
            ]
        else:
            state["quads"] = [[*quad, int(r.present), list(map(list, r.history))]
                              for quad, r in sorted(self._records.items())]
        return state

    @classmethod
    def from_state(cls, sparql: str, spec: WindowSpec, state: dict,
                   dictionary: TermDictionary | None = None) -> WindowedQuery:
        """Rebuild the evaluator `to_state` described (the engine is refilled with the current content)."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise WindowError(f"not a window state of format {STATE_FORMAT}")
        if state.get("spec") != spec.to_json():
            raise WindowError(f"the state was saved for window {state.get('spec')}, not {spec.to_json()}")
        self = cls(sparql, spec, dictionary)
        self._seq = state["seq"]
        self._max_event = state["max_event"]
        self._watermark = state["watermark"]
        self._last = state["last_instant"]
        if self._event_model:
            for t, entered, dirty, triples, rows in state.get("events", []):
                event = self._events[t] = Event()
                event.entered = bool(entered)
                event.dirty = bool(dirty)
                event.triples = None if triples is None else {tuple(q) for q in triples}
                event.rows = Counter({tuple(row): count for row, count in rows})
                event.held = self._hold(event.rows)
                self._settle_event(t, event)
        else:
            for s, p, o, g, present, history in state.get("quads", []):
                quad = (s, p, o, g)
                record = self._records[quad] = self._record(quad)
                record.history = [tuple(u) for u in history]
                record.present = bool(present)
                if record.present:
                    self._engine.apply(1, *quad)
                self._settle(quad, record)
        return self


def _consolidate(changes: Counter) -> list[tuple[int, tuple[int, ...]]]:
    """Net changes as signed rows, retractions first, each sorted (identical after a restart; an operator
    query's unbound variable is None, sorted first)."""
    ordered = sorted(changes.items(), key=_row_order)
    out: list[tuple[int, tuple[int, ...]]] = []
    for row, count in ordered:
        if count < 0:
            out.extend([(-1, row)] * -count)
    for row, count in ordered:
        if count > 0:
            out.extend([(1, row)] * count)
    return out


def _row_order(item: tuple[tuple, int]) -> tuple:
    return tuple(-1 if value is None else value for value in item[0])
