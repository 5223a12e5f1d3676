"""The registry: decision rules without Kafka, then `cbgp registry` as a real process on the real broker."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from cbgp.query.plan import decompose
from cbgp.query.sparql import parse_query
from services.codec import CodecError, decode
from services.kafka.config import KafkaSettings
from services.kafka.client import make_producer, produce_sync, read_all
from services.kafka.broker import free_port
from services.registry.core import Registry
from services.runtime.supervise import ChildProcess, cbgp_command, http_ok
from services.client.requests import admin_request
from tests.fixtures.broker import fresh_settings
from services.kafka.topics import ensure_topics

EX = "http://ex.org/"
QUERIES = {  # one query per class of the paper
    "star": f"SELECT * WHERE {{ ?p <{EX}type> <{EX}Person> . ?p <{EX}city> <{EX}Paris> }}",
    "path": f"SELECT ?a ?c WHERE {{ ?a <{EX}knows> ?b . ?b <{EX}knows> ?c }}",
    "loose": f"SELECT * WHERE {{ ?a <{EX}type> <{EX}P> . ?b <{EX}type> <{EX}Q> }}",
    "general": f"SELECT * WHERE {{ <{EX}x> <{EX}p> <{EX}y> . ?a <{EX}knows> ?b }}",
    "ground": f"SELECT * WHERE {{ <{EX}x> <{EX}p> <{EX}y> }}",
}
CLASSES = {"star": "simple var-centric star", "path": "var-connected", "loose": "loosely-connected",
           "general": "general (product of parts)", "ground": "ground"}


def _register(reg: Registry, qid: str, sparql: str, seq: int = 0, **options: str) -> Any:
    decision = reg.decide({"command": "REGISTER", "query_id": qid, "sparql": sparql, "options": options,
                           "request_id": "r"}, lambda: seq)
    reg.commit(decision)
    return decision


# ---------------------------------------------------------------------------------------- rules (no Kafka)


@pytest.mark.parametrize("name", sorted(QUERIES))
def test_each_query_class_is_accepted_with_the_plan_decompose_gives(name: str) -> None:
    decision = _register(Registry(), name, QUERIES[name], seq=42)
    assert decision.status["status"] == "ACCEPTED"
    assert decision.status["message"].startswith(CLASSES[name])
    key, plan = decision.plan
    assert key == name and plan["version"] == 1 and plan["registered_at_seq"] == 42
    expected = decompose(parse_query(QUERIES[name]))
    assert json.loads(plan["plan_json"]) == expected.to_json()
    assert plan["projected"] == list(expected.query.projected)


OPERATOR_QUERIES = {  # beyond a BGP; their BGP leaves by centre, the operators at the answers service
    "filter": (f"SELECT ?x ?a WHERE {{ ?x <{EX}age> ?a FILTER(?a > 30) }}", ["x", "a"], "FILTER"),
    "optional": (f"SELECT * WHERE {{ ?x <{EX}type> <{EX}P> OPTIONAL {{ ?x <{EX}name> ?n }} }}", ["x", "n"], "OPTIONAL"),
    "count": (f"SELECT ?t (COUNT(?x) AS ?c) WHERE {{ ?x <{EX}type> ?t }} GROUP BY ?t HAVING (COUNT(?x) > 1)",
              ["t", "c"], "aggregates"),
    "ask": (f"ASK {{ ?x <{EX}type> <{EX}P> }}", ["ask"], "ASK"),
    "construct": (f"CONSTRUCT {{ ?y <{EX}knownBy> ?x }} WHERE {{ ?x <{EX}knows> ?y }}",
                  ["subject", "predicate", "object"], "CONSTRUCT"),
}


@pytest.mark.parametrize("name", sorted(OPERATOR_QUERIES))
def test_operator_queries_are_accepted_with_their_class_placement_and_answer_variables(name: str) -> None:
    sparql, columns, operator = OPERATOR_QUERIES[name]
    registry = Registry()
    decision = _register(registry, name, sparql, seq=7)
    status = decision.status
    assert status["status"] == "ACCEPTED", status
    assert status["message"].startswith("operators: ") and operator in status["message"]
    assert "its BGP leaves by centre value" in status["message"]
    _key, plan = decision.plan
    described = json.loads(plan["plan_json"])
    assert (described["class"], described["placement"]) == ("operators", "by-centre")
    assert plan["projected"] == columns == described["columns"]
    assert registry.queries[name].view()["class"] == "operators"
    restored = Registry()
    restored.restore([(name, plan)])
    assert restored.queries[name].query_class == "operators"


def test_operator_queries_a_worker_must_evaluate_whole_are_single_owner() -> None:
    """Variable predicates in patterns that share no end (no one centre meets a solution's triples), and a
    derived stream (written by its owner): both evaluated whole by one worker."""
    registry = Registry()
    decision = _register(registry, "pred", "SELECT * WHERE { ?x ?p ?y . ?y ?q ?z FILTER(?z > 1) }")
    assert "evaluated by its single owner" in decision.status["message"]
    assert json.loads(decision.plan[1]["plan_json"])["placement"] == "single-owner"
    derived = _register(registry, "derived", f"CONSTRUCT {{ ?y <{EX}knownBy> ?x }} WHERE {{ ?x <{EX}knows> ?y }}",
                        stream=f"<{EX}derived>")
    assert derived.status["status"] == "ACCEPTED", derived.status
    assert json.loads(derived.plan[1]["plan_json"])["placement"] == "single-owner"


def test_operators_over_a_window_are_accepted_for_the_spark_job_and_what_a_window_cannot_run_is_not() -> None:
    sparql = (f"SELECT ?x FROM NAMED WINDOW <{EX}w> ON <{EX}s> [RANGE PT10S]\n"
              f"WHERE {{ WINDOW <{EX}w> {{ ?x <{EX}p> ?y FILTER(?y > 1) }} }}")
    decision = _register(Registry(), "w", sparql)
    assert decision.status["status"] == "ACCEPTED", decision.status
    assert "evaluated over the window's content" in decision.status["message"]
    assert "(evaluated by the Spark job)" in decision.status["message"]
    per_event = (f"SELECT (COUNT(*) AS ?n) FROM NAMED WINDOW <{EX}w> ON <{EX}s> [RANGE PT10S STEP PT1S EVENT]\n"
                 f"WHERE {{ WINDOW <{EX}w> {{ ?x <{EX}p> ?y }} }}")
    decision = _register(Registry(), "e", per_event)
    assert decision.status["status"] == "REJECTED" and decision.plan is None
    assert "answers over no triples" in decision.status["message"]
    derived = _register(Registry(), "d", f"CONSTRUCT {{ ?y <{EX}q> ?x }} FROM NAMED WINDOW <{EX}w> ON <{EX}s> "
                        f"[RANGE PT10S] WHERE {{ WINDOW <{EX}w> {{ ?x <{EX}p> ?y }} }}", stream=f"<{EX}derived>")
    assert derived.status["status"] == "REJECTED"
    assert derived.status["message"].startswith("a windowed query cannot feed a derived stream")


def test_a_service_clause_over_a_window_is_accepted_as_background_data() -> None:
    """Seed paper 003's shape: a mention stream in a window, follower counts from an endpoint (their local
    view is background data, not windowed), a FILTER on them beside the window block."""
    sparql = (f"PREFIX : <{EX}>\nSELECT ?u ?n FROM NAMED WINDOW :w ON :s [RANGE PT60S STEP PT10S]\n"
              "WHERE { WINDOW :w { ?t :mentions ?u } SERVICE <http://127.0.0.1:1/sparql> { ?u :followers ?n } "
              "FILTER(?n > 10) }")
    decision = _register(Registry(), "mentions", sparql)
    assert decision.status["status"] == "ACCEPTED", decision.status
    assert "window sliding" in decision.status["message"] and "SERVICE" in decision.status["message"]
    # the default policy, a window join (WSJ-WBM), runs as asked: the service follows the window's join keys
    assert "at every window slide (10 s) with WSJ-WBM within the budget; the window's join keys followed" \
        in decision.status["message"], decision.status["message"]
    per_event = _register(Registry(), "e", f"SELECT * WHERE {{ ?t <{EX}mentions> ?u SERVICE <http://127.0.0.1:1/"
                                           f"sparql> {{ ?u <{EX}followers> ?n }} }}", window="event", range="PT10S")
    assert per_event.status["status"] == "REJECTED"
    assert per_event.status["message"].startswith("SERVICE is not supported in a per-event window")


@pytest.mark.parametrize("bad_id", ["", "has space", "a/b", "x" * 129, None])
def test_invalid_query_ids_are_rejected(bad_id: Any) -> None:
    decision = Registry().decide({"command": "REGISTER", "query_id": bad_id, "sparql": QUERIES["star"]}, lambda: 0)
    assert decision.status["status"] == "REJECTED" and decision.plan is None
    assert "A-Z a-z 0-9 _ . -" in decision.status["message"]


def test_a_second_text_under_the_same_id_needs_replace_and_bumps_the_version() -> None:
    reg = Registry()
    _register(reg, "q", QUERIES["star"])
    clash = _register(reg, "q", QUERIES["path"])
    assert clash.status["status"] == "REJECTED" and "replace=true" in clash.status["message"]
    assert reg.queries["q"].sparql == QUERIES["star"]
    replaced = _register(reg, "q", QUERIES["path"], replace="true")
    assert replaced.status["status"] == "ACCEPTED" and replaced.plan[1]["version"] == 2
    assert "replace" not in replaced.plan[1]["options"]
    assert reg.queries["q"].version == 2 and reg.queries["q"].query_class == "var-connected"


WINDOWED = (f"PREFIX : <{EX}>\nSELECT ?a FROM NAMED WINDOW :w ON :s [RANGE PT60S STEP PT10S]\n"
            "WHERE { WINDOW :w { ?a :knows ?b } }")


def test_a_windowed_query_is_accepted_with_its_window_and_the_plan_of_its_patterns() -> None:
    decision = _register(Registry(), "w", WINDOWED, late="admit", lateness="PT5S")
    assert decision.status["status"] == "ACCEPTED"
    assert "window sliding range 60000 ms step 10000 ms, lateness 5000 ms, late updates admitted" in \
        decision.status["message"]
    _key, plan = decision.plan
    assert plan["sparql"] == WINDOWED and plan["options"] == {"late": "admit", "lateness": "PT5S"}
    assert json.loads(plan["plan_json"]) == decompose(parse_query(f"SELECT ?a WHERE {{ ?a <{EX}knows> ?b }}")).to_json()
    by_options = _register(Registry(), "o", QUERIES["path"], window="tumbling", range="PT1M")
    assert by_options.status["status"] == "ACCEPTED" and "window tumbling range 60000 ms" in by_options.status["message"]


@pytest.mark.parametrize("sparql, options, fragment, line", [
    (WINDOWED.replace("PT60S", "PT6X"), {}, "RANGE", 2),
    (WINDOWED.replace("WINDOW :w {", "WINDOW :v {"), {}, "undeclared window", 3),
    (WINDOWED, {"window": "sliding"}, "declares its window", None),
    (QUERIES["path"], {"window": "hourly", "range": "PT1H"}, "hourly", None),
    (QUERIES["path"], {"range": "PT1H"}, "without window=", None),
])
def test_window_mistakes_are_rejected_with_a_message_that_says_what(sparql: str, options: dict, fragment: str,
                                                                     line: int | None) -> None:
    decision = _register(Registry(), "w", sparql, **options)
    assert decision.status["status"] == "REJECTED" and decision.plan is None
    assert fragment in decision.status["message"]
    assert decision.status["line"] == line


def test_registering_the_same_text_again_publishes_nothing() -> None:
    reg = Registry()
    _register(reg, "q", QUERIES["star"])
    again = _register(reg, "q", QUERIES["star"])
    assert again.status["status"] == "ACCEPTED" and again.plan is None and "already registered" in again.status["message"]


def test_unregister_of_an_unknown_id_is_rejected_and_of_a_known_one_is_a_tombstone() -> None:
    reg = Registry()
    unknown = reg.decide({"command": "UNREGISTER", "query_id": "nope"}, lambda: 0)
    assert unknown.status["status"] == "REJECTED" and unknown.plan is None
    _register(reg, "q", QUERIES["star"])
    gone = reg.decide({"command": "UNREGISTER", "query_id": "q"}, lambda: 0)
    assert gone.status["status"] == "UNREGISTERED" and gone.plan == ("q", None)
    reg.commit(gone)
    assert reg.decide({"command": "LIST"}, lambda: 0).status["queries"] == []


def test_list_answers_a_page_at_a_time_in_id_order() -> None:
    reg = Registry()
    for i in reversed(range(5)):
        reg.commit(reg.decide({"command": "REGISTER", "query_id": f"q{i}", "sparql": QUERIES["star"]}, lambda: 0))
    first = reg.decide({"command": "LIST", "options": {"limit": "2"}}, lambda: 0).status
    assert first["queries"] == ["q0", "q1"] and "the next page: --after q1" in first["message"]
    last = reg.decide({"command": "LIST", "options": {"limit": "2", "after": "q3"}}, lambda: 0).status
    assert last["queries"] == ["q4"] and "next page" not in last["message"]
    assert reg.decide({"command": "LIST", "options": {"limit": "x"}}, lambda: 0).status["status"] == "REJECTED"


def test_restore_keeps_the_last_plan_per_id_and_drops_tombstoned_ids() -> None:
    source = Registry()
    plans = [_register(source, "a", QUERIES["star"]).plan, _register(source, "b", QUERIES["path"]).plan,
             _register(source, "a", QUERIES["loose"], replace="true").plan, ("b", None)]
    restored = Registry()
    assert restored.restore(plans) == 1
    assert restored.queries["a"].version == 2 and restored.queries["a"].query_class == "loosely-connected"


# ---------------------------------------------------------------------------------------- the service


class Registered:
    """A running `cbgp registry` with its settings and ports."""

    def __init__(self, settings: KafkaSettings, state_dir: Path, log_path: Path) -> None:
        self.settings = settings
        self.web_port = free_port()
        self.metrics_port = free_port()
        env = {**os.environ, **settings.to_env()}
        self.child = ChildProcess("registry", cbgp_command(
            "registry", "--web-port", str(self.web_port), "--metrics-port", str(self.metrics_port),
            "--state-dir", str(state_dir)), env=env, log_path=log_path)

    def start(self) -> "Registered":
        self.child.start()
        self.child.wait_until(lambda: http_ok(f"http://127.0.0.1:{self.metrics_port}/readyz"), timeout=60)
        return self

    def ask(self, **command: Any) -> dict[str, Any]:
        return admin_request(self.settings, command, wait=30)

    def web(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}{path}", timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture(scope="module")
def registry(kafka_broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registered]:
    """One registry process for the module's service tests (each test uses its own query ids)."""
    settings = fresh_settings(kafka_broker)
    ensure_topics(settings)
    tmp = tmp_path_factory.mktemp("registry")
    service = Registered(settings, tmp / "state", tmp / "registry.log").start()
    yield service
    service.child.stop()


