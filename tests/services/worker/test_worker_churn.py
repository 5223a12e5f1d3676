"""A worker whose queries are registered and unregistered again and again holds what its current queries need,
not something of every registration it ever read (a query per SEPA subscription, a user's script that replaces
its query every minute): the containers reachable from the worker's core stop growing with the registrations."""

from __future__ import annotations

import gc

from services import codec
from services.worker.core import WorkerCore

EX = "http://ex.org/"
K, L, N = (f"<{EX}{name}>" for name in ("knows", "likes", "name"))
SHAPES = [
    f"SELECT ?x ?n WHERE {{ ?x {N} ?n . ?x {L} ?y }}",  # a star
    f"SELECT * WHERE {{ ?a {K} ?b . ?b {K} ?c . ?c {L} ?d }}",  # a multi-centre path, joined by probes
    f"SELECT ?x (COUNT(?y) AS ?c) WHERE {{ ?x {L} ?y }} GROUP BY ?x",  # operators
    f"SELECT * WHERE {{ <{EX}u1> {K}+ ?y }}",  # a property path's closure
    f"SELECT * WHERE {{ ?x {L} ?y . ?z {N} ?w }}",  # a product of two parts
]
TOPICS = {"deltas.parts": "deltas.parts", "deadletter": "deadletter", "updates.routed": "updates.routed",
          "dictionary": "dictionary"}


def held(root: object) -> int:
    """Entries of every dict, list, set and tuple reachable from ``root`` through attributes (not classes,
    functions or modules): what grows if something is kept per registration."""
    seen: set[int] = set()
    stack, total = [root], 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, str, bytes, int, float, bool)) or callable(obj) \
                and not hasattr(obj, "__dict__"):
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            total += len(obj)
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, set, frozenset, tuple)):
            total += len(obj)
            stack.extend(obj)
        elif hasattr(obj, "__dict__") and type(obj).__module__.startswith(("services", "cbgp")):
            stack.extend(vars(obj).values())
            stack.extend(getattr(obj, name) for cls in type(obj).__mro__
                         for name in getattr(cls, "__slots__", ()) if hasattr(obj, name))
        elif type(obj).__module__.startswith(("services", "cbgp")):
            stack.extend(getattr(obj, name) for cls in type(obj).__mro__
                         for name in getattr(cls, "__slots__", ()) if hasattr(obj, name))
    return total


def test_registering_and_unregistering_again_and_again_leaves_nothing_behind() -> None:
    core = WorkerCore(TOPICS, 2, 1, 2, lambda kind, partition, start, end: [], assemble_in_spark=False,
                      record_reader=lambda partition, start, end: [], term_reader=lambda ids: {})
    for partition in (0, 1):
        core.open_shard("routed", partition, 0, None)
    offset = 0

    def plan(query_id: str, version: int | None, text: str = "") -> None:
        nonlocal offset
        value = None if version is None else codec.encode("QueryPlan", {
            "query_id": query_id, "sparql": text, "options": {}, "plan_json": "{}", "projected": [],
            "registered_at_seq": 0, "version": version, "registered_at_change_seq": 0})
        out, to_open = core.on_plan(0, offset, query_id.encode(), value, [0, 1])
        assert not [o for o in out if o.topic == "deadletter"] and to_open == []
        core.flush_batches()
        offset += 1

    plan("stays", 1, SHAPES[0])

    def churn(rounds: int, start: int) -> None:
        for n in range(start, start + rounds):
            text = SHAPES[n % len(SHAPES)]
            plan(f"q{n}", 1, text)  # a new query each time ...
            plan("replaced", n + 1, text)  # ... and one registered again with a new version each time
            plan(f"q{n}", None)
        core.flush_batches()
        gc.collect()

    churn(2 * len(SHAPES), 0)
    before = held(core)
    churn(40 * len(SHAPES), 2 * len(SHAPES))
    assert held(core) <= before + 10, "the worker keeps something of each registration it read"
