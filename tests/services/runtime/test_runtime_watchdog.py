"""The transaction watchdog: a transactional call blocked far past its timeout (librdkafka #5456 can do
that after a broker restart) makes the process start again from scratch, same PID and arguments."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

BLOCKED = '''
import os, sys, time
sys.path.insert(0, sys.argv[1])
if os.environ.get("CBGP_TEST_AGAIN"):
    print("started again", os.getpid(), flush=True)
    sys.exit(0)
os.environ["CBGP_TEST_AGAIN"] = "1"
print("first start", os.getpid(), flush=True)
from services.runtime.life import _WATCHDOG
_WATCHDOG.enter(0.0)  # calls with a 0 s timeout that never return: the watchdog acts after 10 s
time.sleep(120)
print("the watchdog did not act", flush=True)
'''


@pytest.mark.timeout(90)
def test_a_blocked_transaction_call_restarts_the_process(tmp_path: Path) -> None:
    script = tmp_path / "blocked.py"
    script.write_text(BLOCKED)
    done = subprocess.run([sys.executable, str(script), str(ROOT)], capture_output=True, text=True, timeout=80)
    lines = done.stdout.split()
    assert done.returncode == 0, done.stderr
    assert "first start" in done.stdout and "started again" in done.stdout, done.stdout
    assert lines[2] == lines[5], "execv keeps the PID (a supervisor sees the same process)"
    assert "event=restart-process" in done.stderr and "blocked for over 10 s" in done.stderr  # 4 x 0 s + 10 s


def test_an_unexpected_error_restarts_the_life_only_after_a_broker_outage(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client call can fail in ways its API does not promise while the broker is gone: that life starts
    again.  The same error with the broker there is a bug, and it propagates (the process crashes loudly)."""
    from services.runtime import life as runtime
    from services.kafka import client

    class Stop:
        stopping = False

    lives: list[int] = []

    def life(stopper: Stop) -> None:
        lives.append(1)
        if len(lives) == 1:
            client.OUTAGES[0] += 1  # the broker went away during the first life ...
            raise AttributeError("'NoneType' object has no attribute 'partitions'")  # ... and a call broke
        stopper.stopping = True

    monkeypatch.setattr(runtime.time, "sleep", lambda _s: None)
    assert runtime.run_lives("worker", life, Stop()) == 0
    assert len(lives) == 2

    def buggy(_stopper: Stop) -> None:
        raise AttributeError("a bug")

    with pytest.raises(AttributeError):
        runtime.run_lives("worker", buggy, Stop())


def test_an_error_in_a_rebalance_callback_is_raised_by_serve_as_itself(tmp_path) -> None:  # noqa: ANN001
    """A callback error must not travel through librdkafka's C callback (it came out of poll() as a bare
    KafkaError object that no except clause catches, and a worker died after a broker restart): GroupInput
    keeps it and serve() raises it, so the service life restarts."""
    from confluent_kafka import KafkaError, KafkaException

    from services.kafka.broker import EmbeddedBroker
    from services.kafka.fetch import GroupInput

    def on_revoke(_consumer, _partitions) -> None:  # noqa: ANN001
        raise KafkaException(KafkaError(KafkaError._UNKNOWN_PARTITION, "Failed to get watermark offsets"))

    settings = EmbeddedBroker(tmp_path, port=1).settings(topic_prefix="cb.")  # never started: no broker
    group = GroupInput(settings, "cb.group", [], 10, on_revoke=on_revoke)
    try:
        group._revoked(group.member, [])  # as librdkafka would call it from poll()
        with pytest.raises(KafkaException, match="watermark"):
            group.serve()
        group.serve()  # raised once
    finally:
        group.member.close()
        group.fetcher.close()


