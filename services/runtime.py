"""What every data-path service (ingest, worker, answers) shares around its pure transform.

- :class:`Output`, :func:`query_partition`, :data:`ORIGIN_HEADER`, :func:`kv`: re-exported from the Kafka-free
  ``services.records``, where the transforms import them from;
- :func:`add_service_flags`, :func:`setup_logging` (one line per event, ``key=value``), :class:`Stopper`
  (SIGTERM/SIGINT -> finish the batch, commit, leave the group, exit 0);
- :func:`commit_transaction`: the consume-process-produce step of exactly-once processing;
- :func:`read_range`: read a partition between two offsets (state restore = replay of an input log); it, the
  :class:`Fetcher` (at every new set of positions) and :func:`require_from` refuse a log whose records from the
  needed offset on were deleted (:class:`LogTruncated`), which :func:`run_service` turns into one error line and
  exit code 3 instead of a state rebuilt from what is left;
- :func:`run_service`: restart a service's loop in-process after a broker/transaction failure, so state is
  always rebuilt from the logs (the only source of truth) instead of patched up.

Keys are ASCII strings (term ids in decimal, query ids as given), never Avro: see schemas/README.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from services.kafka import BrokerUnreachable, KafkaSettings, add_kafka_flags, broker_outages, ensure_topics, make_consumer
from services.kafka.truncation import EXIT_TRUNCATED, LogTruncated, require_log_start
from services.metrics import record_consumer_lag, start_metrics_server
from services.records import ORIGIN_HEADER, Output, kv, query_partition  # Kafka-free; importable from here too

__all__ = ["Output", "Stopper", "Fetcher", "GroupInput", "first_record", "idle_pause", "TransactionFailed", "add_service_flags", "setup_logging", "commit_transaction",
           "read_range", "run_service", "wait_for_topics", "query_partition", "ORIGIN_HEADER", "origin_ms", "kv",
           "LogTruncated", "require_from"]

log = logging.getLogger("cbgp.runtime")

DEFAULT_METRICS_PORT = 9400


class TransactionFailed(RuntimeError):
    """A transaction could not be committed (broker down, fenced, timed out); it was aborted if possible.

    The service must drop its in-memory state and restore it from the logs: that is what :func:`run_service`
    does by running the service's loop again from scratch.
    """


def origin_ms(msg: Message) -> int | None:
    """The ``cbgp-origin-ms`` header of ``msg``, if any."""
    for key, value in msg.headers() or ():
        if key == ORIGIN_HEADER and value:
            try:
                return int(value)
            except ValueError:
                return None
    return None


# ---------------------------------------------------------------------------------------- process setup


def add_service_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--metrics-port`` (env CBGP_METRICS_PORT, default 9400, 0 = any free port) and ``--log-level``."""
    parser.add_argument("--metrics-port", type=int, default=None,
                        help=f"port of /metrics /healthz /readyz (env CBGP_METRICS_PORT, default {DEFAULT_METRICS_PORT}; 0 = any)")
    parser.add_argument("--log-level", default=os.environ.get("CBGP_LOG_LEVEL", "INFO"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def metrics_port(args: argparse.Namespace) -> int:
    if args.metrics_port is not None:
        return args.metrics_port
    return int(os.environ.get("CBGP_METRICS_PORT", DEFAULT_METRICS_PORT))


def default_instance_id() -> str:
    """A stable name for this instance (the host name: a StatefulSet pod keeps it across restarts)."""
    return os.environ.get("CBGP_INSTANCE_ID") or socket.gethostname()


def setup_logging(service: str, level: str = "INFO") -> None:
    """One line per event on stderr: ``ts=... level=... service=... msg``."""
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO), stream=sys.stderr, force=True,
        format=f"ts=%(asctime)s level=%(levelname)s service={service} logger=%(name)s %(message)s",
    )


class Stopper:
    """Turns SIGTERM/SIGINT into a flag the loop checks between batches (the batch in hand is finished)."""

    def __init__(self) -> None:
        self.stopping = False
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)

    def _stop(self, signum: int, _frame: object) -> None:
        log.info(kv(event="stop-requested", signal=signal.Signals(signum).name))
        self.stopping = True