def _plans(settings: KafkaSettings, query_id: str) -> list[dict[str, Any] | None]:
    return [None if m.value() is None else decode("QueryPlan", m.value())
            for m in read_all(settings, settings.topic("queries.plans")) if m.key() == query_id.encode()]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_service_accepts_each_class_and_publishes_the_decomposed_plan(registry: Registered) -> None:
    settings = registry.settings
    producer = make_producer(settings)
    for i in range(3):  # three ordered changes: registered_at_seq must be 3
        produce_sync(producer, settings.topic("updates.encoded"), b"change %d" % i)
    for name, sparql in QUERIES.items():
        status = registry.ask(command="REGISTER", query_id=f"cls-{name}", sparql=sparql)
        assert status["status"] == "ACCEPTED", status
        assert status["message"].startswith(CLASSES[name]) and status["query_id"] == f"cls-{name}"
        [plan] = _plans(settings, f"cls-{name}")
        assert json.loads(plan["plan_json"]) == decompose(parse_query(sparql)).to_json()
        assert plan["sparql"] == sparql and plan["version"] == 1 and plan["registered_at_seq"] == 3


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_plan_carries_the_seq_of_the_last_change_before_its_registration(registry: Registered) -> None:
    """``registered_at_change_seq``: the seq a by-centre registration answers as of, found by the registry in
    updates.encoded once, so that workers need not read the log next to every plan at every restore (the log
    there may be deleted one day: docs/design/bounded-input-logs.md).  It equals what a worker finds itself for
    an older plan (``change_seq_before`` over the same log)."""
    from cbgp.change import INSERT, ROLE_BOTH, change_of
    from services.codec import encode_encoded_batch, encoded_changes
    from services.wire.registrations import change_seq_before
    from services.kafka.replay import read_range

    settings = registry.settings
    topic = settings.topic("updates.encoded")
    producer = make_producer(settings)
    last = 0
    for size in (5, 4):
        changes = [change_of((last + i + 1, INSERT, 10 + i, 20, 30 + last + i, 0, 1000, ROLE_BOTH, False))
                   for i in range(size)]
        produce_sync(producer, topic, encode_encoded_batch(changes, [(0, i) for i in range(size)], "raw"))
        last += size
    status = registry.ask(command="REGISTER", query_id="as-of", sparql=f"SELECT ?x WHERE {{ ?x <{EX}p> ?y }}")
    assert status["status"] == "ACCEPTED", status
    [plan] = _plans(settings, "as-of")

    def changes_in(start: int, end: int) -> list:
        out = []
        for msg in read_range(settings, topic, 0, start, end):
            try:
                out.extend(encoded_changes(msg.value()))
            except CodecError:
                pass  # (the junk an earlier test wrote)
        return out

    assert plan["registered_at_change_seq"] == 9 == change_seq_before(changes_in, plan["registered_at_seq"])


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("sparql,line,column,words", [
    # out of scope of the operators too (FILTER, OPTIONAL... are accepted)
    ("SELECT * WHERE {\n  ?x !(^<http://ex.org/p>) ?y .\n}", 2, 8, "negated property set"),
    ("SELECT * WHERE { ?x <http://ex.org/p> ?y FILTER(?y < RAND()) }", 1, 54, "RAND()"),
    # the cause is the brace left open, at its position (syntax errors name a cause)
    ("SELECT * WHERE { ?x <http://ex.org/p> ?y \n ?y", 1, 16, "'{' is never closed"),
])
def test_service_rejects_bad_queries_with_line_and_column(registry: Registered, sparql: str, line: int, column: int,
                                                           words: str) -> None:
    status = registry.ask(command="REGISTER", query_id="bad", sparql=sparql)
    assert status["status"] == "REJECTED" and words in status["message"]
    assert (status["line"], status["column"]) == (line, column)
    assert _plans(registry.settings, "bad") == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_service_unregisters_with_a_tombstone_and_lists(registry: Registered) -> None:
    assert registry.ask(command="REGISTER", query_id="gone", sparql=QUERIES["star"])["status"] == "ACCEPTED"
    assert "gone" in registry.ask(command="LIST")["queries"]
    reply = registry.ask(command="UNREGISTER", query_id="gone")
    assert reply["status"] == "UNREGISTERED"
    assert _plans(registry.settings, "gone")[-1] is None
    listed = registry.ask(command="LIST")
    assert listed["status"] == "LISTED" and "gone" not in listed["queries"]
    assert registry.ask(command="UNREGISTER", query_id="gone")["status"] == "REJECTED"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_service_answers_garbage_with_an_error_and_keeps_going(registry: Registered) -> None:
    settings = registry.settings
    producer = make_producer(settings)
    produce_sync(producer, settings.topic("admin"), b"\x00 not avro at all")
    # The next valid command is still answered, so the garbage did not stop the service.
    assert registry.ask(command="REGISTER", query_id="after-garbage", sparql=QUERIES["path"])["status"] == "ACCEPTED"
    statuses = [decode("QueryStatus", m.value()) for m in read_all(settings, settings.topic("queries.status"))]
    errors = [s for s in statuses if s["status"] == "ERROR"]
    assert errors and "undecodable admin record" in errors[-1]["message"] and "\n" not in errors[-1]["message"]
    dead = [decode("DeadLetter", m.value()) for m in read_all(settings, settings.topic("deadletter"))]
    assert any(d["service"] == "registry" and d["original"] == b"\x00 not avro at all" for d in dead)
    assert registry.child.alive()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_web_view_lists_queries_and_shows_one(registry: Registered) -> None:
    registry.ask(command="REGISTER", query_id="web-q", sparql=QUERIES["star"])
    code, body = registry.web("/queries")
    assert code == 200
    listed = {q["query_id"]: q for q in body["queries"]}
    assert listed["web-q"]["class"] == "simple var-centric star" and listed["web-q"]["status"] == "registered"
    code, one = registry.web("/queries/web-q")
    assert code == 200 and one["sparql"] == QUERIES["star"] and one["version"] == 1
    code, missing = registry.web("/queries/no-such-query")
    assert code == 404 and "no-such-query" in missing["detail"] and missing["status"] == 404


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_restart_keeps_the_registered_set(kafka_broker: Any, tmp_path: Path) -> None:
    settings = fresh_settings(kafka_broker)
    ensure_topics(settings)
    first = Registered(settings, tmp_path / "state", tmp_path / "first.log").start()
    try:
        assert first.ask(command="REGISTER", query_id="keep", sparql=QUERIES["star"])["status"] == "ACCEPTED"
        assert first.ask(command="REGISTER", query_id="drop", sparql=QUERIES["path"])["status"] == "ACCEPTED"
        assert first.ask(command="UNREGISTER", query_id="drop")["status"] == "UNREGISTERED"
        first.child.signal(signal.SIGTERM)
        assert first.child.proc.wait(30) == 0  # graceful SIGTERM
    finally:
        first.child.stop()
    # A fresh state dir: what survives must come from Kafka (queries.plans), not from local files.
    second = Registered(settings, tmp_path / "state2", tmp_path / "second.log").start()
    try:
        assert second.ask(command="LIST")["queries"] == ["keep"]
        assert second.ask(command="REGISTER", query_id="keep", sparql=QUERIES["path"])["status"] == "REJECTED"
        assert [q["query_id"] for q in second.web("/queries")[1]["queries"]] == ["keep"]
        assert http_ok(f"http://127.0.0.1:{second.metrics_port}/metrics")
    finally:
        second.child.stop()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_restart_after_a_plain_register_recovers_the_registered_set(kafka_broker: Any, tmp_path: Path) -> None:
    """A registry stopped right after a REGISTER lists the query in its next life (from queries.plans)."""
    settings = fresh_settings(kafka_broker)
    ensure_topics(settings)
    first = Registered(settings, tmp_path / "s1", tmp_path / "first.log").start()
    try:
        assert first.ask(command="REGISTER", query_id="keep", sparql=QUERIES["star"])["status"] == "ACCEPTED"
        first.child.signal(signal.SIGTERM)
        assert first.child.proc.wait(30) == 0
    finally:
        first.child.stop()
    second = Registered(settings, tmp_path / "s2", tmp_path / "second.log").start()
    try:
        assert second.ask(command="LIST")["queries"] == ["keep"]
    finally:
        second.child.stop()


