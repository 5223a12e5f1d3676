"""The RSP-QL window clause of a query's text: `parse_rspql` strips one `FROM NAMED WINDOW :w ON :stream
[RANGE r STEP s]` declaration and the matching `WINDOW :w { ... }` block, leaving plain SPARQL for
`cbgp.query.sparql.parse_query` at the same line/column positions.

`[RANGE r]` is tumbling, `[RANGE r EVENT]` (or `[RANGE r STEP s EVENT]`) the per-event model.  The stream
name is checked but not used: a job reads one stream.  The window found is a `cbgp.windows.spec.WindowSpec`;
`cbgp.windows.windowed` evaluates it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cbgp.windows.spec import WindowError, WindowSpec, parse_duration

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


def line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def parse_rspql(text: str) -> tuple[str, WindowSpec | None]:
    """Split an RSP-QL query into plain SPARQL (same positions) and its window; no window -> (text, None)."""
    if "window" not in text.lower():  # no keyword can be there: spare the lexer (thousands of registrations)
        return text, None
    tokens = _lex(text)

    def error(message: str, token: _Token | None) -> WindowError:
        offset = token.start if token is not None else len(text)
        return WindowError(message, *line_col(text, offset))

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
    # Everything else in the WHERE group must be separators or SERVICE clauses (background data, not windowed:
    # cbgp.windows.windowed): nothing else may be evaluated outside the window.
    where_open = max(k for k in range(tokens.index(window_tok)) if tokens[k].value == "{" and tokens[k].depth == 0)
    window_index = tokens.index(window_tok)
    k = where_open + 1
    while k < len(tokens):
        tok = tokens[k]
        if tok.depth == 0:
            break
        if window_index <= k <= close_index or tok.value == ".":
            k += 1
            continue
        if tok.word == "SERVICE" and tok.depth == 1:
            if spec.kind == "event":
                raise error("SERVICE is not supported in a per-event window (an event is a set of triples)", tok)
            brace = next((j for j in range(k + 1, len(tokens)) if tokens[j].value == "{"), None)
            end = None if brace is None else next(
                (j for j in range(brace + 1, len(tokens)) if tokens[j].value == "}"
                 and tokens[j].depth == tokens[brace].depth), None)
            if end is not None:
                k = end + 1
                continue
        if tok.word in ("FILTER", "BIND") and tok.depth == 1 and at(k + 1) is not None and at(k + 1).value != "{":
            end = _parenthesised_end(tokens, k + 1)  # an expression over the window's and the SERVICE's variables
            if end is not None:
                k = end + 1
                continue
        raise error(f"patterns outside the WINDOW block are not supported: found {tok.value!r}; put every "
                    f"pattern inside WINDOW <{name}> {{ ... }} (SERVICE clauses, FILTER and BIND may stay outside)",
                    tok)
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


def _parenthesised_end(tokens: list[_Token], j: int) -> int | None:
    """The index of the ')' closing the first '(' at or after token ``j`` (a FILTER's or BIND's expression,
    ``FILTER regex(...)`` included); None when there is none before a brace."""
    depth = 0
    for k in range(j, len(tokens)):
        value = tokens[k].value
        if value in ("{", "}") and depth == 0:
            return None
        if value == "(":
            depth += 1
        elif value == ")":
            depth -= 1
            if depth == 0:
                return k
    return None


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


def check_event_query(query) -> None:  # noqa: ANN001
    graph = next((p for p in query.patterns if p.g is not None), None)
    if graph is None:
        return
    tok = next((t for t in _lex(query.text) if t.word == "GRAPH"), None)
    where = line_col(query.text, tok.start) if tok is not None else (None, None)
    raise WindowError("GRAPH is not supported in a per-event window (an event is a set of triples)", *where)
