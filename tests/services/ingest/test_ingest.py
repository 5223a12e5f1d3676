"""Ingest's transform without Kafka (IngestProcessor), and the worker/answers cores it feeds."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from cbgp.change import ROLE_BOTH, ROLE_OBJECT, ROLE_SUBJECT
from cbgp.engine.engine import Engine
from cbgp.query.plan import BY_CENTRE, SINGLE_OWNER, decompose
from cbgp.query.sparql import parse_query
from cbgp.terms import stable_term_id
from services import codec
from services.answers.core import AnswersCore
from services.codec import current_key
from services.ingest.core import MAX_BATCH_CHANGES, MAX_TERM_BATCH_BYTES, IngestProcessor, RawRecord
from services.kafka.config import KafkaSettings
from services.answers.release import SeqRelease
from services.wire.records import Output
from services.wire.records import query_partition
from services.worker.core import WorkerCore
from services.worker.shard import decode_changes
from tests.fleet_support import EX, QUERIES, generate_patch

# Probed queries exchange probes between routed partitions while they run; this test replays each shard's log
# once, in isolation, so it takes the queries that need no probes (tests/services/worker/test_distribution.py interleaves the rest).
UNPROBED = {name: text for name, text in QUERIES.items() if not decompose(parse_query(text)).probed}

SETTINGS = KafkaSettings(topic_prefix="u.")
A, P, B = f"<{EX}a>", f"<{EX}p>", f"<{EX}b>"


def encoded_of(outputs) -> list[dict]:
    """Every change in the EncodedBatch records among ``outputs``, as EncodedUpdate dicts."""
    return [change for out in outputs for change in codec.encoded_records(out.value)]


def outputs_by_topic(outputs):
    grouped: dict[str, list] = {}
    for out in outputs:
        grouped.setdefault(out.topic.removeprefix("u."), []).append(out)
    return grouped


def test_set_semantics_drop_duplicate_inserts_and_absent_deletes_and_number_effective_changes() -> None:
    ingest = IngestProcessor(SETTINGS, 4, 4)
    text = f"A {A} {P} {B} .\nA {A} {P} {B} .\nD {A} {P} <{EX}zz> .\nD {A} {P} {B} .\nA {A} {P} {B} .\n"
    out = outputs_by_topic(ingest.process(RawRecord(text.encode(), offset=9)))
    assert len(out["updates.encoded"]) == 1  # one batch record per flush
    encoded = encoded_of(out["updates.encoded"])
    # the duplicate insert is forwarded as a refresh (for event-time windows) without a seq of its own
    assert [(e["seq"], e["op"], e["refresh"]) for e in encoded] == \
        [(1, "ADD", False), (1, "ADD", True), (2, "DEL", False), (3, "ADD", False)]
    assert all(e["source"]["offset"] == 9 for e in encoded)
    routed = [change for o in out["updates.routed"] for change in codec.routed_changes(o.value)]
    assert len(routed) == 3 * len(ingest.routes(encoded[0]["s"], encoded[0]["o"]))
    assert "deadletter" not in out


def test_event_time_is_the_given_one_or_else_the_kafka_record_time() -> None:
    ingest = IngestProcessor(SETTINGS, 4, 4)
    given = codec.encode("RawUpdate", {"op": "ADD", "s": A, "p": P, "o": B, "event_time_ms": 1234})
    out = outputs_by_topic(ingest.process(RawRecord(given, timestamp_ms=99)))
    out2 = outputs_by_topic(ingest.process(RawRecord(f"A {B} {P} {A} .".encode(), timestamp_ms=5678)))
    times = [e["event_time_ms"] for e in encoded_of(out["updates.encoded"] + out2["updates.encoded"])]
    assert times == [1234, 5678]


def test_new_terms_go_to_the_dictionary_once_and_before_the_updates_that_use_them() -> None:
    ingest = IngestProcessor(SETTINGS, 4, 4)
    outputs = ingest.process(RawRecord(f"A {A} {P} {B} .\nA {B} {P} {A} .\n".encode()))
    topics = [o.topic.removeprefix("u.") for o in outputs]
    records = [o for o in outputs if o.topic == "u.dictionary"]
    assert topics[:len(records)] == ["dictionary"] * len(records)  # before every update
    entries = [(out, entry) for out in records for entry in codec.dictionary_entries(out.value)]
    assert sorted(term for _out, (_id, term) in entries) == sorted([A, P, B])
    for out, (term_id, term) in entries:
        assert term_id == stable_term_id(term) and out.partition == term_id % 4
    assert len(records) == len({out.partition for out in records})  # one record per dictionary partition
    assert len({out.key for out in records}) == len(records)  # (compacted: no two records share a key)
    again = ingest.process(RawRecord(f"A {B} {P} {B} .\n".encode()))
    assert not [o for o in again if o.topic == "u.dictionary"]  # every term is known: nothing published twice


def test_the_terms_of_a_large_transaction_are_split_into_records_of_bounded_size() -> None:
    ingest = IngestProcessor(SETTINGS, 4, 1)
    big = "x" * 60_000
    lines = "".join(f'A <{EX}s{i}> {P} "{big}{i}" .\n' for i in range(12))
    lines += "".join(f"A <{EX}t{i}> {P} <{EX}u{i}> .\n" for i in range(2500))
    records = [o for o in ingest.process(RawRecord(lines.encode())) if o.topic == "u.dictionary"]
    terms = [term for out in records for _id, term in codec.dictionary_entries(out.value)]
    assert len(terms) == len(set(terms)) == 1 + 12 * 2 + 2500 * 2
    assert all(len(out.value) <= MAX_TERM_BATCH_BYTES + 100_000 for out in records)  # (the columns and header)
    assert all(len(codec.dictionary_entries(out.value)) <= MAX_BATCH_CHANGES for out in records)
    assert len(records) > 3


def test_routing_by_subject_and_object_at_most_twice_with_both_when_partitions_coincide() -> None:
    ingest = IngestProcessor(SETTINGS, 4, 4)
    patch = "".join(f"A <{EX}s{i}> {P} <{EX}o{i}> .\n" for i in range(40))
    routed = [o for o in ingest.process(RawRecord(patch.encode())) if o.topic == "u.updates.routed"]
    marks = [o for o in routed if codec.frontier_of(o.value) is not None]
    assert sorted(o.partition for o in marks) == [0, 1, 2, 3]  # every partition learns its frontier (seq 40)
    assert all(codec.frontier_of(o.value) == {o.partition: 40} for o in marks)
    routed = [o for o in routed if o not in marks]
    by_seq: dict[int, list] = {}
    assert len({out.partition for out in routed}) == len(routed)  # one batch record per partition
    for out in routed:
        for seq, _sign, s, _p, o, _g, _time, role, _refresh in codec.routed_changes(out.value):
            centre = s if role in (ROLE_SUBJECT, ROLE_BOTH) else o
            assert out.partition == centre % 4
            by_seq.setdefault(seq, []).append({"s": s, "o": o, "role": role})
    assert len(by_seq) == 40
    for records in by_seq.values():
        s, o = records[0]["s"], records[0]["o"]
        if s % 4 == o % 4:
            assert [r["role"] for r in records] == [ROLE_BOTH]
        else:
            assert sorted(r["role"] for r in records) == [ROLE_SUBJECT, ROLE_OBJECT]


def test_each_bad_line_is_one_dead_letter_and_the_rest_of_the_message_goes_on() -> None:
    ingest = IngestProcessor(SETTINGS, 4, 4)
    data = f"A {A} {P} {B} .\nA <oops .\n".encode() + b"A <http://x/\xfe> <http://p> <http://o> .\n" + \
        f'A "lit" {P} {B} .\nA {B} {P} {A} .\n'.encode()
    out = outputs_by_topic(ingest.process(RawRecord(data, offset=5)))
    dead = [codec.decode("DeadLetter", o.value) for o in out["deadletter"]]
    assert [(d["reason"], d["line"]) for d in dead] == [("malformed-rdf", 2), ("invalid-utf8", 3), ("malformed-rdf", 4)]
    # each dead letter carries its own line, byte for byte, not the whole record
    assert all(d["offset"] == 5 and d["original"] == data.splitlines()[d["line"] - 1]
               and d["message"].startswith(f"line {d['line']}") for d in dead)
    assert len(encoded_of(out["updates.encoded"])) == 2


def test_avro_raw_updates_are_parsed_and_bad_avro_or_terms_are_dead_lettered() -> None:
    ingest = IngestProcessor(SETTINGS, 4, 4)
    good = codec.encode("RawUpdate", {"op": "ADD", "s": A, "p": P, "o": '"x"@en', "event_time_ms": 7})
    bad_term = codec.encode("RawUpdate", {"op": "ADD", "s": A, "p": "not a term", "o": B})
    literal_predicate = codec.encode("RawUpdate", {"op": "ADD", "s": A, "p": '"p"', "o": B})
    out = []
    for value in (good, good[:11], bad_term, literal_predicate, b""):
        out.extend(ingest.process(RawRecord(value)))
    grouped = outputs_by_topic(out)
    encoded = encoded_of(grouped["updates.encoded"])
    assert len(encoded) == 1 and encoded[0]["event_time_ms"] == 7
    reasons = [codec.decode("DeadLetter", o.value)["reason"] for o in grouped["deadletter"]]
    assert reasons == ["schema-mismatch", "malformed-rdf", "malformed-rdf", "empty"]


def test_format_comes_from_headers_or_json_sniffing() -> None:
    ingest = IngestProcessor(SETTINGS, 4, 4)
    nt = RawRecord(f"{A} {P} {B} .\n".encode(), {"content-type": b"application/n-triples"})
    jsonl = RawRecord(b'{"op": "+", "s": "<http://example.org/a>", "p": "<http://example.org/q>", "o": "\\"1\\""}\n')
    unknown = RawRecord(b"whatever", {"cbgp-format": b"yaml"})
    out = outputs_by_topic(ingest.process(nt) + ingest.process(jsonl) + ingest.process(unknown))
    assert len(encoded_of(out["updates.encoded"])) == 2
    assert [codec.decode("DeadLetter", o.value)["reason"] for o in out["deadletter"]] == ["unknown-format"]


def test_restore_from_the_encoded_log_gives_the_same_state_as_processing() -> None:
    lines = generate_patch(800, seed=3)
    live = IngestProcessor(SETTINGS, 4, 4)
    outputs = live.process(RawRecord(("\n".join(lines) + "\n").encode()))
    restored = IngestProcessor(SETTINGS, 4, 4)
    for out in outputs:
        if out.topic == "u.updates.encoded":
            restored.restore_encoded(out.value)
        elif out.topic == "u.dictionary":
            restored.restore_dictionary(out.value)
    assert restored.present == live.present and restored.seq == live.seq and restored.published == live.published
    more = RawRecord(f"A {A} {P} {B} .\n".encode())
    assert [o.value for o in restored.process(more)] == [o.value for o in live.process(more)]


@pytest.mark.parametrize("assembly", ["worker", "spark"])
def test_worker_and_answers_cores_partitioned_over_four_shards_equal_one_engine(assembly: str) -> None:
    """Ingest -> 4 routed shards + whole shards -> answers, driven in memory: same multisets as one Engine.
    With ``assembly="spark"`` the fleet runs ``--placement single-owner``: the product query's parts are then
    assembled by the Spark job, and its per-query function (``spark.assembly_stream.assemble_group``) multiplies them
    on their way to the answers core (by centre, the answers service's release multiplies them)."""
    lines = generate_patch(1500, seed=5)
    ingest = IngestProcessor(SETTINGS, 4, 4)
    outputs = ingest.process(RawRecord(("\n".join(lines) + "\n").encode()))
    logs: dict[tuple[str, int], list] = {}
    dictionary = {}
    for out in outputs:
        if out.topic == "u.dictionary":
            dictionary.update(codec.dictionary_entries(out.value))
        elif out.topic in ("u.updates.routed", "u.updates.encoded"):
            kind = "routed" if out.topic == "u.updates.routed" else "whole"
            log = logs.setdefault((kind, out.partition if kind == "routed" else 0), [])
            frontier = codec.frontier_of(out.value)
            # one batch record = one offset; a Frontier mark stays as such
            log.append(frontier if frontier is not None else decode_changes(kind, out.value))

    def reader(kind, partition, start, end):
        return [change for changes in logs.get((kind, partition if kind == "routed" else 0), [])[start:end]
                if isinstance(changes, list) for change in changes]

    topics = {"deltas.parts": "u.deltas.parts", "deadletter": "u.deadletter"}
    core = WorkerCore(topics, 4, 4, 4, reader, assemble_in_spark=assembly == "spark",
                      placement=SINGLE_OWNER if assembly == "spark" else BY_CENTRE)
    for i, (name, text) in enumerate(UNPROBED.items()):
        plan = {"query_id": name, "sparql": text, "options": {}, "plan_json": "{}", "projected": [],
                "registered_at_seq": 0, "version": 1}
        core.on_plan(i % 4, i, name.encode(), codec.encode("QueryPlan", plan), range(4))
    deltas = []
    for p in range(4):
        deltas += core.open_shard("routed", p, 0, None)
        deltas += core.open_shard("whole", p, 0, None)
    for (kind, partition), log in logs.items():
        shards = [core.shards[(kind, partition)]] if kind == "routed" else [core.shards[("whole", p)] for p in range(4)]
        for shard in shards:
            for offset, changes in enumerate(log):
                if isinstance(changes, dict):
                    core.on_frontier(shard, offset, changes)
                else:
                    deltas += core.on_record(shard, offset, changes)
    deltas += core.flush_batches()  # the answer deltas, one PartDeltaColumns record per query, then the frontiers
    if assembly == "spark":
        deltas = assembled_through_spark_function(deltas, UNPROBED)
    answers = AnswersCore("u.answers", "u.answers.current", "u.deadletter", "u.deltas.parts")
    release = SeqRelease(4, lambda query_id, _version: UNPROBED.get(query_id))  # the answers service's first step
    for partition in range(4):
        release.restore(partition, None)
    produced = Counter()
    ready = []
    for offset, out in enumerate(deltas):  # (marks, frontiers and deltas: SeqRelease.on_record tells them apart)
        ready += [(out.partition, *r) for r in release.on_record(out.partition, offset, out.value)]
    assert release.held() == 0
    for partition, offset, _origin, columns in ready:
        for result in answers.on_record(partition, offset, b"", None, dictionary.get, columns):
            if result.topic == "u.answers":
                record = codec.decode("Answer", result.value)
                produced[(record["query_id"], record["sign"], tuple(sorted(
                    (v, t["value"]) for v, t in record["binding"].items())))] += 1
    engine = Engine()
    for name, text in UNPROBED.items():
        engine.register(name, text)
    reference = Counter()
    for line in lines:
        op, rest = line[0], line[2:-2]
        s, p, o = rest.split(" ", 2)
        for name, sign, row in engine.apply_terms(1 if op == "A" else -1, s, p, o):
            binding = engine.decode_row(name, row)
            reference[(name, "+" if sign > 0 else "-", tuple(sorted(
                (v, t.strip("<>").split('"')[1] if t.startswith('"') else t.strip("<>")) for v, t in binding.items())))] += 1
    assert produced == reference and sum(reference.values()) > 100


def assembled_through_spark_function(outputs: list, queries: dict[str, str]) -> list:
    """Part deltas (part >= 0) replaced by what spark.assembly_stream's per-query function makes of them."""
    import json

    import pandas as pd

    from spark.assembly_stream import PART_DELTA_SCHEMA, assemble_group

    kept, parts = [], {}
    for offset, out in enumerate(outputs):
        try:
            record = codec.decode("PartDelta", out.value)
        except codec.CodecError:
            kept.append(out)  # frontiers and answers in batches: the Spark assembly reads single PartDelta records
            continue
        parts.setdefault(record["query_id"], []).append((
            record["query_id"], record["part"], record["seq"], 1 if record["sign"] == "PLUS" else -1,
            json.dumps(record["binding"]), record["snapshot"], out.partition, offset))
    assert parts, "some query must be assembled"
    columns = [c.split()[0] for c in PART_DELTA_SCHEMA.split(", ")]
    for query_id, rows in parts.items():
        _assembler, records, _groups = assemble_group(query_id, pd.DataFrame(rows, columns=columns), None, queries[query_id], 4)
        kept += [Output("u.deltas.parts", value, key, partition) for key, value, partition in records]
    return kept


def test_answers_core_drops_duplicates_by_idempotence_key_and_tombstones_retracted_answers() -> None:
    answers = AnswersCore("a", "c", "d", "parts")
    terms = {stable_term_id(A): A}

    def delta(sign, offset, index):
        return codec.encode("PartDelta", {"query_id": "q", "part": -1, "seq": 1, "sign": sign,
                                          "binding": {"x": stable_term_id(A)}, "source_partition": 2,
                                          "source_offset": offset, "index": index, "snapshot": False,
                                          "event_time_ms": None})

    first = answers.on_record(0, 0, delta("PLUS", 5, 0), None, terms.get)
    assert answers.on_record(0, 1, delta("PLUS", 5, 0), None, terms.get) == []  # a replayed duplicate
    retract = answers.on_record(0, 2, delta("MINUS", 6, 0), None, terms.get)
    assert [codec.decode("Answer", first[0].value)["n"], codec.decode("Answer", retract[0].value)["n"]] == [1, 2]
    assert retract[1].value is None and retract[1].key == first[1].key == current_key("q", f'{{"x":"{A}"}}')
    unknown = answers.on_record(0, 3, codec.encode("PartDelta", {
        "query_id": "q", "part": -1, "seq": 1, "sign": "PLUS", "binding": {"x": 12345}, "source_partition": 2,
        "source_offset": 7, "index": 0, "snapshot": False, "event_time_ms": None}), None, terms.get)
    assert codec.decode("DeadLetter", unknown[0].value)["reason"] == "unknown-term"


def test_answers_core_numbers_the_deltas_of_a_batch_in_order_and_drops_its_replayed_part() -> None:
    answers = AnswersCore("a", "c", "d", "parts")
    terms = {stable_term_id(A): A, stable_term_id(B): B}
    row = (1, 1, (stable_term_id(A),), 2, 5, 0, False, None)
    batch = codec.encode_part_delta_batch("q", -1, ["x"], [row, (2, 1, (stable_term_id(B),), 2, 6, 0, False, None)])
    first = answers.on_record(0, 0, batch, None, terms.get)
    assert [codec.decode("Answer", o.value)["n"] for o in first if o.topic == "a"] == [1, 2]
    replay = codec.encode_part_delta_batch("q", -1, ["x"], [row, (3, -1, (stable_term_id(A),), 2, 7, 0, False, None)])
    again = [codec.decode("Answer", o.value) for o in answers.on_record(0, 1, replay, None, terms.get) if o.topic == "a"]
    assert [(a["n"], a["sign"]) for a in again] == [(3, "-")] and answers.duplicates == 1


def test_engine_apply_to_replays_deletions_and_roles_into_one_query_only() -> None:
    """The worker's late-registration replay: ``Engine.apply_to`` feeds one query (deletions and routed
    roles included) and leaves the others alone; the late query ends where a query fed from the start is."""
    from cbgp.change import ROLE_OBJECT, ROLE_SUBJECT

    changes = []
    for line in generate_patch(600, seed=8):
        s, p, o = line[2:-2].split(" ", 2)
        changes.append((1 if line[0] == "A" else -1, s, p, o))
    early, late = Engine(), Engine()
    early.register("star", QUERIES["star"])
    late.register("path", QUERIES["path"])
    encode = late.dictionary.encode
    ids = [(sign, encode(s), encode(p), encode(o)) for sign, s, p, o in changes]
    for sign, s, p, o in ids:
        late.apply(sign, s, p, o)
    late.register("star", QUERIES["star"])  # late: sees nothing of the history
    path_before = late.state_entries("path")
    assert path_before > 0
    replayed = Counter()
    for sign, s, p, o in ids:
        for role in (ROLE_SUBJECT, ROLE_OBJECT):
            for name, d_sign, row in late.apply_to("star", sign, s, p, o, role=role):
                assert name == "star"
                replayed[tuple(late.decode_row(name, row).items())] += d_sign
    assert late.state_entries("path") == path_before, "apply_to touched another query"
    reference = Counter()
    for sign, s, p, o in changes:
        for name, d_sign, row in early.apply_terms(sign, s, p, o):
            reference[tuple(early.decode_row(name, row).items())] += d_sign
    assert +replayed == +reference and sum(reference.values()) > 0
    assert late.state_entries("star") == early.state_entries("star")


def test_fast_writers_produce_exactly_the_generic_avro_bytes() -> None:
    """``codec.encode_routed``/``encode_encoded`` (ingest's hot path) write what ``codec.encode`` writes,
    for extreme and random values: any Avro reader reads them, and a schema change that forgets them fails."""
    import random

    rng = random.Random(4)
    values = [0, 1, -1, 63, 64, -65, (1 << 63) - 1, -(1 << 63)]
    for i in range(3000):
        pick = (lambda: values[i % len(values)]) if i < 64 else (lambda: rng.randrange(-(1 << 63), 1 << 63))
        v = {"seq": pick(), "op": rng.choice(["ADD", "DEL"]), "s": pick(), "p": pick(), "o": pick(), "g": pick(),
             "event_time_ms": rng.choice([None, pick()])}
        role = rng.choice(["SUBJECT", "OBJECT", "BOTH"])
        assert codec.encode_routed(**v, role=role) == codec.encode("RoutedUpdate", {**v, "role": role})
        source = {"topic": rng.choice(["", "u.updates.raw", "tópico"]), "partition": rng.randrange(0, 1 << 31),
                  "offset": pick()}
        refresh = rng.random() < 0.5
        assert codec.encode_encoded(**v, **source, refresh=refresh) == \
            codec.encode("EncodedUpdate", {**v, "source": source, "refresh": refresh})


def test_a_term_too_large_for_downstream_records_is_dead_lettered_and_the_rest_goes_on():
    from cbgp.terms import DEFAULT_MAX_TERM_BYTES

    processor = IngestProcessor(KafkaSettings.from_env(), 4, 1)
    big = "é" * (DEFAULT_MAX_TERM_BYTES // 2 + 1)  # 2 bytes a character: over the limit in bytes, not in characters
    fine = "y" * (DEFAULT_MAX_TERM_BYTES - 10)
    text = (f'A <http://ex/a> <http://ex/p> "{big}" .\n'
            f'A <http://ex/b> <http://ex/p> "{fine}" .\n').encode()
    outputs = processor.process(RawRecord(text, {"cbgp-format": b"patch"}))
    letters = [codec.decode("DeadLetter", o.value) for o in outputs if o.topic == processor.t_deadletter]
    assert [(d["reason"], d["line"]) for d in letters] == [("term-too-large", 1)]
    assert "limit" in letters[0]["message"]
    assert processor.seq == 1  # the literal just under the limit on line 2 is ingested


def test_workers_leave_windowed_queries_to_the_spark_job_and_split_multi_part_ones() -> None:
    core = WorkerCore({"deltas.parts": "u.deltas.parts", "deadletter": "u.deadletter"}, 4, 4, 4,
                      lambda kind, partition, start, end: [])
    windowed = (f"PREFIX : <{EX}>\nSELECT ?x FROM NAMED WINDOW :w ON :s [RANGE PT1M]\n"
                "WHERE { WINDOW :w { ?x :type :Person } }")
    for i, (name, text) in enumerate({"windowed": windowed, "product": QUERIES["product"]}.items()):
        plan = {"query_id": name, "sparql": text, "options": {}, "plan_json": "{}", "projected": [],
                "registered_at_seq": 0, "version": 1}
        out, _open = core.on_plan(0, i, name.encode(), codec.encode("QueryPlan", plan), range(4))
        assert out == []  # accepted, nothing dead-lettered
    # (the product is placed by centre, by its own decomposition here: the answers service multiplies its parts,
    # so the workers do not send them to the Spark job even with --assembly spark)
    assert core.plans["windowed"].windowed and core.assemble_in_spark
    assert core.plans["product"].placement == BY_CENTRE and not core.plans["product"].assembled
    held = {info.query_id for kind in ("routed", "whole") for p in range(4) for info in core.wanted(kind, p)}
    assert held == {"product"}
    assert [name for name, _part, _query in core.plans["product"].engine_queries()] == ["product#0", "product#1"]


def test_the_registry_plan_record_decides_where_a_query_is_placed() -> None:
    """Workers place a query as the registry's plan_json says (the record is read, not re-derived), so
    a worker of another version cannot split a query the registry gave one owner; a record placing by centre a
    query this worker cannot split, or naming no known placement, is dead-lettered as invalid-plan."""
    core = WorkerCore({"deltas.parts": "u.deltas.parts", "deadletter": "u.deadletter"}, 4, 4, 4,
                      lambda kind, partition, start, end: [])
    star = f"SELECT * WHERE {{ ?x <{EX}knows> ?y . ?x <{EX}likes> ?z }}"
    grounded = f"SELECT * WHERE {{ GRAPH ?g {{ ?g <{EX}knows> ?b . ?b <{EX}likes> ?c }} }}"  # ?g also a subject

    def register(offset: int, name: str, text: str, plan_json: dict) -> list:
        plan = {"query_id": name, "sparql": text, "options": {}, "plan_json": json.dumps(plan_json),
                "projected": [], "registered_at_seq": 0, "version": 1}
        return core.on_plan(0, offset, name.encode(), codec.encode("QueryPlan", plan), range(4))[0]

    own = decompose(parse_query(star)).to_json()
    assert own["placement"] == BY_CENTRE
    assert register(0, "split", star, own) == [] and core.plans["split"].partitioned
    assert register(1, "one-owner", star, {**own, "placement": SINGLE_OWNER}) == []
    assert not core.plans["one-owner"].partitioned
    owner = query_partition("one-owner", 4)
    assert [i.query_id for i in core.wanted("whole", owner)] == ["one-owner"]
    assert "one-owner" not in {i.query_id for p in range(4) for i in core.wanted("routed", p)}
    assert register(2, "older-registry", star, {}) == [] and core.plans["older-registry"].partitioned

    refused = register(3, "skewed", grounded, {"placement": BY_CENTRE})
    refused += register(4, "unknown", star, {"placement": "everywhere"})
    letters = [codec.decode("DeadLetter", o.value) for o in refused]
    assert [d["reason"] for d in letters] == ["invalid-plan", "invalid-plan"]
    assert "different versions" in letters[0]["message"] and "'everywhere'" in letters[1]["message"]
    assert "skewed" not in core.plans and "unknown" not in core.plans
