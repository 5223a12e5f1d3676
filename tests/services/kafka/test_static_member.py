"""A service killed with SIGKILL and started again under the same instance id takes its own partitions back at
once, without a rebalance (``GroupInput(member_name=...)`` is a static group member), on the embedded broker,
with real processes: the other member keeps its partitions throughout.  (With dynamic members, the restarted
one joined while its killed predecessor was still a member, and noida-db's rebalance never finished: no member
had a partition for minutes.)"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

from services.kafka.topics import ensure_topics
from tests.fixtures.broker import fresh_settings

pytestmark = [pytest.mark.slow]

MEMBER = """
import sys, time
from services.kafka.config import KafkaSettings
from services.kafka.fetch import GroupInput
def told(what):
    return lambda _member, parts: print(what, *sorted(p.partition for p in parts), flush=True)
member = GroupInput(KafkaSettings.from_env(), sys.argv[1], [sys.argv[2]], 100, on_assign=told("assigned"),
                    on_revoke=told("revoked"), member_name=sys.argv[3])
while True:
    member.serve()
    time.sleep(0.05)
"""


class Member:
    def __init__(self, env: dict[str, str], group: str, topic: str, name: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(MEMBER), group, topic, name], env=env,
                                     stdout=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.split())

    def next(self, timeout: float) -> list[str]:
        return self.lines.get(timeout=timeout)

    def assigned(self, timeout: float) -> set[int]:
        """The partitions of the next assignment (revocations before it skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.next(max(0.1, deadline - time.monotonic()))
            if line[0] == "assigned":
                return {int(p) for p in line[1:]}


def test_a_killed_member_restarted_under_its_name_takes_its_partitions_back_without_a_rebalance(
        kafka_broker: Any) -> None:
    import os

    settings = fresh_settings(kafka_broker)
    ensure_topics(settings)
    env = {**os.environ, **settings.to_env()}
    group, topic = settings.topic("workers"), settings.topic("updates.routed")
    first = Member(env, group, topic, f"{group}.w0")
    members = [first]
    try:
        assert first.assigned(30) == {0, 1, 2, 3}
        other = Member(env, group, topic, f"{group}.w1")
        members.append(other)
        kept = other.assigned(60)
        mine = first.assigned(60)  # (after giving everything up in the rebalance the join started)
        assert mine | kept == {0, 1, 2, 3} and not mine & kept and mine and kept
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        started = time.monotonic()
        again = Member(env, group, topic, f"{group}.w0")
        members.append(again)
        assert again.assigned(30) == mine
        took = time.monotonic() - started
        time.sleep(2.0)
        with pytest.raises(queue.Empty):  # the other member was never revoked
            other.next(0.1)
        assert took < 15, took
    finally:
        for member in members:
            if member.proc.poll() is None:
                member.proc.kill()
