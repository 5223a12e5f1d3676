"""``cbgp topics floor``: per topic partition, the lowest offset the fleet still needs.

Apart from :mod:`services.kafka.topics` because it reads offsets through :mod:`services.kafka.client`, which
itself imports the topics module.
"""

from __future__ import annotations

import os
from typing import Callable, Iterator, Mapping

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from services.kafka.client import make_consumer, watermarks
from services.kafka.config import KafkaSettings
from services.kafka.checkpoint_log import latest_positions
from services.kafka.replay import RangeReader, read_range
from services.kafka.topics import (BASE, CHECKPOINTS, FROM_START, GROUP, LAST_CHANGE, LATEST, NEEDS, NOTHING,
                                  OPTIONAL_GROUP, REGISTRATIONS, SPARK_DUTY, TOPICS, WHOLE_SHARDS, BrokerUnreachable,
                                  TopicSpec)

__all__ = ["delete_below", "floor", "trim"]


def floor(settings: KafkaSettings, specs: tuple[TopicSpec, ...] | list[TopicSpec] = TOPICS,
          timeout: float = 15.0) -> dict[str, dict[str, int]]:
    """``{topic: {partition: offset}}``: per partition of each existing catalogue topic, the lowest offset the
    fleet still needs.  Records below it may be deleted (``delete_records``, or retention) without changing any
    answer.  Per reader (``TopicSpec.rules``; the floor is the lowest of them):

    - 0 for the logs a restore replays and for compacted topics;
    - for a topic read by a consumer group (``updates.raw``: ingest, ``admin``: registry) the group's committed
      offset (0 before its first commit); for an optional duty's group (the Spark job's compaction of
      ``answers``) the same once it committed, nothing before;
    - the high watermark for a topic no service reads back;
    - for a log whose readers restore from checkpoints (``deltas.parts``), the position of each partition's last
      checkpoint (0 without one); for one those restores read beside their own input (``answers``), what the
      last checkpoint says it needs of it (0 without one);
    - for a Spark duty that runs only while a registered query needs it (the windows on ``updates.encoded``, the
      assembly on ``deltas.parts``), its group's committed offset; before its first commit, where it will first
      read (the lowest registration offset of the windowed queries; 0 while a product is multiplied in Spark):
      a JVM that starts a minute after the fleet finds its input there; nothing while no query needs it;
    - for a checkpoint topic, the first record of each partition's last checkpoint (its low watermark without
      one);
    - for ``updates.routed``, besides what the workers' checkpoints say their restores read of it: the offsets
      ingest's snapshot matches (a registration moves it to its point; 0 without one: registrations read the
      log from 0), and, for each registration the last checkpoint of a partition may lack (published at or past
      the queries.plans offsets it reflects), its point in that partition and the Frontier mark before it;
    - for ``updates.encoded``: the offset ingest's snapshot reflects (ingest restores from it, whole shards move it
      to their position; 0 without one), each whole shard's restore (the record of its last checkpoint's last
      change, else its committed offset, else where its queries were registered), the Spark windows' group and the
      record of the log's last change (the seq a registration answers as of).

    Topics not created yet are left out.
    """
    admin = AdminClient(settings.admin_config())
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise BrokerUnreachable(f"cannot list topics on {settings.bootstrap_servers}: {exc.args[0]}") from None
    result: dict[str, dict[str, int]] = {}
    reads = _Reads(settings)
    try:
        for t in specs:
            name = settings.topic(t.name)
            if name not in existing:
                continue
            partitions = sorted(existing[name].partitions)
            offsets: dict[int, int] | None = None
            for rule in t.rules:
                needed = _needed(settings, t, rule, name, partitions, timeout, reads)
                if needed is not None:  # (None: that reader needs nothing of it now)
                    offsets = needed if offsets is None else {p: min(offsets[p], needed[p]) for p in partitions}
            if offsets is None:
                offsets = {p: hi for p, (_, hi) in reads.ends(name, timeout).items()}
            result[name] = {str(p): offsets[p] for p in partitions}
    finally:
        reads.close()
    return result


