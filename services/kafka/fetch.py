"""Reading the data-path inputs without burning the broker's or the client's CPU while idle.

- :class:`Fetcher`: an assign-only consumer reading explicit positions in growing batches, parked (unassigned)
  between batches and while idle; it refuses a log whose needed records were deleted (:class:`LogTruncated`);
- :class:`GroupInput`: group membership (a consumer whose partitions stay paused) plus a :class:`Fetcher`;
- :func:`first_record`, :func:`read_window`, :func:`record_ok`, :func:`idle_pause`: small reads around them.

Split from ``services.runtime.life`` (one job per module); ``services.runtime.life`` re-exports every name.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, Sequence

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from services.kafka.client import make_consumer
from services.kafka.config import KafkaSettings
from services.kafka.doorbell import doorbell
from services.kafka.truncation import require_log_start
from services.metrics.exposition import forget_consumer_lag, record_consumer_lag
from services.wire.loglines import kv
from services.wire.settings import ms_setting

__all__ = ["LISTEN_SECONDS", "LISTEN_MAX_SECONDS", "IDLE_PAUSE_SECONDS", "IDLE_PAUSE_MAX_SECONDS",
           "IDLE_DEEP_AFTER_SECONDS", "IDLE_PAUSE_DEEP_SECONDS", "idle_pause_seconds", "Fetcher",
           "first_record", "next_listen", "WINDOW_POLL_SECONDS", "WINDOW_LISTEN_SECONDS", "read_window", "record_ok",
           "idle_pause", "GroupInput"]

log = logging.getLogger("cbgp.runtime")


# noida-db answers an empty Fetch at once instead of holding it for ``fetch.wait.max.ms`` (measured: one idle
# consumer makes 6-15k Fetch requests/s, ~0.4 core in the client and ~0.35 in the broker), and librdkafka has
# no client-side back-off for empty fetches.  With a dozen consumers in a fleet that alone saturates two
# cores.  pause()/resume() does not help (after resume() the next records took seconds to arrive), but an
# unassigned consumer fetches nothing and assign() at a known offset fetches at once.  So every data-path
# input is read by an assign-only :class:`Fetcher` that is unassigned while it processes a batch and for a
# moment when idle, and that stops listening as soon as every partition reported its end (partition-EOF
# events: one fetch round trip); group membership is kept by a consumer whose partitions stay paused
# (:class:`GroupInput`).
# The pause doubles while an input stays idle, up to IDLE_PAUSE_MAX_SECONDS: an idle fleet costs little,
# and a busy one (idle only between records) waits at most IDLE_PAUSE_SECONDS per stage.
# LISTEN_SECONDS bounds a wait that partition-EOF ends after one round trip when caught up, so it only runs
# out while a fetch is still in flight: a backlog of large records (cbgp publish writes ~260 KB raw records;
# 20 MB of them took noida-db more than 5 ms to serve) whose fetch the idle pause then dropped by unassigning,
# again and again: at 5 ms, reading 77 such records took 0.13-11.5 s (7 tries, 5 of them >= 2 s), at 0.1 s
# 0.15-0.25 s (8 tries); the fleet's ingest sat idle for 7-10 s of a 14 s LSBench run.  The wait also runs out
# when noida-db is slow to report an idle partition's end, which an idle fleet pays for: 0.1 s cost it a third
# more CPU (0.071 -> 0.09-0.106 core); 0.03 s reads the 77 records in 0.02-0.03 s (20 of 20 tries) at an idle
# 0.075-0.078 core (bench/idle_bench.py, median of 3, twice).
# A wait that runs out while a partition has not reported its end had a fetch in flight: parking would drop it,
# and the next one would be dropped the same way.  So the next wait listens twice as long, up to
# LISTEN_MAX_SECONDS, until records or every partition's end arrive.  Without it, a backlog of 256 such records
# (the first 600,000 LSBench updates through `cbgp publish`, with noida-db rewriting its snapshot of them) stalled
# ingest for good: 51 records read, then none in 60 s (bench/lsbench_fleet.py --updates 600000).
LISTEN_SECONDS = 0.03
LISTEN_MAX_SECONDS = 2.0


# Both pauses are settings (CBGP_IDLE_PAUSE_MS, CBGP_IDLE_PAUSE_MAX_MS): the first is what a busy stage may add to
# an answer's latency, the last what an idle fleet costs (docs/operations.md, docs/benchmarks.md).
IDLE_PAUSE_SECONDS = ms_setting("CBGP_IDLE_PAUSE_MS", 15)
IDLE_PAUSE_MAX_SECONDS = max(IDLE_PAUSE_SECONDS, ms_setting("CBGP_IDLE_PAUSE_MAX_MS", 60))
# An input that has read nothing for CBGP_IDLE_DEEP_AFTER_MS (a minute) pauses CBGP_IDLE_PAUSE_DEEP_MS (250 ms):
# a fleet left idle fetches four times a second instead of sixteen, and the first update after such a quiet spell
# waits up to that much per stage; a stream with shorter gaps never sees it.  CBGP_IDLE_PAUSE_DEEP_MS at or below
# CBGP_IDLE_PAUSE_MAX_MS turns it off.
IDLE_DEEP_AFTER_SECONDS = ms_setting("CBGP_IDLE_DEEP_AFTER_MS", 60_000)
IDLE_PAUSE_DEEP_SECONDS = max(IDLE_PAUSE_MAX_SECONDS, ms_setting("CBGP_IDLE_PAUSE_DEEP_MS", 250))


def idle_pause_seconds(streak: int, quiet: float, deep: float | None = None) -> float:
    """The pause after ``streak`` idle pauses in a row, ``quiet`` seconds after the last record read:
    IDLE_PAUSE_SECONDS doubled per pause up to IDLE_PAUSE_MAX_SECONDS, and ``deep`` (None:
    IDLE_PAUSE_DEEP_SECONDS) once quiet for IDLE_DEEP_AFTER_SECONDS."""
    if quiet >= IDLE_DEEP_AFTER_SECONDS:
        return IDLE_PAUSE_DEEP_SECONDS if deep is None else deep
    return min(IDLE_PAUSE_MAX_SECONDS, IDLE_PAUSE_SECONDS * (1 << min(streak, 8)))


class Fetcher:
    """An assign-only consumer reading partitions from explicit positions, in batches that grow with the
    backlog; it is unassigned (*parked*) from a caught-up batch or an idle pause until it is read again (see
    above).  ``epoch`` changes whenever the positions are replaced, so a caller can tell a batch fetched under
    an older assignment."""

    def __init__(self, settings: KafkaSettings, name: str, max_records: int, *, check_log_start: bool = True,
                 deep_pause: float | None = None) -> None:
        # Partition-EOF events tell when one fetch found every partition caught up (see wait()).
        self.consumer = Consumer(settings.consumer_config(f"{settings.topic_prefix}{name}",
                                                          enable_partition_eof=True))
        # Every position set is a position some state depends on (a committed offset, a restored shard's, 0
        # for a log read from its start): refuse it when the log no longer starts at or below it.
        self.check_log_start = check_log_start
        self.max_records = max_records
        self.positions: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset to read
        self.parked = False
        self.epoch = 0
        self.idle_streak = 0  # consecutive idle pauses with nothing read
        self.read_at = time.monotonic()  # when a record was last read (or the fetcher made)
        self.listen = LISTEN_SECONDS  # how long poll() waits (see LISTEN_MAX_SECONDS)
        self.deep_pause = deep_pause  # its pause once quiet for IDLE_DEEP_AFTER_SECONDS (None: the fleet's)
        self.lag_fresh: set[tuple[str, int]] = set()  # partitions whose lag gauge was set at their end since a record
        self.carried: list[Message] = []  # records given back (give_back): the next take() returns them first

    def set_positions(self, positions: dict[tuple[str, int], int]) -> None:
        """Read from ``positions`` on (OFFSET_BEGINNING: offset 0); raises :class:`LogTruncated` when a log no
        longer starts at or below its position (librdkafka would silently start at the log start instead)."""
        if self.check_log_start:
            for (topic, partition), offset in positions.items():
                require_log_start(self.consumer, topic, {partition: offset})
        self.epoch += 1
        self.positions = dict(positions)
        self.carried = []  # (read again from the new positions)
        self.parked = False
        if self.positions:
            self.consumer.assign([TopicPartition(t, p, o) for (t, p), o in self.positions.items()])
        else:
            self.consumer.unassign()

    def take(self) -> list[Message]:
        """Records given back, else those already fetched (up to ``max_records``), without waiting; resumes a
        parked fetcher."""
        if self.carried:
            msgs, self.carried = self.carried, []
            return msgs
        if not self.positions:
            return []
        self.unpark()
        return self._settle(self.consumer.consume(self.max_records, 0))

    def wait(self, timeout: float) -> list[Message]:
        """The first record to arrive within ``timeout``, with everything fetched behind it; [] as soon as
        every partition reported its end (one fetch round trip, not ``timeout`` of empty fetches)."""
        if not self.positions:
            return []
        self.unpark()
        ended: set[tuple[str, int]] = set()

        def on_end(eof: Message) -> None:
            ended.add((eof.topic(), eof.partition()))
            self._at_end(eof)

        first = first_record(self.consumer, self.positions, timeout, on_end=on_end)
        self.listen = next_listen(self.listen, LISTEN_SECONDS, first, len(ended), len(self.positions))
        if first is None:
            return []
        return self._settle([first] + self.consumer.consume(self.max_records - 1, 0))

    def give_back(self, msgs: list[Message]) -> None:
        """Records taken but not used, in order (a batch that ran out of its time: ``services.runtime.runner.
        batch_deadline``): the next take() returns them before anything fetched behind them.  Replacing the
        positions drops them: they are then read again from there."""
        self.carried = list(msgs) + self.carried

    def _settle(self, msgs: list[Message]) -> list[Message]:
        """Track positions and drop partition-EOF events; a short batch means the fetcher is caught up, so it
        parks while the caller processes the batch (an assigned, caught-up consumer spins on empty fetches)."""
        positions = self.positions
        kept = []
        for msg in msgs:
            err = msg.error()
            if err is None:
                positions[(msg.topic(), msg.partition())] = msg.offset() + 1
            elif err.code() == KafkaError._PARTITION_EOF:
                self._at_end(msg)
                continue
            kept.append(msg)
        msgs = kept
        if msgs:
            self.lag_fresh.clear()
            self.idle_streak, self.read_at = 0, time.monotonic()
            if len(msgs) < self.max_records:
                self.park()
        return msgs

    def _at_end(self, eof: Message) -> None:
        """A partition-EOF event: the partition is read to its end.  Its offset is past the transaction
        markers that follow the last record (the next offset of a transactional topic's last record is its
        commit marker), so the position moves there; and the lag gauge is set now, while the partition is
        assigned (cached watermarks, no broker round trip): else an idle reader of a transactional topic
        reported the marker as a lag of 1 until the next record."""
        key = (eof.topic(), eof.partition())
        position = self.positions.get(key)
        if position is None:
            return
        if eof.offset() > position:
            self.positions[key] = position = eof.offset()
        if key not in self.lag_fresh:
            self.lag_fresh.add(key)
            record_consumer_lag(self.consumer, {key: position})

    def park(self) -> None:
        if self.positions and not self.parked:
            self.consumer.unassign()
            self.parked = True

    def unpark(self) -> None:
        if self.parked:
            self.parked = False
            doorbell().drain(self.positions)  # (this fetch reads what they rang for)
            self.consumer.assign([TopicPartition(t, p, o) for (t, p), o in self.positions.items()])

    def poll(self) -> list[Message]:
        """Everything fetched, else what arrives within ``listen``, else [] after an idle pause."""
        msgs = self.take() or self.wait(self.listen)
        if not msgs:
            idle_pause([self])
        return msgs

    def close(self) -> None:
        forget_consumer_lag(self.consumer)
        self.consumer.close()


def next_listen(listen: float, short: float, first: Message | None, ended: int, partitions: int) -> float:
    """How long the next wait listens after one of ``listen`` seconds that got ``first`` and ``ended`` of its
    ``partitions``' ends: twice as long, up to LISTEN_MAX_SECONDS, when it ran out before every end (a fetch in
    flight, which stopping drops); else ``short`` again."""
    in_flight = first is None and ended < partitions
    return min(2 * listen, LISTEN_MAX_SECONDS) if in_flight else short


def first_record(consumer: Consumer, partitions: Iterable[tuple[str, int]], timeout: float, *,
                 on_end: Callable[[Message], None] | None = None) -> Message | None:
    """The first record (or error) ``consumer`` delivers within ``timeout``; None at the timeout or as soon as
    each of ``partitions`` (``(topic, partition)``) reported its end.  The consumer must have partition-EOF
    events on: they end the wait after one fetch round trip instead of ``timeout`` of empty fetches.
    ``on_end`` is called with each partition-EOF event."""
    deadline = time.monotonic() + timeout
    not_at_end = set(partitions)
    while not_at_end:
        msg = consumer.poll(max(0.0, deadline - time.monotonic()))
        if msg is None:
            return None
        err = msg.error()
        if err is None or err.code() != KafkaError._PARTITION_EOF:
            return msg
        if on_end is not None:
            on_end(msg)
        not_at_end.discard((msg.topic(), msg.partition()))
    return None


# A rarely written topic every service follows (queries.plans) is fetched in a short window at most every
# WINDOW_POLL_SECONDS and unassigned in between: an idle assigned consumer fetches in a tight loop on noida-db.
WINDOW_POLL_SECONDS = 0.2  # a registration or unregistration is seen at most about this late
WINDOW_LISTEN_SECONDS = 0.01
# A window that runs out before every partition reported its end had a fetch in flight, which unassigning
# drops; on a loaded machine or just after a broker restart the next one was dropped the same way, again and
# again: in a CI run the answers service never read queries.plans in 5 minutes after three broker restarts
# (queries=0, not one answer, tests/fleet/test_faults.py).  So, as the Fetcher does, the consumer's next
# window listens twice as long, up to LISTEN_MAX_SECONDS, until a record or every partition's end arrives.
_WINDOW_LISTEN: dict[int, float] = {}  # id(consumer) -> how long its next window listens


def read_window(consumer: Consumer, topic: str, positions: dict[int, int], max_records: int = 500) -> list[Message]:
    """Assign ``topic`` at ``positions`` (partition -> next offset), return what arrives within the consumer's
    window (WINDOW_LISTEN_SECONDS, longer after a window that ran out mid-fetch; ended early once every
    partition reported its end), and unassign again.  The consumer must have partition-EOF events on."""
    key = id(consumer)
    listen = _WINDOW_LISTEN.get(key, WINDOW_LISTEN_SECONDS)
    ended: set[tuple[str, int]] = set()
    consumer.assign([TopicPartition(topic, p, o) for p, o in positions.items()])
    try:
        first = first_record(consumer, [(topic, p) for p in positions], listen,
                             on_end=lambda eof: ended.add((eof.topic(), eof.partition())))
        listen = next_listen(listen, WINDOW_LISTEN_SECONDS, first, len(ended), len(positions))
        if listen > WINDOW_LISTEN_SECONDS:
            _WINDOW_LISTEN[key] = listen
        else:
            _WINDOW_LISTEN.pop(key, None)
        return [] if first is None else [first] + consumer.consume(max_records, 0)
    finally:
        consumer.unassign()


def record_ok(msg: Message, log: logging.Logger) -> bool:
    """True for a data record; logs a consume error (partition EOF is not one) and returns False."""
    err = msg.error()
    if err is not None and err.code() != KafkaError._PARTITION_EOF:
        log.warning(kv(event="consume-error", error=str(err)))
    return err is None


def idle_pause(fetchers: Sequence[Fetcher]) -> None:
    """Stop fetching on every fetcher for a moment (nothing was there to read): :func:`idle_pause_seconds` of
    the least idle fetcher's streak and quiet time (and the shortest ``deep_pause``); a pause after a quiet
    minute ends on a ring for one of their partitions once its first IDLE_PAUSE_SECONDS are over."""
    streak = min(fetcher.idle_streak for fetcher in fetchers)
    quiet = time.monotonic() - max(fetcher.read_at for fetcher in fetchers)
    for fetcher in fetchers:
        fetcher.park()
        fetcher.idle_streak += 1
    deep = min(IDLE_PAUSE_DEEP_SECONDS if fetcher.deep_pause is None else fetcher.deep_pause for fetcher in fetchers)
    pause = idle_pause_seconds(streak, quiet, deep)
    keys = {key for fetcher in fetchers for key in fetcher.positions}
    doorbell().listen(keys)  # (from the first pause on, so that no ring before a deep one is lost)
    if quiet < IDLE_DEEP_AFTER_SECONDS:
        # A busy input's pause gathers its next batch: rung earlier, the stages made twice as many transactions
        # for no better median answer (docs/benchmarks.md).
        time.sleep(pause)
    else:
        # After a quiet minute, a ring from a stage that committed to one of these partitions ends the pause
        # (services.kafka.doorbell): the first update costs a stage IDLE_PAUSE_SECONDS, not the deep pause.
        time.sleep(IDLE_PAUSE_SECONDS)
        doorbell().wait(keys, max(0.0, pause - IDLE_PAUSE_SECONDS))
    # They stay parked: the next take() or wait() resumes them, so nothing is fetched before it is wanted.


class GroupInput:
    """A consumer-group input: membership, rebalance callbacks and transactional offsets through a
    subscribed consumer (``member``) whose partitions stay paused; records through a :class:`Fetcher`
    started at the committed offsets of the partitions the group assigned.

    ``on_assign``/``on_revoke`` are called like confluent-kafka's (with ``member``), from :meth:`poll`;
    ``on_assign`` gets the partitions with their committed offsets and commit metadata (offset < 0: none).

    ``on_assign`` (a service's restore) runs *outside* librdkafka's rebalance callback: the callback only takes
    the assignment (assigns it paused and reads the committed offsets), and :meth:`serve` hands it to
    ``on_assign`` once the member's poll has returned; the fetcher starts only then.  A revocation served
    before that takes its partitions out of the assignment still waiting.
    """

    def __init__(self, settings: KafkaSettings, group: str, topics: Sequence[str], max_records: int, *,
                 on_assign: Callable[[Consumer, list[TopicPartition]], None] | None = None,
                 on_revoke: Callable[[Consumer, list[TopicPartition]], None] | None = None,
                 member_name: str | None = None, deep_pause: float | None = None) -> None:
        self.user_assign = on_assign
        self.user_revoke = on_revoke
        self.closing = False
        # An error inside a rebalance callback, re-raised by serve() once poll() returned: one raised through
        # librdkafka's C callback came out of poll() as a bare KafkaError object, which no except clause can
        # catch, and killed a worker after a broker restart (CI).
        self.callback_error: Exception | None = None
        self.fetcher = Fetcher(settings, f"{group.removeprefix(settings.topic_prefix)}.fetch", max_records,
                               deep_pause=deep_pause)
        self.taken: list[TopicPartition] | None = None  # an assignment taken, not yet handed to on_assign
        self._group_metadata: Any = None  # (consumer_group_metadata: cached until the next rebalance)
        # A named member is static (group.instance.id): restarted, it takes its own partitions back at once,
        # without a rebalance.  Its killed predecessor is still a member until its session expires, and a
        # rebalance started meanwhile waited for it; on noida-db one whose leader was gone never finished.
        named = {"group.instance.id": member_name, "client.id": member_name} if member_name else {}
        self.member = make_consumer(settings, group, topics, on_assign=self._assigned, on_revoke=self._revoked,
                                    **named)

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            self._assign(consumer, partitions)
        except Exception as exc:  # noqa: BLE001 - re-raised by serve(), outside the C callback
            self.callback_error = self.callback_error or exc

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._group_metadata = None  # (a new generation)
        if self.closing:
            return  # a rebalance while leaving (others left too): the handle cannot fetch offsets any more
        consumer.assign(partitions)
        consumer.pause(partitions)  # the member never fetches: the fetcher does
        self.taken = consumer.committed(partitions, timeout=30) if partitions else []

    def _hand_over(self) -> None:
        """The assignment taken in the callback, to ``on_assign`` (the restore), then to the fetcher."""
        committed, self.taken = self.taken or [], None
        positions = {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else OFFSET_BEGINNING for tp in committed}
        if self.user_assign is not None:
            self.user_assign(self.member, committed)
        self.fetcher.set_positions(positions)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._group_metadata = None
        try:
            self.fetcher.set_positions({})
            if self.taken is not None:
                gone = {(tp.topic, tp.partition) for tp in partitions}
                self.taken = [tp for tp in self.taken if (tp.topic, tp.partition) not in gone]
            if self.user_revoke is not None:
                self.user_revoke(consumer, partitions)
        except Exception as exc:  # noqa: BLE001 - re-raised by serve(), outside the C callback
            self.callback_error = self.callback_error or exc

    def serve(self) -> None:
        """Run pending rebalance callbacks (the member's partitions are paused: nothing is returned), then hand
        an assignment they took to ``on_assign``; an error one of them raised is raised here."""
        self.member.poll(0)
        error, self.callback_error = self.callback_error, None
        if error is not None:
            raise error
        if self.taken is not None:
            self._hand_over()

    def poll(self) -> list[Message]:
        self.serve()
        return self.fetcher.poll()

    def give_back(self, msgs: list[Message]) -> None:
        """Records of the last poll left for the next one (:meth:`Fetcher.give_back`)."""
        self.fetcher.give_back(msgs)

    def consumer_group_metadata(self) -> Any:
        """The member's group metadata for a transaction's offsets, asked of librdkafka once per assignment: the
        call waits for librdkafka's main thread, and under load that wait was 7% of a busy worker's wall time
        (py-spy), paid in every transaction.  The metadata (generation, member id) changes only in a rebalance,
        whose callbacks drop the cached one; one gone stale all the same fails its transaction, and the next life
        asks again."""
        if self._group_metadata is None:
            self._group_metadata = self.member.consumer_group_metadata()
        return self._group_metadata

    def close(self) -> None:
        self.closing = True
        # Give the partitions up through poll() first: a revocation served inside close() can deadlock
        # librdkafka (the callback's assign waits on a main thread that is shutting down), seen right after
        # a broker restart.  Revoking on unsubscribe is local, so this works with the broker down too.
        try:
            self.member.unsubscribe()
            deadline = time.monotonic() + 10.0
            while self.member.assignment() and time.monotonic() < deadline:
                self.member.poll(0.1)
        except KafkaException:
            pass
        self.member.close()  # leave the group now rather than after the session timeout
        self.fetcher.close()
