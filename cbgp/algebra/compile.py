"""rdflib's SPARQL algebra -> a tree of incremental operators with BGP leaves.

`analyse(text)` tells a plain BGP SELECT (today's fast path, a `ParsedQuery`)
from a query that needs operators (`OperatorQuerySpec`), and rejects what is
still out of scope with one `QueryError` naming the construct, its line and
column.  `Builder` turns the algebra into operators against a term dictionary;
the BGP leaves it collects are registered in an `Engine` by the runtime
(`cbgp.algebra.continuous`), or evaluated by `PatternLeaf` when a pattern has a
variable predicate.

Filter push-down: a FILTER directly over a BGP has its conjuncts on the
variables of a single triple pattern attached to that pattern, and the runtime
drops a change before the engine when every pattern it could match rejects it,
so it costs no state (the FILTER still runs above: push-down only saves work).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from cbgp.algebra.aggregates import Aggregate
from cbgp.algebra.forms import Ask, Construct, TopK
from cbgp.algebra.leaf import PatternLeaf
from cbgp.algebra.paths import Closure, ZeroLength
from cbgp.algebra.operators import (Constant, Distinct, Extend, Filter, Join, Leaf, LeftJoin, Minus, Operator,
                                    Project, Union)
from cbgp.algebra.expressions import Terms, expression_variables, strict_comparisons
from cbgp.query.limits import patterns_problem
from cbgp.query.sparql import (check_text, BNODE_VAR_PREFIX, ParsedQuery, QueryError, TriplePattern, check_prefixes,
                         find_keyword, find_negated_inverse, parse_query, rdflib_algebra, rdflib_parse)
from cbgp.terms import TermError, from_rdflib

_NONDETERMINISTIC = {"Builtin_RAND": "RAND()", "Builtin_NOW": "NOW()", "Builtin_UUID": "UUID()",
                     "Builtin_STRUUID": "STRUUID()", "Builtin_BNODE": "BNODE()"}
_AGGREGATES = {"Aggregate_Count", "Aggregate_Sum", "Aggregate_Avg", "Aggregate_Min", "Aggregate_Max",
               "Aggregate_Sample", "Aggregate_GroupConcat"}


@dataclass
class OperatorQuerySpec:
    """A query that needs operators above its BGPs (rdflib's algebra, checked)."""

    text: str
    form: str  # SELECT, ASK or CONSTRUCT
    algebra: Any  # rdflib's query algebra (the `SelectQuery`/`AskQuery`/`ConstructQuery` node)
    columns: tuple[str, ...] = field(default=())
    prologue: Any = None  # rdflib's Prologue (base IRI and prefixes, for IRI() / STRDT(...))


def _subquery_projection(node: Any) -> list[str] | None:
    """The variables a subquery projects (None: not a subquery, or one with LIMIT/OFFSET, which is not per
    named graph once a graph variable is projected with it)."""
    while node is not None and getattr(node, "name", None) in ("Distinct", "Reduced", "OrderBy"):
        node = _opt(node, "p")
    if getattr(node, "name", None) != "Project":
        return None
    return [str(v) for v in _opt(node, "PV")]


@lru_cache(maxsize=512)
def analyse(text: str) -> ParsedQuery | OperatorQuerySpec:
    """A plain BGP SELECT as today (`ParsedQuery`), else a checked operator query; QueryError if neither.

    Cached by text: the result is only read (operators are built per registration).
    """
    check_text(text)  # before any parser: a text over the limits must not reach rdflib's below
    try:
        return parse_query(text)
    except QueryError as error:
        original = error
    try:
        parsed = rdflib_parse(text)  # (parse_query's, cached: rdflib reads a text once)
    except Exception:  # noqa: BLE001 - parse_query already said why, with its position (RecursionError too)
        raise original from None
    check_prefixes(text)
    try:
        algebra = rdflib_algebra(text)
    except Exception:  # noqa: BLE001
        raise original from None
    form = {"SelectQuery": "SELECT", "AskQuery": "ASK", "ConstructQuery": "CONSTRUCT"}.get(algebra.name)
    if form is None:
        keyword = "DESCRIBE" if algebra.name == "DescribeQuery" else algebra.name
        line, column = find_keyword(text, keyword)
        raise QueryError(f"{keyword} queries are not supported: only SELECT, ASK and CONSTRUCT", line, column)
    if _opt(algebra, "datasetClause"):
        line, column = find_keyword(text, "FROM")
        raise QueryError("FROM / FROM NAMED dataset clauses are not supported", line, column)
    strict_comparisons(algebra)
    spec = OperatorQuerySpec(text, form, algebra)
    try:
        from rdflib.plugins.sparql.algebra import translatePrologue

        spec.prologue = translatePrologue(parsed[0], None)
    except Exception:  # noqa: BLE001 - only IRI() and friends need the base
        spec.prologue = None
    builder = Builder(spec, Terms(_scratch_dictionary(), spec.prologue))
    builder.build_root()  # every check happens here, against a throwaway dictionary
    spec.columns = builder.columns
    return spec


# ``SELECT [DISTINCT|REDUCED] *`` outside strings, IRIs and comments.  Every alternative matches one way only (an
# IRI is whole or its "<" is a less-than; a comment runs to the end of its line): with a comment of any length
# allowed, a line holding many "#" made the search backtrack exponentially (0.3 s for a comment holding three).
_IRI_BODY = r"[^<>\"{}|^`\\\s]*"
_SELECT_STAR = re.compile(rf"^(?:[^\"'#<]|<{_IRI_BODY}>|<(?!{_IRI_BODY}>)|\"[^\"]*\"|'[^']*'|#[^\n]*(?![^\n]))*?"
                          r"\bSELECT\s+(?:(?:DISTINCT|REDUCED)\s+)?\*", re.IGNORECASE)


def _first_use(text: str, variable: str) -> tuple[int, str]:
    found = re.search(rf"[?$]{re.escape(variable)}(?![\w])", text)
    return (found.start() if found else len(text), variable)


def _opt(node: Any, key: str) -> Any:
    """An optional part of an algebra node (rdflib's CompValue.get returns the key itself when missing)."""
    return dict.get(node, key)


def _scratch_dictionary():  # noqa: ANN202
    from cbgp.terms import TermDictionary

    return TermDictionary()


def _reject(text: str, construct: str, *keywords: str, why: str = "") -> QueryError:
    line, column = find_keyword(text, *keywords) if keywords else (None, None)
    return QueryError(f"{construct} is not supported{': ' + why if why else ' in continuous queries'}",
                      line, column)


def _find_names(expr: Any, names: set[str] | dict) -> str | None:
    from rdflib.plugins.sparql.parserutils import CompValue

    if isinstance(expr, CompValue):
        if expr.name in names:
            return expr.name
        for key, value in expr.items():
            if key != "_vars":
                found = _find_names(value, names)
                if found:
                    return found
    elif isinstance(expr, (list, tuple)):
        for value in expr:
            found = _find_names(value, names)
            if found:
                return found
    return None


def expression_text(expr: Any) -> str:
    """A short readable form of an rdflib expression (for explain)."""
    from rdflib import Literal, URIRef, Variable
    from rdflib.plugins.sparql.parserutils import CompValue

    if isinstance(expr, Variable):
        return "?" + str(expr)
    if isinstance(expr, (URIRef, Literal)):
        return expr.n3()
    if isinstance(expr, CompValue):
        name = expr.name
        if "op" in expr and "other" in expr:
            ops = _opt(expr, "op") if isinstance(_opt(expr, "op"), list) else [_opt(expr, "op")] * len(
                _opt(expr, "other") if isinstance(_opt(expr, "other"), list) else [_opt(expr, "other")])
            others = _opt(expr, "other") if isinstance(_opt(expr, "other"), list) else [_opt(expr, "other")]
            text = expression_text(_opt(expr, "expr"))
            for op, other in zip(ops, others):
                text += f" {op} {expression_text(other)}"
            return text
        if name in ("ConditionalAndExpression", "ConditionalOrExpression"):
            op = " && " if name.startswith("ConditionalAnd") else " || "
            return op.join(expression_text(e) for e in [_opt(expr, "expr"), *_opt(expr, "other")])
        args = [expression_text(v) for k, v in expr.items() if k not in ("_vars",) and v is not None
                and not isinstance(v, CompValue) or (isinstance(v, CompValue) and k != "_vars")]
        label = name.replace("Builtin_", "").replace("Function", "")
        return f"{label}({', '.join(args)})"
    if isinstance(expr, list):
        return ", ".join(expression_text(e) for e in expr)
    return str(expr)


def _path_schema(s: Any, o: Any, graph: Any) -> tuple[str, ...]:
    """The variables a path's leaf binds: its ends' and the graph's, sorted."""
    from rdflib import Variable

    return tuple(sorted({str(t) for t in (s, o, graph) if isinstance(t, Variable)}))


@dataclass
class EngineLeaf:
    """A BGP registered in the engine: its operator, the query the engine gets and the pushed filters."""

    leaf: Leaf
    query: ParsedQuery
    pushed: dict[int, list] = field(default_factory=dict)  # pattern index -> [rdflib expression]


class Builder:
    """Builds the operator tree of one query; collects its leaves."""

    def __init__(self, spec: OperatorQuerySpec, terms: Terms, pushdown: bool = True) -> None:
        self.spec = spec
        self.text = spec.text
        self.terms = terms
        self.pushdown = pushdown
        self.engine_leaves: list[EngineLeaf] = []
        self.pattern_leaves: list[PatternLeaf] = []
        self.columns: tuple[str, ...] = ()
        self._graph_vars: list[str] = []  # a subquery's own graph variable, projected with it (see _ToMultiSet)
        self._fresh_count = 0
        self._patterns = 0  # triple patterns of its leaves so far (paths rewritten)

    # -- roots --

    def build_root(self) -> Operator:
        algebra = self.spec.algebra
        form = self.spec.form
        body = self.build(_opt(algebra, "p"), None)
        if form == "SELECT":
            self.columns = tuple(str(v) for v in _opt(algebra, "PV"))
            if _SELECT_STAR.search(self.text):  # rdflib's PV of SELECT * is a set: order of first appearance
                self.columns = tuple(sorted(self.columns, key=lambda v: _first_use(self.text, v)))
            return body
        if form == "ASK":
            self.columns = ()
            return Ask(body)
        template = _opt(algebra, "template")
        if template is None:  # CONSTRUCT WHERE { triples }
            node = _opt(algebra, "p")
            while node.name in ("Project", "Distinct", "Reduced"):
                node = _opt(node, "p")
            if node.name != "BGP":
                raise _reject(self.text, "CONSTRUCT WHERE with more than triple patterns", "WHERE")
            template = _opt(node, "triples")
        self.columns = ("subject", "predicate", "object")
        return Construct(body, [self._template_triple(t) for t in template], self.terms)

    def _template_triple(self, triple: tuple) -> tuple:
        from rdflib import BNode, Variable

        out = []
        for term in triple:
            if isinstance(term, Variable):
                out.append(("var", str(term)))
            elif isinstance(term, BNode):
                out.append(("bnode", str(term)))
            else:
                out.append(("term", self.terms.dictionary.encode(self._term(term))))
        return tuple(out)

    def _term(self, term: Any) -> str:
        try:
            return from_rdflib(term)
        except TermError as exc:
            raise QueryError(str(exc)) from None

    # -- patterns --

    def build(self, node: Any, graph: Any) -> Operator:
        name = node.name
        method = getattr(self, "_" + name, None)
        if method is None:
            keyword = {"ServiceGraphPattern": ("SERVICE", "SERVICE"), "DescribeQuery": ("DESCRIBE", "DESCRIBE")}
            construct, word = keyword.get(name, (name, name))
            raise _reject(self.text, construct, word)
        return method(node, graph)

    def _check_expr(self, expr: Any, keyword: str) -> None:
        found = _find_names(expr, _NONDETERMINISTIC)
        if found:
            word = _NONDETERMINISTIC[found][:-2]
            raise _reject(self.text, _NONDETERMINISTIC[found], word,
                          why="its value changes between evaluations, so its answers could not be retracted")

    def _BGP(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        from rdflib.paths import Path

        triples = []
        for triple in _opt(node, "triples"):
            if triple not in triples:
                triples.append(triple)
        if any(isinstance(p, Path) for _s, p, _o in triples):
            return self._path_bgp(triples, graph)
        return self._bgp(triples, graph)

    def _bgp(self, triples: list, graph: Any) -> Operator:
        from rdflib import BNode, Literal, URIRef, Variable

        if not triples:
            return Constant((), [()])
        self._count_patterns(len(triples))
        variables: list[str] = []

        def var(term: Any) -> str | None:
            if isinstance(term, Variable):
                return str(term)
            if isinstance(term, BNode):
                return BNODE_VAR_PREFIX[1:] + str(term)
            return None

        predicate_var = False
        for s, p, o in triples:
            if isinstance(s, Literal):
                # A literal subject never matches: the BGP has no solutions.
                names = sorted({v for t in triples for x in t if (v := var(x)) and not v.startswith("_:")})
                return Constant(tuple(names), [])
            if not isinstance(p, URIRef):
                predicate_var = True
            for term in (s, p, o):
                v = var(term)
                if v is not None and v not in variables:
                    variables.append(v)
        graph_var = graph if isinstance(graph, Variable) else None
        if graph_var is not None and str(graph_var) not in variables:
            variables.append(str(graph_var))
        schema = tuple(sorted(v for v in variables if not v.startswith("_:")))
        label = "BGP " + " . ".join(" ".join(self._show(t) for t in triple) for triple in triples)
        if graph is not None:
            label = f"GRAPH {self._show(graph)} {{ {label} }}"
        if predicate_var:
            patterns = []
            for triple in triples:
                spec = [("var", v) if (v := var(term)) is not None else self._end(term) for term in triple]
                patterns.append((*spec, self._graph_spec(graph)))
            leaf = PatternLeaf(schema, patterns, label)
            self.pattern_leaves.append(leaf)
            return leaf

        def convert(term: Any) -> str:
            v = var(term)
            if v is not None:
                return "?" + v
            return self._term(term)

        g = None if graph is None else ("?" + str(graph) if graph_var is not None else self._term(graph))
        patterns = tuple(TriplePattern(convert(s), convert(p), convert(o), g) for s, p, o in triples)
        query = ParsedQuery(self.text, patterns, schema, False, False, tuple("?" + v for v in variables))
        leaf = Leaf(schema, label)
        self.engine_leaves.append(EngineLeaf(leaf, query))
        return leaf

    def _count_patterns(self, count: int) -> None:
        """Count a leaf's triple patterns; QueryError as soon as the query has more than its limit."""
        self._patterns += count
        too_many = patterns_problem(self._patterns)
        if too_many:
            raise QueryError(too_many)

    def _end(self, term: Any) -> tuple:
        """A pattern position of an operator-layer leaf: ``("var", name)`` or ``("term", id)``."""
        from rdflib import Variable

        if isinstance(term, Variable):
            return ("var", str(term))
        return ("term", self.terms.dictionary.encode(self._term(term)))

    def _graph_spec(self, graph: Any) -> tuple:
        from rdflib import Variable

        if graph is None:
            return ("default", None)
        return ("named", str(graph)) if isinstance(graph, Variable) else self._end(graph)

    # -- property paths (the recursive ones: cbgp.algebra.paths) --

    def _fresh(self) -> Any:
        """A variable of our own (a step between two path elements), named apart from the query's."""
        from rdflib import Variable

        while True:
            self._fresh_count += 1
            name = f"_path{self._fresh_count}"
            if name not in self.text:
                return Variable(name)

    def _path_bgp(self, triples: list, graph: Any) -> Operator:
        """A BGP with property paths: sequences and inverses become triples over fresh variables, every other
        path an operator joined to them (``_path``), and the fresh variables are projected away.  Blank nodes
        become fresh variables too, so the join sees them."""
        from rdflib import BNode

        hidden: set[str] = set()

        def fresh() -> Any:
            variable = self._fresh()
            hidden.add(str(variable))
            return variable

        blanks: dict = {}

        def unblank(term: Any) -> Any:
            if isinstance(term, BNode) and term not in blanks:
                blanks[term] = fresh()
            return blanks.get(term, term)

        plain: list = []
        paths: list = []
        for s, p, o in triples:
            self._expand(unblank(s), p, unblank(o), plain, paths, fresh)
        ops = [self._bgp(plain, graph)] if plain else []
        ops.extend(self._path(s, p, o, graph) for s, p, o in paths)
        op = ops[0]
        for other in ops[1:]:
            op = Join(op, other)
        if hidden & set(op.schema):
            op = Project(op, [v for v in op.schema if v not in hidden])
        return op

    def _expand(self, s: Any, p: Any, o: Any, plain: list, paths: list, fresh: Any) -> None:
        """Sequence and inverse rewritten into triples (SPARQL's translation: a sequence is a join, so it keeps
        duplicates); any other path kept whole."""
        from rdflib.paths import InvPath, Path, SequencePath

        if isinstance(p, InvPath):
            self._expand(o, p.arg, s, plain, paths, fresh)
        elif isinstance(p, SequencePath):
            ends = [s, *(fresh() for _ in p.args[1:]), o]
            for index, step in enumerate(p.args):
                self._expand(ends[index], step, ends[index + 1], plain, paths, fresh)
        elif isinstance(p, Path):
            paths.append((s, p, o))
        else:
            plain.append((s, p, o))

    def _path(self, s: Any, path: Any, o: Any, graph: Any) -> Operator:
        """An alternative, negated property set or ``?``/``*``/``+`` path between ``s`` and ``o``: a set of
        pairs, as pyoxigraph answers (a negated set of one direction: one answer per triple)."""
        from rdflib import Variable
        from rdflib.paths import AlternativePath, MulPath, NegatedPath

        self._check_negated(path)
        label = f"{self._show(s)} {path.n3()} {self._show(o)}"
        if isinstance(path, AlternativePath):
            op = self._path_bgp([(s, path.args[0], o)], graph)
            for arg in path.args[1:]:
                op = Union(op, self._path_bgp([(s, arg, o)], graph))
            return Distinct(op)
        if isinstance(path, NegatedPath):
            excluded = frozenset(self.terms.dictionary.encode(self._term(arg)) for arg in path.args)
            self._count_patterns(1)
            leaf = PatternLeaf(_path_schema(s, o, graph), [(self._end(s), ("not", excluded), self._end(o),
                                                            self._graph_spec(graph))], "BGP " + label)
            self.pattern_leaves.append(leaf)
            return leaf
        if not isinstance(path, MulPath):
            raise _reject(self.text, f"the property path {path.n3()}", "(")
        graph_var = str(graph) if isinstance(graph, Variable) else None
        if path.mod == "?":
            return Distinct(Union(self._zero_length(s, o, graph, label), self._path_bgp([(s, path.path, o)], graph)))
        start, end = self._fresh(), self._fresh()
        step = self._path_bgp([(start, path.path, end)], graph)
        closure = Closure(step, str(start), str(end), self._end(s), self._end(o), graph_var, label)
        if path.mod == "+":
            return closure
        return Distinct(Union(self._zero_length(s, o, graph, label), closure))

    def _check_negated(self, path: Any) -> None:
        from rdflib import URIRef
        from rdflib.paths import NegatedPath

        if isinstance(path, NegatedPath) and not all(isinstance(arg, URIRef) for arg in path.args):
            line, column = find_negated_inverse(self.text)
            raise QueryError("an inverse IRI inside a negated property set (!^iri) is not supported: rdflib's "
                             "parser drops its IRI; write ^!iri, or !iri|^!iri for both directions", line, column)
        for inner in [*getattr(path, "args", ()), getattr(path, "arg", None), getattr(path, "path", None)]:
            if inner is not None and not isinstance(inner, URIRef):
                self._check_negated(inner)

    def _zero_length(self, s: Any, o: Any, graph: Any, label: str) -> Operator:
        self._count_patterns(1)
        leaf = ZeroLength(_path_schema(s, o, graph), self._end(s), self._end(o), self._graph_spec(graph), label)
        self.pattern_leaves.append(leaf)
        return leaf

    @staticmethod
    def _show(term: Any) -> str:
        from rdflib import Variable

        return "?" + str(term) if isinstance(term, Variable) else term.n3()

    def _Join(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        return Join(self.build(_opt(node, "p1"), graph), self.build(_opt(node, "p2"), graph))

    def _LeftJoin(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        expr = _opt(node, "expr")
        if expr is not None and getattr(expr, "name", None) == "TrueFilter":
            expr = None
        if expr is not None:
            self._check_expr(expr, "FILTER")
            if _find_names(expr, {"Builtin_EXISTS", "Builtin_NOTEXISTS"}):
                raise _reject(self.text, "EXISTS in the FILTER of an OPTIONAL", "EXISTS", why="not yet")
        return LeftJoin(self.build(_opt(node, "p1"), graph), self.build(_opt(node, "p2"), graph), expr, self.terms,
                        expression_text(expr) if expr is not None else None)

    def _Union(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        return Union(self.build(_opt(node, "p1"), graph), self.build(_opt(node, "p2"), graph))

    def _Minus(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        return Minus(self.build(_opt(node, "p1"), graph), self.build(_opt(node, "p2"), graph))

    def _Graph(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        return self.build(_opt(node, "p"), _opt(node, "term"))

    def _ToMultiSet(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        from rdflib import Variable

        inner = _opt(node, "p")
        projected = _subquery_projection(inner)
        if not isinstance(graph, Variable) or projected is None or str(graph) in projected:
            return self.build(inner, graph)
        # A subquery inside GRAPH ?g that does not project ?g: its own ?g is another variable (SPARQL's scoping).
        # It runs over each named graph under a fresh graph variable, projected with it, and that graph binds
        # the outer ?g.
        fresh = Variable(f"__graph{len(self._graph_vars)}")
        self._graph_vars.append(str(fresh))
        try:
            body = self.build(inner, fresh)
        finally:
            self._graph_vars.pop()
        body = Extend(body, str(graph), fresh, self.terms, f"?{fresh}")
        return Project(body, [v for v in body.schema if v != str(fresh)])

    def _values(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        from rdflib.term import Identifier

        rows = _opt(node, "res")
        names = sorted({str(v) for row in rows for v in row})
        encode = self.terms.dictionary.encode
        out = []
        for row in rows:
            by_name = {str(k): v for k, v in row.items()}
            out.append(tuple(encode(self._term(by_name[n])) if isinstance(by_name.get(n), Identifier) else None
                             for n in names))
        return Constant(tuple(names), out)

    def _Extend(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        self._check_expr(_opt(node, "expr"), "BIND")
        return Extend(self.build(_opt(node, "p"), graph), str(_opt(node, "var")), _opt(node, "expr"), self.terms,
                      expression_text(_opt(node, "expr")))

    def _Filter(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        expr = _opt(node, "expr")
        self._check_expr(expr, "FILTER")
        conjuncts = [expr]
        if getattr(expr, "name", None) == "ConditionalAndExpression":
            conjuncts = [_opt(expr, "expr"), *_opt(expr, "other")]
        exists = [c for c in conjuncts if getattr(c, "name", None) in ("Builtin_EXISTS", "Builtin_NOTEXISTS")]
        plain = [c for c in conjuncts if c not in exists]
        for c in plain:
            if _find_names(c, {"Builtin_EXISTS", "Builtin_NOTEXISTS"}):
                raise _reject(self.text, "EXISTS inside an expression", "EXISTS",
                              why="only FILTER [NOT] EXISTS { ... } (alone or in a conjunction) is")
        child = self.build(_opt(node, "p"), graph)
        if self.pushdown:
            for c in plain:
                self._push_into(child, c)
        op: Operator = child
        for c in exists:
            pattern, conditions = self._exists_pattern(c, graph, set(op.schema))
            op = Minus(op, pattern, exists=c.name == "Builtin_EXISTS", conditions=conditions, terms=self.terms)
        if plain:
            whole = expr if not exists else None
            if whole is None:
                for c in plain:
                    op = Filter(op, c, self.terms, expression_text(c))
            else:
                op = Filter(op, whole, self.terms, expression_text(whole))
        return op

    def _exists_pattern(self, expr: Any, graph: Any, outer: set[str]) -> tuple[Operator, tuple]:
        """The pattern of a FILTER [NOT] EXISTS, and the FILTERs at its top that read variables of the outer row
        it does not bind (evaluated on the outer row merged with each of its rows).

        Joining the outer row with the pattern's rows is what substituting the row into the pattern gives when
        every outer variable the pattern reads is bound wherever it is read: in each of its rows, and in the
        part under each FILTER, BIND or OPTIONAL inside.  A pattern that reads one elsewhere is refused."""
        from rdflib.plugins.sparql.algebra import translateGroupGraphPattern

        pattern = expr.graph  # attribute access: rdflib hands out the translated pattern
        if getattr(pattern, "name", None) in ("GroupGraphPatternSub", "SubSelect", "TriplesBlock"):
            pattern = translateGroupGraphPattern(pattern)
            strict_comparisons(pattern)
        pushdown, self.pushdown = self.pushdown, False  # (a FILTER reading an outer variable is not the leaf's)
        try:
            op = self.build(pattern, graph)
        finally:
            self.pushdown = pushdown
        conditions = []
        while isinstance(op, Filter) and (expression_variables(op.expr) & outer) - op.children[0].certain:
            conditions.append(op.expr)
            op = op.children[0]
        if (set(op.schema) & outer) - op.certain:
            raise _reject(self.text, "an EXISTS pattern that leaves a variable of the outer pattern unbound "
                          "(OPTIONAL or UNION inside EXISTS)", "EXISTS", why="not yet")
        for inner in op.walk():
            if isinstance(inner, Aggregate):
                raise _reject(self.text, "aggregates inside EXISTS", "EXISTS", why="not yet")
            reads: set[str] = set()
            if isinstance(inner, (Filter, Extend)):
                reads = expression_variables(inner.expr) | ({inner.var} if isinstance(inner, Extend) else set())
            elif isinstance(inner, LeftJoin):
                reads = set(inner.children[1].schema) | (expression_variables(inner.expr) if inner.expr is not None
                                                          else set())
            elif isinstance(inner, Minus):
                reads = set(inner.children[1].schema) | {v for c in inner.conditions for v in expression_variables(c)}
            if reads & outer and (reads & outer) - inner.children[0].certain:
                raise _reject(self.text, "a FILTER, BIND, OPTIONAL, MINUS or EXISTS inside EXISTS that reads a "
                              "variable of the outer pattern the part before it does not bind", "EXISTS",
                              why="not yet")
        return op, tuple(conditions)

    def _push_into(self, op: Operator, conjunct: Any) -> None:
        """Attach a FILTER conjunct to the engine BGP under `op` that binds all its variables for sure.

        Through a Join (either side) and the required side of an OPTIONAL the conjunct's variables keep the
        leaf's values in every solution, so a triple the conjunct rejects there cannot take part in an answer.
        """
        names = expression_variables(conjunct)
        if not names:
            return
        while True:
            if isinstance(op, Leaf):
                for engine_leaf in self.engine_leaves:
                    if engine_leaf.leaf is op:
                        self._push(engine_leaf, [conjunct])
                return
            if isinstance(op, LeftJoin) or (isinstance(op, Minus) and op.exists is not False):
                op = op.children[0]
            elif isinstance(op, (Minus, Filter, Extend, Distinct, Project)):  # rows keep the child's values
                op = op.children[0]
            elif isinstance(op, Join):
                left, right = op.children
                if names <= left.certain:
                    op = left
                elif names <= right.certain:
                    op = right
                else:
                    return
            else:
                return
            if not names <= op.certain:
                return

    def _push(self, engine_leaf: EngineLeaf, conjuncts: list) -> None:
        for c in conjuncts:
            names = expression_variables(c)
            if not names:
                continue
            for index, pattern in enumerate(engine_leaf.query.patterns):
                if pattern.g is not None and pattern.g.startswith("?"):
                    continue
                own = {t[1:] for t in (pattern.s, pattern.o) if t.startswith("?")}
                if names <= own and not any(n.startswith("_:") for n in names):
                    engine_leaf.pushed.setdefault(index, []).append(c)

    def _Project(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        keep = [str(graph)] if self._graph_vars and str(graph) == self._graph_vars[-1] else []
        return Project(self.build(_opt(node, "p"), graph), [str(v) for v in _opt(node, "PV")] + keep)

    def _Distinct(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        return Distinct(self.build(_opt(node, "p"), graph))

    def _Reduced(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        return self.build(_opt(node, "p"), graph)  # REDUCED may keep any number of duplicates: all of them

    def _OrderBy(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        # The answers are a multiset: without LIMIT/OFFSET the order changes none of them.
        for c in _opt(node, "expr"):
            self._check_expr(c, "ORDER")
        return self.build(_opt(node, "p"), graph)

    def _Slice(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        inner = _opt(node, "p")
        chain = []
        while inner.name in ("Project", "Distinct", "Reduced"):
            chain.append(inner)
            inner = _opt(inner, "p")
        conditions: list = []
        order_vars: set[str] = set()
        if inner.name == "OrderBy":
            for c in _opt(inner, "expr"):
                self._check_expr(c, "ORDER")
                if getattr(c, "name", None) == "OrderCondition":
                    conditions.append((_opt(c, "expr"), _opt(c, "order") == "DESC"))
                else:
                    conditions.append((c, False))
            order_vars = set().union(*(expression_variables(e) for e, _ in conditions)) if conditions else set()
            inner = _opt(inner, "p")
        start = int(_opt(node, "start") or 0)
        length = _opt(node, "length")
        length = None if length is None else int(length)
        projected = next((set(str(v) for v in _opt(n, "PV")) for n in chain if n.name == "Project"), None)
        distinct = any(n.name == "Distinct" for n in chain)
        body = self.build(inner, graph)
        if projected is None or order_vars <= projected:
            op = body
            for n in reversed(chain):
                op = Project(op, [str(v) for v in _opt(n, "PV")]) if n.name == "Project" else \
                    Distinct(op) if n.name == "Distinct" else op
            return TopK(op, conditions, start, length, self.terms)
        if distinct:
            raise _reject(self.text, "ORDER BY on a variable outside a SELECT DISTINCT with LIMIT/OFFSET", "ORDER",
                          why="the window of distinct rows would depend on rows not projected")
        op = TopK(body, conditions, start, length, self.terms)
        for n in reversed(chain):
            if n.name == "Project":
                op = Project(op, [str(v) for v in _opt(n, "PV")])
        return op

    def _AggregateJoin(self, node: Any, graph: Any) -> Operator:  # noqa: N802
        group = _opt(node, "p")
        if group.name != "Group":
            raise _reject(self.text, "aggregates", "GROUP")
        for a in _opt(node, "A"):
            if a.name not in _AGGREGATES:
                raise _reject(self.text, a.name, "GROUP")
            if a.vars != "*":
                self._check_expr(a.vars, "GROUP")
        exprs = _opt(group, "expr")
        for e in exprs or []:
            self._check_expr(e, "GROUP")
        return Aggregate(self.build(_opt(group, "p"), graph), list(exprs) if exprs else None, list(_opt(node, "A")), self.terms)

    def _Group(self, node: Any, graph: Any) -> Operator:  # noqa: N802 - GROUP BY without aggregates
        raise _reject(self.text, "GROUP BY without an aggregate", "GROUP")
