"""REGEX and REPLACE (``cbgp.algebra.regex``): in time linear in the text, so a pattern that makes a backtracking
engine run for ever answers at once; and, on generated patterns, texts and replacements, what pyoxigraph answers
(errors included), through the engine's FILTER and BIND."""

from __future__ import annotations

import pickle

import pyoxigraph as ox
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgp.algebra import ContinuousEngine

EX = "http://ex.org/"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("pattern", ["^(a+)+$", "(a|aa)+$", "^(\\w+\\s?)+$", "(.*a){12}"])
def test_a_pattern_that_backtracking_takes_for_ever_on_answers_at_once(pattern: str) -> None:
    """Python's ``re`` needs about 2^n steps for these on n letters and a mismatch at the end (0.9 s at 24 for the
    first, so years at 64): the engine answers the filter and the REPLACE of the same pattern."""
    engine = ContinuousEngine()
    engine.register("matches", f'SELECT ?s WHERE {{ ?s <{EX}name> ?n FILTER(REGEX(?n, "{pattern}")) }}'
                    .replace("\\", "\\\\"))
    engine.register("replaced", f'SELECT ?s ?r WHERE {{ ?s <{EX}name> ?n BIND(REPLACE(?n, "{pattern}", "-") AS ?r) }}'
                    .replace("\\", "\\\\"))
    text = "a" * 64 + "!"
    deltas = engine.apply_terms(1, f"<{EX}s>", f"<{EX}name>", f'"{text}"')
    expected = _pyoxigraph_rows(pattern, text)
    assert sorted((q, engine.decode_row(q, row)) for q, _sign, row in deltas) == expected


def _pyoxigraph_rows(pattern: str, text: str) -> list:
    store = ox.Store()
    store.add(ox.Quad(ox.NamedNode(f"{EX}s"), ox.NamedNode(f"{EX}name"), ox.Literal(text)))
    rows = []
    lit = ox.Literal(pattern)
    for name, query in [("matches", f"SELECT ?s WHERE {{ ?s <{EX}name> ?n FILTER(REGEX(?n, {lit})) }}"),
                        ("replaced", f"SELECT ?s ?r WHERE {{ ?s <{EX}name> ?n BIND(REPLACE(?n, {lit}, \"-\") AS ?r) }}")]:
        result = store.query(query)
        for solution in result:
            rows.append((name, {v.value: str(solution[v]) for v in result.variables if solution[v] is not None}))
    return sorted(rows)


# Pieces of patterns and texts where engines tend to differ: Unicode classes (a symbol Unicode calls alphabetic,
# "Ⓐ", is in \\w), anchors and newlines, classes with "]" or "-", escapes, groups, flags.
_ATOMS = ["a", "b", "é", ".", "\\w", "\\W", "\\d", "\\D", "\\s", "\\S", "[ab]", "[^a]", "[]a]", "[\\w-]", "[\\s\\d]",
          "[\\W]", "[a\\S]", "\\.", "\\$", "\\n", "\\p{Lu}", "(a|b)", "(é)", "x", "\\b", "(a)\\1", "["]
_QUANTIFIERS = ["", "", "*", "+", "?", "{2}", "*?"]
_TEXT = st.text(alphabet="abéÉx _-.$\n٣\u00a0!Ⓐ", max_size=8)
_PATTERN = st.builds(lambda start, parts, end: start + "".join(a + q for a, q in parts) + end,
                     st.sampled_from(["", "^"]), st.lists(st.tuples(st.sampled_from(_ATOMS),
                                                                    st.sampled_from(_QUANTIFIERS)), max_size=3),
                     st.sampled_from(["", "$"]))
_FLAGS = st.sampled_from([None, "i", "s", "m", "q", "x", "im"])
_REPLACEMENT = st.text(alphabet="-$1{}\\x", max_size=5)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(texts=st.lists(_TEXT, min_size=1, max_size=4), pattern=_PATTERN, flags=_FLAGS, replacement=_REPLACEMENT)
def test_regex_and_replace_answer_what_pyoxigraph_answers(texts: list[str], pattern: str, flags: str | None,
                                                         replacement: str) -> None:
    flag = f", {ox.Literal(flags)}" if flags else ""
    lit, rep = ox.Literal(pattern), ox.Literal(replacement)
    queries = {"matches": f"SELECT ?s WHERE {{ ?s <{EX}v> ?v FILTER(REGEX(?v, {lit}{flag})) }}",
               "replaced": f"SELECT ?s ?r WHERE {{ ?s <{EX}v> ?v BIND(REPLACE(?v, {lit}, {rep}{flag}) AS ?r) }}"}
    engine = ContinuousEngine()
    for name, text in queries.items():
        engine.register(name, text)
    store = ox.Store()
    got: dict[str, list] = {name: [] for name in queries}
    for i, text in enumerate(texts):
        subject, value = f"<{EX}s{i}>", ox.Literal(text)
        store.add(ox.Quad(ox.NamedNode(subject[1:-1]), ox.NamedNode(f"{EX}v"), value))
        for name, _sign, row in engine.apply_terms(1, subject, f"<{EX}v>", str(value)):
            got[name].append(tuple(sorted(engine.decode_row(name, row).items())))
    for name, text in queries.items():
        result = store.query(text)
        expected = [tuple(sorted((v.value, str(s[v])) for v in result.variables if s[v] is not None))
                    for s in result]
        assert sorted(got[name]) == sorted(expected), (name, pattern, flags, replacement, texts)


