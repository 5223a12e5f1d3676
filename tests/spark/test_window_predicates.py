"""The windows duty's fan-out keeps, per windowed query, the predicates it reads: for the query's current
registration only, and for the queries registered now only (a Python worker lives as long as the job)."""

from __future__ import annotations

from cbgp.terms import stable_term_id
from cbgp.windows.spec import WindowSpec
from spark.window_stream import PredicateCache

WINDOW = WindowSpec("sliding", 10_000, 5_000)


def query(predicate: str) -> str:
    return f"SELECT * WHERE {{ ?s <http://ex.org/{predicate}> ?o }}"


def test_a_new_version_reads_its_own_predicates_and_an_unregistered_query_is_forgotten() -> None:
    cache = PredicateCache()
    assert list(cache.get("q", 1, query("p"), WINDOW)) == [stable_term_id("<http://ex.org/p>")]
    assert list(cache.get("q", 2, query("r"), WINDOW)) == [stable_term_id("<http://ex.org/r>")]
    for n in range(100):  # registered and unregistered again, one after the other
        cache.get(f"churn{n}", 1, query("p"), WINDOW)
        cache.keep({"q", f"churn{n}"})
    assert len(cache) == 2
    cache.keep({"q"})
    assert len(cache) == 1 and list(cache.get("q", 2, query("ignored"), WINDOW)) == [stable_term_id("<http://ex.org/r>")]
