"""What a registered query's text and options mean, in one place for the registry, workers and Spark job.

A query's window comes either from RSP-QL clauses in its text (``FROM NAMED WINDOW ... [RANGE ...]`` and
``WINDOW :w { ... }``) or from register options (``window=sliding range=PT60S step=PT10S``); the options
``lateness`` and ``late`` tune either.  Declaring the window both ways is an error rather than a silent
precedence rule.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from cbgp.windows import WindowError, WindowSpec, parse_duration, parse_rspql, window_from_options

__all__ = ["WINDOW_SHAPE_OPTIONS", "read_registration"]

WINDOW_SHAPE_OPTIONS = ("window", "range", "step")  # options that declare a window (vs. tune one)
LATE_POLICIES = ("drop", "admit")


def read_registration(sparql: str, options: Mapping[str, str]) -> tuple[str, WindowSpec | None]:
    """``(plain SPARQL, window or None)`` of a registration; raises WindowError (or QueryError later, when
    the plain text is parsed) with a message that says what is wrong."""
    plain, spec = parse_rspql(sparql)
    if spec is None:
        return plain, window_from_options(dict(options))
    declared = [name for name in WINDOW_SHAPE_OPTIONS if name in options]
    if declared:
        raise WindowError(f"the query text declares its window (FROM NAMED WINDOW) and the options do too "
                          f"({', '.join(declared)}): keep one")
    if "lateness" in options:
        spec = replace(spec, lateness_ms=parse_duration(options["lateness"]))
    if "late" in options:
        if options["late"] not in LATE_POLICIES:
            raise WindowError(f"option late={options['late']!r}: expected one of {', '.join(LATE_POLICIES)}")
        spec = replace(spec, late_policy=options["late"])
    return plain, spec