def trim(settings: KafkaSettings, dry_run: bool = False, timeout: float = 15.0,
         names: tuple[str, ...] | None = None) -> dict[str, dict[str, int]]:
    """``cbgp topics trim``: delete every record below :func:`floor` (``AdminClient.delete_records``), the safe form
    of retention for the logs kept by default; returns ``{topic: {partition: offset}}`` of the partitions whose log
    now starts there (would, with ``dry_run``).  Safe at any time: a floor only rises, and what is registered or
    restored after it was computed needs nothing below it.  ``names``: only these catalogue topics."""
    admin = AdminClient(settings.admin_config())
    trimmed: dict[str, dict[str, int]] = {}
    specs = TOPICS if names is None else [spec for spec in TOPICS if spec.name in names]
    floors = floor(settings, specs, timeout=timeout)
    consumer = make_consumer(settings, f"{settings.topic_prefix}floor")
    try:
        for topic, parts in floors.items():
            cut = delete_below(admin, consumer, topic, {int(p): offset for p, offset in parts.items()}, timeout,
                               dry_run)
            if cut:
                trimmed[topic] = {str(tp.partition): tp.offset for tp in cut}
    finally:
        consumer.close()
    return trimmed


def delete_below(admin: AdminClient, consumer: Consumer, topic: str, offsets: Mapping[int, int],
                 timeout: float = 15.0, dry_run: bool = False) -> list[TopicPartition]:
    """Delete the records of each partition of ``topic`` below its offset in ``offsets`` (``consumer`` reads where
    each log starts now); the partitions cut (would be, with ``dry_run``), at their new start."""
    lows = {p: low for p, (low, _high) in watermarks(consumer, topic, timeout).items()}
    wanted = [TopicPartition(topic, p, offset) for p, offset in offsets.items() if offset > lows[p]]
    if wanted and not dry_run:
        for future in admin.delete_records(wanted, request_timeout=timeout).values():
            future.result(timeout)
    return wanted


class _Reads:
    """What more than one rule reads, read once per floor: the checkpoints' positions (each checkpoint read whole,
    to check its MAC), the plans and ingest's snapshot record; and one consumer for every watermark a rule looks
    up (fresh at each look), instead of a connection per look."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._consumer: Consumer | None = None
        self.ranges = RangeReader(settings)  # (the few records a point's bisection reads, at many places)
        self._positions: dict[str, dict] = {}
        self._plan_records: list | None = None
        self._ingest: tuple[dict | None] | None = None

    def ends(self, topic: str, timeout: float = 15.0) -> dict[int, tuple[int, int]]:
        """``topic``'s watermarks now, per partition."""
        if self._consumer is None:
            self._consumer = make_consumer(self.settings, f"{self.settings.topic_prefix}floor")
        return watermarks(self._consumer, topic, timeout)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
        self.ranges.close()

    def positions(self, topic: str) -> dict:
        if topic not in self._positions:
            self._positions[topic] = latest_positions(self.settings, topic)
        return self._positions[topic]

    def plan_records(self) -> list[tuple[int, int, str | None, dict | None]]:
        if self._plan_records is None:
            self._plan_records = list(_plan_records(self.settings, self.ends))
        return self._plan_records

    def plans(self) -> dict[str, tuple[int, dict]]:
        """The registered queries' current plans: query id -> (queries.plans partition, QueryPlan record)."""
        plans: dict[str, tuple[int, dict] | None] = {}
        for p, _offset, key, plan in self.plan_records():
            if key is not None:
                plans[key] = (p, plan) if plan is not None else None
        return {key: plan for key, plan in plans.items() if plan is not None}

    def ingest_record(self) -> dict | None:
        if self._ingest is None:
            from services.runtime.recovery import ingest_snapshot_record

            self._ingest = (ingest_snapshot_record(self.settings, "floor"),)
        return self._ingest[0]