def wait_for_topics(settings: KafkaSettings, service: str, stopper: "Stopper") -> bool:
    """:func:`ensure_topics`, retried while the broker does not answer (a service may start before its
    broker, as pods do); False if a stop was requested meanwhile.  A wrong layout still raises at once."""
    while not stopper.stopping:
        try:
            ensure_topics(settings)
            return True
        except BrokerUnreachable as exc:
            log.warning(kv(event="waiting-for-broker", service=service, reason=str(exc).replace("\n", " ")))
            time.sleep(2.0)
    return False


# ---------------------------------------------------------------------------------------- polling

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
LISTEN_SECONDS = 0.03
IDLE_PAUSE_SECONDS = 0.015
IDLE_PAUSE_MAX_SECONDS = 0.06


class Fetcher:
    """An assign-only consumer reading partitions from explicit positions, in batches that grow with the
    backlog; it is unassigned (*parked*) from a caught-up batch or an idle pause until it is read again (see
    above).  ``epoch`` changes whenever the positions are replaced, so a caller can tell a batch fetched under
    an older assignment."""

    def __init__(self, settings: KafkaSettings, name: str, max_records: int, *, check_log_start: bool = True) -> None:
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
        self.lag_fresh: set[tuple[str, int]] = set()  # partitions whose lag gauge was set at their end since a record

    def set_positions(self, positions: dict[tuple[str, int], int]) -> None:
        """Read from ``positions`` on (OFFSET_BEGINNING: offset 0); raises :class:`LogTruncated` when a log no
        longer starts at or below its position (librdkafka would silently start at the log start instead)."""
        if self.check_log_start:
            for (topic, partition), offset in positions.items():
                require_log_start(self.consumer, topic, {partition: offset})
        self.epoch += 1
        self.positions = dict(positions)
        self.parked = False
        if self.positions:
            self.consumer.assign([TopicPartition(t, p, o) for (t, p), o in self.positions.items()])
        else:
            self.consumer.unassign()

    def take(self) -> list[Message]:
        """Records already fetched (up to ``max_records``), without waiting; resumes a parked fetcher."""
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
        first = first_record(self.consumer, self.positions, timeout, on_end=self._at_end)
        if first is None:
            return []
        return self._settle([first] + self.consumer.consume(self.max_records - 1, 0))

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
            self.idle_streak = 0
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
            self.consumer.assign([TopicPartition(t, p, o) for (t, p), o in self.positions.items()])

    def poll(self) -> list[Message]:
        """Everything fetched, else what arrives within LISTEN_SECONDS, else [] after an idle pause."""
        msgs = self.take() or self.wait(LISTEN_SECONDS)
        if not msgs:
            idle_pause([self])
        return msgs

    def close(self) -> None:
        self.consumer.close()


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


def read_window(consumer: Consumer, topic: str, positions: dict[int, int], max_records: int = 500) -> list[Message]:
    """Assign ``topic`` at ``positions`` (partition -> next offset), return what arrives within
    WINDOW_LISTEN_SECONDS (ended early once every partition reported its end), and unassign again.  The
    consumer must have partition-EOF events on."""
    consumer.assign([TopicPartition(topic, p, o) for p, o in positions.items()])
    try:
        first = first_record(consumer, [(topic, p) for p in positions], WINDOW_LISTEN_SECONDS)
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
    """Stop fetching on every fetcher for a moment (nothing was there to read): IDLE_PAUSE_SECONDS, doubled
    for each further idle pause in a row of the least idle fetcher, up to IDLE_PAUSE_MAX_SECONDS."""
    streak = min(fetcher.idle_streak for fetcher in fetchers)
    for fetcher in fetchers:
        fetcher.park()
        fetcher.idle_streak += 1
    time.sleep(min(IDLE_PAUSE_MAX_SECONDS, IDLE_PAUSE_SECONDS * (1 << min(streak, 8))))
    # They stay parked: the next take() or wait() resumes them, so nothing is fetched before it is wanted.


