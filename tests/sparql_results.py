"""Read SPARQL 1.1 Query Results JSON with two real clients (pyoxigraph and rdflib), not with our own code.

Every output that claims to be SPARQL JSON goes through both in a test; a watch or replay line is a delta, not a
results document, so its binding is wrapped into one (``results_document``).
"""

from __future__ import annotations

import io
import json
from typing import Any

import pyoxigraph as ox
from rdflib.query import Result


def results_document(variables: list[str], bindings: list[dict[str, Any]]) -> str:
    return json.dumps({"head": {"vars": variables}, "results": {"bindings": bindings}})


def parse_with_pyoxigraph(document: str) -> list[dict[str, Any]]:
    """``[{var: pyoxigraph term}]``; raises SyntaxError on anything pyoxigraph refuses (e.g. a ``lang`` key)."""
    solutions = ox.parse_query_results(document, ox.QueryResultsFormat.JSON)
    names = [v.value for v in solutions.variables]
    return [{name: solution[name] for name in names if solution[name] is not None} for solution in solutions]


def parse_with_rdflib(document: str) -> list[dict[str, Any]]:
    """``[{var: rdflib term}]`` as rdflib reads them."""
    result = Result.parse(io.StringIO(document), format="json")
    return [{str(var): term for var, term in row.items() if term is not None} for row in result.bindings]
