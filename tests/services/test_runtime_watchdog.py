"""The transaction watchdog: a transactional call blocked far past its timeout (librdkafka #5456 can do
that after a broker restart) makes the process start again from scratch, same PID and arguments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

BLOCKED = '''
import os, sys, time
sys.path.insert(0, sys.argv[1])
if os.environ.get("CBGP_TEST_AGAIN"):
    print("started again", os.getpid(), flush=True)
    sys.exit(0)
os.environ["CBGP_TEST_AGAIN"] = "1"
print("first start", os.getpid(), flush=True)
from services.runtime import _WATCHDOG
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
    from services import runtime
    from services.kafka import client

    class Stop:
        stopping = False

    lives: list[int] = []

    def life(stopper: Stop) -> None:
        lives.append(1)
        if len(lives) == 1:
            client._OUTAGES[0] += 1  # the broker went away during the first life ...
            raise AttributeError("'NoneType' object has no attribute 'partitions'")  # ... and a call broke
        stopper.stopping = True

    monkeypatch.setattr(runtime.time, "sleep", lambda _s: None)
    assert runtime._run_service("worker", life, Stop()) == 0
    assert len(lives) == 2

    def buggy(_stopper: Stop) -> None:
        raise AttributeError("a bug")

    with pytest.raises(AttributeError):
        runtime._run_service("worker", buggy, Stop())


def test_an_error_in_a_rebalance_callback_is_raised_by_serve_as_itself(tmp_path) -> None:  # noqa: ANN001
    """A callback error must not travel through librdkafka's C callback (it came out of poll() as a bare
    KafkaError object that no except clause catches, and a worker died after a broker restart): GroupInput
    keeps it and serve() raises it, so the service life restarts."""
    from confluent_kafka import KafkaError, KafkaException

    from services.kafka import EmbeddedBroker
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
