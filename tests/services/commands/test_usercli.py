"""The user commands against the real broker: publish, register/unregister/list (with a real registry
process), watch and current (on Answer / CurrentAnswer records written here, as the answers service would)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pyoxigraph as ox
import pytest
from rdflib import BNode, Literal, URIRef

from cbgp.inputs.formats import InputError, parse_patch
from services.commands.main import main as cbgp
from services.codec import encode
from services.codec.answers import sparql_json_term
from services.kafka.config import KafkaSettings
from services.kafka.topics import ensure_topics
from services.kafka.client import make_producer, produce_sync, read_all
from services.kafka.broker import free_port
from services.runtime.supervise import ChildProcess, cbgp_command, http_ok
from cbgp.results import JSON, serialize, shape_of
from services.client.reading import answer_json, watch_answers
from services.client.requests import admin_request
from services.client.publish import chunk_lines
from tests.fixtures.broker import fresh_settings
from tests.sparql_results import parse_with_pyoxigraph, parse_with_rdflib, results_document

EX = "http://ex.org/"
PATCH = (
    f"PA ex: <{EX}> .\n"
    + "".join(f"A ex:s{i} ex:p ex:o{i} .\n" for i in range(40))
    + "TX .\n" + "".join(f"A ex:t ex:q ex:v{i} .\n" for i in range(30)) + "TC .\n"
    + "".join(f"D ex:s{i} ex:p ex:o{i} .\n" for i in range(20))
)


def flags(settings: KafkaSettings) -> list[str]:
    return ["--bootstrap-servers", settings.bootstrap_servers, "--topic-prefix", settings.topic_prefix]


def term(iri: str) -> dict[str, Any]:
    return {"type": "uri", "value": iri, "datatype": None, "lang": None}


XSD_INT = "http://www.w3.org/2001/XMLSchema#integer"
# Avro SparqlTerm records of a language-tagged literal, a typed literal and a blank node, and what a real
# SPARQL JSON client must read back for them.
LANG = {"type": "literal", "value": "Bob", "datatype": None, "lang": "en"}
TYPED = {"type": "literal", "value": "42", "datatype": XSD_INT, "lang": None}
BLANK = {"type": "bnode", "value": "b7", "datatype": None, "lang": None}
OX_TERMS = {"n": ox.Literal("Bob", language="en"), "age": ox.Literal("42", datatype=ox.NamedNode(XSD_INT)),
            "x": ox.NamedNode(f"{EX}bob")}
RDFLIB_TERMS = {"n": Literal("Bob", lang="en"), "age": Literal("42", datatype=URIRef(XSD_INT)), "x": URIRef(f"{EX}bob")}


def assert_real_clients_read(document: str, rows: int = 1) -> None:
    """pyoxigraph and rdflib both parse ``document`` and get the terms of OX_TERMS / RDFLIB_TERMS back."""
    assert parse_with_pyoxigraph(document) == [OX_TERMS] * rows
    assert parse_with_rdflib(document) == [RDFLIB_TERMS] * rows


# ---------------------------------------------------------------------------------------- publish


@pytest.mark.parametrize("chunk", [1, 64, 500, 10_000])
def test_chunks_are_whole_lines_keep_transactions_and_repeat_prefixes(chunk: int) -> None:
    data = PATCH.encode()
    records = list(chunk_lines(data, "patch", chunk))
    prefix = f"PA ex: <{EX}> .\n".encode()
    bodies = [payload if i == 0 else payload.removeprefix(prefix) for i, (_f, _n, payload) in enumerate(records)]
    assert b"".join(bodies) == data  # every line exactly once, in order
    assert sum(n for _f, n, _p in records) == data.count(b"\n")
    for first, _n, payload in records:
        text = payload.decode()
        assert text.count("TX .") == text.count("TC ."), f"transaction split in the record from line {first}"
        assert not [item for item in parse_patch(text) if isinstance(item, InputError)]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_publish_sends_parseable_records_with_the_format_header(kafka_settings: KafkaSettings, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "changes.rdfp"
    path.write_text(PATCH)
    assert cbgp(["publish", str(path), "--chunk-bytes", "300", *flags(kafka_settings)]) == 0
    assert "published 93 lines" in capsys.readouterr().err
    records = read_all(kafka_settings, kafka_settings.topic("updates.raw"))
    assert len(records) > 3
    updates = 0
    for msg in records:
        headers = dict(msg.headers())
        assert headers["cbgp-format"] == b"patch" and headers["cbgp-source"] == b"changes.rdfp"
        items = list(parse_patch(msg.value().decode()))
        assert not [i for i in items if isinstance(i, InputError)]
        updates += len(items)
    assert updates == 90
    # numbered for ingest, which drops a retried copy by its number (services.ingest.retries): one id per publish
    assert [dict(m.headers())["cbgp-record"] for m in records] == [str(n).encode() for n in range(1, len(records) + 1)]
    ids = {dict(m.headers())["cbgp-publish"] for m in records}
    assert len(ids) == 1 and len(ids.pop()) == 32
    assert cbgp(["publish", str(path), "--chunk-bytes", "300", *flags(kafka_settings)]) == 0
    again = read_all(kafka_settings, kafka_settings.topic("updates.raw"))[len(records):]
    assert {dict(m.headers())["cbgp-publish"] for m in again}.isdisjoint(
        {dict(m.headers())["cbgp-publish"] for m in records}), "a publish run again is a new publish"


def test_publish_of_an_unknown_format_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "changes.weird"
    path.write_text("these are not changes\n")  # (a name that says nothing, and lines no format reads)
    assert cbgp(["publish", str(path), "--bootstrap-servers", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("cbgp publish: error: cannot tell the format") and "\n" not in err


# ---------------------------------------------------------------------------------------- admin commands


@pytest.fixture(scope="module")
def registry_settings(kafka_broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaSettings]:
    settings = fresh_settings(kafka_broker)
    ensure_topics(settings)
    tmp = tmp_path_factory.mktemp("usercli-registry")
    metrics = free_port()
    child = ChildProcess("registry", cbgp_command("registry", "--web-port", str(free_port()), "--metrics-port",
                                                  str(metrics), "--state-dir", str(tmp / "state")),
                         env={**os.environ, **settings.to_env()}, log_path=tmp / "registry.log").start()
    try:
        child.wait_until(lambda: http_ok(f"http://127.0.0.1:{metrics}/readyz"), timeout=60)
        yield settings
    finally:
        child.stop()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_register_list_unregister(registry_settings: KafkaSettings, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "star.rq"
    good.write_text(f"SELECT ?x WHERE {{ ?x <{EX}type> <{EX}Person> }}")
    bad = tmp_path / "bad.rq"
    bad.write_text(f"SELECT ?x WHERE {{\n  ?x <{EX}p> ?y .\n  ?y !(^<{EX}q>) ?z\n}}")  # an inverse in a negated set
    f = flags(registry_settings)
    assert cbgp(["register", "people", str(good), *f]) == 0
    assert capsys.readouterr().out.strip() == "accepted: simple var-centric star: 1 pattern in 1 part(s): star ?x [t0]"
    assert cbgp(["register", "pathy", str(bad), *f]) == 1
    out = capsys.readouterr().out.strip()
    assert out.startswith("rejected: an inverse IRI inside a negated property set") and out.endswith("(line 3, column 8)")
    filtered = tmp_path / "filtered.rq"  # beyond a BGP: the leaves by centre, the operators after
    filtered.write_text(f"SELECT ?x WHERE {{\n  ?x <{EX}p> ?y .\n  FILTER(?y > 1)\n}}")
    assert cbgp(["register", "filtered", str(filtered), *f]) == 0
    assert capsys.readouterr().out.strip().startswith("accepted: operators: SELECT with FILTER over 1 BGP; "
                                                      "its BGP leaves by centre value on updates.routed")
    assert cbgp(["list", *f]) == 0
    assert capsys.readouterr().out.split() == ["filtered", "people"]
    assert cbgp(["register", "people", str(bad), "--option", "replace=true", *f]) == 1  # replace still validates
    capsys.readouterr()
    assert cbgp(["unregister", "people", *f]) == 0
    assert capsys.readouterr().out.strip() == "unregistered: query 'people' unregistered"
    assert cbgp(["unregister", "people", *f]) == 1
    assert "no query with id 'people'" in capsys.readouterr().out


def test_register_with_an_unknown_option_fails_before_sending(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    query = tmp_path / "q.rq"
    query.write_text(f"SELECT ?x WHERE {{ ?x <{EX}p> ?y }}")
    # no broker at this address: the option is checked before any is contacted
    assert cbgp(["register", "late", str(query), "--option", "windw=sliding", "--bootstrap-servers",
                 "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert err == ("cbgp register: error: --option: unknown option 'windw' (did you mean 'window'?): the options "
                   "are window, range, step, lateness, late, stream, cross_product, replace\n")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_raw_admin_command_with_an_unknown_option_is_rejected_on_the_status_topic(
        registry_settings: KafkaSettings) -> None:
    status = admin_request(registry_settings, {"command": "REGISTER", "query_id": "typo",
                                               "sparql": f"SELECT ?x WHERE {{ ?x <{EX}p> ?y }}",
                                               "options": {"windw": "sliding"}})
    assert status["status"] == "REJECTED" and status["message"].startswith("unknown option 'windw'")
    assert "typo" not in admin_request(registry_settings, {"command": "LIST"})["queries"]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_register_without_a_registry_says_so(kafka_settings: KafkaSettings, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    query = tmp_path / "q.rq"
    query.write_text(f"SELECT ?x WHERE {{ ?x <{EX}p> <{EX}o> }}")
    assert cbgp(["register", "q", str(query), "--wait", "2", *flags(kafka_settings)]) == 1
    assert "no reply from the registry within 2 s" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- answers


def test_watch_lines_and_current_results_are_sparql_json_that_pyoxigraph_and_rdflib_read() -> None:
    binding = {"x": term(f"{EX}bob"), "n": LANG, "age": TYPED}
    line = answer_json({"query_id": "q", "version": 1, "n": 1, "seq": 5, "sign": "+", "binding": binding,
                         "snapshot": False})
    assert line["binding"]["n"] == {"type": "literal", "value": "Bob", "xml:lang": "en"}
    assert line["binding"]["age"] == {"type": "literal", "value": "42", "datatype": XSD_INT}
    assert line["query"] == "q" and "query_id" not in line  # named as in `cbgp replay`'s lines
    assert_real_clients_read(results_document(["x", "n", "age"], [line["binding"]]))
    shape = shape_of("SELECT ?x ?n ?age WHERE { ?x ?n ?age }", ("x", "n", "age"))
    assert_real_clients_read(serialize(shape, [line["binding"]] * 2, JSON).decode(), rows=2)
    blank = answer_json({"query_id": "q", "version": 1, "n": 2, "seq": 6, "sign": "-", "binding": {"b": BLANK},
                          "snapshot": False})["binding"]
    assert parse_with_pyoxigraph(results_document(["b"], [blank])) == [{"b": ox.BlankNode("b7")}]
    assert parse_with_rdflib(results_document(["b"], [blank])) == [{"b": BNode("b7")}]


def _answer(query: str, n: int, sign: str = "+") -> bytes:
    return encode("Answer", {"query_id": query, "n": n, "seq": 10 + n, "sign": sign,
                             "binding": {"x": term(f"{EX}a{n}")}, "snapshot": False, "produced_at_ms": 0})


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_watch_starts_at_n_drops_duplicates_and_warns_on_gaps(kafka_settings: KafkaSettings) -> None:
    producer = make_producer(kafka_settings)
    topic = kafka_settings.topic("answers")
    for query, n in [("q", 1), ("q", 2), ("other", 1), ("q", 3), ("q", 3), ("q", 6), ("q", 7)]:
        produce_sync(producer, topic, _answer(query, n), key=query, partition=1)
    import io
    out, err = io.StringIO(), io.StringIO()
    assert watch_answers(kafka_settings, "q", 2, count=4, out=out, err=err) == 4
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [a["n"] for a in lines] == [2, 3, 6, 7] and lines[0]["binding"] == {"x": {"type": "uri", "value": f"{EX}a2"}}
    assert {a["query"] for a in lines} == {"q"}
    assert "expected n=4, got n=6 (2 missing)" in err.getvalue()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_watch_from_answers_retention_deleted_says_where_they_went(kafka_settings: KafkaSettings) -> None:
    """``cbgp watch --from N`` below what retention left says so, and where the answers they add up to
    are -- instead of the warning for a gap a producer left."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    producer = make_producer(kafka_settings)
    topic = kafka_settings.topic("answers")
    for n in range(1, 6):
        produce_sync(producer, topic, _answer("q", n), key="q", partition=2)
    admin = AdminClient(kafka_settings.admin_config())
    for future in admin.delete_records([TopicPartition(topic, 2, 3)], request_timeout=10).values():
        future.result(10)  # as retention would: n = 1..3 are gone
    import io
    out, err = io.StringIO(), io.StringIO()
    assert watch_answers(kafka_settings, "q", 1, count=2, out=out, err=err) == 2
    assert [json.loads(line)["n"] for line in out.getvalue().splitlines()] == [4, 5]
    assert err.getvalue().count("\n") == 1 and "gap" not in err.getvalue()
    assert (f"answers n=1..3 of q are no longer on {topic} (its partition 2 now starts at offset 3: retention "
            "deleted the older records); the current answers they add up to: `cbgp current q`") in err.getvalue()


