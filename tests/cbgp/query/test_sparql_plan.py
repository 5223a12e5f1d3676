"""Query parsing (scope, terms, errors with positions) and the papers' decomposition."""

from __future__ import annotations

import pytest

from cbgp.query.plan import ComponentPart, StarPart, decompose
from cbgp.query.sparql import QueryError, parse_query

EX = "http://ex/"
XSD = "http://www.w3.org/2001/XMLSchema#"


def test_terms_prefixes_a_shorthands_and_literals_become_canonical_strings():
    q = parse_query(
        'PREFIX ex: <http://ex/>\nBASE <http://base/>\n'
        'SELECT * WHERE { ?x a ex:C ; ex:n 1, 2.5, true, "s"@EN, "t"^^<http://www.w3.org/2001/XMLSchema#string>, '
        '"u"^^ex:dt . ?x <rel> ?y }'
    )
    objects = {p.o for p in q.patterns}
    assert f'"1"^^<{XSD}integer>' in objects
    assert f'"2.5"^^<{XSD}decimal>' in objects
    assert f'"true"^^<{XSD}boolean>' in objects
    assert '"s"@en' in objects and '"t"' in objects and f'"u"^^<{EX}dt>' in objects
    assert f"<{EX}C>" in objects
    predicates = {p.p for p in q.patterns}
    assert "<http://www.w3.org/1999/02/22-rdf-syntax-ns#type>" in predicates
    assert "<http://base/rel>" in predicates
    assert q.projected == ("x", "y")


def test_blank_nodes_are_unprojected_variables():
    q = parse_query(f"SELECT * WHERE {{ ?x <{EX}p> _:m . _:m <{EX}q> [ <{EX}r> ?y ] }}")
    assert q.projected == ("x", "y")
    assert len([v for v in q.variables if v.startswith("?_:")]) == 2


def test_duplicate_patterns_collapse_because_a_bgp_is_a_set():
    q = parse_query(f"SELECT * WHERE {{ ?x <{EX}p> ?y . ?x <{EX}p> ?y }}")
    assert len(q.patterns) == 1


@pytest.mark.parametrize(
    "text, construct, line, column",
    [
        ("SELECT * WHERE {\n  ?x <http://ex/p> ?o .\n  FILTER(?o > 3) }", "FILTER", 3, 3),
        ("SELECT * WHERE { ?x <http://ex/p> ?o OPTIONAL { ?o <http://ex/q> ?z } }", "OPTIONAL", 1, 38),
        ("SELECT * WHERE { { ?x <http://ex/p> ?o } UNION { ?x <http://ex/q> ?o } }", "UNION", 1, 42),
        ("SELECT * WHERE {\n ?x <http://ex/p>/<http://ex/q> ?o }", "property paths", 2, 18),
        ("SELECT * WHERE { ?x ?p ?o }", "predicate position", 1, 21),
        ("SELECT (COUNT(?x) AS ?c) WHERE { ?x <http://ex/p> ?o }", "aggregates", 1, 9),
        ("SELECT * WHERE { ?x <http://ex/p> ?o } ORDER BY ?x", "ORDER BY", 1, 40),
        ("SELECT * WHERE { ?x <http://ex/p> ?o } LIMIT 3", "LIMIT", 1, 40),
        ("SELECT * WHERE { ?x <http://ex/p> ?o MINUS { ?x <http://ex/q> ?o } }", "MINUS", 1, 38),
        ("SELECT * WHERE { ?x <http://ex/p> ?o . BIND(1 AS ?z) }", "BIND", 1, 40),
        ("SELECT * WHERE { ?x <http://ex/p> ?o VALUES ?x { <http://ex/a> } }", "VALUES", 1, 38),
        ("ASK { ?x <http://ex/p> ?o }", "ASK", 1, 1),
        ("CONSTRUCT { ?x <http://ex/p> ?o } WHERE { ?x <http://ex/p> ?o }", "CONSTRUCT", 1, 1),
        ("SELECT * FROM <http://ex/g> WHERE { ?x <http://ex/p> ?o }", "FROM", 1, 10),
        ("SELECT * WHERE { ?x <http://ex/p ?o }", "syntax error", 1, None),
    ],
)
def test_out_of_scope_constructs_are_rejected_with_name_and_position(text, construct, line, column):
    with pytest.raises(QueryError) as info:
        parse_query(text)
    error = info.value
    assert construct in error.message
    assert error.line == line
    if column is not None:
        assert error.column == column
    assert f"line {line}" in str(error)


