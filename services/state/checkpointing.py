"""Checkpoints: what a saved state reflects, when to save one, and whether a saved one may serve a restore.

How it works: docs/design/internals.md, services.state.checkpointing.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from services.wire.settings import whole_setting

__all__ = ["Checkpoint", "Checkpointer", "unusable", "FORMAT"]

FORMAT = 1  # the checkpoint record's layout; another one is refused (restore from the logs' start instead)


@dataclass(frozen=True)
class Checkpoint:
    """``positions``: topic -> partition -> first offset not reflected in the state.  ``facts``: numbers the
    service records with it (ingest: the last seq, the number of triples and terms), for checks and logs."""

    positions: Mapping[str, Mapping[int, int]]
    facts: Mapping[str, Any] = field(default_factory=dict)
    written_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "written_ms": self.written_ms, "facts": dict(self.facts),
                "positions": {topic: {str(p): int(o) for p, o in sorted(parts.items())}
                              for topic, parts in sorted(self.positions.items())}}

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> "Checkpoint":
        """Raises ValueError for a record of another format (or not a checkpoint at all)."""
        if not isinstance(record, Mapping) or record.get("format") != FORMAT:
            raise ValueError(f"not a format-{FORMAT} checkpoint record")
        positions = {topic: {int(p): int(o) for p, o in parts.items()} for topic, parts in record["positions"].items()}
        return cls(positions, dict(record.get("facts", {})), int(record.get("written_ms", 0)))

    def describe(self) -> str:
        """``topic[p]@offset`` for each position, for log lines."""
        return ",".join(f"{topic}[{p}]@{o}" for topic, parts in sorted(self.positions.items())
                        for p, o in sorted(parts.items()))


def unusable(checkpoint: Checkpoint, watermarks: Mapping[str, Mapping[int, tuple[int, int]]]) -> str | None:
    """Why ``checkpoint`` cannot serve a restore from the logs whose ``(low, high)`` watermarks per partition are
    ``watermarks`` (topic -> partition -> watermarks; the topics the restore reads); None when it can.

    Records deleted below a position (``low`` above it) do not make the checkpoint unusable: a checkpoint is
    what lets a restore survive retention; records deleted *above* a position are the reader's refusal."""
    for topic in sorted(watermarks):
        if topic not in checkpoint.positions:
            return f"it has no position in {topic}"
    for topic, parts in sorted(checkpoint.positions.items()):
        now = watermarks.get(topic)
        if now is None:
            return f"it has positions in {topic}, which the restore does not read (or which no longer exists)"
        if set(parts) != set(now):
            return f"{topic} has partitions {sorted(now)} but the checkpoint has positions in {sorted(parts)}"
        for partition, offset in sorted(parts.items()):
            high = now[partition][1]
            if offset > high:
                return (f"its position {offset} in {topic}[{partition}] is beyond the log's end {high}: the topic was "
                        "deleted and re-created, or the state was made against another cluster")
    return None


# The share of its time a service may spend writing checkpoints (``--checkpoint-budget``).
DEFAULT_CHECKPOINT_BUDGET = 0.05
# How much longer than its due time a checkpoint may come, at random, as a percentage (see Checkpointer).
SPREAD_SETTING, DEFAULT_SPREAD_PCT = "CBGP_CHECKPOINT_SPREAD_PCT", 50


def checkpoint_spread() -> float:
    """``CBGP_CHECKPOINT_SPREAD_PCT`` as a fraction (0: checkpoints exactly when due)."""
    return whole_setting(SPREAD_SETTING, DEFAULT_SPREAD_PCT, minimum=0, unit="percent") / 100


class Checkpointer:
    """When to checkpoint: :meth:`committed` after each committed transaction, :meth:`due` says whether one is
    due now (changes are unsaved and ``interval`` seconds passed since the last), :meth:`saved` after writing one.
    ``interval=0``: after every committed transaction.

    A checkpoint's cost grows with the state (a snapshot of it all goes to Kafka), so with a positive interval
    checkpoints also take at most ``budget`` of the time: after one that took ``t`` seconds, the next waits at
    least ``t / budget`` (a state that takes 1 s to save is saved at most every 20 s with the default 5%).

    Each wait is lengthened by a random share of itself, up to ``spread``: the services of a fleet start together
    with one interval, and their checkpoints (each a burst of CPU, in a forked child or a thread) would otherwise
    fall at the same moments for ever, the answers behind every one of them waiting for all of them."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic,
                 budget: float = DEFAULT_CHECKPOINT_BUDGET, spread: float | None = None,
                 draw: Callable[[], float] = random.random) -> None:
        if interval < 0:
            raise ValueError(f"checkpoint interval must be >= 0 seconds, got {interval}")
        if not 0 < budget <= 1:
            raise ValueError(f"checkpoint budget must be a fraction of the time in (0, 1], got {budget}")
        self.interval = interval
        self.budget = budget
        self.spread = checkpoint_spread() if spread is None else spread
        self.draw = draw
        self.clock = clock
        self.last = clock()
        self.pause = self._spread(interval)
        self.unsaved = False

    def committed(self) -> None:
        self.unsaved = True

    def due(self) -> bool:
        return self.unsaved and self.clock() - self.last >= self.pause

    def saved(self, took: float = 0.0) -> None:
        """A checkpoint was written (or taken, to be written in the background); it took ``took`` seconds."""
        self.unsaved = False
        self.last = self.clock()
        self.pause = self._spread(max(self.interval, took / self.budget)) if self.interval > 0 else 0.0

    def took(self, seconds: float) -> None:
        """The checkpoint taken at the last :meth:`saved` was written in the background in ``seconds`` in all:
        the next one waits for that too."""
        if self.interval > 0:
            self.pause = max(self.pause, self._spread(seconds / self.budget))

    def _spread(self, pause: float) -> float:
        return pause * (1 + self.spread * self.draw())
