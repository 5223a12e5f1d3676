"""What a registered query's text and options mean, in one place for the registry, workers and Spark job.

A query's window comes either from RSP-QL clauses in its text (``FROM NAMED WINDOW ... [RANGE ...]`` and
``WINDOW :w { ... }``) or from register options (``window=sliding range=PT60S step=PT10S``); the options
``lateness`` and ``late`` tune either (``cbgp.windows.window_from_options``).
"""

from __future__ import annotations

from typing import Mapping

from cbgp.windows import WindowSpec, parse_rspql, window_from_options

__all__ = ["read_registration"]


def read_registration(sparql: str, options: Mapping[str, str]) -> tuple[str, WindowSpec | None]:
    """``(plain SPARQL, window or None)`` of a registration; raises ``cbgp.windows.WindowError`` with a
    message that says what is wrong (the plain text's own errors come when it is parsed)."""
    plain, spec = parse_rspql(sparql)
    return plain, window_from_options(dict(options), base=spec)
