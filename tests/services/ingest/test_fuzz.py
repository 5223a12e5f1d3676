"""Fuzzing every input boundary: parsers, the registry's rules, ingest's transform (hypothesis, no Kafka),
and one hostile-input run through the real processes.

The contract under test (architecture §5, "bad input never stops a service and is never silently
dropped"): each parser raises only its documented error type (or yields ``InputError``), and every bad
input comes back as a report -- ``InputError`` / ``QueryError`` / ``UpdateRequestError`` / a dead letter /
a ``QueryStatus`` -- while the good input around it is processed.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pyoxigraph as ox
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cbgp.inputs.formats import FORMATS, InputError, Update, parse_input, parse_term
from cbgp.query.sparql import QueryError, parse_query
from cbgp.terms import TermError
from cbgp.inputs.sparql_update import UpdateExtractor, UpdateRequestError
from services import codec
from services.ingest.core import IngestProcessor, RawRecord
from services.ingest.core import NOOP_UPDATES
from services.kafka.config import KafkaSettings
from services.kafka.client import make_producer, produce_sync, read_all
from services.kafka.client import DeliveryError
from services.registry.core import Registry
from tests.fleet_support import EX, Fleet, final_answers, replay, wait_answers

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SETTINGS = KafkaSettings(topic_prefix="f.")

# ----------------------------------------------------------------------------------------- strategies

IRI_TAILS = st.text("abcxyz019_-./#", min_size=1, max_size=6)
GOOD_TERMS = st.one_of(
    IRI_TAILS.map(lambda t: f"<http://ex.org/{t}>"),
    st.sampled_from(["_:b0", "_:node1"]),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters='"\\\n\r'), max_size=10)
    .flatmap(lambda v: st.sampled_from([f'"{v}"', f'"{v}"@en', f'"{v}"^^<http://www.w3.org/2001/XMLSchema#string>'])),
)
NASTY = st.sampled_from(["<", ">", '"', "\\", "\\u00", "\\U0001F600", "@", "^^", "_:", " ", "\t", ".", "#", "\x00",
                         "\ud7ff", "\u2028", "{", "}", "A", "D", "TX", "PA", "<http://x/ y>", '"""', "\u00e9", "\x7f"])


@st.composite
def corrupted(draw: st.DrawFn, good: str) -> str:
    """``good`` with a few random cuts, insertions and duplications."""
    text = good
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["cut", "insert", "dup"]))
        if action == "cut":
            text = text[:i] + text[i + draw(st.integers(1, 5)):]
        elif action == "insert":
            text = text[:i] + draw(NASTY) + text[i:]
        else:
            text = text[:i] + text[i:i + 8] + text[i:]
    return text


def patch_line(s: str, p: str, o: str, op: str) -> str:
    return f"{op} {s} {p} {o} ."


LINES = st.builds(patch_line, GOOD_TERMS, IRI_TAILS.map(lambda t: f"<http://ex.org/p{t}>"), GOOD_TERMS,
                  st.sampled_from(["A", "D"]))
MAYBE_BAD_LINES = st.one_of(LINES, LINES.flatmap(corrupted)).filter(
    # Lines that change how the following lines parse (transactions, prefixes, headers) are valid patch,
    # not garbage; they are covered by tests/cbgp/inputs/test_inputs.py.
    lambda line: line.lstrip(" \t")[:1] not in ("T", "P", "H", "@") and "\n" not in line and "\r" not in line
    and "\u2028" not in line and "\x85" not in line and "\x0b" not in line and "\x0c" not in line
    and "\x1c" not in line and "\x1d" not in line and "\x1e" not in line and "\u2029" not in line)


# ----------------------------------------------------------------------------------------- parsers


@FAST
@given(st.one_of(st.binary(max_size=300), st.lists(MAYBE_BAD_LINES, max_size=8).map(lambda ls: "\n".join(ls).encode())),
       st.sampled_from(FORMATS))
