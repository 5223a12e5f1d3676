"""What the user reads from the fleet's topics: ``cbgp watch`` (answers, live), ``cbgp current`` (the
``answers.current`` table as SPARQL JSON results or a text table) and ``cbgp deadletter``.
"""

from __future__ import annotations

import json
import os
import logging
import signal
import sys
import threading
import time
import uuid
from typing import Any, Callable, TextIO

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from services.codec import CodecError, decode, sparql_json_term
from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets, make_consumer, read_all

log = logging.getLogger("cbgp.usercli")


def _excerpt(original: bytes, line: int | None, limit: int = 80) -> str:
    """The rejected line of ``original`` (or its start), as a short quoted string."""
    text = original
    if line is not None and line >= 1:
        lines = original.split(b"\n")
        if line <= len(lines):
            text = lines[line - 1]
    shown = text.decode("utf-8", "replace").strip()
    cut = len(shown) > limit
    return json.dumps(shown[:limit], ensure_ascii=False) + ("..." if cut else "")


def deadletter_line(number: int, record: dict[str, Any]) -> str:
    """One readable line for the ``number``-th DeadLetter record of the deadletter topic."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record["at_ms"] / 1000))
    line = record.get("line")
    message = record["message"]
    if line is not None and message.startswith(f"line {line}: "):
        message = message[len(f"line {line}: "):]
    where = f"{record['source_topic']}[{record['partition']}]@{record['offset']}"
    at_line = f" line {line}" if line is not None else ""
    return (f"#{number} {when} {record['service']} {where}{at_line}: {record['reason']}: {message} "
            f"-- {_excerpt(record['original'], line)}")


def print_deadletters(settings: KafkaSettings, start: int = 1, *, follow: bool = False, out: TextIO | None = None,
                      poll: Callable[[], bool] = lambda: True) -> int:
    """Print the dead letters from the ``start``-th (numbered 1, 2, ... from the oldest the topic keeps; one line
    each, :func:`deadletter_line`) up to the end of the topic, or with ``follow`` until ``poll()`` is false /
    Ctrl-C.  Returns how many were printed.  (Offsets would skip: a transaction's commit marker takes one.)"""
    out = sys.stdout if out is None else out
    topic = settings.topic("deadletter")
    # A read_committed client's high watermark is the last stable offset: an open transaction is not waited for.
    low, high = end_offsets(settings, topic).get(0, (0, 0))
    if not follow and low >= high:
        return 0
    consumer = make_consumer(settings, f"cbgp-deadletter-{uuid.uuid4().hex}", fetch_wait_max_ms=100)
    printed = number = 0
    try:
        consumer.assign([TopicPartition(topic, 0, low)])
        while poll():
            if not follow and consumer.position([TopicPartition(topic, 0)])[0].offset >= high:
                break  # the position also moves past transaction markers
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(msg.error())
                continue
            if msg.value() is None:
                continue
            if not follow and msg.offset() >= high:
                break
            number += 1
            if number < start:
                continue
            try:
                text = deadletter_line(number, decode("DeadLetter", msg.value()))
            except CodecError as exc:
                text = f"#{number} undecodable dead letter ({exc})"
            out.write(text + "\n")
            out.flush()
            printed += 1
        return printed
    except KeyboardInterrupt:
        _exit_now(out)
    finally:
        consumer.close()


def _binding_json(binding: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {var: sparql_json_term(term) for var, term in binding.items()}


def answer_json(record: dict[str, Any]) -> dict[str, Any]:
    """A watch line: named like ``cbgp replay``'s lines (``query``, ``seq``, ``sign``, ``binding``), plus the
    answer number ``n`` within the registration ``version``."""
    return {"query": record["query_id"], "version": record["version"], "n": record["n"], "seq": record["seq"],
            "sign": record["sign"], "binding": _binding_json(record["binding"]), "snapshot": record["snapshot"]}


def _exit_now(out: TextIO) -> None:
    """Ctrl-C ends a live follower at once: it has nothing to commit, and closing its consumer has hung (on the
    embedded broker under load) after the user asked to stop."""
    out.flush()
    sys.stderr.flush()
    os._exit(0)


def end_on_ctrl_c(out: TextIO | None = None) -> None:
    """Make Ctrl-C (or SIGTERM) end this command at once, with status 0, whatever its main thread is waiting on.

    A KeyboardInterrupt only reaches the main thread when it next runs Python code; a follower blocked in the
    Kafka client on a loaded broker did not end within 90 s of Ctrl-C.  Here the signals are blocked in the
    main thread (and in every thread started after, librdkafka's included) and one thread waits for them.
    Call it first in a command process, before any Kafka client exists; never in a process that must go on."""
    wanted = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, wanted)

    def wait() -> None:
        signal.sigwait(wanted)
        _exit_now(sys.stdout if out is None else out)

    threading.Thread(target=wait, name="cbgp-ctrl-c", daemon=True).start()


def watch_answers(settings: KafkaSettings, query_id: str, start_n: int = 1, *, count: int | None = None,
                  out: TextIO | None = None, err: TextIO | None = None, poll: Callable[[], bool] = lambda: True,
                  version: int = 0) -> int:
    """Print the query's answers of registration ``version`` from number ``start_n`` as JSON lines until
    ``count`` printed or ``poll()`` is false (Ctrl-C raises KeyboardInterrupt through it).  Answers of older
    versions are skipped; when a newer registration's answers appear, watch follows them from their n = 1
    (saying so on stderr).  Returns how many were printed."""
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    topic = settings.topic("answers")
    consumer = make_consumer(settings, f"cbgp-watch-{uuid.uuid4().hex}", fetch_wait_max_ms=100)
    wanted = query_id.encode()
    expected = start_n
    printed = 0
    try:
        partitions = end_offsets(settings, topic)
        # All partitions: the key->partition rule belongs to the answers service; filtering by key is cheap here.
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        while poll() and (count is None or printed < count):
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    err.write(f"watch: {msg.error()}\n")
                continue
            if msg.key() != wanted or msg.value() is None:
                continue
            try:
                record = decode("Answer", msg.value())
            except CodecError as exc:
                err.write(f"watch: skipping undecodable answer at {topic}[{msg.partition()}]@{msg.offset()}: {exc}\n")
                continue
            answer_version = record["version"] or version  # 0: written before versions, the current one
            if answer_version < version:
                continue  # an earlier registration of the id
            if answer_version > version:
                if version:
                    err.write(f"watch: {query_id} was registered again: version {answer_version}, "
                              f"its answers from n=1\n")
                    err.flush()
                    expected = 1
                version = answer_version
            record["version"] = version
            n = record["n"]
            if n < expected:
                continue  # before --from, or a duplicate left by a restarted producer
            if n > expected:
                low = partitions.get(msg.partition(), (0, 0))[0]
                if not printed and low > 0:  # the partition's log starts past 0: retention deleted them
                    err.write(f"watch: answers n={expected}..{n - 1} of {query_id} are no longer on {topic} (its "
                              f"partition {msg.partition()} now starts at offset {low}: retention deleted the older "
                              f"records); the current answers they add up to: `cbgp current {query_id}` "
                              "(answers.current), or the Spark job's compaction snapshot\n")
                else:
                    err.write(f"watch: warning: gap in answers of {query_id}: expected n={expected}, got n={n} "
                              f"({n - expected} missing)\n")
                err.flush()
            out.write(json.dumps(answer_json(record)) + "\n")
            out.flush()
            printed += 1
            expected = n + 1
        return printed
    except KeyboardInterrupt:
        _exit_now(out)
    finally:
        consumer.close()


def current_records(settings: KafkaSettings, keep: Callable[[Any], bool] = lambda _msg: True,
                    on_error: Callable[[CodecError], None] = lambda _exc: None) -> list[dict[str, Any]]:
    """The ``CurrentAnswer`` records ``answers.current`` holds now, of the messages ``keep`` selects: the latest
    value of each key (a tombstone removes its key), decoded; an undecodable one is left out (``on_error``)."""
    latest: dict[bytes, bytes | None] = {}
    for msg in read_all(settings, settings.topic("answers.current"), timeout=60):
        if keep(msg):
            latest[msg.key() or b""] = msg.value()
    records = []
    for value in latest.values():
        if value is not None:
            try:
                records.append(decode("CurrentAnswer", value))
            except CodecError as exc:
                on_error(exc)
    return records


def current_at_cut(settings: KafkaSettings, partitions: set[int] | None = None, tries: int = 5,
                   on_error: Callable[[CodecError], None] = lambda _exc: None, who: str = "cbgp"
                   ) -> tuple[list[dict[str, Any]], dict[int, tuple[int, int]]]:
    """``answers.current`` read at a consistent cut of ``answers``: the records of the answers partitions
    ``partitions`` (None: all) and those partitions' ``(low, high)`` watermarks they reflect.  The answers
    service writes an answer and its answers.current record in one transaction, so when the answers partitions'
    ends did not move while answers.current was read, the records are exactly the fold of the answers below
    those ends.  (After ``tries`` reads under a steady stream they are taken as they are, with one log line:
    they may then be off by the answers of one transaction until those answers change again.)"""
    t_answers = settings.topic("answers")

    def ends() -> dict[int, tuple[int, int]]:
        return {p: marks for p, marks in end_offsets(settings, t_answers).items()
                if partitions is None or p in partitions}

    for attempt in range(1, tries + 1):
        before = ends()
        records = current_records(settings, lambda msg: partitions is None or msg.partition() in partitions,
                                  on_error)
        if {p: high for p, (_low, high) in ends().items()} == {p: high for p, (_low, high) in before.items()}:
            break
        if attempt == tries:
            log.warning("%s: answers kept arriving while answers.current was read (%d tries): the records may miss "
                        "the last transaction's answers", who, tries)
    return records, before


def current_answers(settings: KafkaSettings, query_id: str, version: int | None = None) -> list[tuple[dict[str, Any], int]]:
    """``[(binding, multiplicity)]`` of the query now, from ``answers.current`` (latest value per key wins);
    with ``version``, only that registration's answers (an older one's not yet retracted are not current)."""
    def owned(msg: Any) -> bool:
        try:
            return json.loads(msg.key() or b"")[0] == query_id
        except (ValueError, IndexError, KeyError, TypeError):
            return False  # not a key this fleet writes

    rows = [(_binding_json(record["binding"]), record["multiplicity"]) for record in current_records(settings, owned)
            if record["multiplicity"] > 0 and (version is None or record["version"] in (0, version))]
    rows.sort(key=lambda row: json.dumps(row[0], sort_keys=True))
    return rows


def _term_text(term: dict[str, Any]) -> str:
    if term["type"] == "uri":
        return f"<{term['value']}>"
    if term["type"] == "bnode":
        return f"_:{term['value']}"
    text = json.dumps(term["value"], ensure_ascii=False)
    if term.get("xml:lang"):
        return f"{text}@{term['xml:lang']}"
    if term.get("datatype"):
        return f"{text}^^<{term['datatype']}>"
    return text


def results_table(variables: list[str], rows: list[tuple[dict[str, Any], int]]) -> str:
    """A plain text table, one row per answer (repeated by multiplicity), columns = the projected variables."""
    header = ["?" + v for v in variables]
    cells = [[_term_text(b[v]) if v in b else "" for v in variables] for b, mult in rows for _ in range(mult)]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    fmt_row = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    body = [line, fmt_row(header), line, *(fmt_row(r) for r in cells), line]
    return "\n".join(body) + f"\n{len(cells)} answer{'s' if len(cells) != 1 else ''}"
