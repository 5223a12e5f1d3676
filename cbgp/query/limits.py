"""What a query or update text may be before any parser sees it: its size, its nesting, its characters, its
tokens; and how many triple patterns a query may have once its property paths are rewritten.

rdflib's parser recurses about forty Python frames per level of nesting and gives up (RecursionError) near 25
levels of parentheses; pyoxigraph's overflows its native stack (a segmentation fault, the whole process gone) near
2,400 nested groups. So every text from outside is measured here first, by a scanner that does not recurse, and
refused with one line that names the limit, where it was passed, and how to raise it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

# Defaults protect a small machine; every one is a named setting (environment, or the services' flags).
DEFAULT_MAX_QUERY_BYTES = 64 * 1024
DEFAULT_MAX_UPDATE_BYTES = 1024 * 1024  # an update request is at most one Kafka record
DEFAULT_MAX_NESTING = 16  # braces, parentheses and brackets together; rdflib needs about 40 frames a level
_SETTINGS = {"query": ("CBGP_MAX_QUERY_BYTES", DEFAULT_MAX_QUERY_BYTES),
             "update": ("CBGP_MAX_UPDATE_BYTES", DEFAULT_MAX_UPDATE_BYTES)}
NESTING_SETTING = "CBGP_MAX_QUERY_NESTING"
# A query's words, operators, brackets, IRIs and literals (comments not counted): rdflib's parser takes about 1 ms
# a token in an expression, and an expression rdflib evaluates costs tens of µs a term per change.  The longest of
# the W3C suite's queries has 113.  Updates are bounded by their bytes and changes only (INSERT DATA is long by
# nature).
DEFAULT_MAX_TOKENS = 1_000
TOKENS_SETTING = "CBGP_MAX_QUERY_TOKENS"
# Triple patterns once property paths are rewritten: a sequence of n steps is n patterns, an alternative one per
# branch, so a short text can make many, and planning grows faster than the patterns.
DEFAULT_MAX_PATTERNS = 64
PATTERNS_SETTING = "CBGP_MAX_QUERY_PATTERNS"

# Strings, IRIs and comments are skipped whole (brackets inside them do not nest); the rest is one bracket or a
# run of anything else.  No alternative can match the empty string, and none backtracks across another.
_SCAN = re.compile(r'"""(?:[^"\\]|\\.|"(?!""))*"""' r"|'''(?:[^'\\]|\\.|'(?!''))*'''"
                   r'|"(?:[^"\\\n]|\\.)*"' r"|'(?:[^'\\\n]|\\.)*'"
                   r'|<[^<>"{}|^`\\\s]*>|#[^\n]*|[{(\[]|[})\]]|[^"\'<#{}()\[\]]+|.', re.S)
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_WORD = re.compile(r"[\w:?$.\-@]+|[^\w\s]")  # a token of a run between brackets, strings and IRIs


@dataclass(frozen=True)
class TextProblem:
    """Why a text is refused: the message (what, the limit, how to raise it) and where (1-based), if known."""

    message: str
    line: int | None = None
    column: int | None = None


def limit(name: str, default: int) -> int:
    """A limit from the environment (``name``), else ``default``; a value that is not a positive integer is the
    default (the services check their flags themselves)."""
    raw = os.environ.get(name, "")
    return int(raw) if raw.isascii() and raw.isdigit() and int(raw) > 0 else default


def text_problem(text: str, kind: str = "query") -> TextProblem | None:
    """None when ``text`` (a ``query`` or an ``update``) is within the limits; else what is wrong and where."""
    setting, default = _SETTINGS[kind]
    max_bytes = limit(setting, default)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        return TextProblem(f"the {kind} is {size:,} bytes, over the limit of {max_bytes:,} ({setting})")
    bad = _SURROGATE.search(text)
    if bad:
        line, column = _line_col(text, bad.start())
        return TextProblem(f"invalid Unicode in the {kind}: a lone surrogate U+{ord(bad.group()):04X}", line, column)
    if "\x00" in text:
        line, column = _line_col(text, text.index("\x00"))
        return TextProblem(f"a NUL character in the {kind}", line, column)
    max_nesting = limit(NESTING_SETTING, DEFAULT_MAX_NESTING)
    max_tokens = limit(TOKENS_SETTING, DEFAULT_MAX_TOKENS) if kind == "query" else 0
    depth = tokens = 0
    for match in _SCAN.finditer(text):
        token = match.group()
        if max_tokens:
            first = token[0]
            run = first not in "#\"'<{}()[]"  # (a run of words and operators between the others)
            count = len(_WORD.findall(token)) if run else 0 if first == "#" else 1
            if tokens + count > max_tokens:
                offset = match.start()
                if run:  # where the first token past the limit starts
                    offset += [word.start() for word in _WORD.finditer(token)][max_tokens - tokens]
                line, column = _line_col(text, offset)
                return TextProblem(f"the query has more than {max_tokens:,} tokens (terms, operators and brackets; "
                                   f"{TOKENS_SETTING})", line, column)
            tokens += count
        if token in "{([" and len(token) == 1:
            depth += 1
            if depth > max_nesting:
                line, column = _line_col(text, match.start())
                return TextProblem(f"the {kind} nests brackets deeper than the limit of {max_nesting} "
                                   f"({NESTING_SETTING})", line, column)
        elif token in "})]" and len(token) == 1:
            depth -= 1
    return None


def patterns_problem(count: int) -> str | None:
    """None when a query of ``count`` triple patterns (its paths rewritten) is within the limit; else why not."""
    max_patterns = limit(PATTERNS_SETTING, DEFAULT_MAX_PATTERNS)
    if count <= max_patterns:
        return None
    return (f"the query has more than {max_patterns} triple patterns once its property paths are rewritten "
            f"(a sequence of n steps is n patterns, an alternative one per branch; {PATTERNS_SETTING})")


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1
