"""The answers service's side inputs (``cbgp answers``): the dictionary topic, read on demand for the terms of
the deltas it decodes, and queries.plans, read for the registrations whose streams it numbers and ends."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, Message

from services import codec
from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets
from cbgp.query.plan import SINGLE_OWNER
from services.answers.release import SeqRelease
from services.answers.release_operators import HeldTerms
from services.wire.records import query_partition
from services.wire.registrations import read_registration, recorded_class, recorded_placement
from services.registry.core import tombstone_version
from services.kafka.fetch import Fetcher
from services.kafka.replay import read_range
from services.kafka.fetch import WINDOW_POLL_SECONDS, read_window

AnswersCore = Any  # services.answers.service.AnswersCore (the service module imports this one)

DICTIONARY_WAIT_SECONDS = 10.0
# While deltas flow, the dictionary is read ahead at most this often (Dictionary.follow).
DICTIONARY_FOLLOW_SECONDS = 0.25
FOLLOW_RECORDS = 5000


class Dictionary:
    """The dictionary topic, read on demand: id -> canonical term.

    The consumer is only assigned while it reads (ingest commits a term before any update that uses it, so a
    delta's terms are always there to be read): an idle assigned consumer would fetch in a tight loop on noida-db
    (see ``services.runtime.life``).  It reads when ids are missing, and, while deltas flow, ahead
    (:meth:`follow`): else the first delta with a new term after a quiet spell read every term published during
    it, one batch of answers waiting behind the whole read (0.34 s for eight seconds of LSBench at 5,000
    updates/s; a rare alert after an hour would wait for an hour of terms).
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self.topic = settings.topic("dictionary")
        self.terms: dict[int, str] = {}
        self.held = HeldTerms(self.terms)  # (the terms operator queries compute here, while they hold them)
        self.fetcher = Fetcher(settings, "answers.dictionary", 5000)
        self.start = {(self.topic, p): 0 for p in end_offsets(settings, self.topic)}
        self.next_follow = 0.0

    def _read(self, msgs: list[Message]) -> None:
        for msg in msgs:
            if msg.error() is None and msg.value() is not None:
                try:
                    entries = codec.dictionary_entries(msg.value())
                except codec.CodecError:
                    continue  # ingest's own output; a foreign record here is not ours to reject
                self.terms.update(entries)
                self.held.pin(entries)

    def wait_for(self, ids: set[int], timeout: float = DICTIONARY_WAIT_SECONDS) -> None:
        """Read until every id in ``ids`` is known (ingest writes terms before updates; they may lag here)."""
        missing = {i for i in ids if i not in self.terms}
        if not missing:
            return
        if not self.fetcher.positions:
            self.fetcher.set_positions(self.start)
        deadline = time.monotonic() + timeout
        try:
            while missing and time.monotonic() < deadline:
                self._read(self.fetcher.poll())
                missing = {i for i in missing if i not in self.terms}
        finally:
            self.fetcher.park()  # fetch nothing until ids are missing again

    def follow(self) -> None:
        """Read what ingest published since the last read (up to ``FOLLOW_RECORDS``: a few ms), at most every
        DICTIONARY_FOLLOW_SECONDS; the caller calls it while deltas flow, so an idle service fetches nothing."""
        now = time.monotonic()
        if now < self.next_follow:
            return
        self.next_follow = now + DICTIONARY_FOLLOW_SECONDS
        if not self.fetcher.positions:
            self.fetcher.set_positions(self.start)
        read = 0
        try:
            while read < FOLLOW_RECORDS:
                msgs = self.fetcher.take() or self.fetcher.wait(self.fetcher.listen)
                if not msgs:  # (every partition at its end)
                    break
                self._read(msgs)
                read += len(msgs)
        finally:
            self.fetcher.park()

    def close(self) -> None:
        self.fetcher.close()


class Plans:
    """queries.plans (compacted, key query id; tombstone = unregistered), read for :meth:`AnswersCore.on_plan`.

    Read to its end when a life starts (before any partition is restored), then fetched in a short window at
    most every WINDOW_POLL_SECONDS and unassigned in between (``read_window``), as the workers do: an idle assigned consumer
    fetches in a tight loop on noida-db.  Positions are never committed: every life reads it from the start.
    """

    def __init__(self, settings: KafkaSettings, core: AnswersCore, release: SeqRelease | None = None,
                 deltas_partitions: int = 1) -> None:
        """``release``: told of each registration's place in queries.plans (``SeqRelease.note_plan``), whose
        deltas go to ``query_partition(query id, deltas_partitions)``."""
        self.settings = settings
        self.topic = settings.topic("queries.plans")
        self.core = core
        self.release = release
        self.deltas_partitions = deltas_partitions
        self.consumer = Consumer(settings.consumer_config(f"{settings.topic_prefix}answers.plans",
                                                          enable_partition_eof=True))
        self.positions = {p: 0 for p in end_offsets(settings, self.topic)}
        if release is not None:
            release.plans_read = self.positions  # (the same dict: what was read, as it is read)
        self.next_poll = 0.0

    def load(self) -> None:
        for partition, (_low, high) in end_offsets(self.settings, self.topic).items():
            self._apply(read_range(self.settings, self.topic, partition, self.positions.get(partition, 0), high))
            self.positions[partition] = max(self.positions.get(partition, 0), high)
        self.next_poll = time.monotonic() + WINDOW_POLL_SECONDS

    def poll(self) -> None:
        now = time.monotonic()
        if now < self.next_poll:
            return
        self.next_poll = now + WINDOW_POLL_SECONDS
        self._apply(read_window(self.consumer, self.topic, self.positions))

    def _apply(self, msgs) -> None:
        for msg in msgs:
            if msg.error() is not None:
                continue
            self.positions[msg.partition()] = msg.offset() + 1
            key = (msg.key() or b"").decode("utf-8", "replace")
            part = query_partition(key, self.deltas_partitions)
            if msg.value() is None:
                ended = tombstone_version(msg.headers())
                self.core.on_plan(key, None, ended)
                if self.release is not None:
                    self.release.note_plan(key, None, part, msg.partition(), msg.offset(), ended=ended)
                continue
            try:
                plan = codec.decode("QueryPlan", msg.value())
            except codec.CodecError:
                continue  # the registry's own output; not ours to reject
            try:
                # (no endpoint check: this service calls none, and must read every plan the registry accepted)
                text, window = read_registration(plan["sparql"], plan["options"], check_endpoints=False)
            except ValueError:
                text, window = None, None
            if self.release is not None:  # (the workers gate what they place by centre; a guess costs only bytes)
                self.release.note_plan(key, plan["version"], part, msg.partition(), msg.offset(),
                                       window is None and not _single_owner(plan["plan_json"]))
            if text is None:
                continue  # the registry's own output; not ours to reject
            self.core.on_plan(key, plan["version"])
            self.core.note_registration(key, plan["version"], text, recorded_class(plan["plan_json"]))

    def close(self) -> None:
        self.consumer.close()


def _single_owner(plan_json: str) -> bool:
    try:
        return recorded_placement(plan_json) == SINGLE_OWNER
    except ValueError:
        return False