@pytest.mark.parametrize("cls", ["\\w", "\\W", "[\\w]", "\\d", "\\D", "[\\d]", "\\s", "\\S", "[\\s]"])
def test_each_class_holds_every_character_pyoxigraph_s_does(cls: str) -> None:
    """Every character Python's Unicode tables assign (except the few Unicode 16 added since, which RE2's tables
    lack), in or out of each class as in pyoxigraph: the class RE2 is given stands for Rust's Unicode one."""
    import unicodedata

    import re2

    from cbgp.algebra.regex import RE2, translate

    chars = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) not in ("Cn", "Cs")]
    store, pattern = ox.Store(), f"^{cls}$"
    theirs: set[str] = set()
    for start in range(0, len(chars), 4000):
        values = " ".join(str(ox.Literal(ch)) for ch in chars[start:start + 4000])
        theirs |= {s["v"].value for s in store.query(
            f"SELECT ?v WHERE {{ VALUES ?v {{ {values} }} FILTER(REGEX(?v, {ox.Literal(pattern)})) }}")}
    text, mode = translate(pattern)
    assert mode == RE2
    compiled = re2.compile(text)
    ours = {ch for ch in chars if compiled.search(ch)}
    assert ours == theirs, sorted(f"U+{ord(ch):04X}" for ch in ours ^ theirs)[:20]


def test_a_checkpoint_that_holds_rdflib_s_regex_gets_the_linear_one() -> None:
    """A query's expressions pickled with rdflib's REGEX and REPLACE (a checkpoint made before they were linear)
    come back with the linear ones."""
    from rdflib.plugins.sparql.operators import Builtin_REGEX, Builtin_REPLACE
    from types import MethodType

    from cbgp.algebra.pickling import register
    from cbgp.algebra.regex import regex, replace

    register()
    engine = ContinuousEngine()
    engine.register("q", f'SELECT ?s ?r WHERE {{ ?s <{EX}v> ?v FILTER(REGEX(?v, "^(a+)+$")) '
                         f'BIND(REPLACE(?v, "a", "b") AS ?r) }}')
    old = []
    for op in engine.operator_queries["q"].root.walk():
        for expr in _exprs(vars(op)):
            if getattr(expr, "_evalfn", None) is not None and expr._evalfn.__func__ in (regex, replace):
                expr._evalfn = MethodType(Builtin_REGEX if expr._evalfn.__func__ is regex else Builtin_REPLACE, expr)
                old.append(expr)
    assert len(old) == 2
    restored = pickle.loads(pickle.dumps(engine))
    functions = {expr._evalfn.__func__ for op in restored.operator_queries["q"].root.walk() for expr in _exprs(vars(op))
                 if getattr(expr, "_evalfn", None) is not None}
    assert {regex, replace} <= functions and not {Builtin_REGEX, Builtin_REPLACE} & functions
    deltas = restored.apply_terms(1, f"<{EX}s>", f"<{EX}v>", '"' + "a" * 64 + '"')
    assert [restored.decode_row("q", row) for _q, _sign, row in deltas] == [
        {"s": f"<{EX}s>", "r": '"' + "b" * 64 + '"'}]


def _exprs(value, seen=None):  # noqa: ANN001, ANN202
    """Every rdflib expression node under ``value``."""
    from rdflib.plugins.sparql.parserutils import CompValue, Expr

    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, CompValue):
        if isinstance(value, Expr):
            yield value
        for item in value.values():
            yield from _exprs(item, seen)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _exprs(item, seen)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _exprs(item, seen)



@pytest.mark.timeout(60)
def test_an_expression_that_would_make_a_term_over_the_fleet_s_limit_is_an_error(monkeypatch) -> None:
    """``REPLACE(?o, "", ?o)`` puts the text between every two letters of itself: the square of the term limit (4 GB
    at 64 KiB). It, and a GROUP_CONCAT over the limit, are errors (unbound), not terms nobody could carry; under
    the limit both answer."""
    monkeypatch.setenv("CBGP_MAX_TERM_BYTES", "1000")
    engine = ContinuousEngine()
    engine.register("squared", f'SELECT ?s ?z WHERE {{ ?s <{EX}v> ?o BIND(REPLACE(?o, "", ?o) AS ?z) }}')
    engine.register("all", f"SELECT (GROUP_CONCAT(?o) AS ?a) WHERE {{ ?s <{EX}v> ?o }}")

    def answers(i: int, text: str) -> dict:
        deltas = engine.apply_terms(1, f"<{EX}s{i}>", f"<{EX}v>", f'"{text}"')
        return {(q, sign): engine.decode_row(q, row) for q, sign, row in deltas}

    small = answers(0, "ab")
    assert small[("squared", 1)]["z"] == '"abaabbab"' and small[("all", 1)]["a"] == '"ab"'
    long = answers(1, "x" * 600)
    assert "z" not in long[("squared", 1)]  # 360,000 letters: an error, the row without ?z
    assert long[("all", -1)]["a"] == '"ab"' and long[("all", 1)]["a"].startswith('"ab x')  # 604 letters: a term
    over = answers(2, "y" * 600)
    assert over[("all", 1)] == {}  # 1,205 letters: an error, so unbound
