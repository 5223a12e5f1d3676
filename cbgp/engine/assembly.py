"""Assembling a multi-part query's answers from its parts' answer deltas.

How it works: docs/design/internals.md, cbgp.engine.assembly.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from cbgp.query.plan import decompose
from cbgp.query.sparql import ParsedQuery, graph_instance, graph_variable, is_bnode_var, is_var, parse_query

STATE_VERSION = 1


class AssemblyError(ValueError):
    """A query cannot be assembled, or deltas / a saved state do not fit it."""


@dataclass(frozen=True)
class PartQuery:
    index: int  # position in Plan.parts
    sparql: str  # a standalone SELECT over this part's patterns alone
    columns: tuple[str, ...]  # Engine.columns() of `sparql` once registered (variable names without '?')


def _parsed(query: str | ParsedQuery) -> ParsedQuery:
    return parse_query(query) if isinstance(query, str) else query


def needs_assembly(query: str | ParsedQuery) -> bool:
    """True iff the query has more than one part and no GRAPH ?g variable.

    A GRAPH ?g query joins all its parts on ?g (one instance per named graph), so
    the worker keeps it whole.
    """
    parsed = _parsed(query)
    return graph_variable(parsed) is None and len(decompose(parsed).parts) > 1


def _term(term: str) -> str:
    """A pattern term back in SPARQL syntax: blank nodes of the query stay blank nodes."""
    if is_bnode_var(term):
        return "_:" + term[len("?_:"):]
    return term  # a ?variable, or a canonical N-Triples term (valid SPARQL)


def _where(patterns) -> str:  # noqa: ANN001
    """The patterns as a group, consecutive patterns of the same named graph in one GRAPH <iri> block."""
    chunks: list[str] = []
    index = 0
    while index < len(patterns):
        graph = patterns[index].g
        triples = []
        while index < len(patterns) and patterns[index].g == graph:
            t = patterns[index]
            triples.append(f"{_term(t.s)} {t.p} {_term(t.o)} .")
            index += 1
        body = " ".join(triples)
        chunks.append(body if graph is None else f"GRAPH {graph} {{ {body} }}")
    return " ".join(chunks)


def split_parts(query: str | ParsedQuery) -> list[PartQuery]:
    """One standalone SELECT per part of the query's decomposition, in `Plan.parts` order.

    Each projects every named variable of its part (no DISTINCT), so its answers
    are the part's solutions with their multiplicities (blank nodes of the query
    stay non-projected, so a row can come several times).  A part without named
    variables (the ground part, or a star on a blank node) is `SELECT *` with the
    empty row as its solution(s).
    """
    parsed = _parsed(query)
    graph = graph_variable(parsed)
    out: list[PartQuery] = []
    for index, part in enumerate(decompose(parsed).parts):
        columns = tuple(v[1:] for v in part.variables if is_var(v) and not is_bnode_var(v))
        if graph is not None:
            columns = (graph[1:], *columns)  # the product joins the parts on it (GraphAssembler)
        head = " ".join("?" + c for c in columns) if columns else "*"
        patterns = [parsed.patterns[i] for i in part.patterns]
        out.append(PartQuery(index, f"SELECT {head} WHERE {{ {_where(patterns)} }}", columns))
    return out


def _output_columns(parsed: ParsedQuery) -> tuple[str, ...]:
    """What Engine.columns() reports for the whole query (projected variables that occur in a pattern, or are
    its GRAPH variable)."""
    present = {v for p in parsed.patterns for v in p.variables()} | {graph_variable(parsed)}
    return tuple(v for v in parsed.projected if "?" + v in present)


Row = tuple[int, ...]


class Assembler:
    """The answers of one multi-part query, kept from its parts' deltas (see the module docstring)."""

    def __init__(self, query: str | ParsedQuery) -> None:
        parsed = _parsed(query)
        if graph_variable(parsed) is not None:
            raise AssemblyError("a GRAPH ?variable query joins its parts on the graph: use GraphAssembler")
        self.query = parsed
        self.parts: list[PartQuery] = split_parts(parsed)
        self.columns: tuple[str, ...] = _output_columns(parsed)
        self.distinct = parsed.distinct
        out_position = {c: i for i, c in enumerate(self.columns)}
        # Per part: which of its row's values are projected, and where they go in the output row.
        self._keep: list[tuple[int, ...]] = []
        self._place: list[tuple[int, ...]] = []
        for part in self.parts:
            keep = tuple(k for k, c in enumerate(part.columns) if c in out_position)
            self._keep.append(keep)
            self._place.append(tuple(out_position[part.columns[k]] for k in keep))
        # Per part: projected sub-row -> multiplicity (> 0 entries only).
        self._counts: list[dict[Row, int]] = [{} for _ in self.parts]

    # -- updates --

    def apply(self, deltas: list[tuple[int, int, tuple[int, ...]]]) -> list[tuple[int, tuple[int, ...]]]:
        """The answer deltas of one update, from the part deltas (part, sign, row) it caused, in any order."""
        nets: list[dict[Row, int]] = [{} for _ in self.parts]
        n_parts = len(self.parts)
        for part_index, diff, row in deltas:
            if not 0 <= part_index < n_parts:
                raise AssemblyError(f"no part {part_index}: the query has {n_parts} parts")
            keep = self._keep[part_index]
            if len(row) != len(self.parts[part_index].columns):
                raise AssemblyError(
                    f"a row of part {part_index} has {len(row)} values, its columns are "
                    f"{self.parts[part_index].columns}"
                )
            sub = tuple(row[k] for k in keep)
            net = nets[part_index]
            net[sub] = net.get(sub, 0) + diff
        # Validate before touching the state, so a bad batch leaves the assembler as it was.
        for part_index, net in enumerate(nets):
            counts = self._counts[part_index]
            for sub, change in net.items():
                if counts.get(sub, 0) + change < 0:
                    raise AssemblyError(
                        f"part {part_index} would hold row {sub} {counts.get(sub, 0) + change} times: "
                        "a delta removed an answer the part did not have"
                    )
        out: dict[Row, int] = {}
        width = len(self.columns)
        for part_index, net in enumerate(nets):
            counts = self._counts[part_index]
            # The change of this part's weights (multiplicity, or presence under DISTINCT).
            changes: list[tuple[Row, int]] = []
            for sub, change in net.items():
                if not change:
                    continue
                old = counts.get(sub, 0)
                new = old + change
                if self.distinct:
                    change = (new > 0) - (old > 0)
                if change:
                    changes.append((sub, change))
                if new:
                    counts[sub] = new
                else:
                    del counts[sub]
            # Parts before this one are already new, parts after it still old: the telescoping sum.
            # (This part's own state is updated above; it is not a factor of its own term.)
            if changes:
                self._multiply(part_index, changes, out, width)
        result: list[tuple[int, tuple[int, ...]]] = []
        for row, count in out.items():
            if count > 0:
                result.extend([(1, row)] * count)
            elif count < 0:
                result.extend([(-1, row)] * -count)
        return result

    def _multiply(self, part_index: int, changes: list[tuple[Row, int]], out: dict[Row, int], width: int) -> None:
        others = [k for k in range(len(self.parts)) if k != part_index]
        factors = []
        for k in others:
            counts = self._counts[k]
            if not counts:
                return  # an empty part: the product has no answers, before or after
            items = [(sub, 1) for sub in counts] if self.distinct else list(counts.items())
            factors.append(items)
        own_place = self._place[part_index]
        other_places = [self._place[k] for k in others]
        for sub, change in changes:
            template = [0] * width
            for position, value in zip(own_place, sub):
                template[position] = value
            for combo in product(*factors):
                full = template.copy()
                weight = change
                for place, (other_sub, count) in zip(other_places, combo):
                    weight *= count
                    for position, value in zip(place, other_sub):
                        full[position] = value
                row = tuple(full)
                total = out.get(row, 0) + weight
                if total:
                    out[row] = total
                else:
                    del out[row]

    def absorb(self, part_index: int, diff: int, row: tuple[int, ...]) -> None:
        """Fold one part delta into the state without emitting (a restore from deltas already multiplied, in
        any order: a count may go below zero on the way, and ends where it was)."""
        sub = tuple(row[k] for k in self._keep[part_index])
        counts = self._counts[part_index]
        new = counts.get(sub, 0) + diff
        if new:
            counts[sub] = new
        else:
            del counts[sub]

    def answers(self) -> dict[Row, int]:
        """The current answers, row -> multiplicity (1 under DISTINCT): the product of the parts' rows."""
        if not all(self._counts):
            return {}
        width = len(self.columns)
        out: dict[Row, int] = {}
        for combo in product(*(list(counts.items()) for counts in self._counts)):
            full = [0] * width
            weight = 1
            for place, (sub, count) in zip(self._place, combo):
                weight *= count
                for position, value in zip(place, sub):
                    full[position] = value
            row = tuple(full)
            out[row] = 1 if self.distinct else out.get(row, 0) + weight
        return out

    # -- state --

    def state_entries(self) -> int:
        """Entries held: one per distinct projected sub-row per part."""
        return sum(len(counts) for counts in self._counts)

    def to_state(self) -> dict:
        """Plain data (ints, lists, dicts, str): pickle- and JSON-friendly."""
        return {
            "version": STATE_VERSION,
            "columns": list(self.columns),
            "distinct": self.distinct,
            "parts": [
                {
                    "columns": [part.columns[k] for k in self._keep[i]],
                    "rows": [[list(sub), count] for sub, count in self._counts[i].items()],
                }
                for i, part in enumerate(self.parts)
            ],
        }

    @classmethod
    def from_state(cls, query: str | ParsedQuery, state: dict) -> "Assembler":
        assembler = cls(query)
        if state.get("version") != STATE_VERSION:
            raise AssemblyError(f"unknown assembler state version {state.get('version')!r}")
        if (
            list(state.get("columns", ())) != list(assembler.columns)
            or bool(state.get("distinct")) != assembler.distinct
            or len(state.get("parts", ())) != len(assembler.parts)
        ):
            raise AssemblyError("the saved assembler state belongs to a different query")
        for i, saved in enumerate(state["parts"]):
            part = assembler.parts[i]
            if list(saved["columns"]) != [part.columns[k] for k in assembler._keep[i]]:
                raise AssemblyError("the saved assembler state belongs to a different query")
            counts = assembler._counts[i]
            for sub, count in saved["rows"]:
                if count > 0:
                    counts[tuple(int(v) for v in sub)] = int(count)
        return assembler


