"""What the release waits for, by routed partition: its frontier (``cbgp_release_frontier_seq``, the lowest over the
deltas.parts partitions held) and the registrations still missing its ProbeReady mark (``cbgp_gates_waiting``), so
a routed partition whose worker stopped, or whose share of a registration was lost, shows as the one behind."""

from __future__ import annotations

from services.answers.release import SeqRelease

ROUTED = 3


def test_each_routed_partition_shows_its_lowest_frontier_over_the_held_parts_partitions() -> None:
    release = SeqRelease(ROUTED)
    release.restore(0, None)
    release.restore(1, None)
    assert release.frontiers_seen() == {0: -1, 1: -1, 2: -1}
    release.on_frontier(0, {0: 9, 1: 7, 2: 4})
    release.on_frontier(1, {0: 8, 1: 7})
    assert release.frontiers_seen() == {0: 8, 1: 7, 2: -1}  # parts partition 1 has not heard from routed 2
    release.on_frontier(1, {2: 6, 0: 3})  # (a frontier never goes back)
    assert release.frontiers_seen() == {0: 8, 1: 7, 2: 4}
    release.drop(0)
    assert release.frontiers_seen() == {0: 8, 1: 7, 2: 6}


def test_a_registration_missing_one_routed_partitions_mark_is_counted_against_that_partition() -> None:
    release = SeqRelease(ROUTED)
    release.restore(0, None)
    assert release.gates_waiting() == {0: 0, 1: 0, 2: 0}
    release.on_ready(0, 10, "q", 1, 0, 5)
    release.on_ready(0, 11, "q", 1, 2, 5)
    release.on_ready(0, 12, "r", 1, 2, 5)
    assert release.gates_waiting() == {0: 1, 1: 2, 2: 0}
    release.on_ready(0, 13, "q", 1, 1, 5)
    release.on_frontier(0, {0: 6, 1: 6, 2: 6})  # every mark of q is in and the frontiers passed its as_of: open
    assert release.gates_waiting() == {0: 1, 1: 1, 2: 0}
