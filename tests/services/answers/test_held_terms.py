"""The values an operator query computes at the answers service (an aggregate's, a new one per change of its
group) stay in the service's dictionary while they are answers, and leave it once let go: the dictionary grows
with the data, not with the changes.  A term the dictionary topic brings too is kept for good."""

from __future__ import annotations

import pickle

from cbgp.terms import stable_term_id
from services.answers.release_operators import HeldTerms, Operators
from services.wire.registrations import read_query

EX = "http://ex.org/"
X = f"<{EX}x>"
QUERY = f"SELECT ?x (GROUP_CONCAT(?a) AS ?all) (COUNT(?a) AS ?n) WHERE {{ ?x <{EX}p> ?a }} GROUP BY ?x"


def operators(known: dict[int, str], held: HeldTerms) -> Operators:
    _parsed, spec = read_query(QUERY, None)
    return Operators(spec, known, held)


def add_value(ops: Operators, known: dict[int, str], i: int, diff: int = 1) -> list[dict[str, str]]:
    """Value ``i`` of ?a added to (or removed from) ?x's group, as a leaf part delta: the answers, decoded the way
    the service decodes them (before it collects)."""
    value = f'"v{i:03d}"'
    known[stable_term_id(value)] = value  # (the dictionary topic brought the data term before its delta)
    out = ops.apply([(0, diff, (stable_term_id(value), stable_term_id(X)), ("a", "x"))])
    return [{name: known[v] for name, v in zip(ops.columns, row)} | {"sign": d} for d, row in out]


def test_the_service_dictionary_keeps_the_current_values_only() -> None:
    known = {stable_term_id(X): X}
    held = HeldTerms(known)
    ops = operators(known, held)
    base = len(known)  # (?x, and the constants the operators encode)
    for i in range(200):
        answers = add_value(ops, known, i)
        if i:
            assert answers[0]["sign"] == -1 and answers[0]["all"] == '"%s"' % " ".join(f"v{j:03d}" for j in range(i))
        assert answers[-1]["all"] == '"%s"' % " ".join(f"v{j:03d}" for j in range(i + 1))
        held.collect()
    # the data (?x and 200 values) and the current values only (COUNT's 200 would be here too before)
    assert len(known) == base + 200 + 2 and len(held.queries) == 2
    for i in range(200):
        add_value(ops, known, i, -1)
        held.collect()
    assert len(known) == base + 200 and not held.queries


def test_a_value_the_dictionary_topic_also_brings_stays() -> None:
    known = {stable_term_id(X): X}
    held = HeldTerms(known)
    ops = operators(known, held)
    add_value(ops, known, 0)
    add_value(ops, known, 1)
    both = '"v000 v001"'
    assert stable_term_id(both) in held.queries
    held.pin([(stable_term_id(both), both)])  # published by ingest as data meanwhile
    add_value(ops, known, 2)
    held.collect()
    assert known[stable_term_id(both)] == both


def test_a_restored_checkpoint_and_a_dropped_query_let_their_values_go() -> None:
    known = {stable_term_id(X): X}
    held = HeldTerms(known)
    ops = operators(known, held)
    for i in range(3):
        add_value(ops, known, i)
        held.collect()
    blob = pickle.dumps(ops)
    # a new service: its dictionary holds the data the topic brought, not the computed values
    fresh = {term_id: term for term_id, term in known.items() if term_id not in held.queries}
    fresh_held = HeldTerms(fresh)
    restored = pickle.loads(blob)
    restored.rebind(fresh, fresh_held)
    assert set(fresh_held.queries) == set(held.queries)
    answers = add_value(restored, fresh, 3)
    assert answers[0]["all"] == '"v000 v001 v002"' and answers[-1]["all"] == '"v000 v001 v002 v003"'
    fresh_held.collect()
    assert fresh[stable_term_id('"v000 v001 v002 v003"')] and stable_term_id('"v000 v001 v002"') not in fresh
    restored.close()  # re-registered: the old operators are dropped
    fresh_held.collect()
    assert not fresh_held.queries and stable_term_id('"v000 v001 v002 v003"') not in fresh