@pytest.mark.slow
def test_the_end_of_the_update_log_is_waited_for_not_reported_as_an_internal_error(kafka_broker: Any) -> None:
    """Right after the topics are created, the registry may not see updates.encoded yet (librdkafka reports
    an unknown partition): that is the broker catching up, so the registry waits instead of failing the
    command (a fault run once lost its first query this way)."""
    import threading

    from services.kafka.topics import ensure_topics
    from services.registry.service import RegistryService

    settings = fresh_settings(kafka_broker)  # no topics yet
    service = RegistryService(settings)
    try:
        with pytest.raises(Exception):
            service.encoded_end(patience_s=0)  # no updates.encoded yet: an error, not a made-up offset
        creator = threading.Timer(1.5, ensure_topics, args=(settings,))
        creator.start()
        assert service.encoded_end(patience_s=60) == 0
        creator.join()
    finally:
        service.close()


def test_after_an_empty_fetch_aiokafka_backs_off_and_after_records_it_does_not(monkeypatch: pytest.MonkeyPatch) -> None:
    # noida-db answers an empty Fetch at once: without a pause aiokafka's fetch loop spun at ~0.7 core idle
    import asyncio

    from aiokafka.consumer.fetcher import Fetcher

    import services.registry.service as registry_faust

    class Fake:
        def __init__(self) -> None:
            self._records: dict[str, int] = {}

    class Assignment:
        active = True

    async def original(self: Fake, assignment: Any, node_id: int, request: str) -> bool:
        if request == "records":
            self._records["admin-0"] = 1
            return True
        return False

    slept: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        slept.append(seconds)

    monkeypatch.setattr(Fetcher, "_proc_fetch_request", original)
    monkeypatch.setattr(registry_faust.asyncio, "sleep", fake_sleep)
    registry_faust.install_empty_fetch_backoff(0.25)
    registry_faust.install_empty_fetch_backoff(0.25)  # idempotent: one backoff per empty fetch, not two
    fetcher = Fake()
    assert asyncio.run(Fetcher._proc_fetch_request(fetcher, Assignment(), 1, "empty")) is False
    assert slept == [0.25]
    assert asyncio.run(Fetcher._proc_fetch_request(fetcher, Assignment(), 1, "records")) is True
    assert slept == [0.25]


