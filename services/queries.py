"""What a registered query's text and options mean, in one place for the registry, workers and Spark job.

A query's window comes either from RSP-QL clauses in its text (``FROM NAMED WINDOW ... [RANGE ...]`` and
``WINDOW :w { ... }``) or from register options (``window=sliding range=PT60S step=PT10S``); the options
``lateness`` and ``late`` tune either (``cbgp.windows.window_from_options``).  ``replace=true`` steers the
registration itself (the registry does not store it).  Any other option key is an error: a misspelt
``windw=sliding`` must not register a query without a window.
"""

from __future__ import annotations

import difflib
from typing import Mapping

from cbgp.sparql import ParsedQuery, QueryError, parse_query
from cbgp.windows import WindowError, WindowSpec, parse_rspql, window_from_options

__all__ = ["QUERY_OPTIONS", "REGISTER_OPTIONS", "check_option_keys", "read_query", "read_registration"]

QUERY_OPTIONS = ("window", "range", "step", "lateness", "late")  # stored with the query's plan
REGISTER_OPTIONS = (*QUERY_OPTIONS, "replace")  # what `cbgp register --option` accepts


def check_option_keys(keys: object, known: tuple[str, ...] = REGISTER_OPTIONS) -> None:
    """Raise ``WindowError`` (a ``QueryError``) naming the first key not in ``known``, and the known ones."""
    for key in keys:  # type: ignore[attr-defined]
        if key not in known:
            close = difflib.get_close_matches(str(key), REGISTER_OPTIONS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise WindowError(f"unknown option {key!r}{hint}: the options are {', '.join(REGISTER_OPTIONS)}")


def read_registration(sparql: str, options: Mapping[str, str]) -> tuple[str, WindowSpec | None]:
    """``(plain SPARQL, window or None)`` of a registration; raises ``cbgp.windows.WindowError`` with a
    message that says what is wrong (an unknown option key included; the plain text's own errors come
    when it is parsed)."""
    check_option_keys(options)
    plain, spec = parse_rspql(sparql)
    return plain, window_from_options(dict(options), base=spec)


def read_query(text: str, window: WindowSpec | None) -> tuple[ParsedQuery | None, object | None]:
    """``(BGP query, None)`` or ``(None, operator query spec)`` of a registration's plain text (issue 18).

    A BGP ``SELECT`` keeps its parsed form (decomposed and placed as always); any other query the operator
    algebra supports (``cbgp.algebra.analyse``: FILTER, OPTIONAL, UNION, aggregates, ASK, CONSTRUCT, ...) is
    returned as an ``OperatorQuerySpec``, evaluated by its single owner on the total order.  Raises
    ``QueryError`` naming the construct, line and column of what is out of scope; operators over a window are
    (not run by the fleet yet)."""
    try:
        return parse_query(text), None
    except QueryError as error:
        original = error
    from cbgp.algebra import analyse

    try:
        spec = analyse(text)
    except QueryError as error:
        if error.message.startswith("SERVICE") or original.message.startswith("SERVICE"):
            raise original from None
        raise
    if isinstance(spec, ParsedQuery):  # (analyse agrees with parse_query; kept for safety)
        return spec, None
    if window is not None:
        construct = original.message.split(" is not supported")[0]
        raise QueryError(f"{construct} over a window is not supported: the fleet runs operators on the total order "
                         "only (a windowed query must be a BGP)", original.line, original.column)
    return None, spec