class GraphAssembler:
    """The answers of a ``GRAPH ?g`` query with several parts: per named graph, the product of the parts'
    rows *of that graph* (the parts join on ?g and on nothing else).  Each part's rows carry ?g first
    (``split_parts``); one :class:`Assembler` per graph multiplies them over the query with ?g bound, and its
    answers get ?g back where the query projects it.  Without ?g projected, the graphs' answers are a union:
    added up, or, under DISTINCT, counted per row over the graphs (a row in two graphs is one answer)."""

    def __init__(self, query: str | ParsedQuery) -> None:
        parsed = _parsed(query)
        graph = graph_variable(parsed)
        if graph is None:
            raise AssemblyError("not a GRAPH ?variable query: use Assembler")
        self.query = parsed
        self.parts: list[PartQuery] = split_parts(parsed)
        self.columns: tuple[str, ...] = _output_columns(parsed)
        self.distinct = parsed.distinct
        self._graph_at = self.columns.index(graph[1:]) if graph[1:] in self.columns else -1
        self._instance = graph_instance(parsed)  # (?g, no longer a variable there, is in none of its columns)
        self._graphs: dict[int, Assembler] = {}
        self._graph_counts: dict[Row, int] = {}  # DISTINCT without ?g: row -> graphs where it is an answer
        self._stale = False  # absorb() changed the graphs' answers: _graph_counts is rebuilt before use

    def _counting(self) -> bool:
        return self.distinct and self._graph_at < 0

    def _graph(self, graph: int) -> Assembler:
        found = self._graphs.get(graph)
        if found is None:
            found = self._graphs[graph] = Assembler(self._instance)
        return found

    def apply(self, deltas: list[tuple[int, int, tuple[int, ...]]]) -> list[tuple[int, tuple[int, ...]]]:
        """As :meth:`Assembler.apply` (the part deltas of one update: one quad, so one graph)."""
        by_graph: dict[int, list[tuple[int, int, tuple[int, ...]]]] = {}
        for part_index, diff, row in deltas:
            if not 0 <= part_index < len(self.parts):
                raise AssemblyError(f"no part {part_index}: the query has {len(self.parts)} parts")
            if len(row) != len(self.parts[part_index].columns):
                raise AssemblyError(f"a row of part {part_index} has {len(row)} values, its columns are "
                                    f"{self.parts[part_index].columns}")
            by_graph.setdefault(row[0], []).append((part_index, diff, tuple(row[1:])))
        if self._stale:
            self._rebuild()
        out: dict[Row, int] = {}
        at = self._graph_at
        counts = self._graph_counts
        for graph, items in by_graph.items():
            assembler = self._graph(graph)
            for diff, row in assembler.apply(items):
                if at >= 0:
                    row = row[:at] + (graph,) + row[at:]
                elif self._counting():
                    before = counts.get(row, 0)
                    after = before + diff
                    if after:
                        counts[row] = after
                    else:
                        del counts[row]
                    if (before > 0) == (after > 0):
                        continue  # still an answer in another graph, or still not one
                out[row] = out.get(row, 0) + diff
            if not assembler.state_entries():
                del self._graphs[graph]  # nothing of that graph is left
        result: list[tuple[int, tuple[int, ...]]] = []
        for row, count in out.items():
            result.extend([(1 if count > 0 else -1, row)] * abs(count))
        return result

    def absorb(self, part_index: int, diff: int, row: tuple[int, ...]) -> None:
        """As :meth:`Assembler.absorb` (a restore, in any order)."""
        self._graph(row[0]).absorb(part_index, diff, tuple(row[1:]))
        self._stale = self._counting()

    def _rebuild(self) -> None:
        counts: dict[Row, int] = {}
        for graph, assembler in list(self._graphs.items()):
            if not assembler.state_entries():
                del self._graphs[graph]
            for row in assembler.answers():
                counts[row] = counts.get(row, 0) + 1
        self._graph_counts = counts
        self._stale = False

    def state_entries(self) -> int:
        return sum(a.state_entries() for a in self._graphs.values()) + len(self._graph_counts)


def assembler_for(query: str | ParsedQuery) -> Assembler | GraphAssembler:
    """The assembler of a multi-part query: per named graph for a ``GRAPH ?g`` query."""
    parsed = _parsed(query)
    return Assembler(parsed) if graph_variable(parsed) is None else GraphAssembler(parsed)


__all__ = ["AssemblyError", "Assembler", "GraphAssembler", "PartQuery", "assembler_for", "needs_assembly",
           "split_parts"]
