"""Extract the quads a SPARQL 1.1 Update request really inserts and deletes (Aguzzi & Roffia).

How it works: docs/design/internals.md, cbgp.inputs.sparql_update.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from itertools import islice
from typing import Callable, Iterable

import pyoxigraph as ox

from cbgp.inputs import update_syntax as syn
from cbgp.query.cost import cross_product
from cbgp.query.limits import limit, text_problem
from cbgp.query.sparql import text_error
from cbgp.terms import TermError, from_oxigraph

QuadKey = tuple[str, str, str, "str | None"]

_NS = "urn:x-cbgp-update:"
_VAR_NS = _NS + "var:"
_MARK_IRI = _NS + "graph"
_MARK = "<" + _MARK_IRI + ">"
_ERROR_AT = re.compile(r"error at (\d+):(\d+)")
_ABSOLUTE_IRI = re.compile(r"^<[A-Za-z][A-Za-z0-9+.\-]*:[^\\]*>$")
_CONST, _VAR, _BNODE = 0, 1, 2


# Format name of SPARQL 1.1 Update requests among the inputs (media type application/sparql-update).
UPDATE_FORMAT = "sparql-update"

# What one request may cost (named settings; the defaults protect a small machine).  A WHERE clause is evaluated
# by pyoxigraph, which cannot be interrupted, so the clause is checked before (no cross product unless allowed)
# and its solutions are counted and timed while they are read.
MAX_CHANGES_SETTING, DEFAULT_MAX_CHANGES = "CBGP_MAX_UPDATE_CHANGES", 100_000
MAX_SOLUTIONS_SETTING, DEFAULT_MAX_SOLUTIONS = "CBGP_MAX_UPDATE_SOLUTIONS", 1_000_000
MAX_SECONDS_SETTING, DEFAULT_MAX_SECONDS = "CBGP_MAX_UPDATE_SECONDS", 10
# Memory a WHERE clause read through ``isolate`` may take (ingest: above what its forked child started with)
MAX_MEMORY_SETTING, DEFAULT_MAX_MEMORY_MB = "CBGP_MAX_UPDATE_MEMORY_MB", 512
CROSS_PRODUCTS_SETTING = "CBGP_ALLOW_UPDATE_CROSS_PRODUCTS"


@dataclass(frozen=True)
class UpdateDelta:
    inserted: list[tuple[str, str, str, str | None]]  # (s, p, o, g) canonical N-Triples; g None = default graph
    deleted: list[tuple[str, str, str, str | None]]


class UpdateRequestError(ValueError):
    """A request was rejected; the store is unchanged.

    `operation` is the 1-based operation that failed (None when unknown),
    `line`/`column` locate syntax errors, `syntax` tells a syntax error from an
    operation that failed while running (e.g. CREATE of an existing graph).
    """

    def __init__(
        self,
        message: str,
        *,
        operation: int | None = None,
        line: int | None = None,
        column: int | None = None,
        syntax: bool = False,
    ) -> None:
        super().__init__(message)
        self.operation, self.line, self.column, self.syntax = operation, line, column, syntax


@dataclass
class _Undo:
    """What one operation changed, enough to revert it exactly."""

    deleted: list[ox.Quad]
    inserted: list[ox.Quad]
    created_graphs: list[ox.NamedNode | ox.BlankNode]
    dropped_graphs: list[ox.NamedNode | ox.BlankNode]


class UpdateExtractor:
    """Applies SPARQL 1.1 Update requests to `store` and reports their exact quad deltas.

    One extractor (one writer) per store: analysis and execution must see the same
    state, as SEPA's single update queue guarantees.

    ``isolate(where, base, dataset, most)``, when given, returns :func:`read_solutions` of the store as it is now,
    run elsewhere within bounds (ingest: in a child of bounded memory, killed at CBGP_MAX_UPDATE_SECONDS); a WHERE
    clause pyoxigraph may compute without bound before its first solution (:func:`may_run_away`) is read through
    it, as a list of solutions.
    """

    def __init__(self, store: ox.Store, isolate: Callable[[str, str | None, dict, int], tuple] | None = None) -> None:
        self._store = store
        self._scratch = ox.Store()  # never written: template parsing and IRI resolution query it
        self._isolate = isolate

    def apply(self, request: str, *, base: str | None = None) -> UpdateDelta:
        """Apply a SPARQL 1.1 Update request atomically; return exactly the quads it really inserted
        (absent before, present after) and deleted (present before, absent after). A quad deleted and
        re-inserted by the same request is in neither list. On any error the store is unchanged and
        UpdateRequestError is raised."""
        ops = self._analyse(request, base)
        inserted: dict[QuadKey, None] = {}
        deleted: dict[QuadKey, None] = {}
        done: list[_Undo] = []
        for op in ops:
            try:
                undo, op_deleted, op_inserted = self._run(op, base)
            except Exception as exc:
                # Undo operations 1..k-1 whatever went wrong, then say which operation failed.
                self._revert(done)
                if isinstance(exc, (UpdateRequestError, RuntimeError, OSError, ValueError, SyntaxError)):
                    raise UpdateRequestError(
                        f"operation {op.index} ({op.kind}) failed: {exc}; nothing was changed", operation=op.index
                    ) from exc
                raise
            done.append(undo)
            # Compose: a quad deleted then re-inserted (or the reverse) nets to no change.
            for key in op_deleted:
                if key in inserted:
                    del inserted[key]
                else:
                    deleted[key] = None
            for key in op_inserted:
                if key in deleted:
                    del deleted[key]
                else:
                    inserted[key] = None
        return UpdateDelta(inserted=list(inserted), deleted=list(deleted))

    # -- analysis -----------------------------------------------------------------

    def _analyse(self, request: str, base: str | None) -> list[syn.Operation]:
        """Validate the request and split it into operations; raise on anything we will not run."""
        problem = text_problem(request, "update")
        if problem is not None:
            raise UpdateRequestError(problem.message, line=problem.line, column=problem.column, syntax=True)
        tokens = syn.tokenize(request)
        unsupported = syn.uses_keyword(tokens, "LOAD", "SERVICE")
        if not unsupported:
            # pyoxigraph is the parser of record; on a new empty store this costs little
            # (a fresh store, because a cleared in-memory store keeps its history).
            try:
                ox.Store().update(request, base_iri=base)
            except SyntaxError as exc:
                cause = text_error(request)  # (what the text shows says more than the parser's expected tokens)
                if cause is not None and cause.line is not None:
                    offset = syn.offset_of(request, cause.line, cause.column)
                    raise _syntax_error(request, tokens, offset,
                                        cause.message.removeprefix("SPARQL syntax error: ")) from None
                m = _ERROR_AT.search(str(exc))
                if m is None:
                    raise UpdateRequestError(f"syntax error: {_one_line(str(exc))}", syntax=True) from None
                offset = syn.offset_of(request, int(m.group(1)), int(m.group(2)))
                raise _syntax_error(request, tokens, offset, str(exc)[m.end() :].lstrip(": ")) from None
            except ValueError as exc:
                raise UpdateRequestError(f"cannot parse the request: {exc}", syntax=True) from None
            except (RuntimeError, OSError):
                pass  # a run-time error on the empty store says nothing about the real one
        try:
            ops = syn.split_request(request, tokens)
        except syn.UpdateSyntaxError as exc:
            raise _syntax_error(request, tokens, exc.offset, str(exc)) from None
        service_at = [t.start for t in tokens if t.keyword == "SERVICE"] if unsupported else []
        for op in ops:
            if op.kind == "LOAD":
                raise UpdateRequestError(
                    f"operation {op.index}: LOAD is not supported (the processor never dereferences URLs); "
                    "send the document's triples as INSERT DATA instead",
                    operation=op.index,
                )
            if any(op.start <= offset < op.end for offset in service_at):
                raise UpdateRequestError(
                    f"operation {op.index}: SERVICE is not supported in updates (the processor never calls "
                    "remote endpoints); put the remote data in the store first",
                    operation=op.index,
                )
        return ops

    # -- execution ----------------------------------------------------------------

    def _run(self, op: syn.Operation, base: str | None) -> tuple[_Undo, list[QuadKey], list[QuadKey]]:
        if op.kind in syn.GRAPH_MANAGEMENT:
            return self._run_graph_management(op, base)
        return self._run_templates(op, base)

    def _run_templates(self, op: syn.Operation, base: str | None) -> tuple[_Undo, list[QuadKey], list[QuadKey]]:
        store = self._store
        with_graph = self._resolve(op, op.with_graph, base) if op.with_graph else ox.DefaultGraph()
        delete_template = self._parse_template(op, op.delete_blocks, with_graph, base)
        insert_template = self._parse_template(op, op.insert_blocks, with_graph, base)
        if op.where is None:  # INSERT DATA / DELETE DATA: one empty solution
            solutions: Iterable[ox.QuerySolution | None] = (None,)
        else:
            where = self._where_query(op)
            self._check_cost(op, where, base)
            dataset = self._dataset(op, with_graph, base)
            if self._isolate is not None and may_run_away(op.where):
                solutions = self._isolated_solutions(op, where, base, dataset)
            else:
                solutions = store.query(where, base_iri=base, **dataset)
        to_delete: dict[ox.Quad, None] = {}
        to_insert: dict[ox.Quad, None] = {}
        max_changes = limit(MAX_CHANGES_SETTING, DEFAULT_MAX_CHANGES)
        max_solutions = limit(MAX_SOLUTIONS_SETTING, DEFAULT_MAX_SOLUTIONS)
        deadline = time.monotonic() + limit(MAX_SECONDS_SETTING, DEFAULT_MAX_SECONDS)
        for count, solution in enumerate(solutions, 1):
            if delete_template:
                _instantiate(delete_template, solution, to_delete)
            if insert_template:
                _instantiate(insert_template, solution, to_insert)
            if len(to_delete) + len(to_insert) > max_changes:
                raise UpdateRequestError(f"it would make more than {max_changes:,} changes "
                                         f"({MAX_CHANGES_SETTING}); split the request", operation=op.index)
            if count > max_solutions or (count % 1024 == 0 and time.monotonic() > deadline):
                raise UpdateRequestError(f"its WHERE clause has more than {count - 1:,} solutions "
                                         f"or ran past {MAX_SECONDS_SETTING}; make it more selective",
                                         operation=op.index)
        # Presence is judged on the state before this operation; deletes apply before inserts.
        deleted = [q for q in to_delete if q not in to_insert and q in store]
        inserted = [q for q in to_insert if q not in store]
        deleted_keys, inserted_keys = _keys(deleted), _keys(inserted)  # before writing: may reject a term
        created = {
            q.graph_name: None
            for q in inserted
            if not isinstance(q.graph_name, ox.DefaultGraph) and not store.contains_named_graph(q.graph_name)
        }
        undo = _Undo(deleted, inserted, list(created), [])
        try:
            for q in deleted:
                store.remove(q)
            if inserted:
                store.extend(inserted)
        except Exception:
            self._revert([undo])  # this operation's own partial writes
            raise
        return undo, deleted_keys, inserted_keys

    def _run_graph_management(
        self, op: syn.Operation, base: str | None
    ) -> tuple[_Undo, list[QuadKey], list[QuadKey]]:
        store = self._store
        graphs = self._graphs_touched(op, base)
        named = [g for g in graphs if not isinstance(g, ox.DefaultGraph)]
        if op.kind == "CREATE":
            named.append(self._resolve(op, op.target_graph[1], base))  # type: ignore[index]
        existed = {g: store.contains_named_graph(g) for g in named}
        before = _read_graphs(store, graphs)
        store.update(op.prologue + "\n" + op.text, base_iri=base)
        after = _read_graphs(store, graphs)
        # Lists in store order, so that the same request always reports the same order.
        before_set, after_set = set(before), set(after)
        deleted = [q for q in before if q not in after_set]
        inserted = [q for q in after if q not in before_set]
        undo = _Undo(
            deleted,
            inserted,
            [g for g, was in existed.items() if not was and store.contains_named_graph(g)],
            [g for g, was in existed.items() if was and not store.contains_named_graph(g)],
        )
        try:
            return undo, _keys(deleted), _keys(inserted)
        except UpdateRequestError:
            self._revert([undo])
            raise

    def _graphs_touched(self, op: syn.Operation, base: str | None) -> list[ox.NamedNode | ox.BlankNode | ox.DefaultGraph]:
        """The graphs whose content the operation can change (Algorithm 2's target/source graphs)."""
        refs = []
        if op.kind == "MOVE":
            refs.append(op.source_graph)
        if op.kind != "CREATE":
            refs.append(op.target_graph)
        graphs: dict = {}
        for kind, text in refs:  # type: ignore[misc]
            if kind == "DEFAULT":
                graphs[ox.DefaultGraph()] = None
            elif kind == "GRAPH":
                graphs[self._resolve(op, text, base)] = None
            else:  # NAMED or ALL
                graphs.update(dict.fromkeys(self._store.named_graphs()))
                if kind == "ALL":
                    graphs[ox.DefaultGraph()] = None
        return list(graphs)

    def _parse_template(
        self, op: syn.Operation, blocks: list[syn.Block], with_graph: ox.NamedNode | ox.DefaultGraph, base: str | None
    ) -> list[tuple]:
        """Template quads, each position (kind, value): a constant term, a variable name or a bnode key."""
        template: list[tuple] = []
        for number, block in enumerate(blocks):
            graph = block.graph if block.graph is not None else _MARK
            values = ""
            if block.variables:
                names = " ".join("?" + v for v in block.variables)
                sentinels = " ".join(f"<{_VAR_NS}{v}>" for v in block.variables)
                values = f"VALUES ({names}) {{ ({sentinels}) }}"
            query = f"{op.prologue}\nCONSTRUCT {{\n{_MARK} {_MARK} {graph} .\n{block.text}\n}} WHERE {{ {values} }}"
            triples = list(self._scratch.query(query, base_iri=base))
            graph_term: tuple = (_CONST, with_graph)  # default-graph block: the WITH graph if any
            marks = [t for t in triples if t.subject.value == _MARK_IRI and t.predicate.value == _MARK_IRI]
            if block.graph is not None:
                graph_term = _template_term(marks[0].object, number, op.bnode_variables)
            for t in triples:
                if t.subject.value == _MARK_IRI and t.predicate.value == _MARK_IRI:
                    continue
                template.append(
                    (
                        _template_term(t.subject, number, op.bnode_variables),
                        _template_term(t.predicate, number, op.bnode_variables),
                        _template_term(t.object, number, op.bnode_variables),
                        graph_term,
                    )
                )
        return template

    def _isolated_solutions(self, op: syn.Operation, where: str, base: str | None, dataset: dict) -> list[_Solution]:
        """The WHERE clause's solutions read through ``isolate``: at most the solution limit plus one (the caller
        refuses that many), each a mapping that answers None for an unbound variable, as pyoxigraph's do."""
        outcome = self._isolate(where, base, dataset, limit(MAX_SOLUTIONS_SETTING, DEFAULT_MAX_SOLUTIONS) + 1)
        if outcome[0] != "ok":
            raise RuntimeError(outcome[1])
        return outcome[1]

    def _check_cost(self, op: syn.Operation, where: str, base: str | None) -> None:
        """Refuse a WHERE clause that is a cross product (parts sharing no variable: |G|^k solutions, which
        pyoxigraph could spend hours on before the first) unless the fleet allows them."""
        if limit(CROSS_PRODUCTS_SETTING, 0):
            return
        from rdflib.plugins.sparql import prepareQuery

        try:
            product = cross_product(prepareQuery(where, base=base).algebra)
        except Exception:  # noqa: BLE001 - pyoxigraph is the parser of record; it already took the request
            return
        if product:
            raise UpdateRequestError(f"its WHERE clause is a cross product of {product} (no "
                                     f"shared variable): refused unless {CROSS_PRODUCTS_SETTING}=1",
                                     operation=op.index)

    def _where_query(self, op: syn.Operation) -> str:
        # USING / USING NAMED define the WHERE dataset exactly as FROM / FROM NAMED do.
        dataset = "".join(f"FROM {g}\n" for g in op.using) + "".join(f"FROM NAMED {g}\n" for g in op.using_named)
        return f"{op.prologue}\nSELECT *\n{dataset}WHERE {op.where}"

    def _dataset(self, op: syn.Operation, with_graph: ox.NamedNode | ox.DefaultGraph, base: str | None) -> dict:
        # WITH sets the WHERE default graph only when no USING clause overrides it;
        # the named graphs stay all of the store's.
        if op.with_graph and not op.using and not op.using_named:
            return {"default_graph": with_graph}
        return {}

    def _resolve(self, op: syn.Operation, text: str | None, base: str | None) -> ox.NamedNode:
        """The IRI a source IRI or prefixed name denotes under the operation's prologue and base."""
        assert text is not None
        if _ABSOLUTE_IRI.match(text):
            return ox.NamedNode(text[1:-1])
        solutions = self._scratch.query(f"{op.prologue}\nSELECT ?x WHERE {{ BIND({text} AS ?x) }}", base_iri=base)
        for solution in solutions:
            if isinstance(solution["x"], ox.NamedNode):
                return solution["x"]
        raise UpdateRequestError(f"cannot resolve the graph IRI {text}", operation=op.index)

    def _revert(self, done: list[_Undo]) -> None:
        """Undo operations in reverse order, so each sees the state it produced."""
        store = self._store
        for undo in reversed(done):
            for q in undo.inserted:
                store.remove(q)
            if undo.deleted:
                store.extend(undo.deleted)
            for g in undo.created_graphs:
                if store.contains_named_graph(g):
                    store.remove_graph(g)
            for g in undo.dropped_graphs:
                store.add_graph(g)


def _syntax_error(request: str, tokens: list[syn.Token], offset: int, detail: str) -> UpdateRequestError:
    """One line: where (line, column, operation, the text there) and what the parser expected."""
    line, column = syn.line_column(request, offset)
    # Operation number = separators ';' at brace depth 0 before the error, plus one.
    depth, index = 0, 1
    for t in tokens:
        if t.start >= offset:
            break
        if t.text == "{":
            depth += 1
        elif t.text == "}":
            depth -= 1
        elif t.text == ";" and depth == 0:
            index += 1
    # Quote from the start of the token the parser stopped in (it reports its furthest position).
    start = next((t.start for t in reversed(tokens) if t.start <= offset < t.end), offset)
    near = _one_line(request[start : start + 30]) or "end of request"
    expected = _one_line(detail)
    if len(expected) > 80:  # a list of character ranges says nothing to a reader
        expected = "unexpected text"
    return UpdateRequestError(
        f"syntax error at line {line}, column {column} (operation {index}) near {near!r}: {expected}",
        operation=index,
        line=line,
        column=column,
        syntax=True,
    )


def _one_line(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _template_term(term, block: int, bnode_variables: dict[str, str]) -> tuple:  # noqa: ANN001
    if isinstance(term, ox.NamedNode) and term.value.startswith(_VAR_NS):
        name = term.value[len(_VAR_NS) :]
        return (_BNODE, name) if name in bnode_variables else (_VAR, name)
    if isinstance(term, ox.BlankNode):  # [] or ( ... ) in the template: local to its block
        return (_BNODE, (block, term.value))
    return (_CONST, term)


def read_solutions(store: ox.Store, where: str, base: str | None, dataset: dict, most: int) -> tuple:
    """``("ok", solutions)``: at most ``most`` solutions of the WHERE query ``where`` over ``store``, each a mapping
    that answers None for an unbound variable, as pyoxigraph's do (picklable: read in one process, used in
    another); ``("error", one line)`` when pyoxigraph refuses it."""
    try:
        result = store.query(where, base_iri=base, **dataset)
        names = [v.value for v in result.variables]
        return ("ok", [_Solution((n, s[n]) for n in names) for s in islice(result, most)])
    except (RuntimeError, OSError, ValueError, SyntaxError) as exc:
        return ("error", f"{type(exc).__name__}: {exc}")


class _Solution(dict):
    """A WHERE solution read in another process: None for a variable it leaves unbound, as pyoxigraph's."""

    def __missing__(self, _name: str) -> None:
        return None


# What may make pyoxigraph compute without bound before a WHERE clause's first solution: a closure (`*`, `+`),
# a subquery, an aggregate, GROUP BY or ORDER BY.  Plain patterns stream their solutions, which the solution and
# time limits bound as they come.
_RUNAWAY_WORDS = frozenset({"SELECT", "GROUP", "ORDER", "COUNT", "SUM", "MIN", "MAX", "AVG", "SAMPLE",
                            "GROUP_CONCAT"})


def may_run_away(where: str) -> bool:
    """Whether a WHERE clause has one of the constructs above (``*`` and ``+`` in an expression count too)."""
    return any(t.keyword in _RUNAWAY_WORDS or (t.kind == "word" and ("*" in t.text or "+" in t.text))
               for t in syn.tokenize(where))


def _instantiate(template: list[tuple], solution: ox.QuerySolution | None, out: dict[ox.Quad, None]) -> None:
    """Add the quads `template` yields for one solution; skip ill-formed ones as the spec says."""
    fresh: dict = {}
    for quad in template:
        terms = []
        for kind, value in quad:
            if kind == _CONST:
                terms.append(value)
            elif kind == _VAR:
                bound = solution[value] if solution is not None else None
                if bound is None:
                    break  # an unbound variable drops the triple
                terms.append(bound)
            else:
                node = fresh.get(value)
                if node is None:
                    node = fresh[value] = ox.BlankNode()
                terms.append(node)
        else:
            s, p, o, g = terms
            if (
                isinstance(s, (ox.NamedNode, ox.BlankNode))
                and isinstance(p, ox.NamedNode)
                and isinstance(o, (ox.NamedNode, ox.BlankNode, ox.Literal))
                and isinstance(g, (ox.NamedNode, ox.BlankNode, ox.DefaultGraph))
            ):
                out[ox.Quad(s, p, o, g)] = None


def _read_graphs(store: ox.Store, graphs: list) -> list[ox.Quad]:
    quads: list[ox.Quad] = []
    for g in graphs:
        quads.extend(store.quads_for_pattern(None, None, None, g))
    return quads


def _keys(quads: list[ox.Quad]) -> list[QuadKey]:
    try:
        return [
            (
                from_oxigraph(q.subject),
                from_oxigraph(q.predicate),
                from_oxigraph(q.object),
                None if isinstance(q.graph_name, ox.DefaultGraph) else from_oxigraph(q.graph_name),
            )
            for q in quads
        ]
    except TermError as exc:
        raise UpdateRequestError(f"unsupported term (RDF 1.2 triple terms are not supported): {exc}") from None


def check_request(request: str, *, base: str | None = None) -> None:
    """Raise :class:`UpdateRequestError` if ``request`` would be refused whatever the graph holds (syntax,
    LOAD, SERVICE): the checks ingest makes before running a request, without a graph (``cbgp publish``)."""
    UpdateExtractor(ox.Store())._analyse(request, base)
