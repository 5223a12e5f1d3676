"""The cross-product check of a plain BGP, without rdflib's algebra, finds what the check over the algebra finds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from rdflib.plugins.sparql import prepareQuery

from cbgp.query.cost import bgp_cross_product, cross_product
from cbgp.query.sparql import QueryError, parse_query

terms = st.sampled_from(["?a", "?b", "?c", "?d", "?e", "_:x", "<http://ex.org/k>", '"lit"'])
predicates = st.sampled_from(["<http://ex.org/p>", "<http://ex.org/q>"])
triples = st.tuples(terms.filter(lambda t: t != '"lit"'), predicates, terms)


@settings(max_examples=300, deadline=None)
@given(st.lists(triples, min_size=1, max_size=6), st.booleans())
def test_a_bgp_is_a_cross_product_exactly_when_its_algebra_is(patterns, in_graph) -> None:  # noqa: ANN001
    body = " . ".join(" ".join(t) for t in patterns)
    text = f"SELECT * WHERE {{ {'GRAPH <http://ex.org/g> { ' + body + ' }' if in_graph else body} }}"
    try:
        parsed = parse_query(text)
    except QueryError:
        return
    fast = bgp_cross_product((t.s, t.p, t.o) for t in parsed.patterns)
    slow = cross_product(prepareQuery(text).algebra)
    assert (fast is None) == (slow is None), text
    if fast is not None and fast.count("{") <= 3:
        assert sorted(fast.split(" and ")) == sorted(slow.split(" and ")), text
