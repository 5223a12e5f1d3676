"""`cbgp replay` and `cbgp explain` with operator queries: the installed command, real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cbgp.test_cli_replay import cbgp


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "count.rq").write_text(
        "PREFIX ex: <http://ex/>\nSELECT ?x (COUNT(?y) AS ?n) WHERE { ?x ex:knows ?y } GROUP BY ?x\n")
    (tmp_path / "opt.rq").write_text(
        "PREFIX ex: <http://ex/>\nSELECT ?x ?n WHERE { ?x ex:knows ?y OPTIONAL { ?x ex:name ?n } "
        "FILTER(?y != ex:z) }\n")
    (tmp_path / "ask.rq").write_text("PREFIX ex: <http://ex/>\nASK { ?x ex:knows ex:c }\n")
    (tmp_path / "updates.rdfp").write_text(
        "PA ex: <http://ex/> .\n"
        "A ex:a ex:knows ex:b .\n"  # 1
        "A ex:a ex:knows ex:c .\n"  # 2
        'A ex:a ex:name "A" .\n'  # 3
        "D ex:a ex:knows ex:c .\n"  # 4
    )
    return tmp_path


def test_replay_runs_aggregates_optional_and_ask_with_retractions(files: Path):
    out = files / "deltas.jsonl"
    result = cbgp("replay", "--patch", "updates.rdfp", "--query", "count=count.rq", "--query", "opt=opt.rq",
                  "--query", "ask=ask.rq", "--out", str(out), cwd=files)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]

    def seen(query: str) -> list[tuple]:
        return [(d["seq"], d["sign"], {k: v["value"] for k, v in d["binding"].items()})
                for d in lines if d["query"] == query]

    a = "http://ex/a"
    assert seen("count") == [(1, "+", {"x": a, "n": "1"}), (2, "-", {"x": a, "n": "1"}),
                             (2, "+", {"x": a, "n": "2"}), (4, "-", {"x": a, "n": "2"}),
                             (4, "+", {"x": a, "n": "1"})]
    assert seen("opt") == [(1, "+", {"x": a}), (2, "+", {"x": a}), (3, "-", {"x": a}), (3, "-", {"x": a}),
                           (3, "+", {"x": a, "n": "A"}), (3, "+", {"x": a, "n": "A"}),
                           (4, "-", {"x": a, "n": "A"})]
    assert seen("ask") == [(2, "+", {}), (4, "-", {})]


def test_replay_writes_the_answers_a_query_has_before_any_update(files: Path):
    """A COUNT without GROUP BY answers 0 over the empty graph: that row comes first, at seq 0 (replay raised
    UnboundLocalError on it before the output was opened)."""
    (files / "total.rq").write_text("PREFIX ex: <http://ex/>\nSELECT (COUNT(*) AS ?n) WHERE { ?x ex:knows ?y }\n")
    out = files / "total.jsonl"
    result = cbgp("replay", "--patch", "updates.rdfp", "--query", "total=total.rq", "--out", str(out), cwd=files)
    assert result.returncode == 0, result.stderr
    counts = [(d["seq"], d["sign"], d["binding"]["n"]["value"]) for d in map(json.loads, out.read_text().splitlines())]
    assert counts == [(0, "+", "0"), (1, "-", "0"), (1, "+", "1"), (2, "-", "1"), (2, "+", "2"), (4, "-", "2"),
                      (4, "+", "1")]


def test_explain_shows_the_operator_tree_and_its_bgp_leaves(files: Path):
    result = cbgp("explain", "opt.rq", cwd=files)
    assert result.returncode == 0, result.stderr
    assert "LeftJoin (OPTIONAL) on ?x" in result.stdout and "Filter" in result.stdout
    assert "BGP leaf0" in result.stdout
    # where the fleet runs them: the BGP leaves by centre, the operators over their deltas
    assert "placement in the fleet: by-centre (every BGP leaf's parts evaluated by centre value" in result.stdout
    as_json = cbgp("explain", "--json", "count.rq", cwd=files)
    data = json.loads(as_json.stdout)
    assert data["form"] == "SELECT" and data["columns"] == ["x", "n"] and len(data["bgps"]) == 1
    assert data["placement"] == "by-centre" and "updates.routed" in data["where"]
    # variable predicates in patterns that share no end: no centre to key them by
    (files / "pred.rq").write_text("SELECT * WHERE { ?x ?p ?y . ?y ?q ?z FILTER(isIRI(?z)) }")
    data = json.loads(cbgp("explain", "--json", "pred.rq", cwd=files).stdout)
    assert data["placement"] == "single-owner" and "updates.encoded" in data["where"]


def test_out_of_scope_constructs_are_still_rejected_with_line_and_column(files: Path):
    (files / "path.rq").write_text("PREFIX ex: <http://ex/>\nSELECT * WHERE {\n  ?x !(^ex:knows) ?y }\n")
    result = cbgp("replay", "--patch", "updates.rdfp", "--query", "p=path.rq", cwd=files)
    assert result.returncode == 2
    assert "path.rq:3:8: an inverse IRI inside a negated property set" in result.stderr
    assert "Traceback" not in result.stderr


def test_explain_reads_a_service_clause_as_the_fleet_does_and_replay_refuses_it(files: Path):
    """`cbgp explain` shows a SERVICE as the background data the fleet keeps for it (its view graph, kept by
    `cbgp background`); `cbgp replay` has no endpoint and says so in one line."""
    (files / "service.rq").write_text(
        "PREFIX ex: <http://ex/>\nSELECT ?u ?n FROM NAMED WINDOW ex:w ON ex:s [RANGE PT60S STEP PT10S]\n"
        "WHERE { WINDOW ex:w { ?t ex:mentions ?u } SERVICE <http://127.0.0.1:1/sparql> { ?u ex:followers ?n } "
        "FILTER(?n > 10) }\n")
    result = cbgp("explain", "service.rq", cwd=files)
    assert result.returncode == 0, result.stderr
    assert "SERVICE <http://127.0.0.1:1/sparql> on ?u: background data, kept as graph <urn:cbgp:service-view:" \
        in result.stdout and "placement in the fleet: spark-window" in result.stdout
    data = json.loads(cbgp("explain", "--json", "service.rq", cwd=files).stdout)
    (service,) = data["services"]
    assert service["key"] == "u" and service["kept_by"] == "cbgp background" and data["window"]["step_ms"] == 10000
    (files / "plain_service.rq").write_text(
        "PREFIX ex: <http://ex/>\nSELECT * WHERE { ?t ex:mentions ?u SERVICE <http://127.0.0.1:1/sparql> "
        "{ ?u ex:followers ?n } }\n")
    refused = cbgp("replay", "--patch", "updates.rdfp", "--query", "s=plain_service.rq", cwd=files)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "plain_service.rq:2:36: SERVICE is not supported by `cbgp replay`, which has no endpoint" in refused.stderr


def test_explain_says_where_a_property_path_closure_lives(files: Path):
    (files / "reach.rq").write_text("PREFIX ex: <http://ex/>\nSELECT * WHERE { ex:a ex:knows+ ?y }\n")
    (files / "star.rq").write_text("PREFIX ex: <http://ex/>\nSELECT * WHERE { ?x ex:knows* ex:a }\n")
    by_centre = cbgp("explain", "reach.rq", cwd=files).stdout
    assert "placement in the fleet: by-centre" in by_centre
    assert ("property path <http://ex/a> <http://ex/knows>+ ?y: its closure kept by the answers service, "
            "anchored at the subject") in by_centre
    star = cbgp("explain", "star.rq", cwd=files).stdout
    assert "placement in the fleet: by-centre" in star
    assert "its closure kept by the answers service, anchored at the object (reversed steps)" in star
    assert ("pattern leaf ?x <http://ex/knows>* <http://ex/a>: by centre: each node counted where its value lives"
            in star)
    (files / "chained.rq").write_text("PREFIX ex: <http://ex/>\nSELECT * WHERE { ?x ex:knows* ex:a . ?x ?p ?y . "
                                      "?y ?q ?z }\n")
    single = cbgp("explain", "chained.rq", cwd=files).stdout
    assert "placement in the fleet: single-owner" in single and "pattern leaf" not in single
    assert "its closure kept by the query's owner, anchored at the object (reversed steps)" in single
    negated = json.loads(cbgp("explain", "--json", "star.rq", cwd=files).stdout)
    assert negated["placement"] == "by-centre" and [leaf["keyed_by"] for leaf in negated["pattern_leaves"]] == ["node"]
    (files / "negated.rq").write_text("PREFIX ex: <http://ex/>\nSELECT * WHERE { ?x !ex:knows ?y . ?y ?p ex:a . "
                                      "?z ?q ex:a }\n")
    negated = json.loads(cbgp("explain", "--json", "negated.rq", cwd=files).stdout)
    assert sorted(leaf["keyed_by"] for leaf in negated["pattern_leaves"]) == ["object", "subject"]
