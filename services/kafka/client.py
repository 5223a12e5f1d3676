"""Thin helpers around confluent-kafka clients: factories that apply :class:`KafkaSettings`, a synchronous
produce that raises on delivery failure, and "read what is there" utilities for tests and the CLI.

Topic arguments are always the broker-side names (``settings.topic("answers")``), as in confluent-kafka.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import replace
from typing import Any, Callable, Iterable, Sequence

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from confluent_kafka.admin import AdminClient

from services.metrics.instruments import RESTORE_MISSING_OFFSETS
from services.kafka.run_env import SOURCE_VARIABLE
from services.kafka.config import KafkaSettings
from services.kafka.doorbell import doorbell
from services.kafka.truncation import truncation

__all__ = [
    "DeliveryError",
    "make_producer",
    "make_consumer",
    "produce_sync",
    "end_offsets",
    "watermarks",
    "wait_assignment",
    "read_all",
    "consume_until",
    "delete_topics",
    "broker_outages",
    "quiet_librdkafka",
    "require_broker",
    "unreachable_message",
]

log = logging.getLogger(__name__)


class DeliveryError(KafkaException):
    """The broker did not acknowledge a produced record."""


OUTAGES = [0]  # "all brokers down" reports seen by this process's clients


def broker_outages() -> int:
    """How many times a client of this process lost every broker connection (a broker restart, a network
    cut).  Transactional services start a new life after one: see ``services.runtime.life.commit_transaction``."""
    return OUTAGES[0]


def _log_client_error(err: KafkaError) -> None:
    # librdkafka retries transient errors itself (broker down, leader moves); log them so an operator can see
    # why the service is stuck, and let fatal ones surface through the next produce/poll call.
    if err.code() == KafkaError._ALL_BROKERS_DOWN:
        OUTAGES[0] += 1
    log.warning("kafka client error: %s", err)


# librdkafka writes its own log lines (``%3|...|FAIL|...``, one per refused connection attempt) straight to
# stderr.  A command-line tool routes them here instead: they reach a log handler if the process configured
# one (``CBGP_LOG_LEVEL``-style setups, tests), and are dropped otherwise.
LIBRDKAFKA_LOG = logging.getLogger("cbgp.librdkafka")
LIBRDKAFKA_LOG.propagate = False
LIBRDKAFKA_LOG.addHandler(logging.NullHandler())
# Seconds a command waits for the broker's first metadata answer before saying it cannot reach it.
REACHABLE_TIMEOUT = 5.0
# "FAIL [rdkafka#producer-1] [thrd:...]: host:port/bootstrap: Connect to ipv4#... failed: Connection refused (after 0ms
# in state CONNECT)" -> "Connection refused"; "...: Failed to resolve 'h:p': Name or service not known (after ...)"
# -> "Failed to resolve 'h:p': Name or service not known"; the suffix may say "(after 0ms in state CONNECT, 1
# identical error(s) suppressed)".
_FAIL_REASON = re.compile(r"/bootstrap: (?:Connect to \S+ failed: )?(.+?)(?: \(after \d+ms.*\))?$")


class _LastFailure(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reason: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        match = _FAIL_REASON.search(record.getMessage())
        if match:
            self.reason = match.group(1).strip()


def quiet_librdkafka(settings: KafkaSettings) -> KafkaSettings:
    """``settings`` whose clients send librdkafka's log lines to the ``cbgp.librdkafka`` logger, not stderr
    (for user commands: a refused connection must not print hundreds of lines).  Not for child processes:
    the logger does not survive :meth:`KafkaSettings.to_env`."""
    return replace(settings, extra={**settings.extra, "logger": LIBRDKAFKA_LOG, "log.connection.close": False,
                                    "error_cb": _log_quietly})


def _log_quietly(err: KafkaError) -> None:
    # A command reports what failed itself (one line); the client's transient errors only go to the log.
    LIBRDKAFKA_LOG.info("kafka client error: %s", err)


def unreachable_message(settings: KafkaSettings, why: str, hint: bool = True) -> str:
    """The one line a command prints when the broker does not answer (and where its address came from)."""
    source = os.environ.get(SOURCE_VARIABLE)
    if source and settings.bootstrap_servers == os.environ.get("CBGP_BOOTSTRAP_SERVERS"):
        return (f"cannot reach the Kafka broker at {settings.bootstrap_servers} ({why}), the address make run wrote "
                f"to {source}: is make run still running? (or set --bootstrap-servers / CBGP_BOOTSTRAP_SERVERS)")
    return (f"cannot reach the Kafka broker at {settings.bootstrap_servers} ({why}); check --bootstrap-servers / "
            "CBGP_BOOTSTRAP_SERVERS" + (", or run 'cbgp doctor'" if hint else
                                        ", that the broker is running and listening there, and the security settings"))


def require_broker(settings: KafkaSettings, timeout: float = REACHABLE_TIMEOUT, *, hint: bool = True) -> None:
    """Raise :class:`~services.kafka.topics.BrokerUnreachable` (one readable line) unless the broker answers a
    metadata request within ``timeout`` seconds.  librdkafka's own log lines go to ``cbgp.librdkafka``."""
    from services.kafka.topics import BrokerUnreachable

    failure = _LastFailure()
    watcher = logging.getLogger(f"cbgp.librdkafka.check.{id(failure)}")
    watcher.propagate = False
    watcher.addHandler(failure)
    watcher.setLevel(logging.DEBUG)
    admin = AdminClient({**settings.admin_config(), "logger": watcher, "log.connection.close": False})
    try:
        admin.list_topics(timeout=timeout)
        return
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        detail = err.str() if hasattr(err, "str") else str(exc)
    finally:
        admin.poll(0)  # serves the queued log lines to the watcher
        watcher.removeHandler(failure)
    log.info("broker %s unreachable: %s (last connection error: %s)", settings.bootstrap_servers, detail, failure.reason)
    raise BrokerUnreachable(unreachable_message(settings, failure.reason or f"no answer within {timeout:g} s: {detail}",
                                                hint))