@pytest.mark.slow
def test_a_restore_runs_after_the_rebalance_callback_returned(kafka_settings) -> None:  # noqa: ANN001
    """``on_assign`` (a service's restore, which may read a long log) runs from ``serve`` once the member's poll
    returned, not inside librdkafka's rebalance callback; the fetcher starts at the committed offsets only after
    it.  A revocation served before the hand-over takes its partitions out of the assignment waiting."""
    import inspect
    import time

    from confluent_kafka import TopicPartition

    from services.kafka.fetch import GroupInput

    calls: list[tuple[list[int], bool, bool]] = []

    def on_assign(_consumer, partitions) -> None:  # noqa: ANN001
        frames = {frame.function for frame in inspect.stack()}
        calls.append((sorted(tp.partition for tp in partitions), "_assigned" in frames, "serve" in frames))

    topic = kafka_settings.topic("updates.raw")
    group = GroupInput(kafka_settings, f"{kafka_settings.topic_prefix}restore", [topic], 10, on_assign=on_assign)
    try:
        deadline = time.monotonic() + 60
        while not calls and time.monotonic() < deadline:
            group.poll()
        assert calls, "assigned within a minute"
        partitions, in_callback, from_serve = calls[0]
        assert partitions and not in_callback and from_serve
        assert group.taken is None and group.fetcher.positions

        # taken in a callback, then revoked before serve() handed it over: nothing of it reaches on_assign
        group._assign(group.member, [TopicPartition(topic, p) for p in partitions])
        group._revoked(group.member, [TopicPartition(topic, partitions[0])])
        group._hand_over()
        assert calls[-1][0] == partitions[1:]
    finally:
        group.close()


HUNG_STOP = '''
import ctypes, logging, sys, time
sys.path.insert(0, sys.argv[1])
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from services.runtime.life import Stopper
stopper = Stopper(grace=0.5)
print("ready", flush=True)
if sys.argv[2] == "blocked":
    # A C call that no signal interrupts (as a consumer's close waiting on its group): the Python handler cannot
    # run until it returns, and it never does.
    libc, mutex = ctypes.CDLL(None), ctypes.create_string_buffer(64)  # zeros: glibc's default mutex
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)  # locked by this thread already: waits for good
while not stopper.stopping:
    time.sleep(0.01)
print("stop seen", flush=True)
if sys.argv[2] == "holding":  # a C call that never returns and holds the interpreter: no Python thread runs
    libc, mutex = ctypes.PyDLL(None), ctypes.create_string_buffer(64)
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)
time.sleep(60)  # a close (or a transaction's call) that never returns
print("not stopped", flush=True)
'''


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["closing", "blocked"])
def test_a_service_that_cannot_close_exits_after_its_stop_grace(tmp_path: Path, case: str) -> None:
    """SIGTERM to a data-path service whose close hangs (a consumer leaving a rebalancing group, or a
    transaction's call to a stale coordinator, can block in librdkafka): it exits with code 0 and one stop-timeout
    line once the grace has passed, even when its main thread never comes back from C to run the handler."""
    script = tmp_path / "hung.py"
    script.write_text(HUNG_STOP)
    proc = subprocess.Popen([sys.executable, str(script), str(ROOT), case], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)  # the blocked case is in its C call by then
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "not stopped" not in out and "event=stop-timeout" in err, (out, err)
    assert 0.5 <= time.monotonic() - began < 20
    assert ("stop seen" in out) == (case == "closing"), out


@pytest.mark.timeout(60)
def test_a_stop_stuck_holding_the_interpreter_dumps_every_stack_and_exits(tmp_path: Path) -> None:
    """The last resort: a client call that blocks holding the GIL stops the deadline's Python thread too;
    faulthandler's C thread dumps where every thread was and exits with code 1, LAST_RESORT_SECONDS after the
    grace."""
    from services.runtime.life import LAST_RESORT_SECONDS

    script = tmp_path / "hung.py"
    script.write_text(HUNG_STOP)
    proc = subprocess.Popen([sys.executable, str(script), str(ROOT), "holding"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, err
    assert "stop seen" in out and "not stopped" not in out and "event=stop-timeout" not in err, (out, err)
    assert "Timeout (" in err and "most recent call first" in err and "hung.py" in err, err
    assert 0.5 + LAST_RESORT_SECONDS <= time.monotonic() - began < 25
