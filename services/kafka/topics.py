"""The fleet's topic catalogue, as data, and the code that creates it on a broker.

How it works: docs/design/internals.md, services.kafka.topics.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from services.kafka.config import KafkaSettings

__all__ = ["TopicSpec", "TopicError", "BrokerUnreachable", "TOPICS", "catalogue", "ensure_topics", "spec", "KEPT", "WEEK_MS",
           "FROM_START", "NOTHING", "GROUP", "retention_problems", "wanted_configs", "check_existing_configs"]

log = logging.getLogger("cbgp.topics")


class TopicError(RuntimeError):
    """A topic could not be created, or exists with a layout the fleet cannot use."""


class BrokerUnreachable(TopicError):
    """The broker did not answer a metadata request: the topics are not known to be wrong, only unseen."""


KEPT = -1  # retention.ms: never delete by age
WEEK_MS = 7 * 24 * 3600 * 1000

# What the fleet still needs of a topic (TopicSpec.needed_from), see floor():
FROM_START = "start"  # everything: a restore reads it from offset 0
NOTHING = "nothing"  # no service reads it back: the floor is the high watermark
GROUP = "group:"  # GROUP + service: what the consumer group <prefix><service> has not committed yet
CHECKPOINTS = "checkpoints:"  # CHECKPOINTS + topic: the positions of the last checkpoints in that topic
LATEST = "latest"  # a checkpoint topic: from the first record of each partition's last whole checkpoint
NEEDS = "needs:"  # NEEDS + topic: what the last checkpoints in that topic say their restores read of this one
OPTIONAL_GROUP = "optional-group:"  # as GROUP, for an optional duty's group: nothing until it first committed
# SPARK_DUTY + duty (windows, assembly): the Spark duty's group once it committed; before, what the registered
# queries it serves read when it first runs (nothing while none is registered)
SPARK_DUTY = "spark-duty:"
# REGISTRATIONS + checkpoint topic: where the registrations those checkpoints may lack apply in this log (routed)
REGISTRATIONS = "registrations:"
# the offsets ingest's snapshot matches (routed: registrations move it to their point; encoded: ingest restores
# from it, whole shards move it to their position)
BASE = "base"
WHOLE_SHARDS = "whole-shards"  # what each whole shard's restore reads (encoded): checkpoint, committed offset
LAST_CHANGE = "last-change"  # the record of the log's last change: the seq a registration answers as of (encoded)
RULES = ","  # several readers: the floor is the lowest of their rules'


@dataclass(frozen=True)
class TopicSpec:
    """One catalogue entry.  ``partitions=None`` means "the configured ``--partitions``".

    ``retention_ms`` is set on the topic (``KEPT`` = -1, never deleted by age); ``needed_from`` says which of
    its records the fleet still needs (``FROM_START``, ``NOTHING``, ``GROUP + service``, ...; several readers'
    rules joined by ``RULES``), for :func:`services.commands.floor.floor`.
    """

    name: str
    partitions: int | None
    key: str
    doc: str
    cleanup_policy: str = "delete"
    configs: Mapping[str, str] = field(default_factory=dict)
    retention_ms: int = KEPT
    needed_from: str = FROM_START

    @property
    def rules(self) -> list[str]:
        """``needed_from`` as one rule per reader."""
        return self.needed_from.split(RULES)

    @property
    def restored_from(self) -> bool:
        """Whether a restore reads it (from offset 0, or from what a checkpoint says): deleted records it needs
        stop the restore."""
        return any(rule in (FROM_START, BASE, WHOLE_SHARDS) or rule.startswith((CHECKPOINTS, NEEDS))
                   for rule in self.rules)

    @property
    def unbounded(self) -> bool:
        """Whether no record may be deleted by age or size: a topic read from offset 0 (the compacted ones), or a
        checkpoint topic (whose writer deletes its older checkpoints itself)."""
        return self.needed_from in (FROM_START, LATEST)

    def partitions_for(self, settings: KafkaSettings) -> int:
        return settings.partitions if self.partitions is None else self.partitions

    def topic_configs(self) -> dict[str, str]:
        """The catalogue's configs (``--topic-config`` may change them: :func:`wanted_configs`).  A topic read
        from offset 0 is never deleted by size either (``retention.bytes=-1``)."""
        size = {"retention.bytes": "-1"} if self.unbounded else {}
        return {"cleanup.policy": self.cleanup_policy, "retention.ms": str(self.retention_ms), **size, **self.configs}


# Compacted topics keep the latest value per key forever; a small dirty ratio keeps them compact-ish.
_COMPACT = {"min.cleanable.dirty.ratio": "0.1"}

_COMPACTED = " Compacted, retention.ms=-1, retention.bytes=-1: read from offset 0, the latest value per key is kept."
_CHECKPOINT = (" state as of an input position, in chunks of one transaction): partition p holds shard p's. The"
               " writer deletes the older checkpoints itself (delete_records): cleanup.policy=delete, never by age.")
_WEEK = " Bounded: 7 days by default (--topic-config TOPIC:retention.ms=MS)."

TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec("updates.raw", 1, "none", "Triple insertions/deletions as produced; one partition = the graph's change order."
              + _WEEK + " Ingest restores from updates.encoded, not from here: it needs only what its group "
              "has not committed.", retention_ms=WEEK_MS, needed_from=GROUP + "ingest"),
    TopicSpec("updates.encoded", 1, "none", "Dictionary-encoded, deduplicated changes with their 1-based seq: the total-order change log."
              " Kept (retention.ms=-1): ingest restores from its snapshot and the log after it, a whole shard from"
              " its checkpoint (or that snapshot moved to its position) and the log after it, the Spark windows"
              " from their group's offsets; the floor (cbgp topics floor) is the lowest of what those read.",
              needed_from=RULES.join((BASE, WHOLE_SHARDS, SPARK_DUTY + "windows", LAST_CHANGE))),
    TopicSpec("updates.routed", None, "centre term id", "Each change routed to the star-state partition(s) of its subject and/or object."
              " Kept (retention.ms=-1): a worker restores a shard from its checkpoint and the log after it, and a"
              " registration moves ingest's snapshot to its point of the log; the floor (cbgp topics floor) is the"
              " lowest of what those read.",
              needed_from=RULES.join((NEEDS + "checkpoints.routed", REGISTRATIONS + "checkpoints.routed", BASE))),
    TopicSpec("dictionary", None, "term id or value hash",
              "Term ids -> N-Triples terms (a DictionaryColumns record of one ingest transaction's new terms, or a"
              " DictionaryEntry of one); rebuilt by ingest on restart." + _COMPACTED,
              "compact", _COMPACT),
    TopicSpec("admin", 1, "none", "REGISTER / UNREGISTER / LIST commands, in the order users sent them." + _WEEK
              + " The registry restores from queries.plans: it needs only what its group has not committed.",
              retention_ms=WEEK_MS, needed_from=GROUP + "registry"),
    TopicSpec("queries.plans", None, "query id", "Current plan of every registered query (tombstone = unregistered)."
              + _COMPACTED, "compact", _COMPACT),
    TopicSpec("queries.status", 1, "none", "Registry replies: accepted, rejected (with line/column), listed." + _WEEK
              + " Read only by the command waiting for its reply, from the end offset it saw before asking.",
              retention_ms=WEEK_MS, needed_from=NOTHING),
    TopicSpec("deltas.parts", None, "query id", "Per-part +/- deltas from the state workers, with idempotence keys."
              " Kept by default (retention.ms=-1), but the answers service restores each partition from its last"
              " checkpoint in checkpoints.deltas and the deltas after it, and the Spark job's assembly reads from"
              " its group's offsets: what lies below both may be deleted.",
              needed_from=CHECKPOINTS + "checkpoints.deltas" + RULES + SPARK_DUTY + "assembly"),
    TopicSpec("answers", None, "query id", "Numbered per-query answer deltas (resume from n, detect gaps)."
              + _WEEK + " The answers service restores each partition from its last checkpoint in checkpoints.deltas"
              " and the answers after it; the Spark job's compaction folds them into its Parquet snapshot (its group"
              " commits what it folded); answers.current holds the current answers whatever was deleted.",
              retention_ms=WEEK_MS, needed_from=NEEDS + "checkpoints.deltas" + RULES + OPTIONAL_GROUP
              + "spark-compaction"),
    TopicSpec("answers.current", None, "query id + binding", "Current answers with multiplicity; tombstone on retraction."
              + _COMPACTED, "compact", _COMPACT),
    TopicSpec("checkpoints.ingest", 1, "kind/partition", "Ingest's last snapshot: presence set, seq and published"
              " terms, as of its updates.encoded and dictionary positions, in chunks of one transaction. The writer"
              " deletes the older snapshots itself (delete_records): cleanup.policy=delete, never by age.",
              needed_from=LATEST),
    TopicSpec("checkpoints.routed", None, "kind/partition", "Each routed shard's last checkpoint (the worker's"
              + _CHECKPOINT, needed_from=LATEST),
    TopicSpec("checkpoints.whole", None, "kind/partition", "Each whole shard's last checkpoint (the worker's"
              + _CHECKPOINT, needed_from=LATEST),
    TopicSpec("checkpoints.deltas", None, "kind/partition", "Each deltas.parts partition's last checkpoint (the"
              " answers service's" + _CHECKPOINT, needed_from=LATEST),
    TopicSpec("deadletter", 1, "none", "Rejected inputs with the service, source position and reason." + _WEEK
              + " For people (cbgp deadletters); no service reads it back.", retention_ms=WEEK_MS, needed_from=NOTHING),
)

_BY_NAME = {t.name: t for t in TOPICS}


def spec(name: str) -> TopicSpec:
    """The catalogue entry for ``name`` (unprefixed), or a clear :class:`KeyError`."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown topic {name!r}; catalogue: {', '.join(_BY_NAME)}") from None


