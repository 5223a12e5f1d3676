"""Recovery: a state restored from its checkpoint and the tails of its logs, the Kafka side
of :mod:`services.state` (whose store and checkpoint decisions stay Kafka-free).

How it works: docs/design/internals.md, services.runtime.recovery.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from confluent_kafka import Consumer, Message, TopicPartition

from services.metrics.instruments import RESTORE_PROGRESS
from services.kafka.config import KafkaSettings
from services.kafka.checkpoint_log import CheckpointLog
from services.wire.loglines import kv
from services.kafka.replay import read_range
from services.state import presence
from services.state.checkpointing import DEFAULT_CHECKPOINT_BUDGET, Checkpoint, Checkpointer, unusable
from services.state.shards import ShardCheckpoints
from services.state.store import Store, StoreError

__all__ = ["ForeignLog", "saved_checkpoint", "serving_checkpoint", "read_tails", "log_ends", "open_store",
           "shard_checkpoints", "add_state_flags", "ingest_snapshot"]

log = logging.getLogger("cbgp.state")

Positions = Mapping[str, Mapping[int, int]]


class ForeignLog(Exception):
    """A log read after a checkpoint's position does not continue the checkpointed state."""


def saved_checkpoint(store: Store, watermarks: Mapping[str, Mapping[int, tuple[int, int]]],
                     facts: Iterable[str] = ()) -> Checkpoint | None:
    """The store's checkpoint if it can serve a restore from logs with these ``(low, high)`` ``watermarks`` and
    records every name in ``facts``; else None, the store cleared (one log line says why)."""
    record = store.checkpoint()
    if record is None:
        return None
    checkpoint, reason = serving_checkpoint(record, watermarks, facts)
    if reason is not None:
        discard(store, reason)
    return checkpoint


def serving_checkpoint(record: Any, watermarks: Mapping[str, Mapping[int, tuple[int, int]]],
                       facts: Iterable[str] = ()) -> tuple[Checkpoint | None, str | None]:
    """``(checkpoint, None)`` when the checkpoint ``record`` (from a store or a snapshot in Kafka) can serve a
    restore from logs with these ``watermarks`` and records every name in ``facts``; else ``(None, why)``."""
    try:
        checkpoint = Checkpoint.from_json(record)
        missing = [name for name in facts if name not in checkpoint.facts]
        reason = unusable(checkpoint, watermarks) or (f"it does not record {', '.join(missing)}" if missing else None)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        reason = f"unreadable checkpoint record ({exc})"
    return (checkpoint, None) if reason is None else (None, reason)


def load_ingest_snapshot(settings: KafkaSettings, reader: str) -> tuple[dict, dict, list[tuple[int, str]]] | None:
    """Ingest's latest snapshot in ``checkpoints.ingest``, loaded: ``(checkpoint record, presence set with insert
    seqs, published terms)`` (``services.state.presence.load_snapshot``); None when there is none, it cannot be
    read (one log line, :meth:`CheckpointLog.get`) or it is of another format.  ``reader``: who reads it."""
    blob = _ingest_snapshot_blob(settings, reader)
    return presence.load_snapshot(blob) if blob is not None else None


def ingest_snapshot_record(settings: KafkaSettings, reader: str) -> dict | None:
    """The checkpoint record of ingest's latest snapshot alone (its positions and facts), None as
    :func:`load_ingest_snapshot`: for a reader of where it stands, not of its state."""
    blob = _ingest_snapshot_blob(settings, reader)
    return presence.snapshot_record(blob) if blob is not None else None


def _ingest_snapshot_blob(settings: KafkaSettings, reader: str) -> bytes | None:
    remote = CheckpointLog(settings, {"ingest": settings.topic("checkpoints.ingest")}, reader)
    try:
        saved = remote.get("ingest", 0)
    finally:
        remote.close()
    return saved.blob if saved is not None else None


def ingest_snapshot(settings: KafkaSettings, reader: str, logs: Iterable[str]
                    ) -> tuple[tuple[Checkpoint, dict, list[tuple[int, str]]] | None, str]:
    """Ingest's latest snapshot in Kafka (``checkpoints.ingest``: its presence set with insert seqs, its terms
    and the positions they reflect) if it can serve a reader of ``logs`` (catalogue names) as they are now:
    ``((checkpoint, presence, terms), "")``, else ``(None, why)``.  For the readers that start from ingest's
    state rather than from offset 0: the gateway's /query graph, a worker's routed bases."""
    from services.kafka.client import end_offsets

    loaded = load_ingest_snapshot(settings, reader)
    if loaded is None:
        return None, "no readable snapshot of ingest's state in Kafka"
    record, present, terms = loaded
    watermarks = {settings.topic(name): end_offsets(settings, settings.topic(name)) for name in logs}
    checkpoint, why = serving_checkpoint(record, watermarks, ("seq",))
    if checkpoint is None:
        return None, f"ingest's snapshot cannot serve these logs ({why})"
    return (checkpoint, present, terms), ""


