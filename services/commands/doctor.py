"""``cbgp doctor``: does this broker have what the fleet needs?

Each check exercises one broker feature the services rely on, on scratch topics that are deleted at the
end, and says what to do when it fails.  The checks are the ones that separated brokers in the reference
notes: Tansu reports wrong high watermarks and leaks aborted
transactions to read_committed readers; librdkafka's mock cluster has no admin API; auto-created topics
get one partition.  Checks run in dependency order; if the broker cannot be reached, that is the only
check reported.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, replace
from typing import Callable

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

from services.kafka.client import (consume_until, delete_topics, end_offsets, make_consumer, make_producer,
                                   produce_sync, read_all)
from services.kafka.config import KafkaSettings
from services.commands.floor import floor
from services.kafka.topics import (TOPICS, TopicSpec, ensure_topics, retention_problems,
                                  wanted_configs)
from services.kafka.truncation import truncation

__all__ = ["Check", "run_doctor", "format_report", "retention_problems"]

RETENTION_CHECK = "topic retention and cleanup.policy"
RETENTION_REMEDY = ("`cbgp topics create` sets them only on the topics it creates: set them on this topic by hand "
                    "(kafka-configs.sh --alter --entity-type topics --entity-name TOPIC --add-config KEY=VALUE), "
                    "as `cbgp topics list` shows")

TRUNCATION_CHECK = "records restores need still present"
TRUNCATION_REMEDY = ("a service restoring from this partition refuses to start (exit code 3): restore the deleted "
                     "records or start a new fleet under another --topic-prefix")

# librdkafka logs every refused connection on stderr; the report already explains them, so route the
# clients' own logs here (silent unless a caller configures this logger).
_quiet = logging.getLogger("cbgp.doctor.librdkafka")
_quiet.propagate = False
_quiet.addHandler(logging.NullHandler())

TIMEOUT = 10.0


@dataclass(frozen=True)
class Check:
    """One doctor check: ``remedy`` says what to do when ``ok`` is False."""

    name: str
    ok: bool
    detail: str
    remedy: str = ""


class _Failed(Exception):
    """A check's assertion failed; the message becomes the check's detail."""


def _why(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args and hasattr(exc.args[0], "str"):
        return exc.args[0].str()
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, _Failed) else str(exc)


def run_doctor(settings: KafkaSettings, timeout: float = TIMEOUT) -> list[Check]:
    """Run every check against ``settings``' broker; never raises for broker problems."""
    settings = replace(settings, extra={**settings.extra, "logger": _quiet})
    scratch = settings.with_prefix(f"{settings.topic_prefix}doctor.{uuid.uuid4().hex[:8]}.")
    data, txn, compact = scratch.topic("data"), scratch.topic("txn"), scratch.topic("compact")
    checks: list[Check] = []

    def run(name: str, remedy: str, fn: Callable[[], str]) -> bool:
        try:
            checks.append(Check(name, True, fn()))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a report line, never a traceback
            checks.append(Check(name, False, _why(exc), remedy))
        return checks[-1].ok

    admin = AdminClient(settings.admin_config())
    brokers: list[int] = []

    def metadata() -> str:
        meta = admin.list_topics(timeout=timeout)
        brokers.extend(meta.brokers)
        return f"{settings.bootstrap_servers}: {len(meta.brokers)} broker(s), {len(meta.topics)} topic(s)"

    if not run("metadata reachable", "check --bootstrap-servers / CBGP_BOOTSTRAP_SERVERS, that the broker is "
               "running and listening there, and the security settings (CBGP_SECURITY_PROTOCOL, SASL, TLS)", metadata):
        return checks

    def broker_count() -> str:
        if len(brokers) < settings.replication_factor:
            raise _Failed(f"{len(brokers)} broker(s) < replication factor {settings.replication_factor}")
        return f"{len(brokers)} broker(s) >= replication factor {settings.replication_factor}"

    run("brokers vs replication factor", "lower --replication-factor / CBGP_REPLICATION_FACTOR, or add brokers",
        broker_count)

    try:
        def create() -> str:
            specs = [TopicSpec("data", None, "none", "doctor scratch"), TopicSpec("txn", 1, "none", "doctor scratch")]
            ensure_topics(scratch, specs, timeout)
            got = {t: len(end_offsets(scratch, t, timeout)) for t in (data, txn)}
            if got != {data: settings.partitions, txn: 1}:
                raise _Failed(f"asked for {settings.partitions} and 1 partitions, broker made {got}")
            return f"created {data} with {settings.partitions} partitions and {txn} with 1"

        if not run("topic creation with explicit partitions", "grant the client CreateTopics (ACL) or pre-create the "
                   "topics with `cbgp topics create` as an admin; the broker must honour num_partitions", create):
            return checks

        def idempotent() -> str:
            msg = produce_sync(make_producer(scratch, idempotent=True), txn, b"idempotent", timeout=timeout)
            return f"enable.idempotence=true produce acknowledged at offset {msg.offset()}"

        run("idempotent producer", "the broker must support InitProducerId (Kafka >= 0.11); check the "
            "IdempotentWrite ACL on the cluster", idempotent)

        written = 40

        def round_trip() -> str:
            # Plain acks=all producer with a long linger, so records travel in multi-record batches.
            producer = make_producer(scratch, idempotent=False, linger_ms=50)
            for i in range(written):
                producer.produce(data, key=f"k{i % 8}".encode(), value=f"v{i}".encode())
            if producer.flush(timeout):
                raise _Failed(f"{len(producer)} record(s) not acknowledged within {timeout}s")
            got = sorted(m.value().decode() for m in read_all(scratch, data, timeout))
            if got != sorted(f"v{i}" for i in range(written)):
                raise _Failed(f"wrote {written} records, read back {len(got)} different ones")
            return f"{written} records written and read back"

        if run("produce/consume round trip", "check the client's Write/Read ACLs and the broker log", round_trip):
            def watermarks() -> str:
                total = sum(hi - lo for lo, hi in end_offsets(scratch, data, timeout).values())
                if total != written:
                    raise _Failed(f"high watermarks sum to {total} after {written} records")
                return f"high watermarks sum to exactly {written}"

            run("end offsets equal records written", "the broker reports wrong high watermarks (a known Tansu "
                "bug): consumer lag and state restore would be wrong; use Apache Kafka, Redpanda or noida-db",
                watermarks)

            def group() -> str:
                group_id = scratch.topic("group")
                t0 = time.monotonic()
                first = make_consumer(scratch, group_id, [data])
                try:
                    consume_until(first, written, timeout=3 * timeout, commit=True)
                finally:
                    first.close()
                joined = time.monotonic() - t0
                producer = make_producer(scratch)
                for i in range(5):
                    producer.produce(data, key=b"after", value=f"after{i}".encode())
                producer.flush(timeout)
                second = make_consumer(scratch, group_id, [data])
                try:
                    resumed = sorted(m.value().decode() for m in consume_until(second, 5, timeout=3 * timeout))
                    extra = second.poll(0.5)
                finally:
                    second.close()
                if resumed != [f"after{i}" for i in range(5)] or (extra is not None and extra.error() is None):
                    raise _Failed(f"after a commit the group resumed with {resumed[:5]}, expected only the 5 new records")
                for future in admin.delete_consumer_groups([group_id], request_timeout=timeout).values():
                    future.result(timeout)
                return f"joined and consumed in {joined:.1f}s, committed, resumed exactly after the commit"

            run("consumer group join/commit/resume", "the broker must support group coordination with "
                "session.timeout.ms=6000 (check group.min.session.timeout.ms) and the Group ACLs", group)

        def transactions() -> str:
            producer = make_producer(scratch, transactional_id=scratch.topic("txn-id"))
            producer.begin_transaction()
            for i in range(3):
                producer.produce(txn, value=f"committed{i}".encode())
            producer.commit_transaction(timeout)
            producer.begin_transaction()
            for i in range(4):
                producer.produce(txn, value=f"aborted{i}".encode())
            producer.flush(timeout)  # make the broker store them, so the abort has something to hide
            producer.abort_transaction(timeout)
            seen = [m.value() for m in read_all(scratch, txn, timeout)]
            if any(v.startswith(b"aborted") for v in seen):
                raise _Failed("a read_committed consumer received records of an aborted transaction")
            committed = [v for v in seen if v.startswith(b"committed")]
            if committed != [b"committed0", b"committed1", b"committed2"]:
                raise _Failed(f"read_committed returned {committed}, expected the 3 committed records in order")
            return "aborted records hidden from read_committed, committed ones visible"

        run("transactions with read_committed isolation", "the broker must implement transaction markers "
            "(Tansu does not); use Apache Kafka, Redpanda or noida-db, and lower "
            "transaction.state.log.replication.factor on clusters with fewer than 3 brokers", transactions)

        def compaction() -> str:
            ensure_topics(scratch, [TopicSpec("compact", 1, "id", "doctor scratch", "compact")], timeout)
            resource = ConfigResource(ConfigResource.Type.TOPIC, compact)
            configs = admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout)
            policy = configs["cleanup.policy"].value if "cleanup.policy" in configs else None
            if policy != "compact":
                raise _Failed(f"created with cleanup.policy=compact, broker reports {policy!r}")
            return "cleanup.policy=compact stored (compaction itself runs later, broker-side)"

        run("compaction config accepted", "the broker must accept cleanup.policy=compact; the dictionary, "
            "query plans and current answers are compacted topics", compaction)

        # The fleet's own topics, where they exist: retention and cleanup.policy at least what the fleet needs.
        specs: dict[str, TopicSpec] = {}
        try:
            existing = admin.list_topics(timeout=timeout).topics
            specs = {settings.topic(t.name): t for t in TOPICS if settings.topic(t.name) in existing}
            problems: list[str] = []
            for name, spec in specs.items():
                resource = ConfigResource(ConfigResource.Type.TOPIC, name)
                configs = admin.describe_configs([resource], request_timeout=timeout)[resource].result(timeout)
                problems += retention_problems(name, spec, {k: v.value for k, v in configs.items()},
                                               wanted_configs(spec, settings))
            if problems:
                checks.extend(Check(RETENTION_CHECK, False, p, RETENTION_REMEDY) for p in problems)
            elif specs:
                checks.append(Check(RETENTION_CHECK, True, f"{len(specs)} fleet topic(s) keep what the fleet needs"))
            else:
                checks.append(Check(RETENTION_CHECK, True, f"no fleet topic under prefix {settings.topic_prefix!r} "
                                    "yet (`cbgp topics create` sets them)"))
        except Exception as exc:  # noqa: BLE001 - a report line, never a traceback
            checks.append(Check(RETENTION_CHECK, False, _why(exc), "grant the client DescribeConfigs on the topics"))

        # Records already deleted that a restore reads (from offset 0, or from its checkpoint's position): the
        # restore would stop on them (LogTruncated).
        try:
            read = [spec for spec in specs.values() if spec.restored_from]
            needed = floor(settings, read, timeout)
            cut = [str(error) for name, parts in needed.items()
                   for p, (low, high) in sorted(end_offsets(settings, name, timeout).items())
                   if (error := truncation(name, p, parts[str(p)], low, high)) is not None]
            if cut:
                checks.extend(Check(TRUNCATION_CHECK, False, line, TRUNCATION_REMEDY) for line in cut)
            elif read:
                checks.append(Check(TRUNCATION_CHECK, True, f"{len(read)} topic(s) restores read still hold every "
                                    "record they need (from offset 0, or from the last checkpoint)"))
        except Exception as exc:  # noqa: BLE001 - a report line, never a traceback
            checks.append(Check(TRUNCATION_CHECK, False, _why(exc), "check the client's Describe ACL on the topics"))
    finally:
        try:
            delete_topics(scratch, [data, txn, compact], timeout)
        except Exception as exc:  # noqa: BLE001 - cleanup is best effort; say so in the report
            checks.append(Check("cleanup of scratch topics", False, _why(exc),
                                f"delete topics {scratch.topic_prefix}* by hand"))
    return checks


def format_report(checks: list[Check]) -> str:
    """One line per check (✓/✗, name, detail, and the remedy for failures), then a summary line."""
    lines = []
    for c in checks:
        line = f"{'✓' if c.ok else '✗'} {c.name}: {c.detail}"
        if not c.ok and c.remedy:
            line += f" -> {c.remedy}"
        lines.append(line)
    failed = sum(not c.ok for c in checks)
    lines.append(f"{len(checks) - failed}/{len(checks)} checks passed" + ("" if failed else ": the broker is ready for cbgp"))
    return "\n".join(lines)