@pytest.mark.slow
def test_the_registry_log_is_readable_and_names_its_ports(registry: Registered) -> None:
    # Its log is a file, not a terminal: faust's spinner codes filled it and said nothing else before.
    wait = time.monotonic() + 30
    while "ready" not in registry.child.log_tail(200) and time.monotonic() < wait:
        time.sleep(0.5)
    text = registry.child.log_tail(200)
    assert "\x1b" not in text and "\b" not in text
    assert f"http://127.0.0.1:{registry.web_port}/queries" in text
    assert f"http://127.0.0.1:{registry.metrics_port}/metrics" in text
    assert "registry ready" in text


def test_admin_offsets_are_processed_once_in_order_whatever_the_consumer_delivers() -> None:
    """faust was seen (after a kill -9 restart) to skip admin offset 4 and deliver 5 twice: the guard reads
    the skipped offsets directly and drops the repeat."""
    from services.registry.service import admin_gap

    expected, processed = 3, []
    for delivered in (3, 5, 5, 6, 6, 9):
        missed = admin_gap(expected, delivered)
        if missed is None:
            continue
        processed += list(missed) + [delivered]
        expected = delivered + 1
    assert processed == [3, 4, 5, 6, 7, 8, 9]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_burst_of_thousands_of_registrations_is_answered_in_full(embedded_broker: Any, tmp_path: Path) -> None:
    """A subscription service registers its users' alerts all at once: every command gets its reply (the
    registry once stopped reading the admin topic for good after a few thousand waiting commands).  On a broker
    of its own: the embedded broker rewrites its whole snapshot every second, and thousands of records would
    slow every later test of the session."""
    settings = fresh_settings(embedded_broker)
    ensure_topics(settings)
    registry = Registered(settings, tmp_path / "state", tmp_path / "registry.log").start()
    try:
        _burst(registry, settings)
    finally:
        registry.child.stop()


