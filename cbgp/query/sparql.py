"""SPARQL SELECT queries over a Basic Graph Pattern: parsing and scope checks.

rdflib's SPARQL parser does the parsing (it is well kept and gives line/column
on syntax errors); this module turns its algebra into a `ParsedQuery` and
rejects everything outside the supported fragment with one message naming the
construct and where it is.  The algebra carries no source positions, so
positions of unsupported constructs come from a small lexer over the query
text that skips IRIs, strings and comments.

Variables are strings starting with `?`.  Blank nodes in the query act as
variables that are never projected; they are named `?_:label`, which no SPARQL
variable name can collide with.  Constant terms are canonical strings
(`cbgp.terms`).
"""

from __future__ import annotations

import functools

import re
import threading
from dataclasses import dataclass, field

from cbgp.query.limits import patterns_problem, text_problem
from cbgp.terms import TermError, from_rdflib, iri, literal

BNODE_VAR_PREFIX = "?_:"


class QueryError(ValueError):
    """The query is invalid or outside the supported fragment.

    `line` and `column` are 1-based positions in the query text when known.
    """

    def __init__(self, message: str, line: int | None = None, column: int | None = None) -> None:
        self.message = message
        self.line = line
        self.column = column
        where = f" (line {line}, column {column})" if line is not None else ""
        super().__init__(message + where)


@dataclass(frozen=True)
class TriplePattern:
    s: str
    p: str
    o: str
    g: str | None = None  # constant named graph, None = the default graph

    def variables(self) -> tuple[str, ...]:
        out: list[str] = []
        for term in (self.s, self.o):
            if is_var(term) and term not in out:
                out.append(term)
        return tuple(out)

    def __str__(self) -> str:
        body = f"{self.s} {self.p} {self.o}"
        return f"GRAPH {self.g} {{ {body} }}" if self.g else body


@dataclass(frozen=True)
class ParsedQuery:
    text: str
    patterns: tuple[TriplePattern, ...]
    projected: tuple[str, ...]  # variable names without '?', in SELECT order
    distinct: bool
    select_star: bool
    variables: tuple[str, ...] = field(default=())  # every variable incl. blank-node ones, first-seen order


def is_var(term: str) -> bool:
    return term.startswith("?")


def is_bnode_var(term: str) -> bool:
    return term.startswith(BNODE_VAR_PREFIX)


# --- locating constructs in the text -------------------------------------------------------------

_LEX = re.compile(
    r"""(?P<comment>\#[^\n]*)
      | (?P<string>\"\"\"(?:[^\\]|\\.)*?\"\"\"|'''(?:[^\\]|\\.)*?'''|"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
      | (?P<iri><[^<>"{}|^`\\\s]*>)
      | (?P<var>[?$][A-Za-z0-9_\u00b7\u00c0-\uffff]+)
      | (?P<word>[A-Za-z_][A-Za-z0-9_\-]*(?::[A-Za-z0-9_\-.]*)?|:[A-Za-z0-9_\-.]*)
      | (?P<punct>[/|^*+(){}\[\].;,!=<>&@-])
      | (?P<other>\S)""",
    re.VERBOSE,
)


def sparql_tokens(text: str) -> list[tuple[str, str, int]]:
    return [(m.lastgroup or "", m.group(0), m.start()) for m in _LEX.finditer(text)]


def line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, column


def find_keyword(text: str, *words: str) -> tuple[int | None, int | None]:
    """Position of the first occurrence of the first of `words` (in priority order) that occurs."""
    tokens = [(value.upper(), offset) for kind, value, offset in sparql_tokens(text) if kind == "word"]
    for word in words:
        for value, offset in tokens:
            if value == word.upper():
                return line_col(text, offset)
    return None, None


def find_path_operator(text: str) -> tuple[int | None, int | None]:
    """Position of the first property-path operator inside the WHERE clause."""
    tokens = sparql_tokens(text)
    depth = 0
    previous = ""
    for kind, value, offset in tokens:
        if value == "{":
            depth += 1
        elif value == "}":
            depth -= 1
        elif depth > 0 and kind == "punct" and value in "/|^*+" and previous not in ("", "(", ","):
            return line_col(text, offset)
        elif depth > 0 and kind == "punct" and value == "^":
            return line_col(text, offset)
        previous = kind
    return None, None