def test_parse_input_yields_updates_or_errors_for_any_bytes(data: bytes, fmt: str) -> None:
    items = list(parse_input(data, fmt))
    for item in items:
        assert isinstance(item, (Update, InputError))
        if isinstance(item, InputError):
            assert item.message and item.line >= 1
        else:
            for term in (item.s, item.p, item.o) + ((item.g,) if item.g else ()):
                assert parse_term(term) == term, "parsed terms must be canonical"
    if data and fmt != "turtle":
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            assert any(isinstance(i, InputError) and "UTF-8" in i.message for i in items), \
                "invalid UTF-8 must be reported"


@FAST
@given(st.one_of(GOOD_TERMS, GOOD_TERMS.flatmap(corrupted), st.text(max_size=40)))
def test_parse_term_returns_a_canonical_term_or_raises_term_error(text: str) -> None:
    try:
        term = parse_term(text)
    except TermError as exc:
        assert str(exc)
        return
    assert parse_term(term) == term


SPARQL_PIECES = st.sampled_from([
    "SELECT", "DISTINCT", "*", "?x", "?y", "WHERE", "{", "}", ".", ";", ",", "<http://ex.org/p>", "ex:p", "a",
    "PREFIX ex: <http://ex.org/>", "FILTER(?x > 1)", "OPTIONAL", "UNION", "GRAPH", "?g", "_:b", '"lit"@en', "42",
    "LIMIT 3", "ORDER BY ?x", "ASK", "CONSTRUCT", "(", ")", "VALUES ?x { 1 }", "FROM <http://g>", "|", "/", "+",
    "SERVICE <http://s>", "BIND(1 AS ?z)", "COUNT(?x)", "\n", "#", "\"", "'", "\\", "\x00", "é", "<>",
])


@FAST
@given(st.one_of(st.lists(SPARQL_PIECES, max_size=25).map(" ".join), st.text(max_size=80),
                 st.sampled_from(["SELECT ?x WHERE { ?x <http://ex.org/p> ?y }",
                                  "PREFIX ex: <http://ex.org/> SELECT DISTINCT ?y WHERE { ?x ex:p ?y . ?y a ex:C }"])
                 .flatmap(corrupted)))
def test_parse_query_returns_a_query_or_raises_query_error(text: str) -> None:
    try:
        query = parse_query(text)
    except QueryError as exc:
        assert exc.message
        assert exc.line is None or exc.line >= 1
        return
    assert query.patterns


UPDATE_PIECES = st.sampled_from([
    "INSERT DATA", "DELETE DATA", "DELETE", "INSERT", "WHERE", "{", "}", ".", ";", "<http://ex.org/s>",
    "<http://ex.org/p>", '"o"', "?x", "?y", "GRAPH <http://ex.org/g>", "CLEAR ALL", "DROP GRAPH <http://ex.org/g>",
    "CREATE GRAPH <http://ex.org/g>", "LOAD <http://ex.org/doc>", "SERVICE <http://x> { ?x ?y ?z }", "WITH <http://g>",
    "PREFIX ex: <http://ex.org/>", "ex:s", "COPY DEFAULT TO <http://ex.org/g>", "MOVE", "ADD", "SILENT", "(", ")",
    "FILTER(?x = 1)", "BIND(1 AS ?x)", "\n", "#", "\x00", "_:b", "42",
])
GOOD_UPDATES = st.sampled_from([
    "INSERT DATA { <http://ex.org/s> <http://ex.org/p> <http://ex.org/o> }",
    "DELETE { ?s <http://ex.org/p> ?o } INSERT { ?s <http://ex.org/q> ?o } WHERE { ?s <http://ex.org/p> ?o }",
    "DELETE DATA { <http://ex.org/s0> <http://ex.org/p> \"0\" } ; INSERT DATA { <http://ex.org/s9> <http://ex.org/p> \"9\" }",
])


def store_quads(store: ox.Store) -> set[str]:
    return {str(q) for q in store}


@FAST
@given(st.one_of(st.lists(UPDATE_PIECES, max_size=20).map(" ".join), st.text(max_size=60), GOOD_UPDATES,
                 GOOD_UPDATES.flatmap(corrupted)))
