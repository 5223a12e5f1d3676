"""What a transform hands to Kafka and how records are placed, with no Kafka client in it.

The transforms (``services.worker_core``, ``services.release``, the ingest and answers processors) and the
Spark job import these; the Kafka plumbing (``services.runtime``) produces the :class:`Output` s they return.

- :class:`Output`: one record to produce (topic, key, value, explicit partition, headers);
- :func:`query_partition`: the partition of everything keyed by query id;
- :data:`ORIGIN_HEADER`: the header carrying the raw record's time, for end-to-end latency;
- :func:`kv`: one structured log line (``key=value``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cbgp.terms import stable_term_id

__all__ = ["Output", "ORIGIN_HEADER", "query_partition", "kv"]

# Header carrying the time (epoch ms) at which the raw record that caused a change was produced: ingest
# sets it from the raw record's timestamp, workers and answers pass it on, so update-to-answer latency can be
# measured at the end of the pipeline without touching the schemas.
ORIGIN_HEADER = "cbgp-origin-ms"


@dataclass(slots=True)
class Output:
    """One record a transform wants produced.  ``partition`` is always explicit: routing is the design."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int = 0
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def query_partition(query_id: str, partitions: int) -> int:
    """The partition of everything keyed by query id (deltas.parts, answers), and a whole query's owner.

    Explicit and hash-stable in every process (librdkafka's partitioner is not what other clients use).
    """
    return stable_term_id(query_id) % partitions


def kv(**fields: Any) -> str:
    """``key=value`` pairs for one structured log line (values with spaces are quoted)."""
    parts = []
    for key, value in fields.items():
        text = str(value)
        parts.append(f"{key}={text!r}" if (" " in text or not text) else f"{key}={text}")
    return " ".join(parts)
