"""AnswersCore and registration versions, without Kafka.

Every registration of a query id is its own answer stream: numbered from n = 1, told apart by
``(query, version, n)``; a newer version or an unregistration ends the old stream by retracting its current
answers (a "-" Answer per unit of multiplicity and an answers.current tombstone); restore keeps only the
latest version's state.
"""

from __future__ import annotations

import json

from services import codec
from services.answers.core import AnswersCore
from services.registry.core import Registry

TERMS = {1: "<http://ex/a>", 2: "<http://ex/b>", 3: "<http://ex/c>", 4: '"x"@en'}


def batch(version: int, rows: list[tuple[str, int, int]], *, query: str = "late", var: str = "x",
          source_partition: int = 0) -> bytes:
    """A worker's PartDeltaColumns record of ``(sign, term id, source offset)`` rows of ``version``."""
    return codec.encode_part_delta_batch(query, -1, [var], [
        (offset, 1 if sign == "PLUS" else -1, (term,), source_partition, offset, 0, False, None)
        for sign, term, offset in rows],
        version=version)


def spark_delta(sign: str, term: int, offset: int, query: str = "late") -> bytes:
    """A Spark job's PartDelta (part -1): it carries no version."""
    return codec.encode("PartDelta", {"query_id": query, "part": -1, "seq": offset, "sign": sign,
                                      "binding": {"x": term}, "source_partition": -2, "source_offset": offset,
                                      "index": 0, "snapshot": False})


def feed(core: AnswersCore, value: bytes, offset: int = 0) -> list:
    return core.on_record(0, offset, value, None, TERMS.get)


def answers(outputs: list) -> list[tuple[int, int, str, str]]:
    """(version, n, sign, value of ?x) of each Answer."""
    records = [codec.decode("Answer", o.value) for o in outputs if o.topic == "a"]
    return [(r["version"], r["n"], r["sign"], r["binding"]["x"]["value"]) for r in records]


def current_of(outputs: list, live: dict | None = None) -> dict:
    """answers.current after ``outputs`` (key -> (version, value) or absent), on top of ``live``."""
    live = dict(live or {})
    for o in outputs:
        if o.topic != "c":
            continue
        if o.value is None:
            live.pop(o.key, None)
        else:
            record = codec.decode("CurrentAnswer", o.value)
            live[o.key] = (record["version"], record["binding"]["x"]["value"], record["multiplicity"])
    return live


def core() -> AnswersCore:
    return AnswersCore("a", "c", "d", "parts")


def test_a_newer_version_ends_the_old_stream_and_numbers_from_one() -> None:
    c = core()
    out1 = feed(c, batch(1, [("PLUS", 1, 10), ("PLUS", 2, 11), ("PLUS", 2, 12)]))
    assert answers(out1) == [(1, 1, "+", "http://ex/a"), (1, 2, "+", "http://ex/b"), (1, 3, "+", "http://ex/b")]
    live = current_of(out1)
    assert sorted(v for v in live.values()) == [(1, "http://ex/a", 1), (1, "http://ex/b", 2)]
    # The new registration's snapshot has source keys below the old stream's: they are not duplicates.
    out2 = feed(c, batch(2, [("PLUS", 3, 0)]), 1)
    # The old stream ends: its three units of answers are retracted in it (n 4..6), then version 2 starts at 1.
    assert answers(out2) == [(1, 4, "-", "http://ex/a"), (1, 5, "-", "http://ex/b"), (1, 6, "-", "http://ex/b"),
                             (2, 1, "+", "http://ex/c")]
    assert list(current_of(out2, live).values()) == [(2, "http://ex/c", 1)]
    assert c.duplicates == 0


def test_deltas_of_an_older_version_are_dropped_and_counted() -> None:
    c = core()
    feed(c, batch(2, [("PLUS", 1, 5)]))
    assert feed(c, batch(1, [("PLUS", 2, 6), ("MINUS", 1, 7)]), 1) == []
    assert c.stale == 2
    assert answers(feed(c, batch(2, [("PLUS", 2, 8)]), 2)) == [(2, 2, "+", "http://ex/b")]