def test_update_extractor_applies_or_raises_update_request_error_and_changes_nothing(request_text: str) -> None:
    store = ox.Store()
    for i in range(3):
        store.add(ox.Quad(ox.NamedNode(f"http://ex.org/s{i}"), ox.NamedNode("http://ex.org/p"), ox.Literal(str(i))))
    before = store_quads(store)
    try:
        delta = UpdateExtractor(store).apply(request_text)
    except UpdateRequestError as exc:
        assert str(exc)
        assert store_quads(store) == before, "a rejected request must leave the store unchanged"
        return
    after = store_quads(store)
    assert len(before) + len(delta.inserted) - len(delta.deleted) == len(after)


# ----------------------------------------------------------------------------------------- registry rules

ADMIN_COMMANDS = st.fixed_dictionaries({
    "command": st.sampled_from(["REGISTER", "UNREGISTER", "LIST"]),
    "query_id": st.one_of(st.none(), st.sampled_from(["q1", "q2", "bad id", "", "x" * 129, "é"]), st.text(max_size=10)),
    "sparql": st.one_of(st.none(), st.text(max_size=30), st.lists(SPARQL_PIECES, max_size=15).map(" ".join),
                        st.sampled_from(["SELECT ?x WHERE { ?x <http://ex.org/p> ?y }",
                                         "SELECT ?y WHERE { ?x <http://ex.org/p> ?y }"])),
    "options": st.dictionaries(st.sampled_from(["replace", "window_ms", "x"]),
                               st.sampled_from(["true", "false", "1", "", "zz"]), max_size=2),
    "request_id": st.one_of(st.none(), st.text(max_size=8)),
})
STATUSES = {"ACCEPTED", "REJECTED", "UNREGISTERED", "LISTED", "ERROR"}


@FAST
@given(st.lists(ADMIN_COMMANDS, min_size=1, max_size=12))
def test_registry_answers_every_admin_command_with_a_status_and_keeps_its_set_consistent(commands: list[dict]) -> None:
    registry = Registry(clock=lambda: 1)
    published: dict[str, dict | None] = {}
    for command in commands:
        decision = registry.decide(dict(command), lambda: 7)
        status = decision.status
        assert status["status"] in STATUSES and status["message"]
        assert status["request_id"] == command["request_id"]
        codec.decode("QueryStatus", codec.encode("QueryStatus", status))  # always publishable
        if status["status"] in ("REJECTED", "ERROR", "LISTED"):
            assert decision.plan is None
        if decision.plan is not None:
            key, plan = decision.plan
            assert key == command["query_id"]
            if plan is not None:
                codec.encode("QueryPlan", plan)
                parse_query(plan["sparql"])  # the registry only publishes queries that workers can run
            published[key] = plan
        registry.commit(decision)
        assert set(registry.queries) == {k for k, v in published.items() if v is not None}


def valid_admin_bytes() -> st.SearchStrategy[bytes]:
    return ADMIN_COMMANDS.map(lambda c: codec.encode("AdminCommand", c))


@FAST
@given(st.one_of(st.binary(max_size=120), valid_admin_bytes().flatmap(
    lambda b: st.tuples(st.integers(0, len(b) - 1), st.binary(min_size=1, max_size=4), st.integers(0, len(b)))
    .map(lambda t: (b[:t[0]] + t[1] + b[t[0] + len(t[1]):])[:t[2]]))))
def test_admin_record_bytes_decode_or_raise_codec_error(data: bytes) -> None:
    """What the registry service does first with an admin record: anything else would escape its handler."""
    try:
        command = codec.decode("AdminCommand", data)
    except codec.CodecError as exc:
        assert str(exc)
        return
    decision = Registry().decide(command, lambda: 0)
    assert decision.status["status"] in STATUSES


# ----------------------------------------------------------------------------------------- ingest


def noops() -> float:
    return sum(NOOP_UPDATES.labels(op)._value.get() for op in ("ADD", "DEL"))


def by_topic(outputs: list) -> dict[str, list]:
    grouped: dict[str, list] = {}
    for out in outputs:
        grouped.setdefault(out.topic.removeprefix("f."), []).append(out)
    return grouped


