"""The probe routes of multi-centre components (cbgp.distributed.program.probe_route): where an update's probes
start and in which order they match the other patterns.  Exactness does not depend on the route (the
differential tests in test_distributed_probes and test_distribution check every route they make); here, that
every route is well formed and that the LSBench 3-hop path gets the route that sends fewest probes."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from cbgp.query.plan import route_variants
from cbgp.query.plan import probe_route
from cbgp.query.plan import OBJECT_END, SUBJECT_END, Step, stored_ends


def _check_route(pairs: list[tuple[int, int]], j: int) -> None:
    start, steps = probe_route(pairs, j)
    assert start in stored_ends(*pairs[j])
    _check_steps(pairs, j, steps)
    # The routes a partition may choose among: the default first, every one well formed, none twice.
    variant_start, variants = route_variants(pairs, j)
    assert variant_start == start and variants[0] == steps and len(set(variants)) == len(variants)
    for other in variants:
        _check_steps(pairs, j, other)


def _check_steps(pairs: list[tuple[int, int]], j: int, steps: tuple[Step, ...]) -> None:
    assert sorted(step.pattern for step in steps) == [i for i in range(len(pairs)) if i != j]
    bound = {v for v in pairs[j] if v >= 0}
    for step in steps:
        subject_var, object_var = pairs[step.pattern]
        assert step.end in stored_ends(subject_var, object_var)
        at = subject_var if step.end == SUBJECT_END else object_var
        assert step.at == at and at in bound, "a step runs at the partition of a bound value"
        other = object_var if step.end == SUBJECT_END else subject_var
        if step.binds < 0:
            assert all(v in bound for v in (subject_var, object_var) if v >= 0), "a check binds nothing new"
        else:
            assert step.binds == other and other not in bound, "a lookup binds the pattern's other end"
            bound.add(other)


@st.composite
def components(draw) -> list[tuple[int, int]]:  # noqa: ANN001
    """Connected patterns over variables 0..n (-1: a constant), each new pattern sharing a variable with the
    earlier ones."""
    n = draw(st.integers(2, 6))
    pairs = [(0, draw(st.sampled_from([1, -1, 0])))]
    used = {v for v in pairs[0] if v >= 0}
    for _ in range(n - 1):
        old = draw(st.sampled_from(sorted(used)))
        new = draw(st.sampled_from(sorted(used) + [max(used) + 1, -1]))
        pair = (old, new) if draw(st.booleans()) else (new, old)
        if pair[0] < 0 and pair[1] < 0:
            pair = (old, old)
        pairs.append(pair)
        used.update(v for v in pair if v >= 0)
    return pairs


@settings(max_examples=300, deadline=None)
@given(pairs=components())
def test_every_route_is_well_formed(pairs: list[tuple[int, int]]) -> None:
    for j in range(len(pairs)):
        _check_route(pairs, j)


def test_the_lsbench_path_routes_send_one_probe_per_hop() -> None:
    # ?a knows ?b . ?b like ?post . ?post browser ?x   (variables a=0, b=1, post=2, x=3)
    pairs = [(0, 1), (1, 2), (2, 3)]
    # A knows: at ?b (the object end), its likes there, then one probe per liked post.
    start, steps = probe_route(pairs, 0)
    assert start == OBJECT_END and [(s.pattern, s.at) for s in steps] == [(1, 1), (2, 2)]
    # A like: at ?post, its browser there, then one probe to ?b for its friends (not one per friend of ?b).
    start, steps = probe_route(pairs, 1)
    assert start == OBJECT_END and [(s.pattern, s.at) for s in steps] == [(2, 2), (0, 1)]
    # A browser: at ?post, the likers there, then one probe per liker.
    start, steps = probe_route(pairs, 2)
    assert start == SUBJECT_END and [(s.pattern, s.at) for s in steps] == [(1, 2), (0, 1)]