def _needed(settings: KafkaSettings, t: TopicSpec, rule: str, name: str, partitions: list[int],
            timeout: float, reads: _Reads) -> dict[int, int] | None:
    """What one reader (``rule``) still needs of topic ``name``, per partition; None when it needs nothing now."""
    if rule == FROM_START:
        return {p: 0 for p in partitions}
    if rule == NOTHING:
        return {p: hi for p, (_, hi) in reads.ends(name, timeout).items()}
    if rule.startswith((GROUP, OPTIONAL_GROUP)):
        optional = rule.startswith(OPTIONAL_GROUP)
        group = f"{settings.topic_prefix}{rule[len(OPTIONAL_GROUP if optional else GROUP):]}"
        committed = _committed(settings, group, name, partitions, timeout)
        if optional and all(offset < 0 for offset in committed.values()):  # never committed: not deployed
            return {p: hi for p, (_, hi) in reads.ends(name, timeout).items()}
        return {p: max(offset, 0) for p, offset in committed.items()}  # no commit yet (-1001): from 0
    if rule.startswith(SPARK_DUTY):
        return _spark_duty(settings, rule[len(SPARK_DUTY):], name, partitions, timeout, reads)
    if rule.startswith(CHECKPOINTS):
        saved = reads.positions(settings.topic(rule[len(CHECKPOINTS):]))
        return {p: saved[p].position if saved.get(p) is not None else 0 for p in partitions}
    if rule.startswith(NEEDS):
        saved = reads.positions(settings.topic(rule[len(NEEDS):]))
        return {p: saved[p].needs.get(t.name, 0) if saved.get(p) is not None else 0 for p in partitions}
    if rule == LATEST:
        saved = reads.positions(name)
        lows = {p: low for p, (low, _) in reads.ends(name, timeout).items()}
        return {p: saved[p].first_offset if saved.get(p) is not None else lows[p] for p in partitions}
    if rule.startswith(REGISTRATIONS):
        return _registrations(settings, settings.topic(rule[len(REGISTRATIONS):]), name, partitions, reads)
    if rule == BASE:
        return _base(settings, name, partitions, reads)
    if rule == WHOLE_SHARDS:
        return _whole_shards(settings, name, partitions, reads)
    if rule == LAST_CHANGE:
        return _last_change(settings, name, timeout, reads)
    raise ValueError(f"{t.name}: unknown needed_from rule {rule!r}")


def _committed(settings: KafkaSettings, group: str, name: str, partitions: list[int],
               timeout: float) -> dict[int, int]:
    """``group``'s committed offset of each of ``name``'s ``partitions`` (negative: none yet)."""
    consumer = make_consumer(settings, group)
    try:
        return {tp.partition: tp.offset
                for tp in consumer.committed([TopicPartition(name, p) for p in partitions], timeout=timeout)}
    finally:
        consumer.close()


# duty -> {what a plan's start depends on: its start}, for the plans of that duty's last floor: a trimmer that
# takes a floor every few seconds parses each registered query once, not at every pass.
_DUTY_STARTS: dict[str, dict[tuple, int | None]] = {}


def _spark_duty(settings: KafkaSettings, duty: str, name: str, partitions: list[int],
                timeout: float, reads: _Reads) -> dict[int, int] | None:
    """What the Spark job's ``duty`` (windows, assembly) reads of ``name``: its group's committed offsets once it
    committed; before, where its first batch reads (``spark.kafka_io.DutyGate``): from the lowest registration
    offset of the windowed queries, from the start while a product is multiplied in Spark; None while no
    registered query needs the duty."""
    committed = _committed(settings, f"{settings.topic_prefix}spark-{duty}", name, partitions, timeout)
    if any(offset >= 0 for offset in committed.values()):
        return {p: max(offset, 0) for p, offset in committed.items()}
    from cbgp.query.plan import SINGLE_OWNER

    fleet_single_owner = os.environ.get("CBGP_PLACEMENT") == SINGLE_OWNER
    memo, kept = _DUTY_STARTS.get(duty, {}), {}
    first: int | None = None  # the lowest offset a registered query needs the duty to read from
    for _query_id, (_p, plan) in reads.plans().items():
        key = (plan["sparql"], tuple(sorted(plan["options"].items())), plan["plan_json"],
               plan["registered_at_seq"], fleet_single_owner)
        start = kept[key] = memo[key] if key in memo else _duty_start(duty, plan, fleet_single_owner)
        if start is not None:
            first = max(start, 0) if first is None else min(first, max(start, 0))
    _DUTY_STARTS[duty] = kept
    return None if first is None else {p: first for p in partitions}


