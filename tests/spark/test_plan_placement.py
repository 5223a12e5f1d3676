"""The Spark job's assembly gate and the workers agree on which queries' parts the Spark job multiplies, for every
query shape, recorded placement (none, by centre, single owner) and fleet placement (no Spark, no broker)."""

from __future__ import annotations

import pytest

from cbgp.query.plan import BY_CENTRE, SINGLE_OWNER, decompose
from services.wire.registrations import read_query, read_registration
from services.worker.shard import QueryInfo
from spark.plan_topic import RegisteredPlan

EX = "http://example.org/"
QUERIES = {
    "star": f"SELECT * WHERE {{ ?a <{EX}p> ?b . ?a <{EX}q> ?c }}",
    "product": f"SELECT * WHERE {{ ?a <{EX}p> ?b . ?c <{EX}q> ?d }}",
    "path of three": f"SELECT * WHERE {{ ?a <{EX}p> ?b . ?b <{EX}q> ?c . ?c <{EX}r> ?d }}",
    "product with a chain": f"SELECT * WHERE {{ ?a <{EX}p> ?b . ?b <{EX}q> ?c . ?x <{EX}r> ?y }}",
    "graph variable": f"SELECT * WHERE {{ GRAPH ?g {{ ?a <{EX}p> ?b . ?c <{EX}q> ?d }} }}",
    "operators": f"SELECT * WHERE {{ ?a <{EX}p> ?b OPTIONAL {{ ?c <{EX}q> ?d }} }}",
    "windowed": f"SELECT * WHERE {{ ?a <{EX}p> ?b . ?c <{EX}q> ?d }}",
}


@pytest.mark.parametrize("fleet_single_owner", [False, True])
@pytest.mark.parametrize("recorded", [None, BY_CENTRE, SINGLE_OWNER])
@pytest.mark.parametrize("shape", list(QUERIES))
def test_the_spark_gate_and_the_workers_agree_on_what_spark_multiplies(shape: str, recorded: str | None,
                                                                       fleet_single_owner: bool) -> None:
    options = {"window": "sliding", "range": "PT10S", "step": "PT1S"} if shape == "windowed" else {}
    text, window = read_registration(QUERIES[shape], options)
    parsed, operators = read_query(text, window)
    plan = decompose(parsed) if parsed is not None else None
    info = QueryInfo("q", 1, plan, 0, 0, 0, window, True, fleet_single_owner, operators, None, recorded)
    if info.placement_problem() is not None:
        pytest.skip("a record this worker refuses (dead-lettered): nothing to agree on")
    spark = RegisteredPlan("q", 1, text, window, 0, recorded).assembled_by_spark(fleet_single_owner)
    assert spark == info.assembled
    to_spark = [name for name, _part, _q in info.engine_queries() if "#" in name] if info.assembled else []
    assert bool(to_spark) == info.assembled and not (info.assembled and info.partitioned)
    if shape == "product":  # by centre (the answers service multiplies) unless something says single owner
        assert spark == (fleet_single_owner or recorded == SINGLE_OWNER)


def test_a_query_placed_by_centre_is_not_parsed_to_know_that_spark_does_not_multiply_it() -> None:
    """The trimmer and the Spark job's gate ask this of every registered query; by centre, the answers service
    multiplies a product, so the text is not read at all (a text the parser refuses shows it)."""
    from cbgp.query.sparql import QueryError
    from services.wire.registrations import spark_multiplies

    unreadable = "SELECT * WHERE { ?a <http://example.org/p> ?b "
    assert spark_multiplies(unreadable, None, BY_CENTRE, fleet_single_owner=False) is False
    with pytest.raises(QueryError):
        spark_multiplies(unreadable, None, BY_CENTRE, fleet_single_owner=True)
    with pytest.raises(QueryError):
        spark_multiplies(unreadable, None, None, fleet_single_owner=False)
