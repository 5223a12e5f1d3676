"""What every data-path service (ingest, worker, answers) shares around its pure transform.

How it works: docs/design/internals.md, services.runtime.life.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterable, Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from services.kafka.topics import BrokerUnreachable, ensure_topics
from services.kafka.config import KafkaSettings, add_kafka_flags
from services.kafka.client import broker_outages
from services.kafka.doorbell import doorbell
from services.kafka.truncation import EXIT_TRUNCATED, LogTruncated
from services.metrics.exposition import start_metrics_server
from services.wire.failures import EXIT_TOO_MANY_FAILURES, TooManyFailures
from services.wire.records import ORIGIN_HEADER, Output
from services.wire.loglines import kv
from services.wire.sealed import CheckpointKeyMissing
from services.wire.sealed import key as checkpoint_key
# Re-exported: the services import their input and replay helpers from here.

__all__ = ["Output", "Stopper", "TransactionFailed", "add_service_flags", "setup_logging", "commit_transaction",
           "run_service", "require_broker_kept", "checkpoint_at_stop", "set_life", "wait_for_topics", "port_number",
           "ORIGIN_HEADER", "origin_ms", "oldest_origin", "oldest_produced", "kv", "LogTruncated"]

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


def oldest_origin(msgs: Iterable[Message]) -> int | None:
    """The earliest ``cbgp-origin-ms`` of ``msgs`` (None: none carries one): a batch's ``Step.origin_ms``."""
    origins = [origin for origin in map(origin_ms, msgs) if origin is not None]
    return min(origins) if origins else None


def oldest_produced(msgs: Iterable[Message]) -> int | None:
    """The earliest Kafka timestamp (epoch ms, as its producer set it) of ``msgs``: a batch's ``Step.input_ms``."""
    stamps = [ts for _kind, ts in (msg.timestamp() for msg in msgs) if ts > 0]
    return min(stamps) if stamps else None


# ---------------------------------------------------------------------------------------- process setup


def port_number(env: str | None = None) -> Callable[[str], int]:
    """An argparse type: a TCP port, 0-65535 (0: any free one).  A default given as the text of ``env`` is
    checked by argparse the same way, so a bad flag or variable is one usage line, not a traceback at bind."""
    where = f" (the flag, or env {env})" if env else ""

    def parse(text: str) -> int:
        try:
            port = int(text)
        except ValueError:
            port = -1
        if not 0 <= port <= 65535:
            raise argparse.ArgumentTypeError(f"{text!r} is not a port number from 0 to 65535{where}")
        return port
    return parse


def add_service_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--metrics-port`` (env CBGP_METRICS_PORT, default 9400, 0 = any free port) and ``--log-level``."""
    parser.add_argument("--metrics-port", type=port_number("CBGP_METRICS_PORT"),
                        default=os.environ.get("CBGP_METRICS_PORT"),
                        help=f"port of /metrics /healthz /readyz (env CBGP_METRICS_PORT, default {DEFAULT_METRICS_PORT}; 0 = any)")
    parser.add_argument("--log-level", default=os.environ.get("CBGP_LOG_LEVEL", "INFO"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


def metrics_port(args: argparse.Namespace) -> int:
    return args.metrics_port if args.metrics_port is not None else DEFAULT_METRICS_PORT


def default_instance_id() -> str:
    """A stable name for this instance (the host name: a StatefulSet pod keeps it across restarts)."""
    return os.environ.get("CBGP_INSTANCE_ID") or socket.gethostname()


def setup_logging(service: str, level: str = "INFO") -> None:
    """One line per event on stderr: ``ts=... level=... service=... msg``."""
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO), stream=sys.stderr, force=True,
        format=f"ts=%(asctime)s level=%(levelname)s service={service} logger=%(name)s %(message)s",
    )


# How long a data-path service may take to stop once asked (CBGP_STOP_GRACE_SECONDS): its last checkpoint and
# leaving its groups.  Closing a consumer while its group rebalances can block in librdkafka for long (on
# noida-db, holding the interpreter lock), and so may a transaction's call to a stale group coordinator; everything
# committed is in Kafka by then, and a transaction cut short is aborted as after a kill, so the process exits
# anyway (docs/operations.md, "A stop that cannot close").
DEFAULT_STOP_GRACE_SECONDS = 20.0
LAST_RESORT_SECONDS = 5.0


class Stopper:
    """Turns SIGTERM/SIGINT into a flag the loop checks between batches (the batch in hand is finished).

    With ``grace`` (seconds), a process still running that long after the first signal exits (code 0) with one
    line in the log: a stop must not hang on a client that cannot close.  The deadline is started from the
    signal's wakeup byte, not from the Python handler, which runs only once the main thread is back from C.
    A client call that blocks while holding the interpreter's lock stops that deadline's thread too; for it,
    :mod:`faulthandler`'s C thread dumps every thread's stack to the log and exits (code 1) LAST_RESORT_SECONDS
    later."""

    def __init__(self, grace: float | None = None) -> None:
        self.stopping = False
        self.grace = grace
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        if grace is not None:
            read_end, write_end = os.pipe()
            os.set_blocking(write_end, False)
            signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
            threading.Thread(target=self._deadline, args=(read_end, grace), name="stop-deadline",
                             daemon=True).start()

    def _stop(self, signum: int, _frame: object) -> None:
        log.info(kv(event="stop-requested", signal=signal.Signals(signum).name))
        if not self.stopping and self.grace is not None:
            faulthandler.dump_traceback_later(self.grace + LAST_RESORT_SECONDS, exit=True)
        self.stopping = True

    @staticmethod
    def _deadline(wakeup: int, grace: float) -> None:
        while os.read(wakeup, 1)[0] not in (signal.SIGTERM, signal.SIGINT):
            pass
        time.sleep(grace)
        log.error(kv(event="stop-timeout", seconds=grace, reason="the service did not stop in time (a client that "
                     "cannot close): exiting now; everything it committed is kept"))
        logging.shutdown()
        os._exit(0)


def stop_grace() -> float:
    """``CBGP_STOP_GRACE_SECONDS`` (default DEFAULT_STOP_GRACE_SECONDS); a value that is not a positive number
    is ignored with a warning."""
    raw = os.environ.get("CBGP_STOP_GRACE_SECONDS", "").strip()
    try:
        value = float(raw) if raw else DEFAULT_STOP_GRACE_SECONDS
    except ValueError:
        value = -1.0
    if value > 0:
        return value
    log.warning(kv(event="setting-ignored", setting="CBGP_STOP_GRACE_SECONDS", value=raw,
                   reason=f"not a number of seconds above 0: using {DEFAULT_STOP_GRACE_SECONDS:g}"))
    return DEFAULT_STOP_GRACE_SECONDS


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
                       offsets: Sequence[tuple[Sequence[TopicPartition], Any]], timeout: float = 30.0, *,
                       life: int | None = None) -> None:
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
    unknown and only a restore from what the broker kept is safe.  ``life`` is ``broker_outages()`` when the
    caller's clients were made (by default, when the current service life started).
    """
    life = _LIFE[0] if life is None else life

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
        # Step 1: begin.
        producer.begin_transaction()
        # Step 2: produce the outputs (a failure from here to step 4 aborts: nothing happened).
        produce_all(producer, outputs)
        marks.append(time.monotonic())
        # Step 3: add the input offsets, so they commit only with the outputs.
        for partitions, group_metadata in offsets:
            if partitions:
                producer.send_offsets_to_transaction(list(partitions), group_metadata, timeout)
        marks.append(time.monotonic())
        # Step 4: every output acknowledged, then commit (outputs visible and offsets moved, atomically).
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
    doorbell().ring([(out.topic, out.partition) for out in outputs])  # (wakes a reader in its deep pause)


