"""Event-time windows for continuous BGP queries (RSP-QL style), exact and incremental.

A windowed query answers, at each *instant* tau, the query over the part of the
stream that the window at tau covers.  Instants are epoch-aligned multiples of
the step (tau = k * step_ms) and the window at tau covers event times in the
half-open interval [tau - range, tau).  Two models:

Time windows ("sliding", "tumbling" = sliding with step == range)
    The content C(tau) is the set of quads x whose LAST update with event time
    < tau (ordered by event time, ties by arrival) is an ADD with event time
    >= tau - range.  So a triple counts only while event_time + range lies
    ahead, a re-ADD ("refresh", which the ingest service forwards) extends its
    life, and a DEL ends it.  Expiry is then just a deletion: at each instant the
    quads whose membership changed are deleted from / inserted into one
    `cbgp.engine.Engine` (deletes first), and the engine's deltas, consolidated
    per instant, are the report.  A triple ADDed at t is in the windows of the
    grid instants tau with t < tau <= t + range: it enters at the first instant
    after t and leaves at the first instant after t + range (when t + range is
    itself on the grid the window at t + range still holds it, because the
    interval is closed on the left).

Per-event windows ("event", our extension; RSP-QL text `[RANGE r EVENT]`)
    An event is the set of ADDed quads sharing one event time (ms); DELs are
    ignored (events are immutable facts, as in the event-based model of seed
    paper 002).  The event at t is in the window at tau iff tau - range <= t <
    tau, and the answer is the multiset union over the events in the window of
    the query evaluated on each event's triples alone (no joins across events).
    Each event is evaluated once, by its own short-lived Engine, when it enters;
    its rows are kept to be retracted when it leaves.  GRAPH is rejected in this
    model (an event is a set of triples, not a dataset).

Reporting.  `advance(watermark)` reports, in increasing order, every instant
tau with last_instant < tau <= watermark at which the answers change, as the
exact multiset difference from the previous instant (a row whose count rises by
k appears k times with sign +1; no row has both signs in one report).  Work is
driven by a heap of the instants at which some quad's (or event's) membership
can change, so unchanged instants cost nothing and a watermark jump of 10^12 ms
is as cheap as the changes it crosses.  Once advance has passed an instant it
is final: `last_instant` is the last instant passed (reported or not: an
instant with no change simply has an empty report, which is omitted), the
watermark never goes backwards, and an update with event time < last_instant is
*late*: dropped (policy "drop", `add` returns False) or admitted (policy
"admit": recorded, it affects later instants by the definition above).  Late
updates cannot change instants already passed, so an admitted one that alters
the content at last_instant shows up at the next instant.  The default
watermark is (max event time seen) - lateness.

State stays bounded by the window: updates whose predicate (or graph) no
pattern can match are not stored, and per quad only what can still decide a
future instant is kept: at most one update per step cell (a later update in
the same cell shadows the earlier at every grid instant), only the last update
before last_instant, nothing older than last_instant + step - range (it can no
longer be in any future window).

Query text: `parse_rspql` strips one `FROM NAMED WINDOW :w ON :stream [RANGE r
STEP s]` declaration and the matching `WINDOW :w { ... }` block, leaving plain
SPARQL for `cbgp.sparql.parse_query` at the same line/column positions.
`[RANGE r]` is tumbling, `[RANGE r EVENT]` (or `[RANGE r STEP s EVENT]`) the
per-event model.  The stream name is checked but not used: a job reads one
stream.  `window_from_options` builds a spec from register options, or
completes an RSP-QL spec with `lateness` / `late`.
"""

from __future__ import annotations

import heapq
import re
from bisect import bisect_left, insort
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from cbgp.engine import Engine
from cbgp.plan import decompose
from cbgp.sparql import QueryError, is_var, parse_query
from cbgp.terms import DEFAULT_GRAPH_ID, TermDictionary

KINDS = ("sliding", "tumbling", "event")
LATE_POLICIES = ("drop", "admit")
STATE_FORMAT = 1