def test_unversioned_spark_deltas_join_the_current_version() -> None:
    c = core()
    c.on_plan("late", 3)
    assert answers(feed(c, spark_delta("PLUS", 1, 1))) == [(3, 1, "+", "http://ex/a")]
    assert answers(feed(c, batch(3, [("PLUS", 2, 4)]), 1)) == [(3, 2, "+", "http://ex/b")]
    assert answers(feed(c, spark_delta("MINUS", 1, 2), 2)) == [(3, 3, "-", "http://ex/a")]


def test_a_plan_tombstone_retracts_the_current_answers_and_forgets_the_query() -> None:
    c = core()
    c.on_plan("late", 1)
    out = feed(c, batch(1, [("PLUS", 1, 1), ("PLUS", 4, 2)]))
    live = current_of(out)
    assert c.settle() == []  # still registered: nothing to end
    c.on_plan("late", None)  # unregistered
    ended = c.settle()
    assert answers(ended) == [(1, 3, "-", "http://ex/a"), (1, 4, "-", "x")]  # numbered on in version 1
    assert current_of(ended, live) == {}
    assert "late" not in c.queries
    # Deltas of the unregistered registration still in flight are dropped, versioned or not...
    assert feed(c, batch(1, [("PLUS", 2, 3)]), 1) == [] and feed(c, spark_delta("PLUS", 2, 9), 2) == []
    assert c.stale == 2 and "late" not in c.queries
    # ... and a new registration starts its own stream.
    c.on_plan("late", 2)
    assert answers(feed(c, batch(2, [("PLUS", 3, 0)]), 3)) == [(2, 1, "+", "http://ex/c")]


def test_a_plan_of_a_newer_version_ends_the_old_stream_before_any_new_delta() -> None:
    """A re-registration (replace) whose query has no answers yet must not leave the old ones current."""
    c = core()
    c.on_plan("late", 1)
    live = current_of(feed(c, batch(1, [("PLUS", 1, 1)])))
    c.on_plan("late", 2)
    ended = c.settle()
    assert answers(ended) == [(1, 2, "-", "http://ex/a")] and current_of(ended, live) == {}
    assert c.settle() == []  # settled once


def test_a_tombstone_read_late_does_not_end_the_newer_registration() -> None:
    """The answers service may see the new version's deltas before the plans reader reaches the tombstone of
    the previous registration (followed by the new plan)."""
    c = core()
    c.on_plan("late", 1)
    feed(c, batch(1, [("PLUS", 1, 1)]))
    out = feed(c, batch(2, [("PLUS", 2, 0)]), 1)
    live = current_of(out)
    c.on_plan("late", None)  # the tombstone of version 1, read now
    c.on_plan("late", 2)
    assert c.settle() == []
    assert list(live.values()) == [(2, "http://ex/b", 1)] and c.queries["late"].version == 2


def restore_from(outputs: list, c: AnswersCore | None = None) -> AnswersCore:
    c = c or core()
    for o in outputs:
        if o.topic == "a":
            c.restore(0, o.value, dict(o.headers or ()))
    return c


def test_restore_keeps_only_the_latest_version_and_ended_streams_stay_ended() -> None:
    c = core()
    log = feed(c, batch(1, [("PLUS", 1, 1), ("PLUS", 2, 2)]))
    log += feed(c, batch(2, [("PLUS", 3, 0)]), 1)
    restored = restore_from(log)
    state = restored.queries["late"]
    assert (state.version, state.n, state.last_key) == (2, 1, {0: (0, 0, 0)})  # routed source: (seq, offset, index)
    assert list(state.current) == [codec.canonical_binding({"x": "<http://ex/c>"})]
    # A crash after an unregistration was read but before its retractions were committed: the new life
    # restores the answers, reads the tombstone from queries.plans and retracts then.
    crashed = restore_from(log)
    crashed.on_plan("late", 2)
    crashed.on_plan("late", None)
    assert answers(crashed.settle()) == [(2, 2, "-", "http://ex/c")]
    # Retractions committed: the restored stream has no current answers, nothing is retracted twice.
    c.on_plan("late", 2)
    c.on_plan("late", None)
    log += c.settle()
    again = restore_from(log)
    assert again.queries["late"].current == {}
    again.on_plan("late", 2)
    again.on_plan("late", None)
    assert again.settle() == [] and "late" not in again.queries