def test_example_1_var_connected_component_and_its_star_decomposition():
    # Q1 of the paper's Example 1 / Table 2, with the variables-summary order ?Y, ?X, ?Z.
    q = parse_query(
        f"SELECT ?Y ?X ?Z WHERE {{ ?Y <{EX}p3> ?X . ?Y <{EX}p4> <{EX}a> . ?Y <{EX}p5> <{EX}b> . "
        f"<{EX}a> <{EX}p2> ?X . ?X <{EX}p1> ?Z . <{EX}d> <{EX}p10> ?Z }}"
    )
    plan = decompose(q)
    assert plan.query_class == "var-connected"
    assert not plan.grounds and not plan.stars
    (component,) = plan.components
    assert isinstance(component, ComponentPart)
    stars = dict(component.stars)
    assert stars == {"?Y": (0, 1, 2), "?X": (0, 3, 4), "?Z": (4, 5)}  # Q11, Q12, Q13
    overlaps = {(a, b): shared for a, b, shared in component.overlaps}
    assert overlaps == {("?Y", "?X"): (0,), ("?X", "?Z"): (4,)}  # no Q11-Q13 edge
    assert component.join_order(0) == ("?Y", "?X", "?Z")  # (?Y,p3,?X) -> [Q11, Q12, Q13] (paper)
    assert component.join_order(5) == ("?Z", "?X", "?Y")  # (d,p10,?Z) -> [Q13, Q12, Q11] (paper)
    assert component.join_order(1) == ("?Y", "?X", "?Z")
    assert component.join_order(4) == ("?X", "?Z", "?Y")


def test_connected_variable_partition_of_a_general_query():
    q = parse_query(f"SELECT * WHERE {{ ?x <{EX}p> ?y . ?y <{EX}q> <{EX}a> . ?w <{EX}r> <{EX}b> . "
                    f"<{EX}c> <{EX}s> <{EX}d> }}")
    plan = decompose(q)
    assert [(g.patterns, g.subject) for g in plan.grounds] == [((3,), f"<{EX}c>")]
    assert [s.variable for s in plan.stars] == ["?w"]
    assert [c.variables for c in plan.components] == [("?x", "?y")]
    assert plan.query_class == "general (product of parts)"


def test_loosely_connected_and_self_loop_stars():
    loose = decompose(parse_query(f"SELECT * WHERE {{ ?x <{EX}p> <{EX}a> . <{EX}a> <{EX}q> ?y }}"))
    assert loose.query_class == "loosely-connected"
    assert all(isinstance(s, StarPart) and s.simple for s in loose.stars)
    loop = decompose(parse_query(f"SELECT * WHERE {{ ?x <{EX}p> ?x . ?x <{EX}q> <{EX}a> }}"))
    assert loop.query_class == "var-centric star (self-loop)"
    assert not loop.stars[0].simple


def test_explain_json_and_text_describe_the_same_plan():
    plan = decompose(parse_query(f"SELECT ?x WHERE {{ ?x <{EX}p> ?y . ?y <{EX}q> ?x . <{EX}a> <{EX}b> <{EX}c> }}"))
    data = plan.to_json()
    assert [p["kind"] for p in data["parts"]] == ["ground", "component"]
    text = plan.explain()
    assert "ground part [t2]" in text and "var-connected component {?x, ?y}" in text
    assert "cartesian product" in text


def test_graph_variable_block_is_accepted_and_mixing_it_with_other_graphs_is_rejected():
    q = parse_query(f"SELECT * WHERE {{ GRAPH ?g {{ ?x <{EX}p> ?y }} }}")
    assert q.projected == ("x", "y", "g")
    assert q.patterns[0].g == "?g"
    assert "once per named graph" in decompose(q).explain()
    with pytest.raises(QueryError, match="every triple pattern must be inside that GRAPH block") as info:
        parse_query(f"SELECT * WHERE {{ ?x <{EX}q> ?z .\n GRAPH ?g {{ ?x <{EX}p> ?y }} }}")
    assert (info.value.line, info.value.column) == (2, 2)
    with pytest.raises(QueryError, match="only one GRAPH"):
        parse_query(f"SELECT * WHERE {{ GRAPH ?g {{ ?x <{EX}p> ?y }} GRAPH ?h {{ ?y <{EX}p> ?z }} }}")


