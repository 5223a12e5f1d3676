"""``spark.state_log`` without Spark: two Python workers taking turns on a key (as Spark's idle-worker queue makes
them) each end with the state a single worker would have, replaying only the batches they missed."""

from __future__ import annotations

import pickle

from spark import state_log
from tests.fixtures.memory_state import Rows, Value


class Worker:
    """One Python worker: its live cache, and counts of what it had to do."""

    def __init__(self) -> None:
        self.live: state_log.LiveCache[list] = state_log.LiveCache()
        self.builds = self.replayed = 0

    def run(self, store: dict, batch: list[int], min_tail: int = 1, factor: int = 1) -> list:
        def build(saved):  # noqa: ANN001, ANN202
            self.builds += 1
            return list(saved or [])

        def replay(evaluator, record):  # noqa: ANN001, ANN202
            self.replayed += 1
            evaluator.extend(record)
            return evaluator

        version = store["version"]
        evaluator = self.live.evaluator("q", version, "plan", store["base"], store["tail"], build, replay) \
            if version else build(None)
        evaluator.extend(batch)
        store["inputs"] = state_log.save(store["base"], store["tail"], store["inputs"], len(batch), batch,
                                         version + 1, lambda: len(evaluator), lambda: list(evaluator), min_tail,
                                         factor)
        store["version"] = version + 1
        self.live.put("q", version + 1, "plan", evaluator)
        return evaluator


def new_store() -> dict:
    return {"version": 0, "base": Value(), "tail": Rows(), "inputs": 0}


def test_a_worker_catches_up_on_the_batches_another_ran_instead_of_rebuilding() -> None:
    store, a, b = new_store(), Worker(), Worker()
    a.run(store, [1, 2], min_tail=100)
    a.run(store, [3], min_tail=100)
    b.run(store, [4], min_tail=100)  # b never saw the key: rebuilt from the base and the tail
    assert b.builds == 1 and b.replayed == 2
    b.run(store, [5], min_tail=100)
    got = a.run(store, [6], min_tail=100)  # a is two batches behind: it replays just those two
    assert got == [1, 2, 3, 4, 5, 6]
    assert a.builds == 1 and a.replayed == 2  # (its first build was the empty start)


def test_a_base_rewrite_keeps_the_last_rows_for_workers_a_few_batches_behind() -> None:
    store, a, b = new_store(), Worker(), Worker()
    a.run(store, [1], min_tail=100)
    b.run(store, [2], min_tail=1)  # the tail outgrew the state: the base is rewritten
    assert store["base"].exists()
    b.run(store, [3], min_tail=100)
    assert a.run(store, [4], min_tail=100) == [1, 2, 3, 4]
    assert a.builds == 1 and a.replayed == 2  # rows 2 (kept past the rewrite) and 3
    c = Worker()  # a new worker: the base, then only the rows after it
    assert c.run(store, [5], min_tail=100) == [1, 2, 3, 4, 5] and c.replayed == 2


def test_a_worker_further_behind_than_the_kept_rows_rebuilds() -> None:
    store, a, b = new_store(), Worker(), Worker()
    a.run(store, [0], min_tail=100)
    for i in range(1, state_log.KEPT_ROWS + 2):
        b.run(store, [i], min_tail=1, factor=0)  # a base rewrite every batch
    assert len(store["tail"].rows) == state_log.KEPT_ROWS
    assert a.run(store, [99], min_tail=100) == [*range(state_log.KEPT_ROWS + 2), 99]
    assert a.builds == 2


def test_a_live_evaluator_ahead_of_the_store_is_not_used() -> None:
    """A batch that ran here but was not committed (Spark retries it, maybe elsewhere): the store is behind."""
    store, a = new_store(), Worker()
    a.run(store, [1], min_tail=100)
    saved = {k: (pickle.loads(pickle.dumps(v)) if k != "version" else v) for k, v in store.items()}
    a.run(store, [2], min_tail=100)  # then the commit of version 2 fails: the store is still at version 1
    assert a.run(saved, [2], min_tail=100) == [1, 2]
    assert a.builds == 2


def test_rows_written_before_they_carried_versions_still_restore() -> None:
    store = new_store()
    store["tail"].appendList([(state_log.dumps([7]),), (state_log.dumps([8]),)])
    store["version"] = 2
    other = Worker()
    other.live.put("q", 1, "plan", [7])  # even a live evaluator cannot catch up on untagged rows
    assert other.run(store, [9]) == [7, 8, 9] and other.builds == 1
