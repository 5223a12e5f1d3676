"""SERVICE clauses of a registered query, answered from a local view (Dehghanzadeh et al.).

How it works: docs/design/internals.md, cbgp.background.service_clause.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from cbgp.background.view import ViewChange, LocalView

_TOKEN = re.compile(
    r"""(?P<comment>\#[^\n]*)
      | (?P<string>\"\"\"(?:[^\\]|\\.)*?\"\"\"|'''(?:[^\\]|\\.)*?'''|"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
      | (?P<iri><[^<>"{}|^`\\\s]*>)
      | (?P<var>[?$][A-Za-z0-9_\u00b7\u00c0-\uffff]+)
      | (?P<word>[A-Za-z_][A-Za-z0-9_\-]*(?::[A-Za-z0-9_\-.]*)?|:[A-Za-z0-9_\-.]*)
      | (?P<punct>[{}().;,])
      | (?P<other>\S)""",
    re.VERBOSE,
)


class ServiceError(ValueError):
    pass


@dataclass(frozen=True)
class ServiceClause:
    endpoint: str  # the IRI without <>
    pattern: str  # the text between the braces
    silent: bool
    variables: tuple[str, ...]  # without '?', first-seen order
    join_vars: tuple[str, ...]  # shared with the local part
    triple_patterns: int  # a rough count ('.'-separated statements)


@dataclass(frozen=True)
class ServicePlan:
    text: str
    local_text: str
    prologue: str
    services: tuple[ServiceClause, ...]
    projected: tuple[str, ...]  # the original projection (without '?'); () for SELECT *
    local_projected: tuple[str, ...]
    maintenance: str  # "budgeted" or "plain"
    status: str
    reasons: tuple[str, ...] = field(default=())


def service_tokens(text: str):
    return [(m.lastgroup, m.group(0), m.start(), m.end()) for m in _TOKEN.finditer(text)]


def _blank(text: str, start: int, end: int) -> str:
    return text[:start] + "".join(c if c == "\n" else " " for c in text[start:end]) + text[end:]


def split_service(text: str) -> ServicePlan:
    """Take the SERVICE clauses out of ``text``; raise ServiceError for forms we cannot answer from a view."""
    tokens = service_tokens(text)
    clauses: list[tuple[str, str, bool, int, int]] = []  # endpoint, pattern, silent, start, end
    i = 0
    while i < len(tokens):
        kind, value, start, _ = tokens[i]
        if kind == "word" and value.upper() == "SERVICE":
            j = i + 1
            silent = j < len(tokens) and tokens[j][0] == "word" and tokens[j][1].upper() == "SILENT"
            if silent:
                j += 1
            if j >= len(tokens) or tokens[j][0] != "iri":
                raise ServiceError("SERVICE needs a constant endpoint IRI (SERVICE <http://...> { ... }); "
                                   "a variable endpoint cannot be kept in a local view")
            endpoint = tokens[j][1][1:-1]
            j += 1
            if j >= len(tokens) or tokens[j][1] != "{":
                raise ServiceError("SERVICE <endpoint> must be followed by a { ... } group")
            depth, k = 0, j
            while k < len(tokens):
                if tokens[k][1] == "{":
                    depth += 1
                elif tokens[k][1] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                k += 1
            if k >= len(tokens):
                raise ServiceError("unbalanced braces in the SERVICE group")
            inner = text[tokens[j][3]:tokens[k][2]]
            if any(t[0] == "word" and t[1].upper() == "SERVICE" for t in tokens[j + 1:k]):
                raise ServiceError("nested SERVICE is not supported")
            end = tokens[k][3]
            while k + 1 < len(tokens) and tokens[k + 1][1] == ".":  # a trailing '.' after the group
                k += 1
                end = tokens[k][3]
            clauses.append((endpoint, inner.strip(), silent, start, end))
            i = k + 1
            continue
        i += 1
    if not clauses:
        raise ServiceError("the query has no SERVICE clause")

    local = text
    for _, _, _, start, end in clauses:
        local = _blank(local, start, end)
    local_tokens = service_tokens(local)
    where = next((n for n, t in enumerate(local_tokens) if t[1] == "{"), None)
    if where is None:
        raise ServiceError("no WHERE group")
    local_vars = {t[1][1:] for t in local_tokens[where:] if t[0] == "var"}
    prologue_end = next((t[2] for t in local_tokens if t[0] == "word" and t[1].upper() == "SELECT"), None)
    if prologue_end is None:
        raise ServiceError("only SELECT queries may use SERVICE")
    prologue = text[:prologue_end]

    services = []
    for endpoint, pattern, silent, _, _ in clauses:
        variables: list[str] = []
        for kind, value, _, _ in service_tokens(pattern):
            if kind == "var" and value[1:] not in variables:
                variables.append(value[1:])
        joins = tuple(v for v in variables if v in local_vars)
        statements = [s for s in re.split(r"\s\.(?:\s|$)", " " + pattern + " ") if s.strip()]
        services.append(ServiceClause(endpoint, pattern, silent, tuple(variables), joins, len(statements)))

    # The projection: SELECT [DISTINCT|REDUCED] (vars | *) up to the WHERE group.
    select = next(n for n, t in enumerate(local_tokens) if t[0] == "word" and t[1].upper() == "SELECT")
    head = local_tokens[select + 1:where]
    star = any(t[1] == "*" for t in head)
    projected = tuple(t[1][1:] for t in head if t[0] == "var")
    if any(t[1] == "(" for t in head):
        raise ServiceError("SELECT expressions are not supported with SERVICE")
    service_vars = {v for s in services for v in s.variables}
    needed = [v for v in (projected if not star else ()) if v in local_vars]
    for s in services:
        needed += [v for v in s.join_vars if v not in needed]
    if star:
        local_projection = "*"
        local_projected: tuple[str, ...] = ()
    else:
        local_projection = " ".join(f"?{v}" for v in needed)
        local_projected = tuple(needed)
    unknown = [v for v in projected if v not in local_vars and v not in service_vars]
    if unknown:
        raise ServiceError(f"projected variable ?{unknown[0]} occurs in no pattern")
    keywords = [t for t in head if t[0] == "word" and t[1].upper() in ("DISTINCT", "REDUCED")]
    head_start = local_tokens[select][3]
    head_end = local_tokens[where][2]
    # keep WHERE if present: rewrite only the variable list
    where_kw = next((t for t in head if t[0] == "word" and t[1].upper() == "WHERE"), None)
    new_head = " " + " ".join(k[1] for k in keywords) + (" " if keywords else "") + local_projection + " "
    if where_kw is not None:
        new_head += "WHERE "
    local_text = local[:head_start] + new_head + local[head_end:]

    reasons = []
    if len(services) != 1:
        reasons.append(f"{len(services)} SERVICE clauses (the paper's class has one)")
    for s in services:
        if len(s.join_vars) != 1:
            reasons.append(f"SERVICE <{s.endpoint}> joins on {len(s.join_vars)} variables (one expected)")
        if s.triple_patterns != 1:
            reasons.append(f"SERVICE <{s.endpoint}> has {s.triple_patterns} triple patterns (one expected)")
    if reasons:
        maintenance = "plain"
        status = ("SERVICE answered from a local view refreshed by GNR-LRU within the budget (not the paper's "
                  "class: " + "; ".join(reasons) + ")")
    else:
        maintenance = "budgeted"
        status = (f"SERVICE answered from a local view on ?{services[0].join_vars[0]}, budgeted maintenance "
                  f"(the paper's class, if the endpoint has at most one mapping per key)")
    return ServicePlan(text, local_text, prologue, tuple(services), () if star else projected, local_projected,
                       maintenance, status, tuple(reasons))


Row = Mapping[str, str]  # variable (without '?') -> term text


class BackgroundJoin:
    """The local answers joined with a view, as a multiset; input changes in, answer deltas out.

    ``view`` values are frozensets of service rows (tuples of (variable, term)), as ``SparqlRemote`` builds
    them by default.  ``keep`` is an optional filter over joined rows (e.g. a follower threshold);
    ``projected`` the answer's variables (None: all).
    """

    def __init__(self, view: LocalView, join_var: str, projected: Iterable[str] | None = None,
                 keep: Callable[[Mapping[str, str]], bool] | None = None):
        self.view = view
        self.join_var = join_var.lstrip("?")
        self.projected = tuple(projected) if projected is not None else None
        self.keep = keep
        self._local: dict[Any, Counter] = {}  # key -> multiset of local rows (as sorted item tuples)

    def _joined(self, local: tuple, value: Any) -> list[tuple]:
        out = []
        for service_row in value or ():
            row = dict(local)
            clash = any(var in row and row[var] != term for var, term in service_row)
            if clash:
                continue
            row.update(service_row)
            if self.keep is not None and not self.keep(row):
                continue
            if self.projected is not None:
                row = {v: row[v] for v in self.projected if v in row}
            out.append(tuple(sorted(row.items())))
        return out

    def local_delta(self, row: Row, diff: int) -> list[tuple[int, tuple]]:
        """A local answer appears (+1) or goes (-1): the joined answers it brings or takes."""
        key = row.get(self.join_var)
        local = tuple(sorted(row.items()))
        bucket = self._local.setdefault(key, Counter())
        bucket[local] += diff
        if bucket[local] <= 0:
            del bucket[local]
        if not bucket:
            del self._local[key]
        value = self.view.value(key) if key in self.view else None
        return [(diff, joined) for joined in self._joined(local, value)]

    def refresh_change(self, change: ViewChange) -> list[tuple[int, tuple]]:
        """A refresh found a new value: retract what the old value produced, assert what the new one does."""
        out: list[tuple[int, tuple]] = []
        for local, count in self._local.get(change.key, Counter()).items():
            old = Counter(self._joined(local, change.old))
            new = Counter(self._joined(local, change.new))
            for row in old:
                diff = old[row] - new.get(row, 0)
                out += [(-1, row)] * (diff * count if diff > 0 else 0)
            for row in new:
                diff = new[row] - old.get(row, 0)
                out += [(+1, row)] * (diff * count if diff > 0 else 0)
        return out

    def answers(self) -> Counter:
        total: Counter = Counter()
        for key, bucket in self._local.items():
            value = self.view.value(key) if key in self.view else None
            for local, count in bucket.items():
                for joined in self._joined(local, value):
                    total[joined] += count
        return total