def _duty_start(duty: str, plan: dict, fleet_single_owner: bool) -> int | None:
    """Where ``duty`` must read from for one registered ``plan``, None when it does not need it.  A product is
    placed as the Spark job places it: on a single owner in a fleet whose workers run so (env ``CBGP_PLACEMENT``,
    as theirs), else as its plan records or decomposes.  Its SERVICE endpoints are not checked: the floor calls
    none, and a trimmer without the fleet's ``CBGP_SERVICE_ALLOW`` must still count the query."""
    from services.wire.registrations import read_registration, recorded_placement, spark_multiplies

    try:
        text, window = read_registration(plan["sparql"], plan["options"], check_endpoints=False)
        if duty == "windows":
            return plan["registered_at_seq"] if window is not None else None
        multiplied = spark_multiplies(text, window, recorded_placement(plan["plan_json"]), fleet_single_owner)
        return 0 if multiplied else None
    except Exception:  # noqa: BLE001 - a plan the Spark job cannot read it does not serve
        return None


def _base(settings: KafkaSettings, name: str, partitions: list[int], reads: _Reads) -> dict[int, int]:
    """The offsets of ``name`` ingest's latest snapshot matches (updates.encoded: its position; updates.routed:
    the routed ends it records); 0 without one that records them, or one of another log: its readers then read
    from offset 0.  Only the snapshot's record is read (once per floor), not the state it holds."""
    record = reads.ingest_record() or {}  # (none: its readers read from offset 0)
    if name == settings.topic("updates.encoded"):
        recorded = record.get("positions", {}).get(name, {})
    else:
        recorded = record.get("facts", {}).get("routed_ends", {})
    ends = {int(p): int(end) for p, end in recorded.items()}
    highs = reads.ends(name)
    if any(end > highs[p][1] for p, end in ends.items() if p in highs):
        return {p: 0 for p in partitions}
    return {p: ends.get(p, 0) for p in partitions}


def _registrations(settings: KafkaSettings, checkpoints: str, name: str, partitions: list[int],
                   reads: _Reads) -> dict[int, int]:
    """Per routed partition, the lowest offset the registrations its last checkpoint may lack read when they are
    caught up: their point (``services.worker.points.point_of``) and the last Frontier mark before it."""
    from services.worker.points import log_tail, point_of

    saved = reads.positions(checkpoints)
    plans = [(p, offset, plan["registered_at_change_seq"])  # (plans partition, offset, the seq it answers as of)
             for p, offset, _key, plan in reads.plan_records() if plan is not None]
    ends = reads.ends(name)

    def records(partition: int, start: int, end: int) -> list[tuple[int, bytes | None]]:
        return reads.ranges.records(name, partition, start, end)

    needed = {}
    for p in partitions:
        low, high = ends[p]
        checkpoint = saved.get(p)
        if checkpoint is None:
            needed[p] = 0  # (its restore reads the log from 0)
            continue
        reflected = {int(key.rpartition("/")[2]): offset for key, offset in checkpoint.needs.items()
                     if key.startswith("queries.plans/")}
        # (one point per seq: queries registered together, or before any data, share theirs)
        lacking = {seq for plans_p, offset, seq in plans if offset >= reflected.get(plans_p, 0)}
        needed[p] = high
        for seq in sorted(lacking):
            point = point_of(records, p, seq, high, start=low) if seq >= 0 else low  # (-1: an older plan)
            if point is None:
                continue  # its point is still to come: above every record now
            mark = log_tail(records, p, point, start=low).mark_offset
            needed[p] = min(needed[p], point, mark if mark >= 0 else point)
    return needed


