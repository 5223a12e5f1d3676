"""Queries that differ only in their constants share one parse, and get exactly what parsing each would give."""

from __future__ import annotations

import rdflib.plugins.sparql.parser as rdflib_parser
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbgp.query.sparql import QueryError, parse_query

PREFIXES = "BASE <http://base.example/dir/>\nPREFIX ex: <http://ex.org/>\nPREFIX xsd: <http://www.w3.org/2001/XMLSchema#>\n"


def _quoted(text: str, quote: str) -> str:
    escaped = text.replace("\\", "\\\\").replace(quote, "\\" + quote).replace("\n", "\\n").replace("\r", "\\r")
    return quote + escaped + quote


strings = st.text(alphabet=st.sampled_from(list("ab \"'\\\n\té€😀<>{}#?x-:")), max_size=6)
iris = st.sampled_from(["<http://ex.org/a>", "<http://ex.org/b>", "<urn:isbn:1>", "<mailto:a@b.c>", "<rel>",
                        "<#frag>", "<http://ex.org/x-cbgp>", "ex:a", "ex:b", "<http://ex.org/a?q=1&r=<>"])
literals = st.one_of(
    strings.map(lambda t: _quoted(t, '"')),
    strings.map(lambda t: _quoted(t, "'")),
    st.tuples(strings, st.sampled_from(["en", "EN-gb", "fr"])).map(lambda t: _quoted(t[0], '"') + "@" + t[1]),
    st.sampled_from(['"01"^^xsd:integer', '"5"^^<http://www.w3.org/2001/XMLSchema#integer>', "5", "1.0", "true",
                     '"""a"b"""', "'''c'd'''", '"a"', '"a"@en', '""']),
)
variables = st.sampled_from(["?x", "?y", "$z", "_:b"])
subjects = st.one_of(variables, iris)
predicates = st.sampled_from(["<http://ex.org/p>", "ex:q", "a", "<http://ex.org/p>", "?p"])
objects = st.one_of(variables, iris, literals)
triples = st.tuples(subjects, predicates, objects).map(" ".join)


@st.composite
def queries(draw) -> str:  # noqa: ANN001
    body = " . ".join(draw(st.lists(triples, min_size=1, max_size=5)))
    if draw(st.booleans()):
        body = f"GRAPH {draw(iris)} {{ {body} }}"
    head = draw(st.sampled_from(["SELECT *", "SELECT DISTINCT *", "SELECT ?x", "SELECT ?x ?y"]))
    return f"{PREFIXES}{head} WHERE {{ {body} }}"


def _outcome(text: str, by_shape: bool) -> object:
    try:
        return parse_query(text, by_shape=by_shape)
    except QueryError as exc:
        return ("error", str(exc))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queries())
def test_a_query_parsed_by_its_shape_is_the_query_parsed_alone(text: str) -> None:
    assert _outcome(text, by_shape=True) == _outcome(text, by_shape=False)


def test_queries_that_differ_in_constants_cost_one_parse(monkeypatch) -> None:  # noqa: ANN001
    calls = []
    real = rdflib_parser.parseQuery
    monkeypatch.setattr(rdflib_parser, "parseQuery", lambda text: calls.append(text) or real(text))
    template = ('PREFIX sioc: <http://rdfs.org/sioc/ns#>\nSELECT ?shape_test_post WHERE {{ <http://u.example/{0}> '
                'sioc:creator_of ?shape_test_post . ?shape_test_post <http://sib.example/hashtag> "tag {0}" }}')
    parsed = [parse_query(template.format(n)) for n in range(200)]
    assert len(calls) == 1
    assert [q.patterns[0].s for q in parsed] == [f"<http://u.example/{n}>" for n in range(200)]
    assert [q.patterns[1].o for q in parsed] == [f'"tag {n}"' for n in range(200)]
    assert parsed[7].text == template.format(7)


def test_an_operator_query_read_again_after_its_algebra_was_forgotten_keeps_its_filter() -> None:
    """rdflib's translation rewrites the parse it is given: once the cache has let a text go, its algebra is made
    again from a new parse, FILTER and all, never from the rewritten one."""
    from cbgp.query import sparql

    text = 'SELECT * WHERE { ?s <http://x/p> ?o FILTER(isLiteral(?o) && ?o != "gone") }'
    first = str(sparql.rdflib_algebra(text))
    for n in range(300):  # (more queries than the cache keeps, and the text's parse read among them)
        sparql.rdflib_algebra(f"SELECT * WHERE {{ ?s <http://x/p> ?o FILTER(?o != {n}) }}")
        sparql.rdflib_parse(text)
    again = str(sparql.rdflib_algebra(text))
    assert "Filter" in first and again == first
