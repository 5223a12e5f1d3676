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

from confluent_kafka import Consumer

from services.commands.floor import trim
from services.kafka.client import watermarks
from services.kafka.config import KafkaSettings

__all__ = ["INTERNAL_LOGS", "Trimmer"]

# The logs only the fleet reads, each needed back to its floor at most.
INTERNAL_LOGS = ("updates.raw", "updates.encoded", "updates.routed", "deltas.parts")
WATCHED = ("checkpoints.ingest", "checkpoints.routed", "checkpoints.whole", "checkpoints.deltas")


class Trimmer:
    """A thread that trims ``INTERNAL_LOGS`` every ``interval`` seconds, one line per trim (or failure) in
    ``log_path``; :meth:`close` stops it."""

    def __init__(self, settings: KafkaSettings, interval: float, log_path: Path) -> None:
        self.settings, self.interval, self.log_path = settings, interval, log_path
        self.stopping = threading.Event()
        self.trims = 0  # trims that deleted something
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

    def _run(self) -> None:
        consumer = Consumer(self.settings.consumer_config(f"{self.settings.topic_prefix}trimmer",
                                                          enable_partition_eof=False))
        try:
            self._loop(consumer)
        finally:
            consumer.close()

    def _loop(self, consumer: Consumer) -> None:
        seen: dict | None = None  # the logs' watermarks at the last trim: unchanged, nothing can be trimmed
        with open(self.log_path, "a", encoding="utf-8") as log:
            while not self.stopping.wait(self.interval):
                started = time.monotonic()
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
                              f"seconds={time.monotonic() - started:.3f} logs={where or '-'}\n")
                log.flush()
