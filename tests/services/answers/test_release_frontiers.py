"""The release's view of the routed partitions' frontiers (``cbgp_release_frontier_seq``): the lowest over the
deltas.parts partitions it holds, so a routed partition whose worker stopped shows as the one that stays behind."""

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