class GroupInput:
    """A consumer-group input: membership, rebalance callbacks and transactional offsets through a
    subscribed consumer (``member``) whose partitions stay paused; records through a :class:`Fetcher`
    started at the committed offsets of the partitions the group assigned.

    ``on_assign``/``on_revoke`` are called like confluent-kafka's (with ``member``), from :meth:`poll`;
    ``on_assign`` gets the partitions with their committed offsets and commit metadata (offset < 0: none).
    """

    def __init__(self, settings: KafkaSettings, group: str, topics: Sequence[str], max_records: int, *,
                 on_assign: Callable[[Consumer, list[TopicPartition]], None] | None = None,
                 on_revoke: Callable[[Consumer, list[TopicPartition]], None] | None = None) -> None:
        self.user_assign = on_assign
        self.user_revoke = on_revoke
        self.closing = False
        self.fetcher = Fetcher(settings, f"{group.removeprefix(settings.topic_prefix)}.fetch", max_records)
        self.member = make_consumer(settings, group, topics, on_assign=self._assigned, on_revoke=self._revoked)

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self.closing:
            return  # a rebalance while leaving (others left too): the handle cannot fetch offsets any more
        consumer.assign(partitions)
        consumer.pause(partitions)  # the member never fetches: the fetcher does
        committed = consumer.committed(partitions, timeout=30) if partitions else []
        positions = {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else OFFSET_BEGINNING for tp in committed}
        if self.user_assign is not None:
            self.user_assign(consumer, committed)
        self.fetcher.set_positions(positions)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.fetcher.set_positions({})
        if self.user_revoke is not None:
            self.user_revoke(consumer, partitions)

    def serve(self) -> None:
        """Run pending rebalance callbacks (the member's partitions are paused: nothing is returned)."""
        self.member.poll(0)

    def poll(self) -> list[Message]:
        self.serve()
        return self.fetcher.poll()

    def consumer_group_metadata(self) -> Any:
        return self.member.consumer_group_metadata()

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


# ---------------------------------------------------------------------------------------- transactions


def produce_all(producer: Producer, outputs: Sequence[Output]) -> None:
    """Queue ``outputs`` on ``producer``, polling when the local queue is full (backpressure, not failure)."""
    for out in outputs:
        while True:
            try:
                producer.produce(out.topic, out.value, out.key, partition=out.partition,
                                 headers=out.headers or None)
                break
            except BufferError:
                producer.poll(0.05)


def commit_transaction(producer: Producer, outputs: Sequence[Output],
                       offsets: Sequence[tuple[Sequence[TopicPartition], Any]], timeout: float = 30.0) -> None:
    """Produce ``outputs`` and commit the consumed ``offsets`` in one Kafka transaction.

    Steps, in order (the order is the guarantee):
    1. begin the transaction;
    2. produce every output (dictionary entries before the updates that use them: callers order them);
    3. add the input offsets of each consumer group (``(partitions, group_metadata)`` pairs: the next offset
       to read, with optional commit metadata) to the transaction, so they commit only with the outputs;
    4. wait until every output is acknowledged, then commit: outputs become visible to read_committed
       readers and offsets advance atomically.
    Any failure aborts (when the producer can) and raises :class:`TransactionFailed`: neither the outputs
    nor the offsets happened, and the caller must restore its state from the logs.

    A broker outage (every connection lost: a restart) during the transaction also raises
    :class:`TransactionFailed`, before the commit if it is seen by then (the transaction is aborted), or
    after it: a broker that restarts forgets its open transactions (noida-db aborts them in its snapshot
    and then acknowledges the commit of the forgotten transaction without writing it), so the outcome is
    unknown and only a restore from what the broker kept is safe.
    """
    life = _LIFE[0]

    def outage() -> bool:
        producer.poll(0)  # serves pending error callbacks, so an outage reported meanwhile is counted
        return broker_outages() != life

    if outage():
        # librdkafka can then wait forever for a stale group coordinator in send_offsets_to_transaction,
        # ignoring its timeout (librdkafka #5456, #5511); a new life has fresh clients.
        raise TransactionFailed("the broker connection was lost: starting again with new clients")
    _WATCHDOG.enter(timeout)
    try:
        marks = [time.monotonic()]
        producer.begin_transaction()
        produce_all(producer, outputs)
        marks.append(time.monotonic())
        for partitions, group_metadata in offsets:
            if partitions:
                producer.send_offsets_to_transaction(list(partitions), group_metadata, timeout)
        marks.append(time.monotonic())
        unacknowledged = producer.flush(timeout)
        marks.append(time.monotonic())
        if unacknowledged or outage():
            producer.abort_transaction(timeout)
            reason = (f"{unacknowledged} outputs not acknowledged within {timeout:.0f} s" if unacknowledged
                      else "the broker connection was lost during the transaction")
            raise TransactionFailed(f"{reason}: aborted, starting again with new clients")
        producer.commit_transaction(timeout)
        marks.append(time.monotonic())
        if marks[-1] - marks[0] > SLOW_TRANSACTION_SECONDS:
            log.warning(kv(event="slow-transaction", outputs=len(outputs), **{
                f"{step}_s": f"{b - a:.3f}" for step, a, b in zip(("produce", "offsets", "flush", "commit"),
                                                                  marks, marks[1:])}))
    except KafkaException as exc:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        try:
            if err is None or not err.fatal():
                producer.abort_transaction(timeout)
        except KafkaException:
            pass  # the producer is unusable; the restart makes a new one (which fences this one)
        raise TransactionFailed(f"transaction aborted: {exc}") from None
    finally:
        _WATCHDOG.leave()
    if outage():
        raise TransactionFailed("the broker connection was lost while a transaction committed: its outcome is "
                                "unknown, starting again from what the broker kept")