@pytest.mark.parametrize(
    "text, prefix, line, column",
    [
        ("SELECT ?p WHERE { ?p foaf:name ?n }", "foaf", 1, 22),  # rdflib knows foaf: on its own; SPARQL does not
        ("SELECT ?x WHERE {\n  ?x a rdf:Property }", "rdf", 2, 8),
        ('PREFIX ex: <http://ex/>\nSELECT ?x WHERE { ?x ex:p "1"^^xsd:int }', "xsd", 2, 32),
        ("PREFIX : <http://ex/>\nSELECT ?p WHERE {\n  ?p ex:name ?n }", "ex", 3, 6),
        ("PREFIX ex: <http://ex/>\nSELECT ?x WHERE { ?x ex:p :o }", "", 2, 27),
    ],
)
def test_undeclared_prefixes_are_rejected_with_the_prefix_and_its_position(text, prefix, line, column):
    import pyoxigraph

    with pytest.raises(SyntaxError):  # the reference parser rejects them too
        pyoxigraph.Store().query(text)
    with pytest.raises(QueryError) as info:
        parse_query(text)
    assert info.value.message.startswith(f"undeclared prefix '{prefix}:'")
    assert (info.value.line, info.value.column) == (line, column)


def test_declared_prefixes_and_prefix_lookalikes_in_strings_iris_comments_and_blank_nodes_are_fine():
    q = parse_query('PREFIX ex: <http://ex/>\nprefix : <http://d/>\nPREFIX a.b-c: <http://abc/>\n'
                    'SELECT ?x WHERE { ?x ex:p :o, _:b1, "foaf:no", <urn:x:y>, a.b-c:z, ex:a:b . # rdf:type\n}')
    assert {p.o for p in q.patterns} >= {"<http://d/o>", '"foaf:no"', "<urn:x:y>", "<http://abc/z>", "<http://ex/a:b>"}


@pytest.mark.parametrize(
    "text, cause, line, column",
    [
        ('PREFIX ex: <http://ex/>\nSELECT ?x WHERE {\n  ?x ex:p "abc .\n  ?x ex:q ?y }',
         "unterminated string literal", 3, 11),
        ('SELECT ?x WHERE { ?x <http://ex/p> """abc }', "unterminated string literal", 1, 36),
        ("SELECT * WHERE { ?x <http://ex/p ?o }", "unterminated IRI", 1, 21),
        ("SELECT * WHERE { ?x <http://ex/p> ?o } }", "unexpected '}'", 1, 40),
        ("SELECT * WHERE { ?x <http://ex/p> ?o ) }", "unexpected ')'", 1, 38),
        ("SELECT * WHERE {\n  ?x <http://ex/p> ?o .", "'{' is never closed", 1, 16),
        ("SELECT * WHERE { ?x <http://ex/p> }", "unexpected '}'", 1, 35),
        ("SELECT * WHERE { ?x <http://ex/p> ?o ; ?z }", "unexpected '?z'", 1, 40),
        ("SELECT ?x, ?y WHERE { ?x <http://ex/p> ?y }", "unexpected ','", 1, 10),
        ("SELCT * WHERE { ?x <http://ex/p> ?o }", "found 'SELCT'", 1, 1),
        ("PREFIX ex <http://ex/>\nSELECT * WHERE { ?x ex:p ?o }", "PREFIX expects a name ending in ':'", 1, 8),
    ],
)
def test_syntax_errors_name_their_cause_and_position(text, cause, line, column):
    with pytest.raises(QueryError) as info:
        parse_query(text)
    error = info.value
    assert error.message.startswith("SPARQL syntax error: ") and cause in error.message
    assert "Expected" not in error.message  # rdflib's grammar rule names are not a cause
    assert (error.line, error.column) == (line, column)
    assert str(error) == f"{error.message} (line {line}, column {column})" and "\n" not in str(error)
