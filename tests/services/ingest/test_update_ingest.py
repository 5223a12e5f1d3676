"""SPARQL 1.1 Update requests as input, end to end (Aguzzi & Roffia + named graphs).

1. Engine over extracted deltas: random update requests are applied by the extractor, their real deltas
   drive the engine, and after every request the continuous answers of queries with and without GRAPH
   patterns equal pyoxigraph re-evaluating them on the same store.
2. Ingest: requests become exactly their real delta on updates.encoded, see the graph the other inputs
   built, and a failing request is dead-lettered and changes nothing.
3. The fleet: a request published to updates.raw is answered like the equivalent patch.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pyoxigraph as ox
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgp.engine.engine import Engine
from cbgp.inputs.sparql_update import UpdateExtractor
from services import codec
from services.ingest.core import IngestProcessor, RawRecord
from services.kafka.config import KafkaSettings
from tests.oracle import OracleGraph, ReplayedAnswers
from tests.cbgp.inputs.test_update_extraction import EX, GRAPHS, OBJECTS, PREDICATES, SUBJECTS, operations

QUERIES = {
    "default_star": f"SELECT * WHERE {{ ?x <{EX}p> ?y . ?x <{EX}q> ?z }}",
    "default_path": f"SELECT ?x ?z WHERE {{ ?x <{EX}p> ?y . ?y <{EX}p> ?z }}",
    "named_g1": f"SELECT * WHERE {{ GRAPH <{EX}g1> {{ ?x <{EX}p> ?y }} . ?y <{EX}q> ?z }}",
    "any_graph": f"SELECT * WHERE {{ GRAPH ?g {{ ?x <{EX}p> ?y }} }}",
    "any_graph_join": f"SELECT DISTINCT ?g ?x WHERE {{ GRAPH ?g {{ ?x <{EX}p> ?y . ?y <{EX}q> ?x }} }}",
}


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(initial=st.lists(st.tuples(st.sampled_from(SUBJECTS), st.sampled_from(PREDICATES),
                                  st.sampled_from(OBJECTS), st.sampled_from(GRAPHS)), max_size=12),
       requests=st.lists(st.lists(operations(), min_size=1, max_size=3), min_size=1, max_size=4))
def test_answers_driven_by_extracted_deltas_equal_reevaluation(initial, requests):
    store = ox.Store()
    extractor = UpdateExtractor(store)
    engine = Engine()
    replayed = {name: ReplayedAnswers() for name in QUERIES}
    for name, text in QUERIES.items():
        engine.register(name, text)
    data = " ".join(f"GRAPH {g} {{ {s} {p} {o} }}" if g else f"{s} {p} {o} ." for s, p, o, g in initial)
    for request in [f"INSERT DATA {{ {data} }}"] + [" ;\n".join(ops) for ops in requests]:
        try:
            delta = extractor.apply(request)
        except ValueError:
            continue  # a failing request changes nothing (tested in test_update_extraction)
        changes = [(-1, q) for q in delta.deleted] + [(1, q) for q in delta.inserted]
        for sign, (s, p, o, g) in changes:
            for name, d_sign, row in engine.apply_terms(sign, s, p, o, g):
                replayed[name].apply(d_sign, engine.decode_row(name, row), distinct=name == "any_graph_join")
        oracle = OracleGraph()
        oracle.store = store
        for name, text in QUERIES.items():
            assert replayed[name].rows == oracle.answers(text), f"{name} after {request!r}"


def _encoded(outputs, processor: IngestProcessor) -> list[tuple]:
    decode = processor.dictionary.decode
    rows = []
    for out in outputs:
        if out.topic == processor.t_encoded:
            for r in codec.encoded_records(out.value):
                rows.append((r["op"], decode(r["s"]), decode(r["p"]), decode(r["o"]), r["g"] and decode(r["g"])))
    return rows


def test_ingest_turns_a_request_into_its_real_delta_over_the_graph_other_inputs_built():
    processor = IngestProcessor(KafkaSettings.from_env(), 4, 1)
    patch = f"A <{EX}a> <{EX}p> <{EX}b> .\nA <{EX}b> <{EX}p> <{EX}c> .\n".encode()
    processor.process(RawRecord(patch, {"cbgp-format": b"patch"}))
    request = (f"DELETE {{ ?x <{EX}p> ?y }} INSERT {{ GRAPH <{EX}g> {{ ?x <{EX}q> ?y }} }} "
               f"WHERE {{ ?x <{EX}p> ?y . FILTER(?x = <{EX}a>) }} ; "
               f"INSERT DATA {{ <{EX}b> <{EX}p> <{EX}c> . <{EX}z> <{EX}p> <{EX}a> }}")
    outputs = processor.process(RawRecord(request.encode(), {"content-type": b"application/sparql-update"}))
    assert sorted(_encoded(outputs, processor)) == sorted([
        ("DEL", f"<{EX}a>", f"<{EX}p>", f"<{EX}b>", 0),
        ("ADD", f"<{EX}a>", f"<{EX}q>", f"<{EX}b>", f"<{EX}g>"),
        ("ADD", f"<{EX}z>", f"<{EX}p>", f"<{EX}a>", 0),  # <b> p <c> was already there: no change
    ])
    assert processor.seq == 5
    # Later patch input keeps the mirror in step: the next request sees <b> p <c> deleted.
    processor.process(RawRecord(f"D <{EX}b> <{EX}p> <{EX}c> .\n".encode(), {"cbgp-format": b"patch"}))
    outputs = processor.process(RawRecord(f"DELETE WHERE {{ ?s <{EX}p> ?o }}".encode(),
                                          {"cbgp-format": b"sparql-update"}))
    assert _encoded(outputs, processor) == [("DEL", f"<{EX}z>", f"<{EX}p>", f"<{EX}a>", 0)]


def test_a_failing_request_is_dead_lettered_and_changes_nothing():
    processor = IngestProcessor(KafkaSettings.from_env(), 4, 1)
    processor.process(RawRecord(f"A <{EX}a> <{EX}p> <{EX}b> .\n".encode(), {"cbgp-format": b"patch"}))
    before = (set(processor.present), processor.seq)
    request = f"INSERT DATA {{ <{EX}x> <{EX}p> <{EX}y> }} ; CREATE GRAPH <{EX}g> ; CREATE GRAPH <{EX}g>"
    outputs = processor.process(RawRecord(request.encode(), {"cbgp-format": b"sparql-update"}))
    letters = [codec.decode("DeadLetter", o.value) for o in outputs if o.topic == processor.t_deadletter]
    assert [(d["reason"], "operation 3" in d["message"]) for d in letters] == [("invalid-update", True)]
    assert _encoded(outputs, processor) == []
    assert (set(processor.present), processor.seq) == before
    assert len(processor.graph.store) == 1
    for bad, reason in ((b"LOAD <http://example.org/remote>", "invalid-update"),
                        (b"INSERT DATA { <a> <b> ", "invalid-update"), (b"\xff\xfe", "invalid-utf8")):
        outputs = processor.process(RawRecord(bad, {"cbgp-format": b"sparql-update"}))
        assert [codec.decode("DeadLetter", o.value)["reason"] for o in outputs] == [reason]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("on_disk", [False, True], ids=["in memory", "on disk"])
def test_a_where_clause_past_its_memory_or_time_is_dead_lettered_and_ingest_goes_on(monkeypatch, tmp_path,
                                                                                     on_disk: bool) -> None:
    """Over a chain of 2,000 nodes ``?a :k+ ?b`` has 2 M pairs, which pyoxigraph computes before the first solution
    of a WHERE that counts them: ingest reads such a clause in a bounded child, so the request is dead-lettered in
    one line naming the setting, ingest's own memory does not grow, and the next request is applied.  On disk
    (``--state-on-disk``) the child reads a checkpoint of the graph, which is gone once read."""
    import resource

    from services.state.forked import CAN_BOUND
    from services.state.store import Store

    if not CAN_BOUND:
        pytest.skip("a bounded child is forked on Linux only")
    processor = IngestProcessor(KafkaSettings.from_env(), 4, 1)
    if on_disk:
        processor.use_disk(Store(tmp_path / "state"), 0, 0)
    chain = "".join(f"A <{EX}n{i}> <{EX}k> <{EX}n{i + 1}> .\n" for i in range(2000))
    processor.process(RawRecord(chain.encode(), {"cbgp-format": b"patch"}))
    before = (set(processor.present), processor.seq)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    counted = f"INSERT {{ <{EX}stats> <{EX}pairs> ?n }} WHERE {{ SELECT (COUNT(*) AS ?n) WHERE {{ ?a PATH ?b }} }}"
    for path, setting, value, fragment in [
            (f"<{EX}k>+", "CBGP_MAX_UPDATE_MEMORY_MB", "64", "needed more than 64 MB (CBGP_MAX_UPDATE_MEMORY_MB)"),
            (f"(<{EX}k>|^<{EX}k>)+", "CBGP_MAX_UPDATE_SECONDS", "1", "ran past 1 s (CBGP_MAX_UPDATE_SECONDS)")]:
        monkeypatch.setenv(setting, value)
        outputs = processor.process(RawRecord(counted.replace("PATH", path).encode(),
                                              {"cbgp-format": b"sparql-update"}))
        monkeypatch.delenv(setting)
        letters = [codec.decode("DeadLetter", o.value) for o in outputs if o.topic == processor.t_deadletter]
        assert [d["reason"] for d in letters] == ["invalid-update"] and fragment in letters[0]["message"], letters
        assert "\n" not in letters[0]["message"] and _encoded(outputs, processor) == []
        assert (set(processor.present), processor.seq) == before
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 64 * 1024  # (KB)
    small = counted.replace("PATH", f"<{EX}k>+").replace("?a", f"<{EX}n1990>")
    outputs = processor.process(RawRecord(small.encode(), {"cbgp-format": b"sparql-update"}))
    assert _encoded(outputs, processor) == [("ADD", f"<{EX}stats>", f"<{EX}pairs>",
                                             '"10"^^<http://www.w3.org/2001/XMLSchema#integer>', 0)]
    assert (processor.graph.path is not None) == on_disk
    assert sorted(p.name for p in tmp_path.iterdir()) == (["state", "state.graph"] if on_disk else [])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_fleet_answers_a_published_update_request(kafka_settings, tmp_path):
    from services.kafka.client import make_producer
    from tests.fleet_support import Fleet, publish_plan, wait_answers

    query = f"SELECT * WHERE {{ GRAPH ?g {{ ?x <{EX}p> ?y }} }}"
    with Fleet(kafka_settings, tmp_path / "logs") as fleet:
        fleet.start("ingest", "ingest")
        fleet.start("worker", "worker")
        fleet.start("answers", "answers")
        publish_plan(kafka_settings, "graphs", query)
        producer = make_producer(kafka_settings)
        topic = kafka_settings.topic("updates.raw")
        producer.produce(topic, f"INSERT DATA {{ GRAPH <{EX}g1> {{ <{EX}a> <{EX}p> <{EX}b> }} }}".encode(),
                         headers=[("content-type", b"application/sparql-update")], partition=0)
        producer.flush(30)
        (tmp_path / "move.ru").write_text(f"PREFIX ex: <{EX}>\nMOVE ex:g1\n  TO ex:g2\n")
        env = {**os.environ, **kafka_settings.to_env()}
        published = subprocess.run([sys.executable, "-m", "services.commands.main", "publish", str(tmp_path / "move.ru")],
                                   env=env, capture_output=True, text=True, timeout=120)
        assert published.returncode == 0, published.stderr
        answers = wait_answers(kafka_settings, {"graphs": 3})["graphs"]
    got = [(a["sign"], a["binding"]["g"]["value"]) for a in sorted(answers, key=lambda a: a["n"])]
    assert got[0] == ("+", f"{EX}g1")
    assert sorted(got[1:]) == [("+", f"{EX}g2"), ("-", f"{EX}g1")]