SLOW_TRANSACTION_SECONDS = 0.5  # a transaction taking longer is logged with the time of each step
_LIFE = [0]  # broker_outages() when the current service life started


class _TransactionWatchdog:
    """Re-executes the process when a transaction call outlives its timeout by far.

    librdkafka's transactional calls can block past their timeout (#5456); a blocked C call cannot be
    interrupted, so the only way on is a fresh process, which restores from the logs like any new life
    (same PID and arguments; the new producer fences the blocked one's transactional id).
    """

    def __init__(self) -> None:
        self.since: float | None = None
        self.limit = 0.0
        self.thread: threading.Thread | None = None

    def enter(self, timeout: float) -> None:
        # Each of a transaction's calls (offsets per group, commit, abort) may take ``timeout``.
        self.limit = 4 * timeout + 10.0
        self.since = time.monotonic()
        if self.thread is None:
            self.thread = threading.Thread(target=self._watch, name="transaction-watchdog", daemon=True)
            self.thread.start()

    def leave(self) -> None:
        self.since = None

    def _watch(self) -> None:
        while True:
            time.sleep(2.0)
            since = self.since
            if since is not None and time.monotonic() - since > self.limit:
                reason = f"a transaction call blocked for over {self.limit:.0f} s"
                log.error(kv(event="restart-process", reason=reason))
                logging.shutdown()
                os.execv(sys.executable, [sys.executable, *sys.argv])


_WATCHDOG = _TransactionWatchdog()


# ---------------------------------------------------------------------------------------- log replay


