"""The doorbell (``services.kafka.doorbell``): a committed transaction wakes the pausing readers of the partitions
it wrote, and only those; a ring is never lost to a reader that was busy; what a ring carries, a reader that left
and a directory too long for a socket stop nothing.  Then through the real broker: a fetcher in a long idle pause
reads a record committed by ``commit_transaction`` at once."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from services.kafka import fetch
from services.kafka.client import broker_outages, make_producer
from services.kafka.config import KafkaSettings
from services.kafka.doorbell import Doorbell, fresh_doorbell_dir
from services.kafka.fetch import Fetcher
from services.runtime.life import commit_transaction
from services.wire.records import Output


def test_a_ring_wakes_the_readers_of_the_partition_it_names_and_no_other(bell_dir: str) -> None:
    reader_0, reader_1, writer = Doorbell(bell_dir), Doorbell(bell_dir), Doorbell(bell_dir)
    assert reader_0.wait([("t", 0)], 0) is False and reader_1.wait([("t", 1), ("u", 1)], 0) is False  # listening
    assert writer.ring([("t", 1)]) == 1
    assert reader_0.wait([("t", 0)], 0) is False
    assert reader_1.wait([("t", 1), ("u", 1)], 0) is True
    assert reader_1.wait([("t", 1), ("u", 1)], 0) is False  # one ring wakes once
    assert writer.ring([("t", None)]) == 2  # a record without a partition of its own: every reader of the topic
    assert reader_0.wait([("t", 0)], 0) and reader_1.wait([("t", 1), ("u", 1)], 0)
    assert writer.ring([("other", 0), ("u", 0)]) == 0


def test_a_ring_sent_while_the_reader_was_busy_ends_its_next_pause_at_once(bell_dir: str) -> None:
    reader, writer = Doorbell(bell_dir), Doorbell(bell_dir)
    reader.wait([("t", 0)], 0)
    for _ in range(5000):  # more than its queue holds: the ringer does not block, the reader drains them all
        writer.ring([("t", 0)])
    started = time.monotonic()
    assert reader.wait([("t", 0)], 30.0) is True
    assert time.monotonic() - started < 10.0
    assert reader.wait([("t", 0)], 0) is False


def test_a_pause_without_a_ring_lasts_its_whole_time(bell_dir: str) -> None:
    reader = Doorbell(bell_dir)
    started = time.monotonic()
    assert reader.wait([("t", 0)], 0.2) is False
    assert time.monotonic() - started >= 0.19


def test_what_a_ring_carries_is_never_read_and_a_reader_that_left_is_forgotten(bell_dir: str) -> None:
    reader, writer = Doorbell(bell_dir), Doorbell(bell_dir)
    reader.wait([("t", 0)], 0)
    (path,) = [os.path.join(bell_dir, name) for name in os.listdir(bell_dir)]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as stranger:
        stranger.sendto(os.urandom(60_000), path)  # anything: it only wakes the reader
    assert reader.wait([("t", 0)], 0) is True
    # A reader killed without closing: its file stays and nobody is bound to it; a ring removes it.
    reader.listeners[("t", 0)].close()
    assert writer.ring([("t", 0)]) == 0
    assert os.listdir(bell_dir) == []


def test_only_this_users_sockets_are_rung(bell_dir: str, tmp_path: Path) -> None:
    reader, writer = Doorbell(bell_dir), Doorbell(bell_dir)
    reader.wait([("t", 0)], 0)
    (path,) = [os.path.join(bell_dir, name) for name in os.listdir(bell_dir)]
    elsewhere = tmp_path / "elsewhere"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as other:
        other.bind(str(elsewhere))
        other.setblocking(False)
        os.symlink(elsewhere, path.replace(".", ".link", 1))  # a name like a reader's, pointing elsewhere
        Path(path.replace(".", ".file", 1)).write_text("")  # and a plain file
        assert writer.ring([("t", 0)]) == 1
        with pytest.raises(BlockingIOError):
            other.recv(1)
    assert reader.wait([("t", 0)], 0) is True


def test_a_reader_whose_descriptors_pass_1024_is_woken(bell_dir: str) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip(f"this machine allows {hard} descriptors")  # (a gateway with thousands of clients has more)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1100), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1030)]
    try:
        reader, writer = Doorbell(bell_dir), Doorbell(bell_dir)
        reader.wait([("t", 0)], 0)
        assert reader.listeners[("t", 0)].fileno() > 1024
        assert writer.ring([("t", 0)]) == 1
        assert reader.wait([("t", 0)], 5.0) is True
        reader.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_closed_reader_leaves_no_file_and_no_directory_means_no_doorbell(bell_dir: str) -> None:
    reader = Doorbell(bell_dir)
    reader.wait([("t", 0), ("t", 1)], 0)
    assert len(os.listdir(bell_dir)) == 2
    reader.close()
    assert os.listdir(bell_dir) == []
    off = Doorbell(None)
    assert not off.on and off.ring([("t", 0)]) == 0 and off.wait([("t", 0)], 0) is False


def test_a_directory_too_long_for_a_socket_turns_the_doorbell_off_and_cbgp_run_takes_a_short_one(
        tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    bell = Doorbell(str(deep))
    assert not bell.on
    assert bell.wait([("t", 0)], 0) is False and os.listdir(deep) == []
    short = fresh_doorbell_dir(deep / "doorbell")  # (what cbgp run does with a deep run directory)
    try:
        assert short.parent == Path(tempfile.gettempdir()) and (short.stat().st_mode & 0o777) == 0o700
        reader, writer = Doorbell(str(short)), Doorbell(str(short))
        assert reader.on and reader.wait([("t", 0)], 0) is False and writer.ring([("t", 0)]) == 1
        reader.close()
    finally:
        shutil.rmtree(short)


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.usefixtures("process_doorbell")
def test_a_fetcher_in_a_long_idle_pause_reads_a_committed_record_at_once(
        kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "IDLE_DEEP_AFTER_SECONDS", 0.0)  # every pause deep, and longer than a test waits
    monkeypatch.setattr(fetch, "IDLE_PAUSE_DEEP_SECONDS", 20.0)
    topic = kafka_settings.topic("updates.encoded")
    life = broker_outages()  # (the outages earlier tests of this process saw are not this producer's)
    producer = make_producer(kafka_settings, transactional_id=kafka_settings.topic("doorbell-test"))
    fetcher = Fetcher(kafka_settings, "doorbell-test", 100)
    got: list[bytes] = []
    try:
        fetcher.set_positions({(topic, 0): 0})
        while fetcher.take() or fetcher.wait(5.0):  # what an earlier test left there
            pass
        reader = threading.Thread(target=lambda: got.extend(m.value() for m in fetcher.poll() or fetcher.poll()))
        reader.start()
        time.sleep(1.0)  # the reader is in its pause now
        started = time.monotonic()
        commit_transaction(producer, [Output(topic, b"rung", None, 0)], [], life=life)
        reader.join(30)
        assert got == [b"rung"]
        assert time.monotonic() - started < 10.0  # not the 20 s pause
    finally:
        fetcher.close()