def find_negated_inverse(text: str) -> tuple[int | None, int | None]:
    """Position of the first ``^`` inside a negated property set (``!^iri``, ``!( ... ^iri ... )``)."""
    tokens = sparql_tokens(text)
    for index, (kind, value, _offset) in enumerate(tokens):
        if kind != "punct" or value != "!":
            continue
        inside = tokens[index + 1:index + 2]
        if inside and inside[0][1] == "(":
            inside = []
            for token in tokens[index + 2:]:
                if token[1] == ")":
                    break
                inside.append(token)
        for _kind, found, offset in inside:
            if found == "^":
                return line_col(text, offset)
    return None, None


def _find_variable(text: str, name: str) -> tuple[int | None, int | None]:
    in_where = False
    for kind, value, offset in sparql_tokens(text):
        if value == "{":
            in_where = True
        if in_where and kind == "var" and value[1:] == name:
            return line_col(text, offset)
    return None, None


# Algebra node name -> (construct name for the message, keywords to locate it).
_UNSUPPORTED = {
    "Filter": ("FILTER", ("FILTER",)),
    "LeftJoin": ("OPTIONAL", ("OPTIONAL",)),
    "Union": ("UNION", ("UNION",)),
    "Minus": ("MINUS", ("MINUS",)),
    "Extend": ("BIND or a SELECT expression", ("BIND", "AS")),
    "Group": ("GROUP BY / aggregates", ("GROUP", "COUNT", "SUM", "MIN", "MAX", "AVG", "SAMPLE", "GROUP_CONCAT")),
    "AggregateJoin": ("aggregates", ("COUNT", "SUM", "MIN", "MAX", "AVG", "SAMPLE", "GROUP_CONCAT")),
    "OrderBy": ("ORDER BY", ("ORDER",)),
    "Slice": ("LIMIT / OFFSET", ("LIMIT", "OFFSET")),
    "values": ("VALUES", ("VALUES",)),
    "ToMultiSet": ("VALUES or a subquery", ("VALUES", "SELECT")),
    "ServiceGraphPattern": ("SERVICE", ("SERVICE",)),
    "Reduced": ("SELECT REDUCED", ("REDUCED",)),
    "Having": ("HAVING", ("HAVING",)),
}


def _reject(text: str, construct: str, keywords: tuple[str, ...]) -> QueryError:
    line, column = find_keyword(text, *keywords)
    return QueryError(
        f"{construct} is not supported: the query must be a SELECT whose WHERE clause is a basic graph "
        f"pattern (triple patterns, optionally inside GRAPH <iri>)",
        line,
        column,
    )


# rdflib's parser and algebra recurse once per bracket, per triple pattern of a group and per UNION branch.
TOO_DEEP = ("the query is too deep for the parser: too many triple patterns or UNION branches in one group, or "
            "brackets nested too deeply (CBGP_MAX_QUERY_NESTING); split it into smaller queries")


def parse_query(text: str, by_shape: bool = True) -> ParsedQuery:
    """Parse a SPARQL SELECT query with a BGP WHERE clause, or raise QueryError.  Cached per text (the result
    is immutable): a worker parses the same plans and parts again on every restore, at ~5 ms each.  ``by_shape``
    False: parse this text itself even when a query of the same shape was parsed (see `_by_shape`)."""
    check_text(text)
    shaped = _by_shape(text) if by_shape else None
    parsed = shaped if shaped is not None else _parse_query(text)
    too_many = patterns_problem(len(parsed.patterns))
    if too_many:
        raise QueryError(too_many)
    return parsed


def check_text(text: str) -> None:
    """Raise QueryError unless ``text`` is within the limits every parser needs (``cbgp.query.limits``)."""
    problem = text_problem(text, "query")
    if problem is not None:
        raise QueryError(problem.message, problem.line, problem.column)


