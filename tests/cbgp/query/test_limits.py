"""Texts from outside are measured before any parser sees them: a query nested past the parsers' limits, over
its size, or holding invalid Unicode is refused in one line that names the limit and where it was passed; the
process never meets the native parser's stack overflow."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cbgp.algebra.compile import analyse
from cbgp.inputs.sparql_update import UpdateExtractor, UpdateRequestError
from cbgp.query.limits import text_problem
from cbgp.query.sparql import QueryError, parse_query

REPO = Path(__file__).resolve().parents[3]
DEEP = "SELECT * WHERE " + "{ " * 2500 + "?s <http://ex.org/p> ?o" + " }" * 2500  # 10 KB


def test_a_10kb_query_of_2500_nested_groups_is_refused_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "deep.rq"
    path.write_text(DEEP)
    done = subprocess.run([sys.executable, "-m", "services.commands.main", "explain", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done  # before: 139, a segmentation fault in the native parser
    assert len(done.stderr.strip().splitlines()) == 1
    assert "nests brackets deeper than the limit of 16 (CBGP_MAX_QUERY_NESTING)" in done.stderr
    assert "deep.rq:1:48: " in done.stderr  # where: the 17th opening brace


@pytest.mark.parametrize("reader", [parse_query, analyse])
def test_every_query_reader_refuses_what_the_parsers_cannot_take(reader) -> None:  # noqa: ANN001
    for text, expected in [
        (DEEP, "nests brackets deeper"),
        ("SELECT * WHERE { ?s ?p ?o FILTER(" + "(" * 30 + "?o" + ")" * 30 + ") }", "nests brackets deeper"),
        ("SELECT * WHERE { ?s ?p \"x\ud800y\" }", re.escape("lone surrogate U+D800")),
        ("SELECT * WHERE { ?s ?p \"x\x00\" }", "NUL"),
        ("SELECT * WHERE { ?s ?p ?o } #" + "x" * 70_000, re.escape("over the limit of 65,536 (CBGP_MAX_QUERY_BYTES)")),
    ]:
        with pytest.raises(QueryError, match=expected):
            reader(text)


def test_brackets_inside_strings_iris_and_comments_do_not_nest() -> None:
    text = ('SELECT * WHERE { ?s <http://ex.org/p> "' + "{" * 40 + '" . ?s ?p \'' + "(" * 40 + "' } # " + "[" * 40)
    assert text_problem(text) is None
    assert analyse(text) is not None


def test_the_limits_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "SELECT * WHERE " + "{ " * 20 + "?s <http://ex.org/p> ?o" + " }" * 20
    assert text_problem(text) is not None
    monkeypatch.setenv("CBGP_MAX_QUERY_NESTING", "24")
    assert text_problem(text) is None and parse_query(text).patterns


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet='{}()[]<>"\'#?x .\n\\', max_size=400))
def test_any_bracket_soup_gives_an_answer_or_a_query_error(text: str) -> None:
    """Fuzz: the readers never raise anything but QueryError on text made of the characters that nest."""
    for candidate in (text, "SELECT * WHERE " + text):
        try:
            analyse(candidate)
        except QueryError:
            pass


def test_update_requests_are_measured_too() -> None:
    extractor = UpdateExtractor(__import__("pyoxigraph").Store())
    deep = "INSERT { <http://a> <http://b> <http://c> } WHERE " + "{ " * 3000 + "?s ?p ?o" + " }" * 3000
    with pytest.raises(UpdateRequestError, match="nests brackets deeper"):
        extractor.apply(deep)
    with pytest.raises(UpdateRequestError, match="lone surrogate"):
        extractor.apply('INSERT DATA { <http://a> <http://b> "\ud800" }')


@pytest.mark.parametrize("raw", ["²", "-5", "0", "1.5", "big"])
def test_a_limit_that_is_not_a_positive_whole_number_is_the_default(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """('²'.isdigit() is true, and int() refuses it: it must not raise from the check every query passes.)"""
    from cbgp.query.limits import DEFAULT_MAX_QUERY_BYTES, limit

    monkeypatch.setenv("CBGP_MAX_QUERY_BYTES", raw)
    assert limit("CBGP_MAX_QUERY_BYTES", DEFAULT_MAX_QUERY_BYTES) == DEFAULT_MAX_QUERY_BYTES
    assert text_problem("SELECT * WHERE { ?s ?p ?o }") is None


EX = "PREFIX : <http://ex.org/> "
SEQUENCE_3000 = EX + "SELECT * WHERE { ?x " + "/".join(f":p{i % 3}" for i in range(3000)) + " ?y }"
ALTERNATIVE_5000 = EX + "SELECT * WHERE { ?x (" + "|".join(f":p{i}" for i in range(5000)) + ")+ ?y }"


@pytest.mark.parametrize("text", [SEQUENCE_3000, ALTERNATIVE_5000])
def test_a_short_path_that_rewrites_into_thousands_of_patterns_is_refused_by_their_count(text: str, monkeypatch) -> None:  # noqa: ANN001,E501
    # (12 and 34 KB: before, the sequence's plan took minutes and the alternative overflowed Python's stack)
    monkeypatch.setenv("CBGP_MAX_QUERY_TOKENS", "100000")  # (past the token limit too: see below)
    with pytest.raises(QueryError, match=re.escape("more than 64 triple patterns once its property paths are "
                                                   "rewritten")) as refused:
        analyse.__wrapped__(text)
    assert "CBGP_MAX_QUERY_PATTERNS" in refused.value.message and "\n" not in refused.value.message


def test_the_pattern_limit_counts_plain_bgps_and_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    bgp = "SELECT * WHERE { " + " ".join(f"?v{i} <http://ex.org/p> ?v{i + 1} ." for i in range(70)) + " }"
    sequence = "SELECT * WHERE { ?x " + "/".join(["<http://ex.org/p>"] * 70) + " ?y }"
    for text in (bgp, sequence):
        with pytest.raises(QueryError, match="CBGP_MAX_QUERY_PATTERNS"):
            analyse.__wrapped__(text)
    with pytest.raises(QueryError, match="CBGP_MAX_QUERY_PATTERNS"):
        parse_query(bgp, by_shape=False)
    monkeypatch.setenv("CBGP_MAX_QUERY_PATTERNS", "80")
    assert len(parse_query(bgp, by_shape=False).patterns) == 70
    assert analyse.__wrapped__(sequence) is not None


def test_a_query_too_long_for_rdflib_s_recursion_says_so_not_nesting(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("CBGP_MAX_QUERY_TOKENS", "100000")
    unions = EX + "SELECT * WHERE { " + " UNION ".join(f"{{ ?x :p{i} ?y }}" for i in range(2000)) + " }"
    with pytest.raises(QueryError, match="too deep for the parser: too many triple patterns or UNION branches"):
        analyse.__wrapped__(unions)


def test_a_query_of_more_tokens_than_its_limit_is_refused_before_rdflib_parses_it(monkeypatch) -> None:  # noqa: ANN001
    # an IN list of 8,000 numbers (47 KB) took rdflib's parser 23 s, twice; a long expression costs as much per change
    long_in = EX + "SELECT * WHERE { ?x :p ?y FILTER(?y IN (" + ", ".join(str(i) for i in range(8000)) + ")) }"
    for reader in (parse_query, analyse.__wrapped__):
        with pytest.raises(QueryError, match=re.escape("more than 1,000 tokens (terms, operators and brackets; "
                                                       "CBGP_MAX_QUERY_TOKENS)")) as refused:
            reader(long_in)
        assert (refused.value.line, refused.value.column) == (1, long_in.index(", 493,") + 1)  # the 1,001st: a comma
    # comments are not counted; an update is bounded by its bytes and changes, not its tokens
    assert text_problem(EX + "SELECT * WHERE { ?x :p ?y } #" + " x" * 5000) is None
    assert text_problem("INSERT DATA { " + " ".join(f"<http://ex.org/s{i}> <http://ex.org/p> {i} ." for i in
                                                    range(1000)) + " }", "update") is None
    monkeypatch.setenv("CBGP_MAX_QUERY_TOKENS", "20000")
    assert text_problem(long_in) is None