def _ms(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def retention_problems(topic: str, spec: TopicSpec, configs: Mapping[str, str | None],
                       wanted: Mapping[str, str] | None = None) -> list[str]:
    """What in ``topic``'s configs (``describe_configs`` values) keeps less than the fleet needs, one line each.

    A topic read from offset 0 (``spec.needed_from == FROM_START``: the compacted topics) or a checkpoint topic must
    never lose records by age or size; a bounded one must keep them at least as long as ``wanted`` (its
    :func:`wanted_configs`, by default the catalogue's) says.  A compacted topic must be compacted (and not also
    deleted by age), a log must not be compacted (compaction would drop all but the last record per key).
    """
    wanted = spec.topic_configs() if wanted is None else wanted
    problems: list[str] = []
    policy = {p.strip() for p in (configs.get("cleanup.policy") or "delete").split(",")}
    if spec.cleanup_policy == "compact" and "compact" not in policy:
        problems.append(f"{topic}: cleanup.policy={','.join(sorted(policy))}, needs compact "
                        "(the latest value of every key is read from offset 0)")
    if spec.cleanup_policy != "compact" and "compact" in policy:
        problems.append(f"{topic}: cleanup.policy={','.join(sorted(policy))}, needs delete "
                        "(compaction would drop all but the last record of each key)")
    retention = _ms(configs.get("retention.ms"))
    if spec.unbounded:
        why = ("it holds the last checkpoints, whose writers delete the older ones themselves"
               if spec.needed_from == LATEST else "a restore reads it from offset 0")
        if "delete" in policy and retention != KEPT:
            problems.append(f"{topic}: retention.ms={configs.get('retention.ms')}, needs -1 ({why})")
        size = _ms(configs.get("retention.bytes"))
        if "delete" in policy and size is not None and size != -1:
            problems.append(f"{topic}: retention.bytes={size}, needs -1 (a restore reads it from offset 0)")
    else:
        minimum = _ms(wanted.get("retention.ms"))
        if minimum is not None and retention is not None and retention != KEPT and (
                minimum == KEPT or retention < minimum):
            problems.append(f"{topic}: retention.ms={retention}, needs "
                            + ("-1" if minimum == KEPT else f"at least {minimum}"))
    return problems


def wanted_configs(spec: TopicSpec, settings: KafkaSettings) -> dict[str, str]:
    """``spec``'s configs with the settings' ``--topic-config`` changes for it.  Raises :class:`TopicError` for a
    change that would let a compacted or checkpoint topic lose records (a finite ``retention.ms`` or
    ``retention.bytes``, another ``cleanup.policy``): nothing but their own writers may bound them."""
    configs = {**spec.topic_configs(), **settings.topic_configs.get(spec.name, {})}
    if spec.unbounded:
        problems = retention_problems(spec.name, spec, configs)
        if problems:
            raise TopicError("--topic-config / CBGP_TOPIC_CONFIG would lose records a restore needs: "
                             + "; ".join(problems))
    return configs


def _check_overrides(settings: KafkaSettings) -> None:
    unknown = sorted(set(settings.topic_configs) - set(_BY_NAME))
    if unknown:
        raise TopicError(f"--topic-config / CBGP_TOPIC_CONFIG names unknown topic(s) {', '.join(unknown)} "
                         f"(unprefixed catalogue names: {', '.join(_BY_NAME)})")


def catalogue(settings: KafkaSettings) -> list[dict[str, object]]:
    """The catalogue resolved for ``settings`` (prefixed names, concrete partition counts, ``--topic-config``
    applied), for ``cbgp topics list``."""
    _check_overrides(settings)
    entries: list[dict[str, object]] = []
    for t in TOPICS:
        configs = wanted_configs(t, settings)
        entries.append({
            "name": settings.topic(t.name),
            "partitions": t.partitions_for(settings),
            "replication_factor": settings.replication_factor,
            "cleanup_policy": configs.get("cleanup.policy", t.cleanup_policy),
            "retention_ms": _ms(configs.get("retention.ms")),
            "key": t.key,
            "configs": configs,
            "doc": t.doc,
        })
    return entries


def check_existing_configs(admin: Any, settings: KafkaSettings, specs: Mapping[str, TopicSpec],
                           timeout: float = 15.0) -> list[str]:
    """Read the configs of the existing topics ``specs`` (prefixed name -> spec) with ``describe_configs`` and
    compare them with what the fleet needs (:func:`retention_problems` against :func:`wanted_configs`).

    Raises :class:`TopicError`, one line naming every problem, when a compacted or checkpoint topic would lose
    records (a restore from it would come back with silently wrong state).  Problems of bounded topics are logged as a
    warning and returned.  A broker or client that cannot describe configs (no DescribeConfigs support or ACL)
    is logged in one line and the check is skipped: truncation is still caught when a restore reads the log
    (:mod:`services.kafka.truncation`).
    """
    if not specs:
        return []
    resources = {name: ConfigResource(ConfigResource.Type.TOPIC, name) for name in specs}
    try:
        futures = admin.describe_configs(list(resources.values()), request_timeout=timeout)
        described = {name: futures[resource].result(timeout) for name, resource in resources.items()}
    except Exception as exc:  # noqa: BLE001 - KafkaException, NotImplementedError, a timeout: all mean "cannot check"
        reason = exc.args[0].str() if isinstance(exc, KafkaException) and hasattr(exc.args[0], "str") else str(exc)
        log.warning(f"event=topic-config-check-skipped reason={reason!r}: cannot describe the configs of existing "
                    "topics, their retention is not checked (records already deleted are still caught when a "
                    "restore reads them)")
        return []
    fatal: list[str] = []
    warnings: list[str] = []
    for name, spec in specs.items():
        values = {k: v.value for k, v in described[name].items()}
        problems = retention_problems(name, spec, values, wanted_configs(spec, settings))
        (fatal if spec.unbounded else warnings).extend(problems)
    for problem in warnings:
        log.warning(f"event=topic-config problem={problem!r}")
    if fatal:
        raise TopicError("refusing to start: existing topics would lose records a restore reads from offset 0: "
                         + "; ".join(fatal) + " (set them with kafka-configs.sh --alter --entity-type topics "
                         "--entity-name TOPIC --add-config retention.ms=-1,retention.bytes=-1; `cbgp doctor` checks)")
    return warnings


def ensure_topics(
    settings: KafkaSettings,
    specs: tuple[TopicSpec, ...] | list[TopicSpec] = TOPICS,
    timeout: float = 15.0,
    check_configs: bool = True,
) -> list[str]:
    """Create the missing catalogue topics; return the names created (idempotent: ``[]`` the second time).

    Raises :class:`TopicError` if an existing topic has a different partition count (keys would land on
    other partitions than the fleet expects: fix by deleting the topic or changing ``--partitions``), if an
    existing topic a restore reads from offset 0 may lose records (:func:`check_existing_configs`, unless
    ``check_configs`` is False), if ``--topic-config`` asks for such a topic to lose records, or if the broker
    refuses a creation.
    """
    if specs is TOPICS:
        _check_overrides(settings)
    configs = {settings.topic(t.name): wanted_configs(t, settings) for t in specs}
    admin = AdminClient(settings.admin_config())
    wanted = {settings.topic(t.name): t for t in specs}
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise BrokerUnreachable(f"cannot list topics on {settings.bootstrap_servers}: {exc.args[0]}") from None

    mismatches = [
        f"{name} has {len(existing[name].partitions)} partitions, expected {t.partitions_for(settings)}"
        for name, t in wanted.items()
        if name in existing and len(existing[name].partitions) != t.partitions_for(settings)
    ]
    if mismatches:
        raise TopicError(
            "topic partition count mismatch: " + "; ".join(mismatches)
            + " (delete the topics or use the --partitions they were created with)"
        )

    if check_configs:
        check_existing_configs(admin, settings, {n: t for n, t in wanted.items() if n in existing}, timeout)

    new = [
        NewTopic(name, num_partitions=t.partitions_for(settings),
                 replication_factor=settings.replication_factor, config=configs[name])
        for name, t in wanted.items()
        if name not in existing
    ]
    if not new:
        return []
    created: list[str] = []
    errors: list[str] = []
    for name, future in admin.create_topics(new, request_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
            created.append(name)
        except KafkaException as exc:
            err = exc.args[0]
            # A concurrent creator (another service starting at the same time) is not an error.
            if getattr(err, "name", lambda: "")() == "TOPIC_ALREADY_EXISTS":
                continue
            errors.append(f"{name}: {err.str() if hasattr(err, 'str') else err}")
    if errors:
        raise TopicError("cannot create topics: " + "; ".join(errors))
    _wait_visible(admin, [t.topic for t in new], timeout)
    return created


def _wait_visible(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Wait until metadata lists the new topics, so a producer right after this call never auto-creates them."""
    deadline = time.monotonic() + timeout
    while True:
        topics = admin.list_topics(timeout=timeout).topics
        if all(n in topics and topics[n].error is None and topics[n].partitions for n in names):
            return
        if time.monotonic() > deadline:
            missing = [n for n in names if n not in topics]
            raise TopicError(f"topics created but not visible in metadata after {timeout}s: {', '.join(missing)}")
        time.sleep(0.05)

