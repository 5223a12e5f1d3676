"""What a transform hands to Kafka and how records are placed, with no Kafka client in it.

The transforms (``services.worker.core``, ``services.answers.release``, the ingest and answers processors) and the
Spark job import these; the Kafka plumbing (``services.runtime.life``) produces the :class:`Output` s they return.

- :class:`Output`: one record to produce (topic, key, value, explicit partition, headers);
- :func:`query_partition`: the partition of everything keyed by query id;
- :func:`routes` (from ``cbgp.change``): the routed partitions (and the role of the centre) of one change, the
  one routing function;
- :func:`dead_letter`: the one ``DeadLetter`` record builder of every service;
- :func:`query_error`: an ``ERROR`` ``QueryStatus`` about one query from a service other than the registry;
- :data:`WHOLE_QUERY_PART`: ``PartDelta.part`` of a query's own answers (what the answers service numbers);
- :data:`ORIGIN_HEADER`: the header carrying the raw record's time, for end-to-end latency;
- :data:`PUBLISH_HEADER`, :data:`NUMBER_HEADER`: a ``cbgp publish`` record's publish and number (ingest drops a
  retried copy by them: ``services.ingest.retries``);
- :func:`kv`: one structured log line (``key=value``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from cbgp.query.limits import limit
from cbgp.terms import DEFAULT_MAX_TERM_BYTES, MAX_TERM_SETTING, stable_term_id
from services import codec
from services.metrics.instruments import REJECTED_INPUTS

__all__ = ["Output", "NUMBER_HEADER", "ORIGIN_HEADER", "PUBLISH_HEADER", "WHOLE_QUERY_PART", "dead_letter",
           "query_error", "query_partition"]

WHOLE_QUERY_PART = -1  # PartDelta.part of a query's own answers; parts of a multi-part query are 0, 1, ...

# Header carrying the time (epoch ms) at which the raw record that caused a change was produced: ingest
# sets it from the raw record's timestamp, workers and answers pass it on, so update-to-answer latency can be
# measured at the end of the pipeline without touching the schemas.
ORIGIN_HEADER = "cbgp-origin-ms"
PUBLISH_HEADER, NUMBER_HEADER = "cbgp-publish", "cbgp-record"


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


# Record sizes. An answer carries its terms whole and must fit in one Kafka record (the broker's default
# message.max.bytes is about 1 MB): ingest refuses terms over CBGP_MAX_TERM_BYTES, and the registry refuses a query
# whose answers could exceed CBGP_MAX_RECORD_BYTES with terms that large.
RECORD_SETTING, DEFAULT_MAX_RECORD_BYTES = "CBGP_MAX_RECORD_BYTES", 1_000_000
ANSWER_OVERHEAD_BYTES, TERM_OVERHEAD_BYTES = 1024, 64


def answer_size_problem(columns: int) -> str | None:
    """Why answers of ``columns`` variables might not fit in a record (one line), or None."""
    record = limit(RECORD_SETTING, DEFAULT_MAX_RECORD_BYTES)
    term = limit(MAX_TERM_SETTING, DEFAULT_MAX_TERM_BYTES)
    worst = ANSWER_OVERHEAD_BYTES + columns * (term + TERM_OVERHEAD_BYTES)
    if worst <= record:
        return None
    return (f"an answer of {columns} variables may take {worst:,} bytes with terms of up to {term:,} bytes, over "
            f"the record limit of {record:,} ({RECORD_SETTING}, {MAX_TERM_SETTING}): project fewer variables")


# A dead letter carries an excerpt of what was refused, never the whole input: one bad line of a 1 MB record
# must not make a dead letter over the record size limit (CBGP_DEAD_LETTER_EXCERPT_BYTES).
EXCERPT_SETTING, DEFAULT_EXCERPT_BYTES = "CBGP_DEAD_LETTER_EXCERPT_BYTES", 1024
MAX_MESSAGE_CHARS = 1000


def excerpt(original: bytes | None) -> tuple[bytes, str]:
    """``(the first bytes of original, a note on what was cut or "")``."""
    original = original or b""
    size = limit(EXCERPT_SETTING, DEFAULT_EXCERPT_BYTES)
    if len(original) <= size:
        return original, ""
    return original[:size], f" [excerpt: the first {size:,} of {len(original):,} bytes]"


def query_error(query_id: str, message: str) -> bytes:
    """An ``ERROR`` QueryStatus about ``query_id`` (an accuracy alert, a query stopped at a bound), encoded."""
    return codec.encode("QueryStatus", {"query_id": query_id, "status": "ERROR", "message": message, "line": None,
                                        "column": None, "request_id": None, "at_ms": int(time.time() * 1000),
                                        "queries": []})


def dead_letter(deadletter_topic: str, service: str, source_topic: str, partition: int, offset: int, reason: str,
                message: str, original: bytes | None, line: int | None = None, at_ms: int | None = None) -> Output:
    """The ``DeadLetter`` record for an input ``service`` rejected (and ``cbgp_rejected_inputs`` counted).

    ``source_topic``/``partition``/``offset`` say where the input was, ``reason`` is the code (e.g.
    ``schema-mismatch``), ``message`` one line for people, ``original`` what was refused (the offending line
    when there is one; only an excerpt is kept), ``line`` the line of a text input, ``at_ms`` the time of the
    rejection (default now).
    """
    REJECTED_INPUTS.labels(service, reason).inc()
    kept, note = excerpt(original)
    message = message.replace("\n", " ")
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS] + "..."
    record = {"service": service, "source_topic": source_topic, "partition": partition, "offset": offset,
              "reason": reason, "message": message + note, "line": line, "original": kept,
              "at_ms": int(time.time() * 1000) if at_ms is None else at_ms}
    return Output(deadletter_topic, codec.encode("DeadLetter", record))