_QUERY = "q"  # the one query name inside our engines
# Parsing (rdflib) costs milliseconds and ParsedQuery is immutable: restarts and per-key evaluators reuse it.
_parse = lru_cache(maxsize=256)(parse_query)
_ANY_NAMED = -1  # graph slot of a `GRAPH ?g` pattern: any named graph (term ids are > 0, default graph 0)


class WindowError(QueryError):
    """A window specification, window clause or windowed query is invalid (a QueryError: same `message`,
    `line` / `column` in the query text when known, so callers report both alike)."""


# --- specification ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowSpec:
    kind: str  # "sliding" | "tumbling" | "event"
    range_ms: int
    step_ms: int  # tumbling: step == range
    lateness_ms: int = 0  # default watermark = max event time seen - lateness
    late_policy: str = "drop"  # "drop" | "admit"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise WindowError(f"unknown window kind {self.kind!r}: expected one of {', '.join(KINDS)}")
        for name in ("range_ms", "step_ms", "lateness_ms"):
            value = getattr(self, name)
            if type(value) is not int:
                raise WindowError(f"{name} must be an integer number of milliseconds, not {value!r}")
        if self.range_ms <= 0:
            raise WindowError(f"the window range must be positive, not {self.range_ms} ms")
        if self.step_ms <= 0:
            raise WindowError(f"the window step must be positive, not {self.step_ms} ms")
        if self.lateness_ms < 0:
            raise WindowError(f"the allowed lateness cannot be negative ({self.lateness_ms} ms)")
        if self.kind == "tumbling" and self.step_ms != self.range_ms:
            raise WindowError(
                f"a tumbling window has step == range (got range {self.range_ms} ms, step {self.step_ms} ms); "
                f"use a sliding window for another step"
            )
        if self.late_policy not in LATE_POLICIES:
            raise WindowError(f"unknown late-data policy {self.late_policy!r}: expected drop or admit")

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "range_ms": self.range_ms,
            "step_ms": self.step_ms,
            "lateness_ms": self.lateness_ms,
            "late_policy": self.late_policy,
        }

    @classmethod
    def from_json(cls, data: dict) -> WindowSpec:
        if not isinstance(data, dict):
            raise WindowError(f"a window spec must be a JSON object, not {type(data).__name__}")
        known = {"kind", "range_ms", "step_ms", "lateness_ms", "late_policy"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise WindowError(f"unknown window spec field(s): {', '.join(unknown)}")
        missing = [k for k in ("kind", "range_ms", "step_ms") if k not in data]
        if missing:
            raise WindowError(f"window spec lacks field(s): {', '.join(missing)}")
        return cls(**data)


_DURATION = re.compile(
    r"P(?:(?P<W>\d+(?:\.\d+)?)W)?(?:(?P<D>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<H>\d+(?:\.\d+)?)H)?(?:(?P<M>\d+(?:\.\d+)?)M)?(?:(?P<S>\d+(?:\.\d+)?)S)?)?"
)
_UNIT_MS = {"W": 7 * 86_400_000, "D": 86_400_000, "H": 3_600_000, "M": 60_000, "S": 1000}


def parse_duration(text: str) -> int:
    """Milliseconds of an ISO-8601 duration as RSP-QL writes them: PT60S, PT1M30S, PT0.5S, PT2H, P1D, P1W."""
    if not isinstance(text, str):
        raise WindowError(f"a duration must be a string like PT60S, not {text!r}")
    upper = text.upper()
    match = _DURATION.fullmatch(upper)
    if match is None or upper in ("P", "PT") or upper.endswith("T"):
        if re.fullmatch(r"P(\d+Y)?(\d+M)?(\d+[WD])?(T.*)?", upper) and re.match(r"P(\d+Y|\d+M)", upper):
            raise WindowError(f"duration {text!r}: years and months have no fixed length; use days (P30D)")
        raise WindowError(f"invalid duration {text!r}: expected ISO-8601 like PT60S, PT1M30S, PT0.5S, PT2H or P1D")
    total = sum(Fraction(value) * _UNIT_MS[unit] for unit, value in match.groupdict().items() if value is not None)
    if total.denominator != 1:
        raise WindowError(f"duration {text!r} is not a whole number of milliseconds")
    return int(total)


def window_from_options(options: dict[str, str], base: WindowSpec | None = None) -> WindowSpec | None:
    """The window of a query registered with string options, or None.

    Options: `window` (sliding | tumbling | event), `range` (duration), `step`
    (duration, default = range), `lateness` (duration, default 0), `late`
    (drop | admit, default drop); other keys are not ours and are ignored.
    With `base` (the spec `parse_rspql` found in the query text) only
    `lateness` and `late` may be given: they complete that spec, and declaring
    the window a second time in the options is an error.
    """
    options = options or {}
    lateness = options.get("lateness")
    late = options.get("late")
    extra = {}
    if lateness is not None:
        extra["lateness_ms"] = _option_duration("lateness", lateness)
    if late is not None:
        if late not in LATE_POLICIES:
            raise WindowError(f"option late={late!r}: expected drop or admit")
        extra["late_policy"] = late
    shape_keys = [k for k in ("window", "range", "step") if k in options]
    if base is not None:
        if shape_keys:
            raise WindowError(
                f"the query text declares its window (FROM NAMED WINDOW); option(s) {', '.join(shape_keys)} "
                f"would declare it again: give only lateness / late"
            )
        return _replace(base, **extra)
    kind = options.get("window")
    if kind is None:
        if shape_keys or extra:
            given = ", ".join(shape_keys + [k for k in ("lateness", "late") if k in options])
            raise WindowError(f"option(s) {given} given without window=sliding|tumbling|event")
        return None
    if kind not in KINDS:
        raise WindowError(f"option window={kind!r}: expected sliding, tumbling or event")
    if "range" not in options:
        raise WindowError(f"option window={kind} needs a range (e.g. range=PT60S)")
    range_ms = _option_duration("range", options["range"])
    step_ms = _option_duration("step", options["step"]) if "step" in options else range_ms
    return WindowSpec(kind, range_ms, step_ms, **extra)


def _option_duration(name: str, value: str) -> int:
    try:
        return parse_duration(value)
    except WindowError as exc:
        raise WindowError(f"option {name}: {exc.message}") from None


def _replace(spec: WindowSpec, **changes: object) -> WindowSpec:
    data = spec.to_json()
    data.update(changes)
    return WindowSpec.from_json(data)


# --- RSP-QL text ---------------------------------------------------------------------------------------

_SEGMENT = r"[\w\-%]+(?:\.[\w\-%]+)*"  # a name part: inner dots only (a trailing '.' ends the triple)
_LEX = re.compile(
    r"""(?P<comment>\#[^\n]*)
      | (?P<string>\"\"\"(?:[^\\]|\\.)*?\"\"\"|'''(?:[^\\]|\\.)*?'''|"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
      | (?P<iri><[^<>"{}|^`\\\s]*>)
      | (?P<var>[?$]\w+)
      | (?P<word>(?:[A-Za-z_][\w\-]*(?:\.[\w\-]+)*)?:(?:""" + _SEGMENT + r""")?|[A-Za-z_0-9][\w\-]*(?:\.[\w\-]+)*)
      | (?P<punct>[{}\[\]().;,])
      | (?P<other>\S)""",
    re.VERBOSE,
)


@dataclass
class _Token:
    kind: str
    value: str
    start: int
    end: int
    depth: int  # brace depth the token sits at ('{' counts at its outer depth)

    @property
    def word(self) -> str:
        return self.value.upper() if self.kind == "word" else ""


def _lex(text: str) -> list[_Token]:
    out: list[_Token] = []
    depth = 0
    for m in _LEX.finditer(text):
        kind = m.lastgroup or ""
        if kind == "comment":
            continue
        value = m.group(0)
        if value == "}":
            depth -= 1
        out.append(_Token(kind, value, m.start(), m.end(), depth))
        if value == "{":
            depth += 1
    return out


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def parse_rspql(text: str) -> tuple[str, WindowSpec | None]:
    """Split an RSP-QL query into plain SPARQL (same positions) and its window; no window -> (text, None)."""
    tokens = _lex(text)

    def error(message: str, token: _Token | None) -> WindowError:
        offset = token.start if token is not None else len(text)
        return WindowError(message, *_line_col(text, offset))

    prefixes: dict[str, str] = {}
    for i, tok in enumerate(tokens[:-2]):
        if tok.word == "PREFIX" and tokens[i + 1].kind == "word" and tokens[i + 1].value.endswith(":"):
            if tokens[i + 2].kind == "iri":
                prefixes[tokens[i + 1].value[:-1]] = tokens[i + 2].value[1:-1]

    def resolve(tok: _Token | None, what: str) -> str:
        if tok is not None and tok.kind == "iri":
            return tok.value[1:-1]
        if tok is not None and tok.kind == "word" and ":" in tok.value and not tok.value.startswith("_:"):
            prefix, local = tok.value.split(":", 1)
            if prefix not in prefixes:
                raise error(f"undeclared prefix {prefix + ':'!r} in {what}", tok)
            return prefixes[prefix] + local
        found = "the end of the query" if tok is None else repr(tok.value)
        raise error(f"expected an IRI or prefixed name for {what}, found {found}", tok)

    def at(i: int) -> _Token | None:
        return tokens[i] if i < len(tokens) else None

    declarations: list[tuple[str, _Token, int, int, WindowSpec]] = []  # (name, token, start, end, spec)
    blocks: list[tuple[str, _Token, int, int]] = []  # (name, WINDOW token, index of '{', index of '}')
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.word == "FROM" and (at(i + 1) or tok).word == "NAMED" and (at(i + 2) or tok).word == "WINDOW":
            if tok.depth != 0:
                raise error("FROM NAMED WINDOW must come before the WHERE clause", tok)
            name = resolve(at(i + 3), "the window name")
            j = i + 4
            if (at(j) or tok).word != "ON":
                raise error("expected ON <stream> after the window name in FROM NAMED WINDOW", at(j))
            resolve(at(j + 1), "the stream name")
            j += 2
            spec, j = _window_bracket(tokens, j, error)
            declarations.append((name, tok, tok.start, tokens[j - 1].end, spec))
            i = j
            continue
        if tok.word == "WINDOW":
            if tok.depth == 0:
                raise error("WINDOW without FROM NAMED outside the WHERE clause", tok)
            name = resolve(at(i + 1), "the window name")
            brace = at(i + 2)
            if brace is None or brace.value != "{":
                raise error("expected '{' after WINDOW and its name", brace)
            close = next((k for k in range(i + 3, len(tokens))
                          if tokens[k].value == "}" and tokens[k].depth == brace.depth), None)
            if close is None:
                raise error("the WINDOW block is not closed with '}'", brace)
            blocks.append((name, tok, i + 2, close))
            i += 3
            continue
        i += 1

    if not declarations and not blocks:
        return text, None
    if len(declarations) > 1:
        raise error("only one window per query is supported (a second FROM NAMED WINDOW)", declarations[1][1])
    if len(blocks) > 1:
        raise error("only one WINDOW block per query is supported", blocks[1][1])
    if not declarations:
        raise error(f"WINDOW <{blocks[0][0]}> names an undeclared window (no FROM NAMED WINDOW)", blocks[0][1])
    name, decl_tok, decl_start, decl_end, spec = declarations[0]
    if not blocks:
        raise error(f"window <{name}> is declared but never used: put the patterns in WINDOW <{name}> {{ ... }}",
                    decl_tok)
    block_name, window_tok, open_index, close_index = blocks[0]
    if block_name != name:
        raise error(f"WINDOW <{block_name}> names an undeclared window (the declared one is <{name}>)", window_tok)
    if window_tok.depth != 1:
        raise error("the WINDOW block must sit directly in the WHERE clause", window_tok)
    # Everything else in the WHERE group must be separators: nothing may be evaluated outside the window.
    where_open = max(k for k in range(tokens.index(window_tok)) if tokens[k].value == "{" and tokens[k].depth == 0)
    window_index = tokens.index(window_tok)
    for k in range(where_open + 1, len(tokens)):
        tok = tokens[k]
        if tok.depth == 0:
            break
        if window_index <= k <= close_index or tok.value == ".":
            continue
        raise error(f"patterns outside the WINDOW block are not supported: found {tok.value!r}; "
                    f"put every pattern inside WINDOW <{name}> {{ ... }}", tok)
    if spec.kind == "event":
        for tok in tokens[open_index:close_index]:
            if tok.word == "GRAPH":
                raise error("GRAPH is not supported in a per-event window (an event is a set of triples)", tok)

    chars = list(text)

    def blank(start: int, end: int) -> None:  # spaces keep every later line and column where it was
        for k in range(start, end):
            if chars[k] not in "\n\r":
                chars[k] = " "

    blank(decl_start, decl_end)
    blank(window_tok.start, tokens[open_index].end)
    blank(tokens[close_index].start, tokens[close_index].end)
    return "".join(chars), spec


def _window_bracket(tokens: list[_Token], j: int, error) -> tuple[WindowSpec, int]:  # noqa: ANN001
    """Parse `[RANGE r (STEP s)? (EVENT)?]` starting at token j; return the spec and the index after ']'."""

    def at(k: int) -> _Token | None:
        return tokens[k] if k < len(tokens) else None

    def duration(k: int, what: str) -> int:
        tok = at(k)
        if tok is None or tok.kind != "word":
            raise error(f"expected a duration (e.g. PT60S) after {what}", tok)
        try:
            return parse_duration(tok.value)
        except WindowError as exc:
            raise error(f"{what}: {exc.message}", tok) from None

    if (at(j) or _Token("", "", 0, 0, 0)).value != "[":
        raise error("expected '[RANGE ...]' after the stream name in FROM NAMED WINDOW", at(j))
    if (at(j + 1) or _Token("", "", 0, 0, 0)).word != "RANGE":
        raise error("expected RANGE <duration> in the window '[...]'", at(j + 1))
    range_tok = at(j + 2)
    range_ms = duration(j + 2, "RANGE")
    if range_ms <= 0:
        raise error("RANGE must be a positive duration", range_tok)
    k = j + 3
    step_ms = None
    if (at(k) or _Token("", "", 0, 0, 0)).word == "STEP":
        step_tok = at(k + 1)
        step_ms = duration(k + 1, "STEP")
        if step_ms <= 0:
            raise error("STEP must be a positive duration", step_tok)
        k += 2
    event = (at(k) or _Token("", "", 0, 0, 0)).word == "EVENT"
    if event:
        k += 1
    if (at(k) or _Token("", "", 0, 0, 0)).value != "]":
        raise error("expected ']' (the window is [RANGE r], [RANGE r STEP s] or [RANGE r EVENT])", at(k))
    if event:
        kind = "event"
    elif step_ms is None or step_ms == range_ms:
        kind = "tumbling"
    else:
        kind = "sliding"
    return WindowSpec(kind, range_ms, step_ms if step_ms is not None else range_ms), k + 1


def _check_event_query(query) -> None:  # noqa: ANN001
    graph = next((p for p in query.patterns if p.g is not None), None)
    if graph is None:
        return
    tok = next((t for t in _lex(query.text) if t.word == "GRAPH"), None)
    where = _line_col(query.text, tok.start) if tok is not None else (None, None)
    raise WindowError("GRAPH is not supported in a per-event window (an event is a set of triples)", *where)


# --- evaluation --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowReport:
    instant_ms: int
    deltas: list[tuple[int, tuple[int, ...]]]  # (sign, row): the change of the answers since the last report


class _Record:
    """One quad of a time window: its pruned history and whether the engine holds it."""

    __slots__ = ("history", "present", "wake")

    def __init__(self) -> None:
        self.history: list[tuple[int, int, int]] = []  # (event time, arrival seq, op), sorted
        self.present = False
        self.wake: int | None = None  # the instant the heap should look at it again


class _Event:
    """One event of a per-event window: its triples (while they may be needed) and its current answer rows."""

    __slots__ = ("triples", "entered", "dirty", "rows", "wake")

    def __init__(self) -> None:
        self.triples: set[tuple[int, int, int, int]] | None = set()
        self.entered = False
        self.dirty = False  # a late triple joined it after it was evaluated
        self.rows: Counter[tuple[int, ...]] = Counter()
        self.wake: int | None = None


class WindowedQuery:
    """A BGP query (plain SPARQL) evaluated over event-time windows; see the module docstring."""

    def __init__(self, sparql: str, spec: WindowSpec, dictionary: TermDictionary | None = None) -> None:
        if not isinstance(spec, WindowSpec):
            raise TypeError(f"spec must be a WindowSpec, not {type(spec).__name__}")
        self.sparql = sparql
        self.spec = spec
        self.dictionary = dictionary if dictionary is not None else TermDictionary(stable=True)
        self.query = _parse(sparql)
        self._event_model = spec.kind == "event"
        if self._event_model:
            _check_event_query(self.query)
        self._plan = decompose(self.query)
        self._engine = Engine(dictionary=self.dictionary)  # time windows: holds C(last_instant)
        self._engine.register(_QUERY, self._plan)
        encode = self.dictionary.encode
        self._relevant: dict[int, set[int]] = {}  # predicate id -> graph ids its patterns read
        for pattern in self.query.patterns:
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
        self._records: dict[tuple[int, int, int, int], _Record] = {}
        self._events: dict[int, _Event] = {}
        self._heap: list[tuple[int, object]] = []  # (instant, quad or event time); stale entries skipped

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
        graphs = self._relevant.get(lookup(p))  # type: ignore[arg-type]
        if graphs is None or (g is None and DEFAULT_GRAPH_ID not in graphs) or (
                g is not None and _ANY_NAMED not in graphs and lookup(g) not in graphs):
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
        graphs = self._relevant.get(p)
        if graphs is None or not (g in graphs or (g != DEFAULT_GRAPH_ID and _ANY_NAMED in graphs)):
            return True
        last = self._last
        if last is not None and t < last + self._step - self._range:
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
            record = self._records[quad] = _Record()
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
            event = self._events[t] = _Event()
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
        heap = self._heap
        while heap and heap[0][0] <= target:
            instant = heap[0][0]
            keys = []
            while heap and heap[0][0] == instant:
                keys.append(heapq.heappop(heap)[1])
            self._last = instant  # pruning and the next wake-ups are relative to this instant
            if self._event_model:
                changes = self._process_events(instant, keys)
            else:
                changes = self._process_quads(instant, keys)
            deltas = _consolidate(changes)
            if deltas:
                reports.append(WindowReport(instant, deltas))
        self._last = target
        if len(heap) > 2 * (len(self._records) + len(self._events)) + 64:
            self._rebuild_heap()
        return reports

    def _rebuild_heap(self) -> None:
        items = self._events.items() if self._event_model else self._records.items()
        self._heap = [(item.wake, key) for key, item in items if item.wake is not None]
        heapq.heapify(self._heap)

    def _next_grid(self, value: int) -> int:
        """The first instant strictly after `value`."""
        return (value // self._step + 1) * self._step

    # -- time windows --

    def _member(self, history: list[tuple[int, int, int]], instant: int) -> bool:
        index = bisect_left(history, (instant,))
        if index == 0:
            return False
        t, _seq, op = history[index - 1]
        return op > 0 and t >= instant - self._range

    def _prune(self, history: list[tuple[int, int, int]]) -> None:
        last = self._last
        if last is None:
            return
        cut = last + self._step - self._range  # an update before this is in no future window
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

    def _next_change(self, record: _Record) -> int | None:
        history = record.history
        after = self._last
        range_ms = self._range
        candidates = set()
        for t, _seq, op in history:
            candidates.add(self._next_grid(t))
            if op > 0:
                candidates.add(self._next_grid(t + range_ms))
        if after is not None:
            candidates.add(after + self._step)  # a late admitted update may differ from the engine right away
            candidates = {c for c in candidates if c > after}
        # Membership is constant between candidates, so the first differing candidate is the next change.
        for instant in sorted(candidates):
            if self._member(history, instant) != record.present:
                return instant
        if history:  # wake up once the history can all be pruned, so that idle records go away
            cleanup = self._next_grid(history[-1][0] + range_ms - self._step)
            return cleanup if after is None or cleanup > after else after + self._step
        return None

    def _settle(self, quad: tuple[int, int, int, int], record: _Record) -> None:
        self._prune(record.history)
        if not record.history and not record.present:
            del self._records[quad]
            return
        wake = self._next_change(record)
        if wake != record.wake:
            record.wake = wake
            if wake is not None:
                heapq.heappush(self._heap, (wake, quad))

    def _process_quads(self, instant: int, keys: list) -> Counter:
        touched = []
        for quad in sorted(set(keys)):
            record = self._records.get(quad)
            if record is None or record.wake != instant:
                continue  # stale heap entry
            record.wake = None
            touched.append((quad, record, self._member(record.history, instant)))
        changes: Counter = Counter()
        apply = self._engine.apply
        for wanted in (False, True):  # leaving quads first, then entering ones
            for quad, record, member in touched:
                if member == wanted and record.present != member:
                    for _name, sign, row in apply(1 if member else -1, *quad):
                        changes[row] += sign
                    record.present = member
        for quad, record, _member in touched:
            self._settle(quad, record)
        return changes

    # -- per-event windows --

    def _event_wake(self, t: int, event: _Event) -> int | None:
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

    def _settle_event(self, t: int, event: _Event) -> None:
        wake = self._event_wake(t, event)
        if wake is None and not event.entered:
            del self._events[t]
            return
        if wake != event.wake:
            event.wake = wake
            if wake is not None:
                heapq.heappush(self._heap, (wake, t))

    def _evaluate(self, triples: set[tuple[int, int, int, int]]) -> Counter:
        engine = Engine(dictionary=self.dictionary)
        engine.register(_QUERY, self._plan)
        rows: Counter = Counter()
        for quad in sorted(triples):
            for _name, sign, row in engine.apply(1, *quad):
                rows[row] += sign
        return +rows

    def _process_events(self, instant: int, keys: list) -> Counter:
        changes: Counter = Counter()
        for t in sorted(set(keys)):
            event = self._events.get(t)
            if event is None or event.wake != instant:
                continue
            event.wake = None
            inside = instant - self._range <= t < instant
            if not inside:
                rows: Counter = Counter()
            elif event.dirty or not event.entered:
                rows = self._evaluate(event.triples or set())
            else:
                rows = event.rows
            changes.update(rows)
            changes.subtract(event.rows)
            event.rows = rows
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
            state["quads"] = [
                [*quad, int(r.present), [list(u) for u in r.history]]
                for quad, r in sorted(self._records.items())
            ]
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
                event = self._events[t] = _Event()
                event.entered = bool(entered)
                event.dirty = bool(dirty)
                event.triples = None if triples is None else {tuple(q) for q in triples}
                event.rows = Counter({tuple(row): count for row, count in rows})
                self._settle_event(t, event)
        else:
            for s, p, o, g, present, history in state.get("quads", []):
                quad = (s, p, o, g)
                record = self._records[quad] = _Record()
                record.history = [tuple(u) for u in history]
                record.present = bool(present)
                if record.present:
                    self._engine.apply(1, *quad)
                self._settle(quad, record)
        return self


def _consolidate(changes: Counter) -> list[tuple[int, tuple[int, ...]]]:
    """Net changes as signed rows, retractions first, each sorted (identical after a restart)."""
    out: list[tuple[int, tuple[int, ...]]] = []
    for row, count in sorted(changes.items()):
        if count < 0:
            out.extend([(-1, row)] * -count)
    for row, count in sorted(changes.items()):
        if count > 0:
            out.extend([(1, row)] * count)
    return out