def _plan_records(settings: KafkaSettings, ends: Callable[[str], dict[int, tuple[int, int]]]
                  ) -> Iterator[tuple[int, int, str | None, dict | None]]:
    """Every record of queries.plans: (partition, offset, query id, QueryPlan; None for a tombstone); records
    that cannot be decoded are left out (the workers dead-letter them)."""
    from services.codec import CodecError, decode

    t_plans = settings.topic("queries.plans")
    for p, (_low, high) in sorted(ends(t_plans).items()):
        for msg in read_range(settings, t_plans, p, 0, high):
            try:
                plan = decode("QueryPlan", msg.value()) if msg.value() else None
            except CodecError:
                continue
            yield p, msg.offset(), msg.key().decode("utf-8", "replace") if msg.key() else None, plan


def _whole_shards(settings: KafkaSettings, name: str, partitions: list[int], reads: _Reads) -> dict[int, int]:
    """The lowest offset of updates.encoded a whole shard's restore reads.  A whole shard P (the routed partition
    that owns its queries) restores from its last checkpoint (``checkpoints.whole``; its ``needs``: the record of
    its last change, which the restore checks) and the log after it, else from ingest's snapshot moved to its
    committed offset (group ``<prefix>workers.encoded.P``), else, never committed, from the offset its queries
    were registered at.  Counted: the shards owning a non-windowed query (with ``--placement single-owner`` every
    such query is whole); of those owning no whole query by its plan, only those that committed an offset."""
    from cbgp.query.plan import SINGLE_OWNER
    from services.wire.registrations import read_registration, recorded_placement
    from services.wire.records import query_partition

    n_routed = len(reads.ends(settings.topic("updates.routed")))
    owners: dict[int, tuple[int, bool]] = {}  # P -> (lowest registered_at_seq, whether a plan says whole)
    for query_id, (_p, plan) in reads.plans().items():
        try:
            _text, window = read_registration(plan["sparql"], plan["options"], check_endpoints=False)
            whole = recorded_placement(plan["plan_json"]) in (None, SINGLE_OWNER)
        except Exception:  # noqa: BLE001 - a plan the workers dead-letter holds nothing
            continue
        if window is None:
            owner = query_partition(query_id, n_routed)
            low, any_whole = owners.get(owner, (plan["registered_at_seq"], False))
            owners[owner] = (min(low, plan["registered_at_seq"]), any_whole or whole)
    saved = reads.positions(settings.topic("checkpoints.whole"))
    needed = min((high for _low, high in reads.ends(name).values()), default=0)
    for owner, (registered, whole) in sorted(owners.items()):
        checkpoint = saved.get(owner)
        if checkpoint is not None:
            needed = min(needed, checkpoint.needs.get("updates.encoded", checkpoint.position))
            continue
        committed = _committed(settings, f"{settings.topic_prefix}workers.encoded.{owner}", name, [0], 15)[0]
        if committed >= 0:
            needed = min(needed, committed)
        elif whole:
            needed = min(needed, registered)
    return {p: needed for p in partitions}


def _last_change(settings: KafkaSettings, name: str, timeout: float, reads: _Reads) -> dict[int, int]:
    """Per partition, the offset of the last record holding a change (its end when none is left): a registration
    reads it for the seq it answers as of (``services.wire.registrations.change_seq_before``)."""
    from services.codec import CodecError, encoded_changes

    needed = {}
    for p, (low, high) in reads.ends(name, timeout).items():
        end, chunk, found = high, 1, None
        while end > low and found is None:
            start = max(low, end - chunk)
            for offset, value in reads.ranges.records(name, p, start, end):
                try:
                    if value and encoded_changes(value):
                        found = offset
                except CodecError:
                    continue
            end, chunk = start, min(chunk * 8, 512)
        needed[p] = found if found is not None else high
    return needed