def _burst(registry: Registered, settings: KafkaSettings) -> None:
    import uuid

    from confluent_kafka import TopicPartition

    from services.codec import encode
    from services.kafka.client import end_offsets, make_consumer

    n = int(os.environ.get('BURST_N', '5000'))
    status_topic = settings.topic("queries.status")
    consumer = make_consumer(settings, f"burst-{uuid.uuid4().hex}")
    consumer.assign([TopicPartition(status_topic, 0, end_offsets(settings, status_topic).get(0, (0, 0))[1])])
    producer = make_producer(settings)
    waiting = {}
    for i in range(n):
        request_id = uuid.uuid4().hex
        waiting[request_id] = f"burst{i}"
        producer.produce(settings.topic("admin"), value=encode("AdminCommand", {
            "command": "REGISTER", "query_id": f"burst{i}", "options": {}, "request_id": request_id,
            "sparql": f"SELECT ?post WHERE {{ ?post <http://ex.org/tag> \"t{i}\" ; <http://ex.org/by> ?who }}"}))
        producer.poll(0)
    assert producer.flush(60) == 0
    statuses: dict[str, int] = {}
    deadline = time.monotonic() + 240
    try:
        while waiting and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            status = decode("QueryStatus", msg.value())
            if waiting.pop(status["request_id"], None) is not None:
                statuses[status["status"]] = statuses.get(status["status"], 0) + 1
    finally:
        consumer.close()
    assert not waiting, f"{len(waiting)} of {n} commands unanswered; answered: {statuses}"
    assert statuses == {"ACCEPTED": n}
    listed: list[str] = []  # a page at a time: the reply to one LIST is a record, bounded in size
    after = None
    while True:
        reply = registry.ask(command="LIST", options={"limit": "2000", **({"after": after} if after else {})})
        listed += reply["queries"]
        if "the next page" not in reply["message"]:
            break
        after = reply["queries"][-1]
    assert sum(1 for q in listed if q.startswith("burst")) == n and listed == sorted(set(listed))
    shown: list[str] = []
    path = "/queries?limit=3000"
    while path:
        status, body = registry.web(path)
        assert status == 200
        shown += [q["query_id"] for q in body["queries"]]
        path = body.get("next")
    assert shown == listed
    assert registry.web("/queries?limit=0")[0] == 400