SLOW_TRANSACTION_SECONDS = 0.5  # a transaction taking longer is logged with the time of each step
_LIFE = [0]  # broker_outages() when the current service life started (set again by run_processor)


def set_life(outages: int) -> None:
    """The current life began when ``broker_outages()`` was ``outages``."""
    _LIFE[0] = outages


def checkpoint_at_stop(checkpoint: Callable[[], None]) -> None:
    """A clean stop's last checkpoint, skipped with one line when the broker was lost meanwhile (see
    :func:`require_broker_kept`): the next life restores from what the broker kept."""
    try:
        checkpoint()
    except TransactionFailed as exc:
        log.warning(kv(event="checkpoint-skipped", reason=str(exc)))


def require_broker_kept(producer: Producer, what: str) -> None:
    """Raise :class:`TransactionFailed` when the broker was lost since the current life began, before ``what``
    (a checkpoint) is saved.  A broker that restarts can forget transactions it acknowledged just before it
    stopped (noida-db does), and positions read from it afterwards describe its log without them: a state that
    includes them, saved at those positions, would be restored as if they were on the log (ingest once marked
    their terms published and never wrote them again).  The next life restores from what the broker kept."""
    producer.poll(0)  # serves pending error callbacks, so an outage reported meanwhile is counted
    if broker_outages() != _LIFE[0]:
        raise TransactionFailed(f"the broker connection was lost since this life began: {what} not saved, starting "
                                "again from what the broker kept")


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
            return run_lives(name, loop, stopper)
        finally:
            profiler.disable()
            os.makedirs(profile_dir, exist_ok=True)
            profiler.dump_stats(os.path.join(profile_dir, f"{name}-{os.getpid()}.prof"))
    return run_lives(name, loop, stopper)


def run_lives(name: str, loop: Callable[[Stopper], None], stopper: Stopper) -> int:
    while not stopper.stopping:
        began = broker_outages()
        set_life(began)
        try:
            loop(stopper)
        except TooManyFailures as exc:
            # Not restarted: a new life would read the same failing inputs.  One line, then exit code 4.
            log.error(kv(event="too-many-failures", service=name, reason=str(exc)))
            return EXIT_TOO_MANY_FAILURES
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
            if broker_outages() == began:
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
        if getattr(args, "checkpoint_interval", -1) >= 0:
            try:
                checkpoint_key()  # a service that would checkpoint without the fleet's key refuses to start
            except CheckpointKeyMissing as exc:
                print(f"cbgp {name}: error: {exc}", file=sys.stderr)
                return 2
        settings = KafkaSettings.from_args(args)
        stopper = Stopper(grace=stop_grace())
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