HEADER_VALUES = st.one_of(st.sampled_from([b"patch", b"ntriples", b"nquads", b"turtle", b"jsonl", b"text/turtle",
                                           b"application/n-triples", b"application/rdf-patch", b"", b"\xff\xfe",
                                           b"image/png", b"a" * 300]), st.binary(max_size=12))
HEADERS = st.dictionaries(st.sampled_from(["cbgp-format", "content-type", "x-junk", ""]), HEADER_VALUES, max_size=3)
RAW_VALUES = st.one_of(
    st.none(), st.just(b""), st.binary(max_size=200),
    st.lists(MAYBE_BAD_LINES, max_size=6).map(lambda ls: "\n".join(ls).encode()),
    st.lists(MAYBE_BAD_LINES, max_size=4).map(lambda ls: "\n".join(ls).encode() + b"\n\xff\xfe bad\n"),
    st.builds(lambda o: json.dumps({"op": "+", "s": "<http://ex.org/s>", "p": "<http://ex.org/p>", "o": o}).encode(),
              st.text(max_size=10)),
    st.just(b'A <http://ex.org/s> <http://ex.org/p> "' + b"x" * 200_000 + b'" .\n'),
)


@FAST
@given(RAW_VALUES, HEADERS, st.integers(0, 10**9))
def test_ingest_transform_never_raises_and_reports_what_it_does_not_apply(value: bytes | None, headers: dict,
                                                                           offset: int) -> None:
    ingest = IngestProcessor(SETTINGS, 4, 4)
    outputs = ingest.process(RawRecord(value, headers, offset=offset))
    topics = by_topic(outputs)
    assert set(topics) <= {"dictionary", "updates.encoded", "updates.routed", "deadletter"}
    for out in topics.get("deadletter", []):
        dead = codec.decode("DeadLetter", out.value)
        assert dead["reason"] and dead["message"] and dead["offset"] == offset and dead["service"] == "ingest"
        assert "\n" not in dead["message"]
    if not value:
        assert len(topics.get("deadletter", [])) == 1, "an empty record must be reported"


@FAST
@given(st.lists(MAYBE_BAD_LINES, min_size=1, max_size=10), st.sampled_from([{}, {"cbgp-format": b"patch"}]))
def test_ingest_accounts_for_every_line_applied_noop_or_dead_lettered(lines: list[str], headers: dict) -> None:
    """Every line of a patch record is exactly one of: applied (an encoded update), a set-semantics no-op,
    or reported (a dead letter naming its line) -- judged line by line with the parser as the reference."""
    ingest = IngestProcessor(SETTINGS, 4, 4)
    before = noops()
    topics = by_topic(ingest.process(RawRecord("\n".join(lines).encode(), headers, offset=3)))
    noop_count = noops() - before
    dead_lines = Counter(codec.decode("DeadLetter", o.value)["line"] for o in topics.get("deadletter", []))
    assert all(n is not None and 1 <= n <= len(lines) for n in dead_lines), f"dead letters must name a line: {dead_lines}"
    applied = sum(not e["refresh"] for o in topics.get("updates.encoded", []) for e in codec.encoded_records(o.value))
    good: set[int] = set()
    for number, line in enumerate(lines, 1):
        alone = list(parse_input(line, "patch"))
        if any(isinstance(i, InputError) for i in alone):
            assert dead_lines[number] >= 1, f"line {number} {line!r} is bad but not dead-lettered"
        elif alone:
            good.add(number)
    rejected_good = sum(1 for n in dead_lines if n in good)  # parsed, then refused (e.g. a term collision)
    assert applied + noop_count + rejected_good == len(good), \
        "a good statement was neither applied, a no-op nor reported"


RAW_UPDATES = st.fixed_dictionaries({
    "op": st.sampled_from(["ADD", "DEL"]), "s": st.one_of(GOOD_TERMS, st.text(max_size=8)),
    "p": st.one_of(IRI_TAILS.map(lambda t: f"<http://ex.org/{t}>"), st.text(max_size=8)),
    "o": st.one_of(GOOD_TERMS, st.text(max_size=8)), "g": st.one_of(st.none(), GOOD_TERMS),
    "event_time_ms": st.one_of(st.none(), st.integers(0, 2**40)),
})


