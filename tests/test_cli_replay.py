"""`cbgp replay` and `cbgp explain` as a user runs them: the installed command, real files."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.oracle import OracleGraph

CBGP = [sys.executable, "-m", "services.cli"]
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
    (files / "bad.rq").write_text("SELECT * WHERE {\n  ?x <http://ex/p> ?y .\n  FILTER(?y > 1)\n}\n")
    result = cbgp("replay", "--patch", "updates.rdfp", "--query", "bad=bad.rq", cwd=files)
    assert result.returncode == 2
    assert "bad.rq:3:3: FILTER is not supported" in result.stderr
    assert "Traceback" not in result.stderr


def test_explain_prints_the_decomposition_and_json(files: Path):
    text = cbgp("explain", "knows.rq", cwd=files)
    assert text.returncode == 0
    assert "var-connected component {?a, ?b, ?c}" in text.stdout
    data = json.loads(cbgp("explain", "--json", "knows.rq", cwd=files).stdout)
    assert data["class"] == "var-connected" and data["distinct"] is True