# Queries that differ only in their constants (a subscription service's thousands of alerts) share one parse:
# absolute IRIs and plain short strings become placeholders, the template is parsed once (rdflib's parser costs
# ~2 ms a query), and the placeholders of its patterns are put back.  Anything else, and any template that is not
# a plain BGP with every placeholder a whole term of a pattern, takes the full parse of the text itself (which
# also gives the errors their positions).
_PLACEHOLDER = "x-cbgp-constant-"
_ABSOLUTE_IRI = re.compile(r"<[A-Za-z][A-Za-z0-9+.\-]*:[^<>\"{}|^`\\\x00-\x20]*>")
# (no tab or CR: rdflib's parser expands tabs to spaces by their column, inside strings too, and refuses a CR)
_PLAIN_STRING = re.compile(r"\"[^\"\\\n\r\t]*\"|'[^'\\\n\r\t]*'")


def _by_shape(text: str) -> ParsedQuery | None:
    if _PLACEHOLDER in text:
        return None
    tokens = sparql_tokens(text)
    pieces: list[str] = []
    constants: dict[str, str] = {}  # the placeholder's canonical term -> the constant's
    last = 0
    for index, (kind, value, offset) in enumerate(tokens):
        before = tokens[index - 1][1] if index else ""
        after = tokens[index + 1][1] if index + 1 < len(tokens) else ""
        if kind == "string" and "\t" in value:
            return None
        if kind == "iri" and _ABSOLUTE_IRI.fullmatch(value) and not before.endswith(":") \
                and before.upper() != "BASE":
            placeholder = f"<urn:{_PLACEHOLDER}{len(constants)}>"
            constants[placeholder] = iri(value[1:-1])
        elif kind == "string" and _PLAIN_STRING.fullmatch(value) and after not in ("@", "^"):
            placeholder = f'"{_PLACEHOLDER}{len(constants)}"'
            constants[placeholder] = literal(value[1:-1])
        else:
            continue
        pieces += [text[last:offset], placeholder]
        last = offset + len(value)
    if not constants:
        return None
    shape = _template(("".join(pieces) + text[last:]))
    if shape is None:
        return None
    used: set[str] = set()
    patterns: list[TriplePattern] = []
    for t in shape.patterns:
        terms = [t.s, t.p, t.o, t.g]
        for i, term in enumerate(terms):
            if term is not None and _PLACEHOLDER in term:
                if term not in constants:
                    return None
                used.add(term)
                terms[i] = constants[term]
        pattern = TriplePattern(*terms)
        if pattern not in patterns:  # a BGP is a set: two placeholders may stand for one constant
            patterns.append(pattern)
    if len(used) != len(constants):
        return None
    return ParsedQuery(text, tuple(patterns), shape.projected, shape.distinct, shape.select_star, shape.variables)


@functools.lru_cache(maxsize=1024)
def _template(text: str) -> ParsedQuery | None:
    """A template's parse, None if it is not a plain BGP SELECT (remembered too: an operator query's shape)."""
    try:
        return _parse_query(text)
    except QueryError:
        return None


@functools.lru_cache(maxsize=256)
def _rdflib_read(text: str) -> list:
    """``[parse, algebra]`` of ``text``, the algebra None until asked for.  One entry for both: rdflib's
    translation rewrites the parse it is given (its FILTERs are taken out of it), so a parse is translated once,
    in its own entry; two caches apart could forget the algebra first and translate the rewritten parse again."""
    from rdflib.plugins.sparql.parser import parseQuery

    return [parseQuery(text), None]


def rdflib_parse(text: str):  # noqa: ANN201
    """rdflib's parse of ``text``, once per text for `parse_query` and `cbgp.algebra.analyse` alike (rdflib takes
    about 1 ms a token, and an operator query is read by both); raises what rdflib raises.  Read only, and once
    `rdflib_algebra` has been made from it, only its prologue and its form's name."""
    return _rdflib_read(text)[0]