@FAST
@given(RAW_UPDATES, st.integers(0, 40), st.binary(max_size=4), st.integers(-30, 0))
def test_ingest_avro_record_valid_or_corrupted_is_applied_noop_or_dead_lettered(record: dict, at: int, junk: bytes,
                                                                                truncate: int) -> None:
    data = codec.encode("RawUpdate", record)
    at = min(at, len(data))
    corrupt = (data[:at] + junk + data[at + len(junk):])[:len(data) + truncate or None]
    assume(corrupt[:2] == codec.MAGIC)
    ingest = IngestProcessor(SETTINGS, 4, 4)
    before = noops()
    topics = by_topic(ingest.process(RawRecord(corrupt, offset=5)))
    effective = [e for o in topics.get("updates.encoded", []) for e in codec.encoded_records(o.value)
                 if not e["refresh"]]
    outcomes = len(effective) + len(topics.get("deadletter", [])) + (noops() - before)
    assert outcomes == 1, f"one Avro record must be exactly one of applied / no-op / dead letter, got {topics}"
    for out in topics.get("deadletter", []):
        assert codec.decode("DeadLetter", out.value)["reason"] in ("schema-mismatch", "malformed-rdf", "term-collision")


# ----------------------------------------------------------------------------------------- through the fleet


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_hostile_inputs_are_reported_services_keep_running_and_good_input_is_answered(
        kafka_settings: KafkaSettings, tmp_path: Path) -> None:
    from services.kafka.broker import free_port

    settings = kafka_settings
    names = f"SELECT ?x ?n WHERE {{ ?x <{EX}name> ?n }}"
    producer = make_producer(settings)
    raw, admin = settings.topic("updates.raw"), settings.topic("admin")

    def command(kind: str, query_id: str | None, sparql: str | None = None, request_id: str = "") -> None:
        produce_sync(producer, admin, codec.encode("AdminCommand", {
            "command": kind, "query_id": query_id, "sparql": sparql, "options": {}, "request_id": request_id}))

    # A 400 KB literal.  Kafka's 1 MB record limit bounds what can be published at all (a 1 MB literal is
    # refused to the producer); at 900 KB the answers service cannot produce the Answer (MSG_SIZE_TOO_LARGE)
    # and restarts forever on it -- as a report once showed.
    big = "x" * 400_000
    good = [f'A <{EX}s{i}> <{EX}name> "n{i}" .' for i in range(6)]
    hostile = {
        "malformed": ("\n".join([good[0], "A <broken .", good[1]]) + "\n").encode(),
        "utf8": (good[2] + "\n").encode() + b'A <http://x/\xff> <http://x/p> "x" .\n',
        "big": f'A <{EX}big> <{EX}name> "{big}" .\n'.encode(),
        "avro-mismatch": codec.encode("DeadLetter", {"service": "x", "source_topic": "t", "partition": 0, "offset": 0,
                                                     "reason": "r", "message": "m", "line": None, "original": b"",
                                                     "at_ms": 0}),
        "avro-truncated": codec.encode("RawUpdate", {"op": "ADD", "s": f"<{EX}a>", "p": f"<{EX}b>", "o": f"<{EX}c>",
                                                     "g": None, "event_time_ms": None})[:14],
        "unknown-format": (good[3] + "\n").encode(),
        "empty": b"",
    }
    with Fleet(settings, tmp_path / "logs") as fleet:
        fleet.start("registry", "registry", "--web-port", str(free_port()), "--state-dir", str(tmp_path / "state"))
        fleet.start("ingest", "ingest", "--instance-id", "i1")
        fleet.start("w0", "worker", "--worker-id", "w0")
        fleet.start("answers", "answers", "--instance-id", "a1")
        pids = {name: proc.pid for name, proc in fleet.procs.items()}
        command("REGISTER", "names", names, "r-good")
        # hostile admin input: unknown / invalid / out-of-scope / undecodable commands
        command("UNREGISTER", "nope", None, "r-unknown-query")
        command("REGISTER", "bad", "SELECT ?x WHERE { ?x <p> ", "r-invalid")
        command("REGISTER", "scope", f"SELECT ?x WHERE {{ ?x !(^<{EX}p>) ?y }}", "r-out-of-scope")  # an inverse in a negated set
        command("REGISTER", "bad id!", names, "r-bad-id")
        produce_sync(producer, admin, b"\xc3\x01garbage-admin")
        produce_sync(producer, admin, b"REGISTER q SELECT *")
        # A QueryPlan with no key on queries.plans (compacted, keyed by query id): the broker refuses it, as
        # Kafka does for a keyless record on a compacted topic, so the producer gets the error, not the fleet.
        with pytest.raises(DeliveryError, match="INVALID_RECORD"):
            produce_sync(producer, settings.topic("queries.plans"), codec.encode("QueryPlan", {
                "query_id": "keyless", "sparql": names, "options": {}, "plan_json": "{}", "projected": ["x", "n"],
                "registered_at_seq": 0, "version": 1}), partition=0)
        offsets = {}
        for name, value in hostile.items():
            headers = [("cbgp-format", b"klingon")] if name == "unknown-format" else None
            offsets[name] = produce_sync(producer, raw, value, headers=headers).offset()
        produce_sync(producer, raw, ("\n".join(good[4:]) + "\n").encode())
        # every raw record above has no key: updates.raw is unkeyed (one partition), so they are processed
        # (a term over CBGP_MAX_TERM_BYTES, 64 KiB, is dead-lettered: its answer could not fit a record)
        expected_lines = [good[0], good[1], good[2], good[4], good[5]]
        expected = replay(tmp_path, expected_lines, {"names": names})
        wait_answers(settings, {"names": len(expected["names"])}, timeout=120)

        deadline = time.monotonic() + 60
        statuses: dict[str, dict] = {}
        all_statuses: list[dict] = []
        dead: list[dict] = []
        while time.monotonic() < deadline:
            all_statuses = [codec.decode("QueryStatus", m.value())
                            for m in read_all(settings, settings.topic("queries.status"))]
            statuses = {s["request_id"]: s for s in all_statuses}
            dead = [codec.decode("DeadLetter", m.value()) for m in read_all(settings, settings.topic("deadletter"))]
            if len(all_statuses) >= 7 and len(dead) >= 9:
                break
            time.sleep(0.5)
        assert statuses["r-good"]["status"] == "ACCEPTED"
        assert statuses["r-unknown-query"]["status"] == "REJECTED"
        assert statuses["r-invalid"]["status"] == "REJECTED" and "syntax" in statuses["r-invalid"]["message"].lower()
        assert statuses["r-out-of-scope"]["status"] == "REJECTED" \
            and "negated property set" in statuses["r-out-of-scope"]["message"]
        assert statuses["r-out-of-scope"]["line"] == 1 and statuses["r-out-of-scope"]["column"]
        assert statuses["r-bad-id"]["status"] == "REJECTED"
        errors = [s for s in all_statuses if s["status"] == "ERROR"]  # request_id None: not in ``statuses``
        assert len(errors) >= 2, "each undecodable admin record gets an ERROR status"

        raw_dead = {d["offset"]: d for d in dead if d["service"] == "ingest"}
        reasons = {name: raw_dead.get(offset, {}).get("reason") for name, offset in offsets.items()}
        assert reasons == {"malformed": "malformed-rdf", "utf8": "invalid-utf8", "big": "term-too-large",
                           "avro-mismatch": "schema-mismatch", "avro-truncated": "schema-mismatch",
                           "unknown-format": "unknown-format", "empty": "empty"}
        assert raw_dead[offsets["malformed"]]["line"] == 2
        registry_dead = [d for d in dead if d["service"] == "registry"]
        assert len(registry_dead) == 2 and all(d["reason"] == "schema-mismatch" for d in registry_dead)

        got = wait_answers(settings, {"names": len(expected["names"])})
        folded = Counter()
        for a in got["names"]:
            folded[a["key"]] += 1 if a["sign"] == "+" else -1
        assert +folded == final_answers(expected["names"])
        assert {name: proc.pid for name, proc in fleet.procs.items() if proc.poll() is None} == pids, \
            "every service must survive hostile input with its PID"