def make_producer(settings: KafkaSettings, *, idempotent: bool = True, transactional_id: str | None = None,
                  **overrides: Any) -> Producer:
    """A producer with acks=all and idempotence; with ``transactional_id`` its transactions are initialised.

    ``overrides`` are librdkafka properties with ``_`` for ``.`` (``linger_ms=0``).
    """
    conf = settings.producer_config(idempotent=idempotent, transactional_id=transactional_id)
    conf.update({k.replace("_", "."): v for k, v in overrides.items()})
    conf.setdefault("error_cb", _log_client_error)
    producer = Producer(conf)
    if transactional_id:
        # Fences any older producer with the same id and aborts its open transaction.
        producer.init_transactions(30)
    return producer


def make_consumer(settings: KafkaSettings, group: str, topics: Sequence[str] = (), *,
                  on_assign: Callable[..., None] | None = None, on_revoke: Callable[..., None] | None = None,
                  **overrides: Any) -> Consumer:
    """A consumer in ``group`` (manual commit, read_committed, earliest), subscribed to ``topics`` if given."""
    conf = settings.consumer_config(group, **overrides)
    conf.setdefault("error_cb", _log_client_error)
    consumer = Consumer(conf)
    if topics:
        kwargs: dict[str, Any] = {}
        if on_assign is not None:
            kwargs["on_assign"] = on_assign
        if on_revoke is not None:
            kwargs["on_revoke"] = on_revoke
        consumer.subscribe(list(topics), **kwargs)
    return consumer


def produce_sync(producer: Producer, topic: str, value: bytes | str | None, key: bytes | str | None = None, *,
                 partition: int | None = None, headers: Sequence[tuple[str, bytes]] | None = None,
                 timeout: float = 10.0) -> Message:
    """Produce one record and wait for its acknowledgement; return the delivered message (partition, offset).

    Raises :class:`DeliveryError` if the broker refuses it or it is not acknowledged within ``timeout``.
    Slow (one round trip per record): for tests, the CLI and rare control messages, not for data paths.
    """
    result: list[tuple[KafkaError | None, Message]] = []
    kwargs: dict[str, Any] = {"value": value, "key": key, "on_delivery": lambda e, m: result.append((e, m))}
    if partition is not None:
        kwargs["partition"] = partition
    if headers:
        kwargs["headers"] = list(headers)
    producer.produce(topic, **kwargs)
    deadline = time.monotonic() + timeout
    while not result and time.monotonic() < deadline:
        producer.poll(min(0.1, max(0.0, deadline - time.monotonic())))
    if not result:
        raise DeliveryError(KafkaError(KafkaError._MSG_TIMED_OUT, f"{topic}: no acknowledgement within {timeout}s"))
    err, msg = result[0]
    if err is not None:
        raise DeliveryError(err)
    doorbell().ring([(topic, msg.partition())])  # (wakes a reader in its deep pause: services.kafka.doorbell)
    return msg


def end_offsets(settings: KafkaSettings, topic: str, timeout: float = 10.0) -> dict[int, tuple[int, int]]:
    """``{partition: (low, high)}`` watermarks of ``topic`` (high = offset the next record will get)."""
    consumer = Consumer(settings.consumer_config("cbgp-watermarks", enable_partition_eof=False))
    try:
        return watermarks(consumer, topic, timeout)
    finally:
        consumer.close()