def discard(store: Store, reason: str) -> None:
    log.warning(kv(event="checkpoint-discarded", store=store.path, reason=reason))
    store.clear()


def read_tails(settings: KafkaSettings, starts: Positions, ends: Positions, apply: Callable[[str, int, Message], None],
               label: str, every: int = 2000) -> int:
    """Hand every committed record of each topic partition in ``ends`` from its ``starts`` offset up to its end to
    ``apply(topic, partition, message)``, topics in the order of ``ends``; return the number of records.
    ``label``: the ``partition`` label of ``cbgp_restore_progress_ratio`` (the share of the records read)."""
    total = sum(max(end - starts[t][p], 0) for t, parts in ends.items() for p, end in parts.items())
    gauge = RESTORE_PROGRESS.labels(label)
    gauge.set(0.0 if total else 1.0)
    done, last_log = 0, time.monotonic()
    for topic, parts in ends.items():
        for partition, end in sorted(parts.items()):
            for msg in read_range(settings, topic, partition, starts[topic][partition], end):
                apply(topic, partition, msg)
                done += 1
                if done % every == 0:
                    ratio = min(done / total, 1.0)
                    gauge.set(ratio)
                    if time.monotonic() - last_log > 5:
                        last_log = time.monotonic()
                        log.info(kv(event="restoring", topic=topic, partition=partition, offset=msg.offset(), end=end,
                                    records=done, of=total, ratio=round(ratio, 3)))
    gauge.set(1.0)
    return done


def log_ends(consumer: Consumer, topics: Mapping[str, Iterable[int]]) -> dict[str, dict[int, int]]:
    """High watermarks (the next offsets) of ``topics`` (topic -> partitions), through one ``consumer`` kept for
    that: after a service's committed transaction, the positions its state reflects in the logs it alone writes."""
    return {topic: {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
            for topic, parts in topics.items()}


def add_state_flags(parser: argparse.ArgumentParser, service: str, what: str) -> None:
    """``--state-dir`` and ``--checkpoint-interval`` of a service that checkpoints ``what``."""
    parser.add_argument("--state-dir", default=os.environ.get("CBGP_STATE_DIR", ".run/state"), metavar="DIR",
                        help=f"where {what} is also checkpointed on this instance's disk, in "
                             "<prefix>{service}-<instance-id> (default $CBGP_STATE_DIR or .run/state; empty: "
                             "only in Kafka)")
    parser.add_argument("--checkpoint-interval", type=float,
                        default=os.environ.get("CBGP_CHECKPOINT_INTERVAL", "10"), metavar="SECONDS",
                        help="at most this often under load, checkpoint after a committed transaction (default "
                             "$CBGP_CHECKPOINT_INTERVAL or 10; 0: after every transaction; negative: never, and "
                             "restores read the logs from 0)")
    parser.add_argument("--checkpoint-budget", type=_fraction,
                        default=os.environ.get("CBGP_CHECKPOINT_BUDGET", str(DEFAULT_CHECKPOINT_BUDGET)),
                        metavar="FRACTION",
                        help="with a positive interval, the share of the time checkpoints may take: after one that "
                             "took t seconds the next waits at least t / FRACTION (default $CBGP_CHECKPOINT_BUDGET "
                             f"or {DEFAULT_CHECKPOINT_BUDGET})")


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"a fraction of the time in (0, 1] is needed, got {value}")
    return value


def shard_checkpoints(args: argparse.Namespace, settings: KafkaSettings, service: str,
                      kinds: Mapping[str, str]) -> tuple[ShardCheckpoints | None, Checkpointer]:
    """A service's checkpoints and when to write them (``--checkpoint-interval``; negative: none, and None here):
    in its store (``<prefix><service>-<instance-id>`` under ``--state-dir``, when given and it opens) and in the
    checkpoint topics ``kinds`` names per shard kind (catalogue names)."""
    interval = getattr(args, "checkpoint_interval", -1.0)
    if interval < 0:
        return None, Checkpointer(0.0)
    store = open_store(getattr(args, "state_dir", ""), f"{settings.topic_prefix}{service}-{args.instance_id}")
    remote = CheckpointLog(settings, {kind: settings.topic(name) for kind, name in kinds.items()}, args.instance_id)
    return ShardCheckpoints(store, remote), Checkpointer(interval, budget=checkpoint_budget(args))


def checkpoint_budget(args: argparse.Namespace) -> float:
    return getattr(args, "checkpoint_budget", DEFAULT_CHECKPOINT_BUDGET)


def open_store(state_dir: str | Path, name: str) -> Store | None:
    """The store ``<state_dir>/<name>``; None when ``state_dir`` is empty (checkpoints off) or the store cannot
    be opened (one log line: the service runs on, restoring from its logs' start)."""
    if not state_dir:
        return None
    try:
        return Store(Path(state_dir) / name)
    except StoreError as exc:
        log.warning(kv(event="checkpoints-off", reason=str(exc)))
        return None
