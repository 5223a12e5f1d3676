"""The W3C SPARQL 1.1 property-path tests, continuous: each test's data inserted and then deleted triple by
triple, in a shuffled order, and the answers rebuilt from our deltas compared with pyoxigraph's after every
step.  (Their final answers against the expected results run with the other suites in test_algebra_w3c.)"""

from __future__ import annotations

import random

import pytest
import rdflib

from cbgp.algebra import ContinuousEngine, analyse
from cbgp.query.sparql import QueryError
from tests.cbgp.algebra.test_algebra_differential import expected_answers
from tests.oracle import OracleGraph, ReplayedAnswers
from tests.w3c_query import case_quads, cases

CASES = cases("property-path")


def test_the_suite_is_there():
    assert len(CASES) >= 24


@pytest.mark.parametrize("case", CASES, ids=[c.query.stem for c in CASES])
def test_a_property_path_test_inserted_and_deleted_triple_by_triple_matches_pyoxigraph(case):
    text = f"BASE <{case.query.as_uri()}>\n" + case.query.read_text(encoding="utf-8")
    try:
        spec = analyse(text)
    except QueryError as exc:
        pytest.fail(f"refused: {exc}")
    rdflib.NORMALIZE_LITERALS = False
    try:
        quads = case_quads(case)
    finally:
        rdflib.NORMALIZE_LITERALS = True
    order = quads[:]
    random.Random(7).shuffle(order)
    steps = [(1, q) for q in order] + [(1, q) for q in order[:3]] + [(-1, q) for q in reversed(order)]
    engine = ContinuousEngine()
    oracle = OracleGraph()
    replayed = ReplayedAnswers()
    for _, sign, row in engine.register("q", spec):
        replayed.apply(sign, engine.decode_row("q", row))
    for number, (op, quad) in enumerate(steps, 1):
        oracle.apply(op, *quad)
        for _, sign, row in engine.apply_terms(op, *quad):
            replayed.apply(sign, engine.decode_row("q", row))
        expected = expected_answers(oracle, text)
        assert replayed.rows == expected, f"after step {number} of {len(steps)} {(op, quad)}"
