"""How long a short read of a rarely written topic listens (``services.kafka.fetch.read_window``), on a consumer
that stands for a slow broker: a window that runs out while a fetch is in flight makes the next one longer, up
to LISTEN_MAX_SECONDS, so a fetch slower than the window is not dropped again and again (it was: the answers
service never read queries.plans after three broker restarts in a loaded CI run); a window that ends with a
record or every partition's end sets it back to WINDOW_LISTEN_SECONDS."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError

from services.kafka import doorbell as doorbell_module
from services.kafka import fetch


class _Eof:
    def __init__(self, topic: str, partition: int) -> None:
        self._topic, self._partition = topic, partition

    def error(self) -> Any:
        return KafkaError(KafkaError._PARTITION_EOF)

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition


class _SlowBroker:
    """Answers a fetch only after ``delay`` seconds of listening (what the window waits in ``poll``)."""

    def __init__(self, delay: float, partitions: int) -> None:
        self.delay, self.partitions = delay, partitions
        self.windows: list[float] = []
        self._pending: list[Any] = []

    def assign(self, _tps: Any) -> None:
        self._waited = 0.0

    def unassign(self) -> None:
        pass

    def poll(self, timeout: float) -> Any:
        if not self._pending:
            self.windows.append(round(timeout, 3))  # (first_record passes what is left of the window)
            if timeout < self.delay:
                return None  # the fetch is still in flight when the window ends (and unassign drops it)
            self._pending = [_Eof("plans", p) for p in range(self.partitions)]
        return self._pending.pop(0)

    def consume(self, _n: int, _timeout: float) -> list:
        return []


def test_a_window_that_runs_out_mid_fetch_listens_longer_next_time_and_then_starts_short_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A still clock: each poll is passed its window whole, however long the machine took to call it (a loaded
    # CI machine once passed 0.039 of a 0.04 window).
    monkeypatch.setattr(fetch, "time", SimpleNamespace(monotonic=lambda: 1000.0, sleep=time.sleep))
    broker = _SlowBroker(delay=0.05, partitions=4)
    positions = {p: 0 for p in range(4)}
    for _ in range(6):
        assert fetch.read_window(broker, "plans", positions) == []
    windows = broker.windows
    assert windows[0] == fetch.WINDOW_LISTEN_SECONDS
    assert windows[1:4] == [0.02, 0.04, 0.08]  # doubled until the fetch fits in the window
    assert windows[4] == fetch.WINDOW_LISTEN_SECONDS  # every partition's end came: short again
    broker.delay = 100.0  # a broker that answers nothing: bounded
    for _ in range(12):
        fetch.read_window(broker, "plans", positions)
    assert max(broker.windows) == fetch.LISTEN_MAX_SECONDS


class _Input:
    """Stands for a Fetcher in ``idle_pause``: its idle streak, when it last read a record, and its parking."""

    def __init__(self, streak: int, quiet: float, deep_pause: float | None = None) -> None:
        self.idle_streak, self.read_at, self.parked = streak, time.monotonic() - quiet, False
        self.deep_pause = deep_pause
        self.positions: dict[tuple[str, int], int] = {}  # (no doorbell to listen on)

    def park(self) -> None:
        self.parked = True


def test_the_idle_pause_doubles_to_its_longest_and_deepens_after_a_quiet_minute(monkeypatch: Any) -> None:
    """15, 30, 60, 60 ms... while records keep coming now and then; 250 ms once nothing was read for a minute,
    judged by the input that read last (a worker with one busy input of two never goes deep)."""
    pauses = [fetch.idle_pause_seconds(streak, quiet=1.0) for streak in range(5)]
    assert pauses == [0.015, 0.03, 0.06, 0.06, 0.06]
    assert fetch.idle_pause_seconds(200, quiet=59.0) == 0.06
    assert fetch.idle_pause_seconds(200, quiet=60.0) == 0.25
    assert fetch.idle_pause_seconds(200, quiet=60.0, deep=0.06) == 0.06  # (an input's own: ingest's)
    slept: list[float] = []
    clock = SimpleNamespace(sleep=slept.append, monotonic=time.monotonic)  # (these modules' only)
    monkeypatch.setattr(fetch, "time", clock)
    monkeypatch.setattr(doorbell_module, "time", clock)  # (a deep pause's rest, with nothing to listen on)
    quiet, busy = _Input(300, quiet=61.0), _Input(300, quiet=2.0)
    fetch.idle_pause([quiet, busy])  # type: ignore[list-item]
    first = round(sum(slept), 6)
    fetch.idle_pause([quiet])  # type: ignore[list-item]
    assert [first, round(sum(slept) - first, 6)] == [0.06, 0.25]
    assert quiet.parked and busy.parked and quiet.idle_streak == 302


def test_a_ring_ends_a_deep_pause_past_its_first_part_and_leaves_a_busy_inputs_pause_alone(
        process_doorbell: Any, bell_dir: str, monkeypatch: Any) -> None:
    """After a quiet minute, a ring for one of the input's partitions ends its pause once the first
    IDLE_PAUSE_SECONDS are over; a busy input's pause (what gathers its next batch) is slept whole."""
    slept: list[float] = []
    monkeypatch.setattr(fetch, "time", SimpleNamespace(sleep=slept.append, monotonic=time.monotonic))  # (fetch's only)
    quiet = _Input(300, quiet=61.0)
    quiet.positions = {("t", 0): 5}
    started = time.monotonic()
    fetch.idle_pause([quiet])  # nobody rings: its first part slept, the rest listened out
    assert slept == [fetch.IDLE_PAUSE_SECONDS]
    assert time.monotonic() - started >= fetch.IDLE_PAUSE_DEEP_SECONDS - fetch.IDLE_PAUSE_SECONDS - 0.01
    assert doorbell_module.Doorbell(bell_dir).ring([("t", 0)]) == 1
    started = time.monotonic()
    fetch.idle_pause([quiet])  # rung: over after its first part
    assert time.monotonic() - started < 0.1 and slept == [fetch.IDLE_PAUSE_SECONDS] * 2
    busy = _Input(1, quiet=0.5)
    busy.positions = {("t", 0): 5}
    assert doorbell_module.Doorbell(bell_dir).ring([("t", 0)]) == 1
    fetch.idle_pause([busy])  # 30 ms, slept whole: the ring waits
    assert slept[-1] == 2 * fetch.IDLE_PAUSE_SECONDS
    assert process_doorbell.wait([("t", 0)], 0) is True


