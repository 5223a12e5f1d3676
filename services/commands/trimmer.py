"""``make run``'s trimmer: every ``--trim-interval`` seconds, ``cbgp topics trim`` on the fleet's internal logs.

The embedded broker (noida-db) rewrites everything it stores as one JSON file about once a second while data
changes, so its CPU grows with the history it keeps, not with the rate: 135 MB of JSON after 150,000 LSBench
updates, and a broker that saturates a core after a few minutes of load.  Records below the floor are ones no
service and no restore will read again (:func:`services.commands.floor.floor`); deleting them keeps what the
broker holds to about a checkpoint interval of each log.  Only the internal logs are trimmed: the answers and
the dead letters stay for users to read back, and the compacted topics keep their latest values.  A Helm
deployment trims with its ``topicsTrim`` CronJob instead.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from services.commands.floor import delete_below, trim
from services.kafka.client import make_consumer, watermarks
from services.kafka.config import KafkaSettings
from services.kafka.topics import GROUP, RULES, TOPICS
from services.wire.settings import ms_setting

__all__ = ["INTERNAL_LOGS", "QUICK_LOGS", "QUICK_INTERVAL_SECONDS", "Trimmer"]

# The logs only the fleet reads, each needed back to its floor at most.
INTERNAL_LOGS = ("updates.raw", "updates.encoded", "updates.routed", "deltas.parts")
WATCHED = ("checkpoints.ingest", "checkpoints.routed", "checkpoints.whole", "checkpoints.deltas")
# Those whose floor is one consumer group's committed offset alone: {log: group service}.
QUICK_LOGS = {spec.name: spec.needed_from[len(GROUP):] for spec in TOPICS if spec.name in INTERNAL_LOGS
              and spec.needed_from.startswith(GROUP) and RULES not in spec.needed_from}
# 0: the quick logs wait for the full pass too.
QUICK_INTERVAL_SECONDS = ms_setting("CBGP_TRIM_QUICK_INTERVAL_MS", 1000, minimum=0)


class Trimmer:
    """A thread that trims ``INTERNAL_LOGS`` every ``interval`` seconds and ``QUICK_LOGS`` every
    ``quick_interval``, one line per full pass (or failure) in ``log_path``; :meth:`close` stops it."""

    def __init__(self, settings: KafkaSettings, interval: float, log_path: Path,
                 quick_interval: float = QUICK_INTERVAL_SECONDS) -> None:
        self.settings, self.interval, self.log_path = settings, interval, log_path
        self.quick_interval = min(quick_interval, interval) if quick_interval > 0 else interval
        self.stopping = threading.Event()
        self.trims = 0  # full passes that deleted something
        self.quick_trims = 0  # quick trims that deleted something
        self.thread = threading.Thread(target=self._run, name="trimmer", daemon=True)

    def start(self) -> "Trimmer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.thread.start()
        return self

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(30)

    def _ends(self, consumer: Consumer) -> dict[str, dict[int, tuple[int, int]]]:
        """The watermarks of the internal logs and of the checkpoints their floors follow: while none moves,
        the floors do not either.  (One consumer for the trimmer's life, not a new one per topic at every look:
        each connects to the broker and fetches its metadata.)"""
        return {name: watermarks(consumer, self.settings.topic(name)) for name in INTERNAL_LOGS + WATCHED}

    def _quick(self, admin: AdminClient, consumer: Consumer, groups: dict[str, Consumer]) -> int:
        """Delete each quick log's records below its group's committed offset; the partitions trimmed.  (The
        clients are the thread's: no new connection per look.)"""
        cut = 0
        for name, group in groups.items():
            topic = self.settings.topic(name)
            committed = group.committed([TopicPartition(topic, p) for p in watermarks(consumer, topic)], timeout=10)
            cut += len(delete_below(admin, consumer, topic, {tp.partition: tp.offset for tp in committed}, 10))
        return cut

    def _run(self) -> None:
        consumer = Consumer(self.settings.consumer_config(f"{self.settings.topic_prefix}trimmer",
                                                          enable_partition_eof=False))
        groups = {name: make_consumer(self.settings, f"{self.settings.topic_prefix}{service}")
                  for name, service in QUICK_LOGS.items()} if self.quick_interval < self.interval else {}
        admin = AdminClient(self.settings.admin_config())
        try:
            self._loop(consumer, admin, groups)
        finally:
            for group in groups.values():
                group.close()
            consumer.close()

    def _loop(self, consumer: Consumer, admin: AdminClient, groups: dict[str, Consumer]) -> None:
        seen: dict | None = None  # the logs' watermarks at the last trim: unchanged, nothing can be trimmed
        quick_failed = False  # (one line per streak of failed quick trims)
        due = time.monotonic() + self.interval
        with open(self.log_path, "a", encoding="utf-8") as log:
            while not self.stopping.wait(max(0.0, min(self.quick_interval, due - time.monotonic()))):
                started = time.monotonic()
                if started < due:
                    try:
                        self.quick_trims += self._quick(admin, consumer, groups) > 0
                        quick_failed = False
                    except Exception as exc:  # noqa: BLE001 - one line; the next look tries again
                        if not quick_failed:
                            log.write(f"ts={time.strftime('%Y-%m-%dT%H:%M:%S')} event=quick-trim-failed "
                                      f"reason={type(exc).__name__}: "
                                      f"{str(exc).splitlines()[0] if str(exc) else ''}\n")
                            log.flush()
                        quick_failed = True
                    continue
                due = started + self.interval
                try:
                    ends = self._ends(consumer)
                    if ends == seen:
                        continue  # an idle fleet: no trim, no cost
                    cut = trim(self.settings, names=INTERNAL_LOGS)
                    seen = self._ends(consumer)
                except Exception as exc:  # noqa: BLE001 - one line; the next interval tries again
                    log.write(f"ts={time.strftime('%Y-%m-%dT%H:%M:%S')} event=trim-failed "
                              f"reason={type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}\n")
                else:
                    if cut:
                        self.trims += 1
                    where = ",".join(f"{topic.removeprefix(self.settings.topic_prefix)}[{p}]@{offset}"
                                     for topic, parts in sorted(cut.items()) for p, offset in sorted(parts.items()))
                    log.write(f"ts={time.strftime('%Y-%m-%dT%H:%M:%S')} event=trimmed "
                              f"seconds={time.monotonic() - started:.3f} logs={where or '-'} "
                              f"quick_trims={self.quick_trims}\n")
                log.flush()
