"""``free_port`` picks below the kernel's ephemeral range when there is room, so a port the kernel hands out
between the pick and the bind (a port-0 listener, an outgoing connection) cannot be the picked one; a port
already bound is never returned; without room, or without the range, the kernel picks."""

from __future__ import annotations

import socket
from collections import deque
from pathlib import Path
from typing import Any

from services.kafka import broker


def test_the_port_is_below_the_ephemeral_range_and_free() -> None:
    low = broker.ephemeral_low()
    ports = {broker.free_port() for _ in range(50)}
    if low > broker.LOWEST_PICKED_PORT:
        assert all(broker.LOWEST_PICKED_PORT <= port < low for port in ports)
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # (free: the bind works)


def test_a_bound_port_is_never_picked(monkeypatch: Any) -> None:
    taken = []
    try:
        for port in range(broker.LOWEST_PICKED_PORT, broker.LOWEST_PICKED_PORT + 20):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            taken.append(s)
        monkeypatch.setattr(broker, "ephemeral_low", lambda: broker.LOWEST_PICKED_PORT + 20)
        busy = {s.getsockname()[1] for s in taken}
        for _ in range(20):
            assert broker.free_port() not in busy
    finally:
        for s in taken:
            s.close()


def test_ports_picked_in_a_row_are_distinct_until_none_is_left_below_the_range(monkeypatch: Any) -> None:
    """A plan picks its ports one after another before its services bind them: the picks never repeat."""
    monkeypatch.setattr(broker, "recent_ports", deque(maxlen=1024))
    low = broker.LOWEST_PICKED_PORT + 8
    monkeypatch.setattr(broker, "ephemeral_low", lambda: low)
    monkeypatch.setattr(broker.random, "randrange", lambda start, stop: start + len(broker.recent_ports) % 2)
    picks = [broker.free_port() for _ in range(3)]
    assert len(set(picks)) == 3
    assert picks[:2] == [broker.LOWEST_PICKED_PORT, broker.LOWEST_PICKED_PORT + 1]
    assert picks[2] >= low  # (the two the random picks can reach are handed out: the kernel picks)


def test_without_room_below_the_range_or_without_the_range_the_kernel_picks(monkeypatch: Any, tmp_path: Path) -> None:
    (tmp_path / "range").write_text("1024\t65535\n")
    assert broker.ephemeral_low(str(tmp_path / "range")) == 1024
    assert broker.ephemeral_low(str(tmp_path / "missing")) == 0
    monkeypatch.setattr(broker, "ephemeral_low", lambda: 1024)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", broker.free_port()))