def rdflib_algebra(text: str):  # noqa: ANN201
    """rdflib's algebra of ``text`` (`translate_in_source_order`), once per text as `rdflib_parse`."""
    from rdflib.plugins.sparql.algebra import translateQuery

    entry = _rdflib_read(text)
    if entry[1] is None:
        entry[1] = translate_in_source_order(translateQuery, entry[0])
    return entry[1]


@functools.lru_cache(maxsize=1024)
def _parse_query(text: str) -> ParsedQuery:
    from pyparsing import ParseException

    try:
        parsed = rdflib_parse(text)
    except ParseException as exc:
        raise _syntax_error(text, (exc.lineno, exc.col)) from None
    except RecursionError:
        raise QueryError(TOO_DEEP) from None
    except Exception:  # rdflib raises assorted errors for bad prefixes etc.
        raise _syntax_error(text, None) from None
    check_prefixes(text)  # rdflib quietly knows foaf:, rdf:, xsd:, ...; SPARQL (and pyoxigraph) do not
    form = parsed[1].name
    if form != "SelectQuery":
        keyword = {"ConstructQuery": "CONSTRUCT", "AskQuery": "ASK", "DescribeQuery": "DESCRIBE"}.get(form, form)
        line, column = find_keyword(text, keyword)
        raise QueryError(f"{keyword} queries are not supported: only SELECT", line, column)
    try:
        algebra = rdflib_algebra(text)
    except RecursionError:
        raise QueryError(TOO_DEEP) from None
    except Exception as exc:
        raise QueryError(f"invalid query: {exc}") from None
    if algebra.get("datasetClause"):
        line, column = find_keyword(text, "FROM")
        raise QueryError("FROM / FROM NAMED dataset clauses are not supported", line, column)

    node = algebra["p"]
    distinct = False
    if node.name == "Distinct":
        distinct = True
        node = node["p"]
    if node.name in _UNSUPPORTED:
        raise _reject(text, *_UNSUPPORTED[node.name])
    if node.name != "Project":
        raise _reject(text, node.name, (node.name,))
    projected_vars = [str(v) for v in node["PV"]]
    inner = node["p"]
    if inner.name == "Extend" and _contains(inner, "AggregateJoin"):
        raise _reject(text, *_UNSUPPORTED["AggregateJoin"])
    patterns = _collect_patterns(text, inner, None)
    if not patterns:
        raise QueryError("the WHERE clause has no triple patterns")

    unique: list[TriplePattern] = []
    for pattern in patterns:  # a BGP is a set of triple patterns
        if pattern not in unique:
            unique.append(pattern)
    _check_graph_variable(text, unique)
    variables: list[str] = []
    for pattern in unique:
        for term in (pattern.s, pattern.o, pattern.g or ""):
            if is_var(term) and term not in variables:
                variables.append(term)
    select_star = _is_select_star(text)
    if select_star:
        projected = tuple(v[1:] for v in variables if not is_bnode_var(v))
    else:
        projected = tuple(projected_vars)
    return ParsedQuery(text, tuple(unique), projected, distinct, select_star, tuple(variables))


# --- syntax errors that name their cause ---------------------------------------------------------
# rdflib says where it gave up ("Expected SelectQuery"), rarely why; these checks find the usual causes
# first, in this order: an unterminated string or IRI, an unbalanced bracket, a malformed prologue or
# query form, an undeclared prefix.  Anything else is "unexpected <token>" at pyoxigraph's position (its
# parser reports the furthest point it reached, which is where the mistake is, more often than rdflib's).

_PN_CHARS = r"A-Za-z0-9_\-\u00b7\u00c0-\ufffd"
# A prefixed name's prefix (possibly empty) and its colon, not preceded by a name character, '?', '$',
# '@' or ':' (which would make it part of a variable, a blank node label `_:b`, a local name, ...).
_PNAME_RE = re.compile(rf"(?<![{_PN_CHARS}.:?$@])((?:[A-Za-z\u00c0-\ufffd](?:[{_PN_CHARS}.]*[{_PN_CHARS}])?)?):")
_PREFIX_DECL_RE = re.compile(rf"(?<![{_PN_CHARS}])PREFIX\s*$", re.IGNORECASE)
_SCHEME_RE = re.compile(r"<[A-Za-z][A-Za-z0-9+.\-]*:")
_OPENERS = {"}": "{", ")": "(", "]": "["}