def read_range(settings: KafkaSettings, topic: str, partition: int, start: int, end: int,
               batch: int = 2000, timeout: float = 120.0) -> Iterator[Message]:
    """Every committed record of ``topic[partition]`` with ``start <= offset < end``, in offset order.

    Raises :class:`LogTruncated` if the partition's log starts above ``start``: records the caller needs were
    deleted (a restore replaying "from offset 0" must read from 0, not from the low watermark).
    Transaction markers and aborted records take offsets too, so progress is tracked by the consumer's
    position, not by the last record.  Raises :class:`TimeoutError` if the range cannot be read in time.
    """
    if end <= start:
        return
    # auto.offset.reset=error: a position deleted while this runs is an error, never a silent skip to the log start.
    consumer = Consumer(settings.consumer_config(f"{settings.topic_prefix}replay", enable_partition_eof=True,
                                                 fetch_wait_max_ms=20, auto_offset_reset="error"))
    try:
        # Every record in [start, end) is needed: refuse a log that no longer starts at or below ``start``.
        require_log_start(consumer, topic, {partition: start}, end={partition: end})
        consumer.assign([TopicPartition(topic, partition, start if start > 0 else OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        tp = TopicPartition(topic, partition)
        while True:
            msgs = consumer.consume(batch, 0.2)
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                if msg.offset() >= end:
                    return
                yield msg
            position = consumer.position([tp])[0].offset
            if position >= end:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"replay of {topic}[{partition}] {start}..{end} stuck at {position}")
    finally:
        consumer.close()


def require_from(settings: KafkaSettings, topic: str, needed: dict[int, int], timeout: float = 30.0) -> None:
    """Raise :class:`LogTruncated` when a partition of ``topic`` no longer holds its ``needed`` offset (partition
    -> first offset a reader needs; negative = 0): for readers that assign their own consumer at an offset."""
    consumer = Consumer(settings.consumer_config(f"{settings.topic_prefix}watermarks"))
    try:
        require_log_start(consumer, topic, needed, timeout)
    finally:
        consumer.close()


def run_service(name: str, loop: Callable[[Stopper], None], stopper: Stopper) -> int:
    """Run ``loop`` until a stop is requested; after a :class:`TransactionFailed` or a Kafka error, run it
    again from scratch (fresh clients, state restored from the logs) after a short pause.  A restore that finds
    records it needs deleted (:class:`LogTruncated`) stops the service: one error line, exit code 3.

    With ``CBGP_PROFILE=<dir>`` the whole run is profiled with cProfile and the stats are written to
    ``<dir>/<service>-<pid>.prof`` on exit (read them with ``python -m pstats``): the hook for finding
    where a service spends its time under load.
    """
    profile_dir = os.environ.get("CBGP_PROFILE")
    if profile_dir:
        import cProfile

        profiler = cProfile.Profile(time.process_time)  # CPU time: the machine is shared
        profiler.enable()
        try:
            return _run_service(name, loop, stopper)
        finally:
            profiler.disable()
            os.makedirs(profile_dir, exist_ok=True)
            profiler.dump_stats(os.path.join(profile_dir, f"{name}-{os.getpid()}.prof"))
    return _run_service(name, loop, stopper)


def _run_service(name: str, loop: Callable[[Stopper], None], stopper: Stopper) -> int:
    while not stopper.stopping:
        _LIFE[0] = broker_outages()
        try:
            loop(stopper)
        except LogTruncated as exc:
            # Not restarted: a new life would read the same truncated log.  One line, then exit code 3.
            log.error(kv(event="log-truncated", service=name, topic=exc.topic, partition=exc.partition,
                         needed_offset=exc.needed, log_start=exc.log_start, reason=str(exc)))
            return EXIT_TRUNCATED
        except (TransactionFailed, KafkaException, TimeoutError) as exc:
            log.error(kv(event="restart", service=name, reason=str(exc).replace("\n", " ")))
            time.sleep(1.0)
            continue
        except Exception as exc:  # noqa: BLE001 - see below
            if broker_outages() == _LIFE[0]:
                raise  # a bug, not the broker: crash loudly and let the orchestrator restart the process
            # The broker was lost during this life: a client call may fail in ways its API does not promise
            # (an empty metadata answer, a half-torn-down handle).  The committed logs are intact, so a new
            # life with fresh clients restores exactly; the traceback stays in the log.
            log.error(kv(event="restart", service=name, reason=f"{type(exc).__name__} after a broker outage: "
                         + str(exc).replace("\n", " ")), exc_info=True)
            time.sleep(1.0)
            continue
        break
    log.info(kv(event="stopped", service=name))
    return 0


ServiceLife = Callable[[KafkaSettings, argparse.Namespace, "Stopper", list[bool]], None]


def service_command(commands: argparse._SubParsersAction, name: str, description: str, life: ServiceLife, *,
                    batch: int, batch_help: str, id_flag: str = "--instance-id",
                    id_help: str = "stable instance name, part of the transactional id (default: host name)",
                    group: str | None = None,
                    configure: Callable[[argparse.ArgumentParser], None] | None = None,
                    ) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Register ``cbgp <name>``: Kafka and service flags, then one handler that runs the service.

    The handler sets up logging and topics, serves /metrics /healthz /readyz (ready once ``life`` says
    so through ``ready[0]``) and runs ``life(settings, args, stopper, ready)`` under :func:`run_service`,
    which starts a new life after a failed transaction.
    """
    parser = commands.add_parser(name, help=description)
    add_kafka_flags(parser)
    add_service_flags(parser)
    parser.add_argument("--group", help=f"consumer group (default <prefix>{group or name})")
    parser.add_argument(id_flag, dest="instance_id", default=default_instance_id(), help=id_help)
    parser.add_argument("--batch", type=int, default=batch, help=f"{batch_help} (default {batch})")
    if configure is not None:
        configure(parser)  # the service's own flags

    def handler(args: argparse.Namespace) -> int:
        setup_logging(name, args.log_level)
        settings = KafkaSettings.from_args(args)
        stopper = Stopper()
        ready = [False]
        server = start_metrics_server(metrics_port(args), lambda: ready[0])  # /healthz answers while waiting
        logging.getLogger(f"cbgp.{name}").info(kv(event="started", metrics_port=server.port,
                                                   instance=args.instance_id, topics=settings.topic_prefix))
        try:
            if not wait_for_topics(settings, name, stopper):
                return 0
            return run_service(name, lambda stop: life(settings, args, stop, ready), stopper)
        finally:
            server.stop()

    return {name: handler}
