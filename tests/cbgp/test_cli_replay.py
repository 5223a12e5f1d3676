"""`cbgp replay` and `cbgp explain` as a user runs them: the installed command, real files."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.oracle import OracleGraph

CBGP = [sys.executable, "-m", "services.commands.main"]
EX = "http://ex/"


def cbgp(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CBGP, *args], cwd=cwd, capture_output=True, text=True, timeout=180)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "people.rq").write_text(
        "PREFIX ex: <http://ex/>\nSELECT ?x ?n WHERE { ?x a ex:Person ; ex:name ?n . }\n")
    (tmp_path / "knows.rq").write_text(
        "PREFIX ex: <http://ex/>\nSELECT DISTINCT ?a WHERE { ?a ex:knows ?b . ?b ex:knows ?c }\n")
    (tmp_path / "flag.rq").write_text("PREFIX ex: <http://ex/>\nSELECT * WHERE { ex:sys ex:status ex:on }\n")
    (tmp_path / "updates.rdfp").write_text(
        "H id <uuid:1> .\n"
        "PA ex: <http://ex/> .\n"
        "A ex:alice <http://www.w3.org/1999/02/22-rdf-syntax-ns#type> ex:Person .\n"  # 1
        'A ex:alice ex:name "Alice"@EN .\n'  # 2
        "A this is not a triple\n"  # 3 (malformed, still counted)
        "TX .\n"
        'A ex:bob ex:name "Bob" .\n'  # 4 (aborted)
        "TA .\n"
        "TX .\n"
        "A ex:a ex:knows ex:b .\n"  # 5
        "A ex:b ex:knows ex:c .\n"  # 6
        "TC .\n"
        "A ex:sys ex:status ex:on .\n"  # 7
        "A ex:sys ex:status ex:on .\n"  # 8 duplicate insert: nothing
        'D ex:alice ex:name "Alice"@en .\n'  # 9
        "D ex:nobody ex:name \"x\" .\n"  # 10 delete of an absent triple: nothing
        "D ex:sys ex:status ex:on .\n"  # 11
    )
    return tmp_path


def test_replay_writes_one_json_line_per_delta_with_the_exact_contract(files: Path):
    out = files / "deltas.jsonl"
    result = cbgp("replay", "--patch", "updates.rdfp", "--query", "people=people.rq", "--query", "knows=knows.rq",
                  "--query", "flag=flag.rq", "--out", str(out), cwd=files)
    assert result.returncode == 0, result.stderr
    assert "updates.rdfp:5:" in result.stderr  # the malformed line, by line number
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    alice = {"x": {"type": "uri", "value": f"{EX}alice"},
             "n": {"type": "literal", "value": "Alice", "xml:lang": "en"}}
    assert lines == [
        {"query": "people", "seq": 2, "sign": "+", "binding": alice},
        {"query": "knows", "seq": 6, "sign": "+", "binding": {"a": {"type": "uri", "value": f"{EX}a"}}},
        {"query": "flag", "seq": 7, "sign": "+", "binding": {}},
        {"query": "people", "seq": 9, "sign": "-", "binding": alice},
        {"query": "flag", "seq": 11, "sign": "-", "binding": {}},
    ]


def test_replay_to_stdout_agrees_with_pyoxigraph_on_the_final_graph(files: Path):
    result = cbgp("replay", "--patch", "updates.rdfp", "--query", "knows=knows.rq", cwd=files)
    assert result.returncode == 0
    counts: Counter = Counter()
    for line in result.stdout.splitlines():
        delta = json.loads(line)
        key = json.dumps(delta["binding"], sort_keys=True)
        counts[key] += 1 if delta["sign"] == "+" else -1
    oracle = OracleGraph()
    oracle.apply(1, f"<{EX}a>", f"<{EX}knows>", f"<{EX}b>")
    oracle.apply(1, f"<{EX}b>", f"<{EX}knows>", f"<{EX}c>")
    expected = oracle.answers((files / "knows.rq").read_text())
    assert sum(counts.values()) == sum(expected.values()) == 1


def test_replay_strict_stops_at_the_first_malformed_line(files: Path):
    result = cbgp("replay", "--strict", "--patch", "updates.rdfp", "--query", "people=people.rq", cwd=files)
    assert result.returncode == 2
    assert "line 5" in result.stderr
    assert result.stderr.count("\n") == 1  # one readable line, no traceback


def test_replay_reports_a_bad_query_with_file_line_and_column(files: Path):
    (files / "bad.rq").write_text("SELECT * WHERE {\n  ?x <http://ex/p> ?y .\n  SERVICE <http://x/> { ?y ?p ?z }\n}\n")
    result = cbgp("replay", "--patch", "updates.rdfp", "--query", "bad=bad.rq", cwd=files)
    assert result.returncode == 2
    assert "bad.rq:3:3: SERVICE is not supported" in result.stderr
    assert "Traceback" not in result.stderr


def test_explain_prints_the_decomposition_and_json(files: Path):
    text = cbgp("explain", "knows.rq", cwd=files)
    assert text.returncode == 0
    assert "var-connected component {?a, ?b, ?c}" in text.stdout
    data = json.loads(cbgp("explain", "--json", "knows.rq", cwd=files).stdout)
    assert data["class"] == "var-connected" and data["distinct"] is True


def test_replay_bindings_are_sparql_json_that_pyoxigraph_and_rdflib_read(files: Path):
    import pyoxigraph as ox
    from rdflib import Literal, URIRef

    from tests.sparql_results import parse_with_pyoxigraph, parse_with_rdflib, results_document

    result = cbgp("replay", "--patch", "updates.rdfp", "--query", "people=people.rq", cwd=files)
    bindings = [json.loads(line)["binding"] for line in result.stdout.splitlines()]
    document = results_document(["x", "n"], bindings)
    alice_ox = {"x": ox.NamedNode(f"{EX}alice"), "n": ox.Literal("Alice", language="en")}
    assert parse_with_pyoxigraph(document) == [alice_ox, alice_ox]
    alice_rdflib = {"x": URIRef(f"{EX}alice"), "n": Literal("Alice", lang="en")}
    assert parse_with_rdflib(document) == [alice_rdflib, alice_rdflib]


RDF_TYPE = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"
SAME_UPDATES = {  # alice a Person; name "Alice"@en -- in every format publish reads, named as publish expects
    "in.nt": f'<{EX}alice> <{RDF_TYPE}> <{EX}Person> .\n<{EX}alice> <{EX}name> "Alice"@en .\n',
    "in.nq": f'<{EX}alice> <{RDF_TYPE}> <{EX}Person> .\n<{EX}alice> <{EX}name> "Alice"@en .\n',
    "in.ttl": f'@prefix ex: <{EX}> .\nex:alice a ex:Person ;\n  ex:name "Alice"@en .\n',
    "in.jsonl": json.dumps({"op": "+", "s": f"<{EX}alice>", "p": f"<{RDF_TYPE}>", "o": f"<{EX}Person>"}) + "\n"
                + json.dumps({"op": "+", "s": f"<{EX}alice>", "p": f"<{EX}name>", "o": '"Alice"@en'}) + "\n",
    "in.rdfp": f'A <{EX}alice> <{RDF_TYPE}> <{EX}Person> .\nA <{EX}alice> <{EX}name> "Alice"@en .\n',
    "in.ru": f'PREFIX ex: <{EX}>\nINSERT DATA {{ ex:alice a ex:Person ; ex:name "Alice"@en }}\n',
}


@pytest.mark.parametrize("name", sorted(SAME_UPDATES))
def test_replay_tells_the_input_format_from_the_file_name_as_publish_does(files: Path, name: str):
    (files / name).write_text(SAME_UPDATES[name])
    result = cbgp("replay", "--patch", name, "--query", "people=people.rq", cwd=files)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    (delta,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert delta["sign"] == "+" and delta["binding"] == {
        "x": {"type": "uri", "value": f"{EX}alice"}, "n": {"type": "literal", "value": "Alice", "xml:lang": "en"}}
    assert delta["seq"] == 2 or name.endswith(".ru")  # a request's changes are numbered in the extractor's order


def test_replay_of_a_file_name_with_no_known_format_asks_for_format_in_one_line(files: Path):
    (files / "updates.txt").write_text((files / "updates.rdfp").read_text())
    result = cbgp("replay", "--patch", "updates.txt", "--query", "people=people.rq", cwd=files)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("cbgp replay: error: cannot tell the format of updates.txt from its name")
    assert result.stderr.count("\n") == 1
    forced = cbgp("replay", "--format", "patch", "--patch", "updates.txt", "--query", "people=people.rq", cwd=files)
    assert forced.returncode == 0 and len(forced.stdout.splitlines()) == 2


def test_explain_of_a_windowed_query_shows_the_window_and_does_not_mention_replay(files: Path):
    (files / "recent.rq").write_text(
        "PREFIX : <http://example.org/>\nSELECT ?fan ?photo\n"
        "FROM NAMED WINDOW :recent ON :updates [RANGE PT10S STEP PT1S]\n"
        "WHERE { WINDOW :recent { ?fan :likes ?photo . ?photo a :Photo } }\n")
    text = cbgp("explain", "recent.rq", cwd=files)
    assert text.returncode == 0, text.stderr
    assert text.stdout.startswith("event-time window: sliding, range 10000 ms, step 1000 ms, lateness 0 ms, "
                                  "late updates dropped; evaluated by the fleet's Spark job")
    assert "var-connected component {?fan, ?photo}" in text.stdout
    assert "replay" not in (text.stdout + text.stderr).lower()
    data = json.loads(cbgp("explain", "--json", "recent.rq", cwd=files).stdout)
    assert data["window"] == {"kind": "sliding", "range_ms": 10000, "step_ms": 1000, "lateness_ms": 0, "late": "drop"}


def test_replay_of_many_queries_answers_each_as_alone_whatever_the_option_form(tmp_path: Path):
    """Hundreds of alert queries of one shape: each answers what it answers alone, in the order given; the
    options may be interleaved and in either form; a name given twice is refused, however far apart."""
    n = 300
    (tmp_path / "u.nt").write_text("".join(f'<{EX}p{i}> <{EX}name> "n{i}" .\n' for i in range(0, n, 3)))
    args = []
    for i in range(n):
        (tmp_path / f"q{i}.rq").write_text(f'SELECT ?n WHERE {{ <{EX}p{i}> <{EX}name> ?n }}\n')
        args += [f"--query=q{i}=q{i}.rq"] if i % 2 else ["--query", f"q{i}=q{i}.rq"]
        if i == n // 2:
            args += ["--out", "all.jsonl"]
    result = cbgp("replay", "--patch", "u.nt", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    assert [(d["query"], d["binding"]["n"]["value"]) for d in lines] == [(f"q{i}", f"n{i}") for i in range(0, n, 3)]
    twice = cbgp("replay", "--patch", "u.nt", *args, "--query", "q7=q0.rq", cwd=tmp_path)
    assert twice.returncode == 2 and "given twice: q7" in twice.stderr
