"""The fleet's topic catalogue, as data, and the code that creates it on a broker.

Every topic is pre-created with an explicit partition count: auto-creation gives 1 partition on Kafka and
noida-db, which would silently break key->partition co-partitioning between services.  Topics whose order
*is* the semantics (the graph's change order, the admin log) have exactly one partition whatever
``--partitions`` says.

Retention is explicit on every topic (``retention.ms``), chosen for its role, because a broker's default (7 days
on Apache Kafka) would silently delete history the restores replay:

- **kept** (``retention.ms=-1``): the logs a restore replays from offset 0 (``updates.encoded``,
  ``updates.routed``, ``deltas.parts``, ``answers``), until checkpointed state (issue 16) lets them be bounded;
- **compacted** (``cleanup.policy=compact``, ``retention.ms=-1``): the latest value per key, read from offset 0;
- **bounded** (7 days): the inputs whose consumers restore from elsewhere and need only what their group has not
  committed yet (``updates.raw``, ``admin``), and what no service reads back (``queries.status``, ``deadletter``).

:func:`services.kafka.floor.floor` says, per partition, the lowest offset the fleet still needs (``cbgp topics floor``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from services.kafka.config import KafkaSettings

__all__ = ["TopicSpec", "TopicError", "BrokerUnreachable", "TOPICS", "catalogue", "ensure_topics", "spec", "KEPT", "WEEK_MS", "FROM_START", "NOTHING", "GROUP"]


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


@dataclass(frozen=True)
class TopicSpec:
    """One catalogue entry.  ``partitions=None`` means "the configured ``--partitions``".

    ``retention_ms`` is set on the topic (``KEPT`` = -1, never deleted by age); ``needed_from`` says which of
    its records the fleet still needs (``FROM_START``, ``NOTHING`` or ``GROUP + service``), for
    :func:`services.kafka.floor.floor`.
    """

    name: str
    partitions: int | None
    key: str
    doc: str
    cleanup_policy: str = "delete"
    configs: Mapping[str, str] = field(default_factory=dict)
    retention_ms: int = KEPT
    needed_from: str = FROM_START

    def partitions_for(self, settings: KafkaSettings) -> int:
        return settings.partitions if self.partitions is None else self.partitions

    def topic_configs(self) -> dict[str, str]:
        return {"cleanup.policy": self.cleanup_policy, "retention.ms": str(self.retention_ms), **self.configs}


# Compacted topics keep the latest value per key forever; a small dirty ratio keeps them compact-ish.
_COMPACT = {"min.cleanable.dirty.ratio": "0.1"}

_REPLAYED = " Kept (retention.ms=-1): {} replays it from offset 0; checkpoints (issue 16) will let it be bounded."
_COMPACTED = " Compacted, retention.ms=-1: read from offset 0, the latest value per key is kept."
_WEEK = " Bounded: 7 days."

TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec("updates.raw", 1, "none", "Triple insertions/deletions as produced; one partition = the graph's change order."
              + _WEEK + " Ingest restores from updates.encoded, not from here: it needs only what its group "
              "has not committed.", retention_ms=WEEK_MS, needed_from=GROUP + "ingest"),
    TopicSpec("updates.encoded", 1, "none", "Dictionary-encoded, deduplicated changes with their 1-based seq: the total-order change log."
              + _REPLAYED.format("ingest (presence set, seq) and every worker")),
    TopicSpec("updates.routed", None, "centre term id", "Each change routed to the star-state partition(s) of its subject and/or object."
              + _REPLAYED.format("each worker (its shards' star state)")),
    TopicSpec("dictionary", None, "term id", "Term id -> N-Triples term; rebuilt by ingest on restart." + _COMPACTED,
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
              + _REPLAYED.format("answers (DISTINCT counts, up to its committed position)")),
    TopicSpec("answers", None, "query id", "Numbered per-query answer deltas (resume from n, detect gaps)."
              + _REPLAYED.format("answers (numbering, multiplicities)")),
    TopicSpec("answers.current", None, "query id + binding", "Current answers with multiplicity; tombstone on retraction."
              + _COMPACTED, "compact", _COMPACT),
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


def catalogue(settings: KafkaSettings) -> list[dict[str, object]]:
    """The catalogue resolved for ``settings`` (prefixed names, concrete partition counts), for ``cbgp topics list``."""
    return [
        {
            "name": settings.topic(t.name),
            "partitions": t.partitions_for(settings),
            "replication_factor": settings.replication_factor,
            "cleanup_policy": t.cleanup_policy,
            "retention_ms": t.retention_ms,
            "key": t.key,
            "configs": t.topic_configs(),
            "doc": t.doc,
        }
        for t in TOPICS
    ]


def ensure_topics(
    settings: KafkaSettings,
    specs: tuple[TopicSpec, ...] | list[TopicSpec] = TOPICS,
    timeout: float = 15.0,
) -> list[str]:
    """Create the missing catalogue topics; return the names created (idempotent: ``[]`` the second time).

    Raises :class:`TopicError` if an existing topic has a different partition count (keys would land on
    other partitions than the fleet expects: fix by deleting the topic or changing ``--partitions``), or if
    the broker refuses a creation.
    """
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

    new = [
        NewTopic(name, num_partitions=t.partitions_for(settings),
                 replication_factor=settings.replication_factor, config=t.topic_configs())
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