def _masked(text: str) -> str:
    """``text`` with comments, string literals and IRIs blanked out (same length and line breaks)."""
    out = list(text)
    for kind, value, offset in sparql_tokens(text):
        if kind in ("comment", "string", "iri"):
            for i in range(offset, offset + len(value)):
                if out[i] != "\n":
                    out[i] = " "
    return "".join(out)


def _undeclared_prefix(text: str) -> QueryError | None:
    masked = _masked(text)
    declared: set[str] = set()
    for match in _PNAME_RE.finditer(masked):
        prefix = match.group(1)
        if _PREFIX_DECL_RE.search(masked, max(0, match.start() - 200), match.start()):
            declared.add(prefix)
        elif prefix not in declared:
            end = match.end()
            while end < len(masked) and (masked[end].isalnum() or masked[end] in "_-.:%\\"):
                end += 1
            name = masked[match.start():end].rstrip(".")
            return QueryError(f"undeclared prefix '{prefix}:' in {name} (declare it first: "
                              f"PREFIX {prefix}: <...>)", *line_col(text, match.start()))
    return None


def check_prefixes(text: str) -> None:
    error = _undeclared_prefix(text)
    if error is not None:
        raise error


def text_error(text: str) -> QueryError | None:
    """The usual causes of a syntax error that the text alone shows (an unterminated string or IRI, an unbalanced
    bracket, an undeclared prefix), for a query or an update request; None when it shows none."""
    error = functools.partial(_located, text)
    tokens = sparql_tokens(text)
    for index, (kind, value, offset) in enumerate(tokens):
        if kind == "other" and value in "\"'":
            before = tokens[index - 1] if index else None
            if before and before[0] == "string" and before[1] == value * 2 and before[2] + 2 == offset:
                offset = before[2]  # the opening of an unterminated long string
            return error("unterminated string literal", offset)
        if kind == "punct" and value == "<" and _SCHEME_RE.match(text, offset):
            return error("unterminated IRI: no '>' before the next space, quote or brace", offset)
    stack: list[tuple[str, int]] = []
    for kind, value, offset in tokens:
        if kind != "punct":
            continue
        if value in "{([":
            stack.append((value, offset))
        elif value in _OPENERS:
            if not stack:
                return error(f"unexpected '{value}' (nothing to close)", offset)
            opener, opened_at = stack.pop()
            if opener != _OPENERS[value]:
                line, column = line_col(text, opened_at)
                return error(f"unexpected '{value}' ('{opener}' at line {line}, column {column} is still open)",
                             offset)
    if stack:
        opener, opened_at = stack[-1]
        return error(f"'{opener}' is never closed", opened_at)
    return _undeclared_prefix(text)


def _located(text: str, message: str, offset: int | None = None,
             position: tuple[int, int] | None = None) -> QueryError:
    line, column = line_col(text, offset) if offset is not None else position or (None, None)
    return QueryError(f"SPARQL syntax error: {message}", line, column)


def _syntax_error(text: str, rdflib_position: tuple[int, int] | None) -> QueryError:
    """The error for a text rdflib could not parse, naming a cause where one can be told."""
    error = functools.partial(_located, text)
    tokens = sparql_tokens(text)
    found = text_error(text)
    if found is not None and "undeclared prefix" not in found.message:
        return found
    prologue = _prologue_error(tokens)
    if prologue is not None:
        message, offset = prologue
        return error(message, offset if offset is not None else len(text))
    if found is not None:
        return found
    # rdflib's position is the token it could not take, except that a triple it cannot complete is
    # reported at the triple's start (after '{' or '.'); there pyoxigraph's position (the furthest point
    # its parser reached) names the token, unless it ran on to the end of the text.
    offset = _offset(text, *rdflib_position) if rdflib_position else None
    previous = [v for k, v, o in tokens if k != "comment" and o < (offset or 0)][-1:]
    if offset is None or previous in (["{"], ["."]):
        ox_position = _oxigraph_position(text)
        ox_offset = _offset(text, *ox_position) if ox_position else None
        if ox_offset is not None and (offset or 0) < ox_offset < len(text.rstrip()):
            offset = ox_offset
    if offset is None:
        return error("the query could not be parsed")
    following = [(v, o) for k, v, o in tokens if k != "comment" and o + len(v) > offset]
    if not following:
        return error("unexpected end of query", len(text))
    value, at = following[0]
    shown = value if len(value) <= 40 else value[:37] + "..."
    return error(f"unexpected '{shown}'", at)


