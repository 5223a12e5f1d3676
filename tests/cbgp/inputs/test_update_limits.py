"""What one SPARQL Update request may cost: a WHERE clause that is a product of unconstrained parts is refused
before pyoxigraph evaluates it, and the changes and solutions a request makes are capped; a refused request
changes nothing, and the same request within the limits still runs."""

from __future__ import annotations

import pyoxigraph as ox
import pytest

from cbgp.inputs.sparql_update import UpdateExtractor, UpdateRequestError

P = "http://ex.org/p"


@pytest.fixture
def extractor() -> UpdateExtractor:
    store = ox.Store()
    store.extend(ox.Quad(ox.NamedNode(f"http://ex.org/{i}"), ox.NamedNode(P), ox.Literal(str(i))) for i in range(500))
    return UpdateExtractor(store)


def test_a_product_of_unconstrained_patterns_is_refused_and_changes_nothing(extractor: UpdateExtractor) -> None:
    before = len(extractor._store)
    with pytest.raises(UpdateRequestError, match=r"cross product of \{\?a \?b \?c\} and \{\?d \?e \?f\}"):
        extractor.apply(f"INSERT {{ ?a <{P}> ?d }} WHERE {{ ?a ?b ?c . ?d ?e ?f }}")  # 250,000 changes
    assert len(extractor._store) == before


def test_a_product_with_one_anchored_part_runs(extractor: UpdateExtractor) -> None:
    delta = extractor.apply(f'INSERT {{ ?a <http://ex.org/q> ?d }} WHERE {{ ?a <{P}> "7" . ?d <{P}> ?e }}')
    assert len(delta.inserted) == 500


def test_the_changes_of_one_request_are_capped(extractor: UpdateExtractor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CBGP_MAX_UPDATE_CHANGES", "100")
    with pytest.raises(UpdateRequestError, match=r"more than 100 changes \(CBGP_MAX_UPDATE_CHANGES\)"):
        extractor.apply(f"INSERT {{ ?a <http://ex.org/q> ?c }} WHERE {{ ?a <{P}> ?c }}")
    assert extractor.apply(f'INSERT {{ ?a <http://ex.org/q> ?c }} WHERE {{ ?a <{P}> ?c FILTER(?c IN ("1", "2")) }}').inserted


def test_the_solutions_of_a_where_clause_are_capped(extractor: UpdateExtractor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CBGP_MAX_UPDATE_SOLUTIONS", "50")
    with pytest.raises(UpdateRequestError, match="more than 50 solutions"):
        extractor.apply(f"DELETE {{ <http://ex.org/none> <{P}> ?c }} WHERE {{ ?a <{P}> ?c }}")


def test_products_may_be_allowed(extractor: UpdateExtractor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CBGP_ALLOW_UPDATE_CROSS_PRODUCTS", "1")
    monkeypatch.setenv("CBGP_MAX_UPDATE_CHANGES", "1000000")
    assert len(extractor.apply("INSERT { ?a <http://ex.org/r> ?d } WHERE { ?a ?b ?c . ?d ?e ?f }").inserted) \
        == 500 * 500