def test_an_owner_registers_at_most_its_limit_per_minute_and_an_operator_has_none(monkeypatch) -> None:
    """Each registration costs every worker a snapshot of its share of the graph: one owner's are limited per
    minute (a retry of the same text counts nothing), and the refusal names the setting and when to try again."""
    monkeypatch.setenv("CBGP_MAX_QUERIES_PER_MINUTE", "3")
    now = [1_000_000]
    reg = Registry(clock=lambda: now[0])

    def register(qid: str, owner: str | None, text: str = QUERIES["star"]) -> dict:
        decision = reg.decide({"command": "REGISTER", "query_id": qid, "sparql": text, "owner": owner,
                               "options": {"replace": "true"}}, lambda: 0)
        reg.commit(decision)
        return decision.status

    assert [register(f"q{i}", "alice")["status"] for i in range(3)] == ["ACCEPTED"] * 3
    assert register("q0", "alice")["status"] == "ACCEPTED"  # (the same text again: nothing published)
    refused = register("q3", "alice")
    assert refused["status"] == "REJECTED" and "CBGP_MAX_QUERIES_PER_MINUTE=3" in refused["message"]
    assert "try again in 60 s" in refused["message"]
    assert register("q2", "alice", QUERIES["path"])["status"] == "REJECTED"  # (a replacement is a registration)
    assert register("b0", "bob")["status"] == "ACCEPTED"  # (another owner's own minute)
    assert all(register(f"op{i}", None)["status"] == "ACCEPTED" for i in range(5))
    now[0] += 60_000
    assert register("q3", "alice")["status"] == "ACCEPTED"