def _prologue_error(tokens: list[tuple[str, str, int]]) -> tuple[str, int | None] | None:
    """A malformed PREFIX / BASE declaration, or a query form that is not a SPARQL keyword."""
    rest = [t for t in tokens if t[0] != "comment"]
    i = 0

    def found(j: int) -> tuple[str, int | None]:
        return ("the end of the query", None) if j >= len(rest) else (repr(rest[j][1]), rest[j][2])

    while i < len(rest) and rest[i][1].upper() in ("PREFIX", "BASE"):
        keyword = rest[i][1].upper()
        if keyword == "PREFIX":
            if i + 1 >= len(rest) or rest[i + 1][0] != "word" or not rest[i + 1][1].endswith(":"):
                what, offset = found(i + 1)
                return f"PREFIX expects a name ending in ':' then an <IRI>, found {what}", offset
            i += 1
        if i + 1 >= len(rest) or rest[i + 1][0] != "iri":
            what, offset = found(i + 1)
            return f"{keyword} expects an <IRI>, found {what}", offset
        i += 2
    if i >= len(rest):
        return "the query has no SELECT", None
    if rest[i][1].upper() not in ("SELECT", "CONSTRUCT", "DESCRIBE", "ASK"):
        return f"expected PREFIX, BASE or SELECT, found {rest[i][1]!r}", rest[i][2]
    return None


def _oxigraph_position(text: str) -> tuple[int, int] | None:
    """Where pyoxigraph's SPARQL parser stops on ``text`` (1-based line and column), if it does."""
    try:
        import pyoxigraph
    except ImportError:  # pragma: no cover - a dependency, but only for better error positions
        return None
    try:
        pyoxigraph.Store().query(text)
    except SyntaxError as exc:
        match = re.match(r"error at (\d+):(\d+):", str(exc))
        if match:
            return int(match.group(1)), int(match.group(2))
    except Exception:  # noqa: BLE001 - an evaluation error means it parsed
        return None
    return None


def _offset(text: str, line: int, column: int) -> int | None:
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        return None
    return sum(len(ln) + 1 for ln in lines[: line - 1]) + min(max(column - 1, 0), len(lines[line - 1]))


_TRANSLATE_LOCK = threading.Lock()


def translate_in_source_order(translate, parsed):  # noqa: ANN001, ANN202
    """rdflib's algebra, with triple patterns in the order the query wrote them.

    rdflib sorts a BGP's triples for its own evaluator; we number patterns
    t0, t1, ... as written (as the papers do), so its reordering is switched off
    while translating.
    """
    from rdflib.plugins.sparql import algebra

    with _TRANSLATE_LOCK:
        original = algebra.reorderTriples
        algebra.reorderTriples = list
        try:
            return translate(parsed).algebra
        finally:
            algebra.reorderTriples = original


def _is_select_star(text: str) -> bool:
    tokens = sparql_tokens(text)
    for index, (kind, value, _offset) in enumerate(tokens):
        if kind == "word" and value.upper() == "SELECT":
            rest = [v for k, v, _ in tokens[index + 1 : index + 3]]
            return "*" in rest
    return False


def graph_variable(query: ParsedQuery) -> str | None:
    """The variable of the query's `GRAPH ?g` block, if it has one."""
    for pattern in query.patterns:
        if pattern.g is not None and is_var(pattern.g):
            return pattern.g
    return None