def test_answers_written_before_versions_continue_in_the_first_versioned_stream() -> None:
    """An upgraded fleet: answers with version 0 were written for the registration the workers now label."""
    old = [o for o in feed(core(), batch(0, [("PLUS", 1, 1)]))]
    c = restore_from(old)
    c.on_plan("late", 1)
    assert c.settle() == []
    assert answers(feed(c, batch(1, [("PLUS", 2, 2)]), 1)) == [(1, 2, "+", "http://ex/b")]


def test_registry_versions_keep_increasing_across_unregister_and_restore() -> None:
    registry = Registry(clock=lambda: 0)
    text = "SELECT ?x WHERE { ?x <http://ex/p> ?y }"
    other = "SELECT ?y WHERE { ?x <http://ex/p> ?y }"
    plans: list[tuple[str, dict | None]] = []
    for command, sparql in (("REGISTER", text), ("UNREGISTER", None), ("REGISTER", other)):
        decision = registry.decide({"command": command, "query_id": "late", "sparql": sparql, "options": {}},
                                   lambda: 7)
        registry.commit(decision)
        plans.append(decision.plan)
    assert plans[0][1]["version"] == 1 and plans[1] == ("late", None) and plans[2][1]["version"] == 2
    # A registry restarted from queries.plans (the plan, its tombstone, the new plan) knows the same.
    restored = Registry(clock=lambda: 0)
    restored.restore(plans[:2])
    decision = restored.decide({"command": "REGISTER", "query_id": "late", "sparql": other, "options": {}},
                               lambda: 7)
    assert decision.plan[1]["version"] == 2
    assert json.loads(decision.plan[1]["plan_json"])


def plan(c: AnswersCore, query_id: str, version: int | None, text: str = "") -> None:
    """One queries.plans record, as the service reads it: the plan (or tombstone), then its query text."""
    c.on_plan(query_id, version)
    if version is not None:
        c.note_registration(query_id, version, text, "BGP")


def test_a_query_registered_again_and_again_keeps_only_its_current_text() -> None:
    """Ten thousand registrations of 10 KB queries, replaced or unregistered: the service keeps the texts of the
    registrations still current, not one per registration it ever read."""
    c = core()
    query = "SELECT * WHERE { ?s ?p ?o }" + " " * 10_000
    for version in range(1, 10_001):
        plan(c, "churn", version, query)
        plan(c, f"once{version}", 1, query)
        plan(c, f"once{version}", None)
    assert sum(len(v) for v in c.texts.values()) == 1 and sum(len(v) for v in c.classes.values()) == 1
    assert c.text_of("churn", 10_000) == query and c.class_of("churn", 10_000) == "BGP"
    assert c.text_of("churn", 9_999) is None and c.text_of("once1", 1) is None


def test_deltas_of_a_replaced_registration_are_dropped_once_its_plan_is_read() -> None:
    """Between the new plan and the next settle, the old registration's deltas still in flight join no stream
    (its text, which a product's assembler needs, is gone by then)."""
    c = core()
    plan(c, "late", 1)
    live = current_of(feed(c, batch(1, [("PLUS", 1, 1)])))
    plan(c, "late", 2)
    assert feed(c, batch(1, [("PLUS", 2, 2)]), 1) == [] and c.stale == 1
    ended = c.settle()
    assert answers(ended) == [(1, 2, "-", "http://ex/a")] and current_of(ended, live) == {}
