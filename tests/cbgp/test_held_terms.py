"""Terms an aggregate computes are held while they are answers and freed once let go: a GROUP_CONCAT, SUM or AVG
over a changing group makes a new term per change, and the dictionary kept every one (4.5 MB of GROUP_CONCAT values
on 150,000 LSBench updates, growing with the square of a group's size)."""

from __future__ import annotations

import pickle

import pytest

from cbgp.algebra import ContinuousEngine
from cbgp.terms import TermDictionary, stable_term_id

EX = "http://ex.org/"


def test_a_held_term_is_freed_when_its_last_holder_lets_go_and_collect_runs() -> None:
    terms = TermDictionary()
    term = '"a b"'
    term_id = terms.hold(term)
    assert term_id == stable_term_id(term) and terms.hold(term) == term_id and terms.decode(term_id) == term
    terms.release(term_id)
    assert terms.collect() == [] and terms.decode(term_id) == term  # one holder left
    terms.release(term_id)
    assert terms.decode(term_id) == term  # (let go, still readable until collect)
    assert terms.collect() == [term_id]
    with pytest.raises(KeyError):
        terms.decode(term_id)
    assert terms.lookup(term) is None and len(terms) == 0


def test_a_term_also_data_or_a_constant_is_kept_for_good() -> None:
    terms = TermDictionary(stable=True)
    data = terms.encode('"3"')
    assert terms.hold('"3"') == data  # data first: the hold counts nothing
    terms.release(data)
    assert terms.collect() == [] and terms.decode(data) == '"3"'
    made = terms.hold('"4"')
    assert terms.encode('"4"') == made  # held, then data: kept from then on
    terms.release(made)
    assert terms.collect() == [] and terms.decode(made) == '"4"' and terms.ids['"4"'] == made
    added = terms.hold('"5"')
    terms.add(added, '"5"')  # read from the dictionary topic
    terms.release(added)
    assert terms.collect() == [] and terms.decode(added) == '"5"'


def test_a_dictionary_pickled_before_held_terms_loads_and_holds() -> None:
    terms = TermDictionary()
    terms.encode("<http://ex.org/a>")
    _none, slots = terms.__getstate__()
    old = {name: slots[name] for name in ("_ids", "_terms", "_stable")}  # what a checkpoint held before
    loaded = TermDictionary.__new__(TermDictionary)
    loaded.__setstate__((None, old))
    assert loaded.decode(1) == "<http://ex.org/a>"
    held = loaded.hold('"x"')
    assert pickle.loads(pickle.dumps(loaded)).decode(held) == '"x"'


@pytest.mark.parametrize("aggregate", ["GROUP_CONCAT(STR(?o))", "SUM(?n)", "AVG(?n)", "COUNT(?o)"])
def test_an_aggregate_over_a_changing_group_keeps_only_its_current_values(aggregate: str) -> None:
    """A thousand changes of two groups: the dictionary holds the two groups' current values, not a thousand, and
    every answer decodes when it is read (a '-' names the value it retracts)."""
    engine = ContinuousEngine()
    engine.register("q", f"SELECT ?s (({aggregate}) AS ?v) WHERE {{ ?s <{EX}p> ?o . ?o <{EX}n> ?n }} GROUP BY ?s")
    current: dict[str, str] = {}
    base = None
    for i in range(1000):
        s, o = f"<{EX}s{i % 2}>", f"<{EX}o{i}>"
        deltas = engine.apply_terms(1, o, f"<{EX}n>", f'"{i}"^^<http://www.w3.org/2001/XMLSchema#integer>')
        deltas += engine.apply_terms(1, s, f"<{EX}p>", o)
        for _name, sign, row in deltas:
            binding = engine.decode_row("q", row)
            if sign > 0:
                current[binding["s"]] = binding["v"]
            else:
                assert current.pop(binding["s"]) == binding["v"]
        engine.collect()
        if i == 9:
            base = len(engine.dictionary)
    assert len(current) == 2
    # Each change brought two new data terms (an object, a number) and at most one STR(?o); of the aggregate's
    # values, two stayed.
    assert len(engine.dictionary) - base <= 3 * 990 + 2
    assert engine.dictionary.held() <= 2