BOUND_GRAPH = "<urn:cbgp:bound-graph>"  # stands for one graph in a GRAPH ?g query's instance; never looked up


def graph_instance(query: ParsedQuery) -> ParsedQuery:
    """A ``GRAPH ?g`` query with its graph bound: every pattern in :data:`BOUND_GRAPH`, ``?g`` in a subject or
    object position that constant too, ``?g`` no longer a variable (it stays projected: each user gives it the
    graph's own value)."""
    var = graph_variable(query)

    def sub(value: str) -> str:
        return BOUND_GRAPH if value == var else value

    patterns = tuple(TriplePattern(sub(t.s), t.p, sub(t.o), BOUND_GRAPH) for t in query.patterns)
    return ParsedQuery(query.text, patterns, query.projected, query.distinct, query.select_star,
                       tuple(v for v in query.variables if v != var))


def _check_graph_variable(text: str, patterns: list[TriplePattern]) -> None:
    """`GRAPH ?g` is evaluated once per named graph, so every pattern must be inside that one block."""
    graph_vars = {p.g for p in patterns if p.g is not None and is_var(p.g)}
    if not graph_vars:
        return
    line, column = find_keyword(text, "GRAPH")
    if len(graph_vars) > 1:
        raise QueryError("only one GRAPH ?variable block per query is supported", line, column)
    if any(p.g is None or not is_var(p.g) for p in patterns):
        raise QueryError(
            "with GRAPH ?variable, every triple pattern must be inside that GRAPH block "
            "(patterns of the default graph or of other graphs beside it are not supported yet)",
            line,
            column,
        )


def _contains(node, name: str) -> bool:  # noqa: ANN001
    from rdflib.plugins.sparql.parserutils import CompValue

    if isinstance(node, CompValue):
        return node.name == name or any(_contains(v, name) for v in node.values())
    if isinstance(node, (list, tuple)):
        return any(_contains(v, name) for v in node)
    return False


def _collect_patterns(text: str, node, graph: str | None) -> list[TriplePattern]:  # noqa: ANN001
    name = node.name
    if name == "BGP":
        return [_pattern(text, triple, graph) for triple in node["triples"]]
    if name == "Join":
        return _collect_patterns(text, node["p1"], graph) + _collect_patterns(text, node["p2"], graph)
    if name == "Graph":
        from rdflib import Variable

        term = node["term"]
        if graph is not None:
            line, column = find_keyword(text, "GRAPH")
            raise QueryError("nested GRAPH blocks are not supported", line, column)
        if isinstance(term, Variable):
            return _collect_patterns(text, node["p"], "?" + str(term))
        return _collect_patterns(text, node["p"], from_rdflib(term))
    if name in _UNSUPPORTED:
        raise _reject(text, *_UNSUPPORTED[name])
    if name == "Project":  # a subquery
        raise _reject(text, "a subquery", ("SELECT",))
    raise _reject(text, name, (name,))


def _pattern(text: str, triple, graph: str | None) -> TriplePattern:  # noqa: ANN001
    from rdflib import BNode, Literal, URIRef, Variable

    s, p, o = triple
    if not isinstance(p, (URIRef, Variable)):
        line, column = find_path_operator(text)
        raise QueryError("property paths are not supported: use a single IRI as predicate", line, column)
    if isinstance(p, Variable):
        line, column = _find_variable(text, str(p))
        raise QueryError(f"a variable in predicate position (?{p}) is not supported", line, column)
    if isinstance(s, Literal):
        raise QueryError(f"a literal cannot be the subject of a triple pattern: {s!r}")

    def convert(term) -> str:  # noqa: ANN001
        if isinstance(term, Variable):
            return "?" + str(term)
        if isinstance(term, BNode):
            return BNODE_VAR_PREFIX + str(term)
        if isinstance(term, (URIRef, Literal)):
            try:
                return from_rdflib(term)
            except TermError as exc:
                raise QueryError(str(exc)) from None
        raise QueryError(f"unsupported term in a triple pattern: {term!r}")

    return TriplePattern(convert(s), convert(p), convert(o), graph)
