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

from cbgp.windows import WindowError, WindowSpec, parse_rspql, window_from_options

__all__ = ["QUERY_OPTIONS", "REGISTER_OPTIONS", "check_option_keys", "read_registration"]

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