def test_ingest_pauses_no_longer_than_its_busy_pause_after_a_quiet_minute_and_a_ring_still_ends_it(
        process_doorbell: Any, bell_dir: str, monkeypatch: Any) -> None:
    """Nothing rings ingest for a producer of the user's own: its input pauses DEEP_PAUSE_SECONDS (60 ms) after a
    quiet minute, not the fleet's 250 ms; an input read together with a deeper one (a worker's two) pauses as the
    shorter; and an input's own pause after a quiet minute still ends on a ring past its first IDLE_PAUSE_SECONDS
    (cbgp publish rings ingest)."""
    from services.ingest.service import DEEP_PAUSE_SECONDS

    assert DEEP_PAUSE_SECONDS == fetch.IDLE_PAUSE_MAX_SECONDS == 0.06 < fetch.IDLE_PAUSE_DEEP_SECONDS
    slept: list[float] = []
    monkeypatch.setattr(fetch, "time", SimpleNamespace(sleep=slept.append, monotonic=time.monotonic))  # (fetch's only)
    ingest = _Input(300, quiet=61.0, deep_pause=DEEP_PAUSE_SECONDS)
    ingest.positions = {("raw", 0): 5}
    started = time.monotonic()
    fetch.idle_pause([ingest])  # nobody rings: its first part slept, the rest (45 ms) listened out
    waited = time.monotonic() - started
    assert slept == [fetch.IDLE_PAUSE_SECONDS]
    assert DEEP_PAUSE_SECONDS - fetch.IDLE_PAUSE_SECONDS - 0.01 <= waited < fetch.IDLE_PAUSE_DEEP_SECONDS - 0.05
    deeper = _Input(300, quiet=61.0)
    started = time.monotonic()
    fetch.idle_pause([deeper, ingest])
    assert time.monotonic() - started < fetch.IDLE_PAUSE_DEEP_SECONDS - 0.05
    ingest.deep_pause = 5.0  # (long enough that only a ring ends it within a test)
    assert doorbell_module.Doorbell(bell_dir).ring([("raw", 0)]) == 1
    started = time.monotonic()
    fetch.idle_pause([ingest])  # rung: over after its first part
    assert time.monotonic() - started < 1.0 and slept == [fetch.IDLE_PAUSE_SECONDS] * 3