def watermarks(consumer: Consumer, topic: str, timeout: float = 10.0) -> dict[int, tuple[int, int]]:
    """:func:`end_offsets` through a consumer the caller keeps (one that looks often: no new connection each
    time)."""
    meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
    if meta is None or meta.error is not None:
        raise KafkaException(meta.error if meta else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, topic))
    return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            for p in sorted(meta.partitions)}


def wait_assignment(consumer: Consumer, timeout: float = 30.0) -> list[TopicPartition]:
    """Poll until the group gives ``consumer`` partitions (returns them); records polled meanwhile are kept
    by librdkafka only if none arrive, so call this before data is expected."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = consumer.poll(0.1)
        if msg is not None and msg.error() is None:
            # A record arrived: the assignment exists.  Seek back so the caller still sees this record.
            consumer.seek(TopicPartition(msg.topic(), msg.partition(), msg.offset()))
        assignment = consumer.assignment()
        if assignment:
            return assignment
    raise TimeoutError(f"no partition assigned within {timeout}s")


def read_all(settings: KafkaSettings, topic: str, timeout: float = 10.0, *,
             isolation: str = "read_committed", restore: bool = False) -> list[Message]:
    """Every record now in ``topic`` (all partitions, from the start to the high watermark at call time).

    ``restore=True``: the caller rebuilds state from it, so every record from offset 0 is needed; raises
    :class:`services.kafka.truncation.LogTruncated` if a partition's log starts above 0 (records were deleted).
    No consumer group is joined (partitions are assigned directly), so nothing is committed.  Ordered by
    partition, then offset.  Raises :class:`TimeoutError` if it cannot catch up within ``timeout`` (e.g. a
    transaction left open on the topic holds read_committed readers back).
    """
    consumer = Consumer(settings.consumer_config("cbgp-read-all", isolation_level=isolation,
                                                 enable_partition_eof=True, fetch_wait_max_ms=20))
    try:
        offsets = end_offsets(settings, topic, timeout)
        if restore:
            for p, (lo, hi) in offsets.items():
                error = truncation(topic, p, 0, lo, hi)
                if error is not None:
                    RESTORE_MISSING_OFFSETS.labels(topic, str(p)).set(error.log_start - error.needed)
                    raise error
        highs = {p: hi for p, (lo, hi) in offsets.items() if hi > lo}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in highs])
        out: list[Message] = []
        pending = set(highs)
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"read_all({topic}): partitions {sorted(pending)} not read to their end in {timeout}s")
            msg = consumer.poll(0.1)
            if msg is not None:
                err = msg.error()
                if err is None:
                    out.append(msg)
                elif err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
            # Position, not the last record: it also moves past transaction markers and aborted records.
            for tp in consumer.position([TopicPartition(topic, p) for p in pending]):
                if tp.offset >= highs[tp.partition]:
                    pending.discard(tp.partition)
        out.sort(key=lambda m: (m.partition(), m.offset()))
        return out
    finally:
        consumer.close()


def consume_until(consumer: Consumer, until: int | Callable[[list[Message]], bool], timeout: float = 30.0,
                  *, commit: bool = False) -> list[Message]:
    """Poll ``consumer`` until ``until`` holds: a record count, or a predicate on the records so far.

    With ``commit=True`` the offsets of the returned records are committed synchronously at the end.
    Raises :class:`TimeoutError` (with the count so far) if the condition is not met within ``timeout``.
    """
    done: Callable[[list[Message]], bool] = (lambda ms: len(ms) >= until) if isinstance(until, int) else until
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while not done(out):
        if time.monotonic() > deadline:
            raise TimeoutError(f"consume_until: condition not met within {timeout}s ({len(out)} records received)")
        msg = consumer.poll(0.1)
        if msg is None:
            continue
        err = msg.error()
        if err is None:
            out.append(msg)
        elif err.fatal():
            raise KafkaException(err)
        elif err.code() != KafkaError._PARTITION_EOF:
            log.warning("consume_until: %s", err)
    if commit and out:
        consumer.commit(asynchronous=False)
    return out


def delete_topics(settings: KafkaSettings, topics: Iterable[str], timeout: float = 10.0) -> None:
    """Delete ``topics`` (missing ones are ignored): used by the doctor and tests to clean up scratch topics."""
    names = list(topics)
    if not names:
        return
    admin = AdminClient(settings.admin_config())  # keep a reference: the futures die with their client
    for name, future in admin.delete_topics(names, request_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