def put_plan(settings: KafkaSettings, query_id: str, projected: list[str], sparql: str = "") -> None:
    """The ``QueryPlan`` the registry would publish for ``query_id`` (watch and current look it up)."""
    plan = {"query_id": query_id, "sparql": sparql or f"SELECT * WHERE {{ ?x <{EX}p> <{EX}o> }}", "options": {},
            "plan_json": "{}", "projected": projected, "registered_at_seq": 0, "version": 1}
    produce_sync(make_producer(settings), settings.topic("queries.plans"), encode("QueryPlan", plan), key=query_id)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_watch_and_current_of_an_unknown_id_say_so_in_one_line(kafka_settings: KafkaSettings) -> None:
    producer = make_producer(kafka_settings)
    # answers left behind by a query that is no longer registered (its plan tombstoned) are not served either
    produce_sync(producer, kafka_settings.topic("answers"), _answer("gone", 1), key="gone")
    put_plan(kafka_settings, "gone", ["x"])
    produce_sync(producer, kafka_settings.topic("queries.plans"), None, key="gone")
    for command in ("watch", "current"):
        for query_id in ("nope", "gone"):
            result = subprocess.run(cbgp_command(command, query_id, *flags(kafka_settings)), capture_output=True,
                                    text=True, timeout=30)  # watch used to wait forever
            assert result.returncode == 1 and result.stdout == ""
            assert result.stderr == (f"cbgp {command}: error: no query with id {query_id!r} is registered "
                                     "(`cbgp list` shows the registered ids)\n")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_watch_runs_live_until_ctrl_c(kafka_settings: KafkaSettings, tmp_path: Path) -> None:
    producer = make_producer(kafka_settings)
    put_plan(kafka_settings, "live", ["x"])
    produce_sync(producer, kafka_settings.topic("answers"), _answer("live", 1), key="live")
    # (stderr to a file, not an unread pipe: the client's log lines on a loaded broker can fill a pipe, and a
    # watcher blocked writing to it never ends)
    with open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen(cbgp_command("watch", "live", *flags(kafka_settings)), stdout=subprocess.PIPE,
                                stderr=stderr, text=True)
    try:
        assert json.loads(proc.stdout.readline())["n"] == 1
        produce_sync(producer, kafka_settings.topic("answers"), _answer("live", 2, "-"), key="live")
        second = json.loads(proc.stdout.readline())  # arrives while watch is running: it is live
        assert (second["n"], second["sign"]) == (2, "-")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_current_folds_the_latest_value_per_key(kafka_settings: KafkaSettings,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    producer = make_producer(kafka_settings)
    topic = kafka_settings.topic("answers.current")

    def put(query: str, x: str, multiplicity: int | None) -> None:
        key = json.dumps([query, {"x": {"type": "uri", "value": x}}]).encode()
        value = None if multiplicity is None else encode("CurrentAnswer", {
            "query_id": query, "binding": {"x": term(x)}, "multiplicity": multiplicity, "last_n": 1})
        produce_sync(producer, topic, value, key=key)

    put("cur", f"{EX}a", 1)
    put("cur", f"{EX}b", 1)
    put("cur", f"{EX}b", 2)  # later value wins
    put("cur", f"{EX}c", 1)
    put("cur", f"{EX}c", None)  # tombstone: gone
    put("else", f"{EX}z", 1)
    plan = {"query_id": "cur", "sparql": "SELECT ?x WHERE { ?x <http://ex.org/p> <http://ex.org/o> }", "options": {},
            "plan_json": "{}", "projected": ["x"], "registered_at_seq": 0, "version": 1}
    produce_sync(producer, kafka_settings.topic("queries.plans"), encode("QueryPlan", plan), key="cur")
    f = flags(kafka_settings)
    assert cbgp(["current", "cur", *f]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["head"] == {"vars": ["x"]}
    assert [b["x"]["value"] for b in result["results"]["bindings"]] == [f"{EX}a", f"{EX}b", f"{EX}b"]
    assert cbgp(["current", "cur", "--table", *f]) == 0
    table = capsys.readouterr().out
    assert f"| <{EX}b>" in table and table.rstrip().endswith("3 answers") and f"{EX}c" not in table
    assert cbgp(["current", "nope", *f]) == 1
    assert "no query with id 'nope' is registered" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_current_prints_results_that_pyoxigraph_and_rdflib_read(kafka_settings: KafkaSettings,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    producer = make_producer(kafka_settings)
    binding = {"x": term(f"{EX}bob"), "n": LANG, "age": TYPED}
    key = json.dumps(["people", {"x": {"type": "uri", "value": f"{EX}bob"}}]).encode()
    produce_sync(producer, kafka_settings.topic("answers.current"), encode("CurrentAnswer", {
        "query_id": "people", "binding": binding, "multiplicity": 1, "last_n": 1}), key=key)
    plan = {"query_id": "people", "sparql": f"SELECT ?x ?n ?age WHERE {{ ?x <{EX}n> ?n ; <{EX}age> ?age }}",
            "options": {}, "plan_json": "{}", "projected": ["x", "n", "age"], "registered_at_seq": 0, "version": 1}
    produce_sync(producer, kafka_settings.topic("queries.plans"), encode("QueryPlan", plan), key="people")
    f = flags(kafka_settings)
    assert cbgp(["current", "people", *f]) == 0
    assert_real_clients_read(capsys.readouterr().out)
    assert cbgp(["current", "people", "--table", *f]) == 0
    assert f'| <{EX}bob> | "Bob"@en | "42"^^<{XSD_INT}> |' in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_current_speaks_each_form_in_its_formats_and_keeps_order_by(kafka_settings: KafkaSettings,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``cbgp current --format``: SELECT in XML/CSV/TSV in the query's ORDER BY order, ASK as a boolean, CONSTRUCT
    as RDF, each read by pyoxigraph or rdflib; a format that does not fit the form is one line and exit 1."""
    import io

    from rdflib import Graph
    from rdflib.query import Result

    producer = make_producer(kafka_settings)

    def put(query: str, binding: dict) -> None:
        key = json.dumps([query, {v: sparql_json_term(t) for v, t in binding.items()}]).encode()
        produce_sync(producer, kafka_settings.topic("answers.current"), key=key, value=encode("CurrentAnswer", {
            "query_id": query, "binding": binding, "multiplicity": 1, "last_n": 1}))

    def plan(query: str, sparql: str, projected: list[str]) -> None:
        produce_sync(producer, kafka_settings.topic("queries.plans"), key=query, value=encode("QueryPlan", {
            "query_id": query, "sparql": sparql, "options": {}, "plan_json": "{}", "projected": projected,
            "registered_at_seq": 0, "version": 1}))

    def integer(n: int) -> dict:
        return {"type": "literal", "value": str(n), "datatype": XSD_INT, "lang": None}

    for name, age in (("a", 66), ("b", 77), ("c", 67)):
        put("top", {"p": term(f"{EX}{name}"), "age": integer(age)})
    plan("top", f"SELECT ?p ?age WHERE {{ ?p <{EX}age> ?age }} ORDER BY DESC(?age) LIMIT 3", ["p", "age"])
    put("ask", {"ask": {"type": "literal", "value": "true", "datatype": f"{XSD_INT[:-3]}boolean", "lang": None}})
    plan("ask", f"ASK {{ ?p <{EX}age> 77 }}", ["ask"])
    put("con", {"subject": term(f"{EX}a"), "predicate": term(f"{EX}older"), "object": integer(66)})
    plan("con", f"CONSTRUCT {{ ?p <{EX}older> ?age }} WHERE {{ ?p <{EX}age> ?age }}", ["subject", "predicate", "object"])
    f = flags(kafka_settings)

    assert cbgp(["current", "top", *f]) == 0
    assert [b["age"]["value"] for b in json.loads(capsys.readouterr().out)["results"]["bindings"]] == ["77", "67", "66"]
    for fmt in ("xml", "csv", "tsv"):
        assert cbgp(["current", "top", "--format", fmt, *f]) == 0
        rows = Result.parse(io.BytesIO(capsys.readouterr().out.encode()), format=fmt)
        assert [str(row[1]) for row in rows] == ["77", "67", "66"], fmt
    assert cbgp(["current", "top", "--table", *f]) == 0
    assert [line.split("|")[2].strip() for line in capsys.readouterr().out.splitlines()[3:6]] == [
        f'"{n}"^^<{XSD_INT}>' for n in (77, 67, 66)]
    assert cbgp(["current", "ask", *f]) == 0
    assert json.loads(capsys.readouterr().out) == {"head": {}, "boolean": True}
    assert cbgp(["current", "ask", "--format", "xml", *f]) == 0
    assert Result.parse(io.BytesIO(capsys.readouterr().out.encode()), format="xml").askAnswer is True
    for fmt, parser in (("turtle", "turtle"), ("ntriples", "nt"), ("jsonld", "json-ld")):
        assert cbgp(["current", "con", "--format", fmt, *f]) == 0
        graph = Graph().parse(data=capsys.readouterr().out, format=parser)
        assert [(str(s), str(p), str(o)) for s, p, o in graph] == [(f"{EX}a", f"{EX}older", "66")], fmt
    assert cbgp(["current", "con", "--format", "csv", *f]) == 1
    err = capsys.readouterr().err
    assert "does not fit a CONSTRUCT query" in err and len(err.strip().splitlines()) == 1
