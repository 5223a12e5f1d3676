"""PatternStore's collapse: every read as of the watermark or later stays what it was, what no read needs is
dropped, and a checkpoint pickled with the older set of dirty entries still loads and collapses."""

from __future__ import annotations

import pickle

from hypothesis import given, settings, strategies as st

from cbgp.distributed.versioned_state import PatternStore, present_at

# A step: flip pair (key, other) at the next seq, or collapse at a watermark some seqs behind the newest.
steps = st.lists(st.one_of(st.tuples(st.just("flip"), st.integers(0, 3), st.integers(0, 3)),
                           st.tuples(st.just("collapse"), st.integers(0, 6))), max_size=60)


def _reads(store: PatternStore, keys: range, as_of: range) -> dict:
    return {(k, o, t): store.present(k, o, t) for k in keys for o in keys for t in as_of}


def _run(program: list[tuple], store: PatternStore) -> tuple[PatternStore, int, int]:
    """Apply ``program``; returns the store, the newest seq and the highest watermark collapsed at."""
    seq, floor, present = 0, -1, set()
    for step in program:
        if step[0] == "flip":
            _kind, key, other = step
            seq += 1
            diff = -1 if (key, other) in present else 1
            present.symmetric_difference_update({(key, other)})
            store.flip(key, other, seq, diff)
        else:
            floor = max(floor, seq - step[1])  # (watermarks only move forward, as the workers' floors do)
            store.collapse(floor)
    return store, seq, floor


@settings(max_examples=300, deadline=None)
@given(steps)
def test_collapse_keeps_every_read_it_may_still_get_and_drops_what_it_may_not(program):
    folded, newest, floor = _run(program, PatternStore())
    kept, _, _ = _run([step for step in program if step[0] == "flip"], PatternStore())  # never collapsed
    later = range(max(floor, 0), newest + 2)
    assert _reads(folded, range(4), later) == _reads(kept, range(4), later)
    folded.collapse(newest)  # everything folded: one flip at most per pair, absent pairs gone
    for bucket in folded.table.values():
        for history in bucket.values():
            assert len(history) == 1 and present_at(history, newest)
    assert folded.entries() == sum(len(bucket) for bucket in folded.table.values())
    assert not [entry for entry in folded.dirty if entry[0] <= newest]


def test_a_store_pickled_with_a_set_of_dirty_pairs_loads_and_collapses():
    store = PatternStore()
    for seq, (key, other, diff) in enumerate([(1, 2, 1), (1, 2, -1), (1, 3, 1), (1, 2, 1), (4, 5, 1)], start=1):
        store.flip(key, other, seq, diff)
    state = {name: getattr(store, name) for name in PatternStore.__slots__}
    state["dirty"] = {(1, 2)}  # as the stores of older checkpoints keep it

    class Old:  # pickles as a PatternStore whose dirty entries are a set
        def __reduce__(self):
            return (PatternStore.__new__, (PatternStore,), (None, state))

    loaded = pickle.loads(pickle.dumps(Old()))
    assert isinstance(loaded.dirty, list) and loaded.present(1, 2, 4) and not loaded.present(1, 2, 2)
    loaded.collapse(4)
    assert loaded.table[1] == {2: [-1], 3: [3]} and loaded.present(1, 2, 4) and loaded.entries() == 3
    assert pickle.loads(pickle.dumps(loaded)).table == loaded.table
