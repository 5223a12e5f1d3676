"""Split a SPARQL 1.1 Update request into operations, at the token level.

This is not a SPARQL parser: pyoxigraph parses and validates every request
(`cbgp.inputs.sparql_update` runs it on an empty store first).  This module only finds the
*structure* the delta extraction needs and that pyoxigraph does not expose: where
each operation starts and ends, its kind, the prologue (BASE/PREFIX) in force,
the graphs a graph-management operation names, and for DELETE/INSERT the WITH
graph, the template blocks (default graph or `GRAPH x { ... }`), the USING
clauses and the WHERE group, each kept as source text so that pyoxigraph
re-parses them with the same prologue and base.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOKEN_RE = re.compile(
    r"""
     (?P<ws>\s+)
    |(?P<comment>\#[^\n\r]*)
    |(?P<iri><[^<>"{}|^`\\\x00-\x20]*>)
    |(?P<string>\"\"\"(?:[^"\\]|\\.|"(?!""))*\"\"\"|'''(?:[^'\\]|\\.|'(?!''))*'''
                |"(?:[^"\\\n\r]|\\.)*"|'(?:[^'\\\n\r]|\\.)*')
    |(?P<var>[?$][\w\u00B7]+)
    |(?P<bnode>_:[\w.\-\u00B7]+)
    |(?P<word>(?:[^\s{}()\[\];,"'<>\#?$\\]|\\.)+)
    |(?P<punct>.)
    """,
    re.VERBOSE | re.DOTALL,
)

GRAPH_MANAGEMENT = ("CLEAR", "DROP", "CREATE", "ADD", "MOVE", "COPY", "LOAD")


class UpdateSyntaxError(ValueError):
    """The request does not have the shape of a SPARQL Update request."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


@dataclass(frozen=True)
class Token:
    kind: str  # iri | string | var | bnode | word | punct
    text: str
    start: int
    end: int

    @property
    def keyword(self) -> str:
        """Upper-cased text of a bare word (keywords are case-insensitive), else ''."""
        return self.text.upper() if self.kind == "word" and ":" not in self.text else ""


@dataclass(frozen=True)
class Block:
    """One block of a quad template: triples in the default graph or in `GRAPH graph { }`."""

    graph: str | None  # source text of the graph term (variable, IRI or prefixed name)
    text: str  # the triples, with blank-node labels replaced by variables
    variables: tuple[str, ...]  # every variable the block mentions, graph variable included


@dataclass
class Operation:
    index: int  # 1-based position in the request
    kind: str  # INSERT DATA | DELETE DATA | DELETE WHERE | MODIFY | one of GRAPH_MANAGEMENT
    prologue: str  # BASE / PREFIX declarations in force, as source text
    start: int  # source offsets of the operation, prologue excluded
    end: int
    text: str
    silent: bool = False
    source_graph: tuple[str, str | None] | None = None  # (DEFAULT|NAMED|ALL|GRAPH, iri text)
    target_graph: tuple[str, str | None] | None = None
    with_graph: str | None = None
    delete_blocks: list[Block] = field(default_factory=list)
    insert_blocks: list[Block] = field(default_factory=list)
    using: list[str] = field(default_factory=list)
    using_named: list[str] = field(default_factory=list)
    where: str | None = None
    bnode_variables: dict[str, str] = field(default_factory=dict)  # variable -> original bnode label


def tokenize(source: str) -> list[Token]:
    tokens: list[Token] = []
    for m in _TOKEN_RE.finditer(source):
        kind = m.lastgroup
        if kind in ("ws", "comment"):
            continue
        text, start = m.group(), m.start()
        if kind in ("word", "bnode") and text.endswith("."):
            # A prefixed name or bnode label never ends with '.': that dot ends the triple.
            stem = text.rstrip(".")
            if stem and stem != "_:":
                tokens.append(Token(kind, stem, start, start + len(stem)))
            for k in range(len(stem), len(text)):
                tokens.append(Token("punct", ".", start + k, start + k + 1))
            continue
        tokens.append(Token(kind, text, start, m.end()))  # type: ignore[arg-type]
    return tokens


def uses_keyword(tokens: list[Token], *keywords: str) -> bool:
    return any(t.keyword in keywords for t in tokens)


def line_column(source: str, offset: int) -> tuple[int, int]:
    line = source.count("\n", 0, offset) + 1
    return line, offset - (source.rfind("\n", 0, offset) + 1) + 1


def offset_of(source: str, line: int, column: int) -> int:
    lines = source.split("\n")
    return sum(len(x) + 1 for x in lines[: line - 1]) + column - 1


def split_request(source: str, tokens: list[Token]) -> list[Operation]:
    """The operations of a request, in order, with their structure."""
    match = _matching_braces(tokens)
    ops: list[Operation] = []
    prologue: list[str] = []
    i, n = 0, len(tokens)
    while i < n:
        i = _read_prologue(source, tokens, i, prologue)
        if i >= n:
            break
        end = _operation_end(tokens, i, match)
        op = _parse_operation(source, tokens, i, end, match, len(ops) + 1, "\n".join(prologue))
        ops.append(op)
        i = end
        if i < n:  # tokens[i] is the ';' separator
            if i + 1 < n and tokens[i + 1].text == ";":
                raise UpdateSyntaxError("two ';' with no operation between them", tokens[i + 1].start)
            i += 1
    return ops


def _matching_braces(tokens: list[Token]) -> dict[int, int]:
    stack: list[int] = []
    match: dict[int, int] = {}
    for k, t in enumerate(tokens):
        if t.kind == "punct" and t.text == "{":
            stack.append(k)
        elif t.kind == "punct" and t.text == "}":
            if not stack:
                raise UpdateSyntaxError("'}' without a matching '{'", t.start)
            match[stack.pop()] = k
    if stack:
        raise UpdateSyntaxError("'{' is never closed", tokens[stack[-1]].start)
    return match


def _read_prologue(source: str, tokens: list[Token], i: int, prologue: list[str]) -> int:
    while i < len(tokens) and tokens[i].keyword in ("BASE", "PREFIX"):
        width = 2 if tokens[i].keyword == "BASE" else 3
        last = tokens[min(i + width - 1, len(tokens) - 1)]
        if last.kind != "iri":
            raise UpdateSyntaxError(f"{tokens[i].keyword} must end with an <IRI>", last.start)
        prologue.append(source[tokens[i].start : last.end])
        i += width
    return i


def _operation_end(tokens: list[Token], i: int, match: dict[int, int]) -> int:
    while i < len(tokens) and tokens[i].text != ";":
        i = match[i] + 1 if tokens[i].text == "{" else i + 1
    return i


class _Cursor:
    """Reads the depth-0 tokens of one operation."""

    def __init__(self, tokens: list[Token], i: int, end: int, match: dict[int, int]) -> None:
        self.tokens, self.i, self.end, self.match = tokens, i, end, match

    def peek(self) -> Token | None:
        return self.tokens[self.i] if self.i < self.end else None

    def at(self, keyword: str) -> bool:
        t = self.peek()
        return t is not None and t.keyword == keyword

    def take(self, keyword: str | None = None) -> Token:
        t = self.peek()
        if t is None:
            last = self.tokens[self.end - 1]
            raise UpdateSyntaxError(f"operation ends early, expected {keyword or 'more'}", last.end)
        if keyword is not None and t.keyword != keyword:
            raise UpdateSyntaxError(f"expected {keyword}, found {t.text!r}", t.start)
        self.i += 1
        return t

    def iri(self) -> str:
        t = self.take()
        if t.kind == "iri" or (t.kind == "word" and ":" in t.text):
            return t.text
        raise UpdateSyntaxError(f"expected an IRI, found {t.text!r}", t.start)

    def group(self) -> tuple[int, int]:
        t = self.take()
        if t.text != "{":
            raise UpdateSyntaxError(f"expected '{{', found {t.text!r}", t.start)
        open_ = self.i - 1
        close = self.match[open_]
        self.i = close + 1
        return open_, close  # token indexes of '{' and '}'

    def done(self) -> None:
        t = self.peek()
        if t is not None:
            raise UpdateSyntaxError(f"unexpected {t.text!r} (missing ';' between operations?)", t.start)


def _parse_operation(
    source: str, tokens: list[Token], i: int, end: int, match: dict[int, int], index: int, prologue: str
) -> Operation:
    c = _Cursor(tokens, i, end, match)
    op = Operation(index, "", prologue, tokens[i].start, tokens[end - 1].end, source[tokens[i].start : tokens[end - 1].end])
    first = c.take()
    kw = first.keyword
    if kw in GRAPH_MANAGEMENT:
        op.kind = kw
        if c.at("SILENT"):
            c.take()
            op.silent = True
        if kw == "LOAD":
            op.source_graph = ("GRAPH", c.iri())
            if c.at("INTO"):
                c.take()
                c.take("GRAPH")
                op.target_graph = ("GRAPH", c.iri())
        elif kw == "CREATE":
            c.take("GRAPH")
            op.target_graph = ("GRAPH", c.iri())
        elif kw in ("CLEAR", "DROP"):
            op.target_graph = _graph_ref(c, ("DEFAULT", "NAMED", "ALL"), need_graph_keyword=True)
        else:  # ADD, MOVE, COPY
            op.source_graph = _graph_ref(c, ("DEFAULT",), need_graph_keyword=False)
            c.take("TO")
            op.target_graph = _graph_ref(c, ("DEFAULT",), need_graph_keyword=False)
        c.done()
        return op
    if kw in ("INSERT", "DELETE") and c.at("DATA"):
        c.take()
        op.kind = kw + " DATA"
        lo, hi = c.group()
        blocks = _template_blocks(source, tokens, lo, hi, match, op.bnode_variables)
        if kw == "INSERT":
            op.insert_blocks = blocks
        else:
            op.delete_blocks = blocks
        c.done()
        return op
    if kw == "DELETE" and c.at("WHERE"):
        c.take()
        op.kind = "DELETE WHERE"
        lo, hi = c.group()
        op.delete_blocks = _template_blocks(source, tokens, lo, hi, match, op.bnode_variables)
        op.where = source[tokens[lo].start : tokens[hi].end]
        c.done()
        return op
    if kw not in ("WITH", "DELETE", "INSERT"):
        raise UpdateSyntaxError(f"{first.text!r} does not start an update operation", first.start)
    op.kind = "MODIFY"
    c.i -= 1
    if c.at("WITH"):
        c.take()
        op.with_graph = c.iri()
    if c.at("DELETE"):
        c.take()
        op.delete_blocks = _template_blocks(source, tokens, *c.group(), match, op.bnode_variables)
    if c.at("INSERT"):
        c.take()
        op.insert_blocks = _template_blocks(source, tokens, *c.group(), match, op.bnode_variables)
    while c.at("USING"):
        c.take()
        if c.at("NAMED"):
            c.take()
            op.using_named.append(c.iri())
        else:
            op.using.append(c.iri())
    c.take("WHERE")
    lo, hi = c.group()
    op.where = source[tokens[lo].start : tokens[hi].end]
    c.done()
    return op


def _graph_ref(c: _Cursor, keywords: tuple[str, ...], *, need_graph_keyword: bool) -> tuple[str, str | None]:
    t = c.peek()
    if t is not None and t.keyword in keywords:
        c.take()
        return (t.keyword, None)
    if need_graph_keyword or c.at("GRAPH"):
        c.take("GRAPH")
    return ("GRAPH", c.iri())


def _template_blocks(
    source: str, tokens: list[Token], lo: int, hi: int, match: dict[int, int], bnode_vars: dict[str, str]
) -> list[Block]:
    """Blocks of the quad template between tokens[lo] == '{' and tokens[hi] == '}'."""
    blocks: list[Block] = []
    default_chunks: list[list[Token]] = [[]]
    i = lo + 1
    while i < hi:
        t = tokens[i]
        if t.keyword == "GRAPH":
            graph = tokens[i + 1]
            open_ = i + 2
            if open_ >= hi or tokens[open_].text != "{":
                raise UpdateSyntaxError("expected GRAPH <iri> { ... }", t.start)
            close = match[open_]
            blocks.append(_block(source, graph, tokens[open_ + 1 : close], bnode_vars))
            default_chunks.append([])
            i = close + 1
        else:
            default_chunks[-1].append(t)
            i += 1
    chunks = [_strip_dots(ch) for ch in default_chunks]
    chunks = [ch for ch in chunks if ch]
    if chunks:
        # Default-graph triples may be split by GRAPH blocks; join the pieces as one block.
        merged: list[Token] = []
        for ch in chunks:
            if merged:
                merged.append(Token("punct", ".", -1, -1))
            merged.extend(ch)
        blocks.insert(0, _block(source, None, merged, bnode_vars))
    return blocks


def _strip_dots(chunk: list[Token]) -> list[Token]:
    lo, hi = 0, len(chunk)
    while lo < hi and chunk[lo].text == ".":
        lo += 1
    while hi > lo and chunk[hi - 1].text == ".":
        hi -= 1
    return chunk[lo:hi]


def _block(source: str, graph: Token | None, body: list[Token], bnode_vars: dict[str, str]) -> Block:
    variables: list[str] = []
    if graph is not None and graph.kind == "var":
        variables.append(graph.text[1:])
    parts: list[str] = []
    for t in body:
        if t.kind == "bnode":
            # A labelled blank node stands for one fresh node per solution, shared by all
            # blocks of the template: bind it like a variable and mint the node ourselves.
            name = next((v for v, label in bnode_vars.items() if label == t.text), None)
            if name is None:
                name = f"__cbgp_bnode{len(bnode_vars)}"
                bnode_vars[name] = t.text
            parts.append("?" + name)
            variables.append(name)
        else:
            if t.kind == "var":
                variables.append(t.text[1:])
            parts.append(t.text)
    # Tokens are re-joined with newlines: any whitespace separates SPARQL tokens, and
    # comments were dropped by the tokenizer.
    return Block(None if graph is None else graph.text, "\n".join(parts), tuple(dict.fromkeys(variables)))
