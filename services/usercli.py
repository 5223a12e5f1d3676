"""The user's commands: ``cbgp publish | register | unregister | list | watch | current | deadletter``.

All take the shared Kafka flags (or ``CBGP_*`` variables).  What they put on and read from the topics:

- ``publish FILE``: the file's bytes to ``updates.raw`` in records of whole lines (about ``--chunk-bytes``
  each), header ``cbgp-format`` = the input format (plus ``cbgp-source`` = file name and
  ``cbgp-first-line``).  RDF Patch transactions ``TX .. TC/TA`` are never split across records, and the
  patch prefixes (``PA``/``@prefix`` lines) seen so far are repeated at the head of every later record, so
  ingest can parse each record on its own.  Turtle is sent as one record (statements span lines and
  depend on prefixes).  ``FILE`` ``-`` is standard input (then ``--format`` is needed).  Before sending,
  the input is checked with ingest's parsers and limits: each problem ingest would dead-letter is printed as
  ``FILE:LINE: reason``; the input is still published (ingest dead-letters the bad parts) unless
  ``--strict``, and the exit code is 1.  A record over the broker's size limit is never sent.
- ``register / unregister / list``: an Avro ``AdminCommand`` with a fresh ``request_id`` to ``admin``, then
  wait for the ``QueryStatus`` with that id on ``queries.status`` (read from its end offset taken *before*
  sending, so the reply cannot be missed).
- ``watch ID``: ``Answer`` records of the query from ``answers``, as JSON lines, from answer number
  ``--from``; duplicates (n already seen) are dropped, a jump in n is reported on stderr.
- ``current ID``: the query's ``answers.current`` records folded to the latest value per key (the topic is
  compacted, but a broker may not have compacted it yet), as SPARQL 1.1 Query Results JSON or ``--table``.
- ``deadletter``: the ``DeadLetter`` records on ``deadletter`` (inputs a service rejected), one line each,
  from offset ``--from``; ``--follow`` keeps printing new ones until Ctrl-C.

Every command first checks that the broker answers (a few seconds at most): if not, it prints one line
and exits with code 2; librdkafka's own log lines never reach the terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from cbgp.update import UPDATE_FORMAT
from services.codec import CodecError, decode, encode, sparql_json_term
from services.kafka import (BrokerUnreachable, KafkaSettings, add_kafka_flags, end_offsets, make_consumer,
                            make_producer, quiet_librdkafka, read_all, require_broker)

__all__ = ["UserError", "admin_request", "check_input", "chunk_lines", "current_answers", "deadletter_line",
           "format_status", "print_deadletters", "publish_file",
           "results_json", "results_table", "user_commands", "watch_answers"]

Handler = Callable[[argparse.Namespace], int]
DEFAULT_CHUNK_BYTES = 256 * 1024
# Kafka's default message.max.bytes is ~1 MB: a record larger than this would be refused by the broker.
MAX_RECORD_BYTES = 900 * 1024


class UserError(Exception):
    """A problem the user can fix (bad file, no reply, unknown query): printed as one line, exit 1."""


# ---------------------------------------------------------------------------------------- publish


def _is_patch_tx(line: bytes) -> str | None:
    word = line.lstrip()[:2]
    return {b"TX": "open", b"TC": "close", b"TA": "close"}.get(word)


def _is_patch_prefix(line: bytes) -> bool:
    stripped = line.lstrip()
    return stripped.startswith(b"PA ") or stripped.startswith(b"PA\t") or stripped.lower().startswith(b"@prefix")


def chunk_lines(data: bytes, fmt: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[tuple[int, int, bytes]]:
    """Split ``data`` into records of whole lines: yields ``(first_line, line_count, payload)``.

    A record is cut once it holds ``chunk_bytes``, but never inside a patch transaction; for patch input
    the prefix lines seen so far are prepended to every later record (they are not counted as its lines).
    Turtle and SPARQL Update requests are one record each.
    """
    if fmt in ("turtle", UPDATE_FORMAT):  # statements span lines; a request applies atomically as a whole
        yield 1, data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1), data
        return
    prefixes: list[bytes] = []
    head = b""  # the prefixes repeated at the start of the current record
    body: list[bytes] = []
    size = 0
    first = 1
    in_tx = False
    for line_no, line in enumerate(data.splitlines(keepends=True), 1):
        if not body:
            first = line_no
        body.append(line)
        size += len(line)
        if fmt == "patch":
            tx = _is_patch_tx(line)
            in_tx = True if tx == "open" else False if tx == "close" else in_tx
            if _is_patch_prefix(line):
                prefixes.append(line if line.endswith(b"\n") else line + b"\n")
        if size >= chunk_bytes and not in_tx:
            yield first, len(body), head + b"".join(body)
            body, size = [], 0
            head = b"".join(prefixes)
    if body:
        yield first, len(body), head + b"".join(body)


class _Meter:
    """A progress line on stderr (lines, bytes, rate), at most twice a second."""

    def __init__(self, out: TextIO, enabled: bool, total_bytes: int) -> None:
        self.out, self.enabled, self.total = out, enabled, max(total_bytes, 1)
        self.start = self.last = time.monotonic()

    def tick(self, lines: int, sent: int) -> None:
        now = time.monotonic()
        if self.enabled and now - self.last >= 0.5:
            self.last = now
            rate = sent / max(now - self.start, 1e-9)
            self.out.write(f"\rpublish: {lines:,} lines, {sent / 1e6:.1f}/{self.total / 1e6:.1f} MB "
                           f"({100 * sent // self.total}%), {rate / 1e6:.2f} MB/s ")
            self.out.flush()

    def done(self, summary: str) -> None:
        if self.enabled:
            self.out.write("\r" + " " * 72 + "\r")
        self.out.write(summary + "\n")
        self.out.flush()


STDIN = "-"
# At most this many problems are printed one per line; the rest are counted in the summary.
MAX_PROBLEMS_SHOWN = 100


def _record_kind(fmt: str) -> str:
    return {"turtle": "Turtle file", UPDATE_FORMAT: "SPARQL Update request"}.get(fmt, "patch transaction or line")


def check_input(data: bytes, fmt: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[tuple[int, str]]:
    """What ingest would dead-letter in ``data`` (and records the broker would refuse), found locally with
    ingest's own parsers and limits: ``[(line, reason)]`` in line order, lines counted in ``data``."""
    from cbgp.inputs import InputError, parse_input
    from cbgp.update import UpdateRequestError, check_request
    from services.ingest import MAX_TERM_CHARS, _position_problem

    problems: list[tuple[int, str]] = []
    if fmt == UPDATE_FORMAT:
        try:
            check_request(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            problems.append((data.count(b"\n", 0, exc.start) + 1, f"SPARQL Update request is not UTF-8 "
                             f"(byte {exc.start})"))
        except UpdateRequestError as exc:
            problems.append((exc.line or 1, str(exc)))
    else:
        for item in parse_input(data, fmt):
            if isinstance(item, InputError):
                problems.append((item.line, item.message))
                continue
            problem = _position_problem(item.s, item.p, item.o, item.g)
            if problem is None:
                longest = max(len(item.s), len(item.p), len(item.o), len(item.g or ""))
                if longest > MAX_TERM_CHARS:
                    problem = (f"a term of {longest:,} characters is over ingest's {MAX_TERM_CHARS:,}-character "
                               "limit (answers carrying it would not fit in a Kafka record)")
            if problem is not None:
                problems.append((item.line, problem))
    for first, _lines, payload in chunk_lines(data, fmt, chunk_bytes):
        if len(payload) > MAX_RECORD_BYTES:
            problems.append((first, f"a {_record_kind(fmt)} of {len(payload):,} bytes starts here, over the "
                             f"{MAX_RECORD_BYTES:,}-byte record limit: not sent; split it"
                             + (" (or convert Turtle to N-Triples)" if fmt == "turtle" else "")))
    problems.sort(key=lambda p: p[0])
    return problems


def _read_input(path: str, fmt: str | None, stdin: Any = None) -> tuple[bytes, str, str]:
    """``(data, format, name to show)`` of ``path`` (``-``: standard input)."""
    from cbgp.inputs import FORMATS, detect_format

    known = (*FORMATS, UPDATE_FORMAT)
    if fmt is not None and fmt not in known:
        raise UserError(f"unknown format {fmt!r}: use one of {', '.join(known)}")
    if path == STDIN:
        if fmt is None:
            raise UserError(f"cannot tell the format of standard input: pass --format ({', '.join(known)})")
        stream = sys.stdin if stdin is None else stdin
        return getattr(stream, "buffer", stream).read(), fmt, "<stdin>"
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror}") from None
    if fmt is None:
        if path.lower().endswith((".ru", ".sparql-update")):
            fmt = UPDATE_FORMAT
        else:
            try:
                fmt = detect_format(path)
            except ValueError:
                raise UserError(f"cannot tell the format of {path} from its name: pass --format "
                                f"({', '.join(known)})") from None
    return data, fmt, path


def publish_file(settings: KafkaSettings, path: str, fmt: str | None = None, *,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, progress: bool = False, out: TextIO | None = None,
                 strict: bool = False, stdin: Any = None) -> dict[str, int]:
    """Check ``path`` (``-``: ``stdin``, default standard input) and send it to ``updates.raw`` (see the module
    docstring); returns ``{records, lines, bytes, problems}``.

    Each problem found locally is printed to ``out`` (default: stderr at call time) as ``FILE:LINE: reason``,
    before anything is sent; with ``strict`` nothing is sent then (:class:`UserError`).  Otherwise the input
    is sent as it is (ingest dead-letters the bad parts), except records over the size limit.
    Progress and the summary go to ``out`` too."""
    out = sys.stderr if out is None else out
    data, fmt, name = _read_input(path, fmt, stdin)
    problems = check_input(data, fmt, chunk_bytes)
    for line, reason in problems[:MAX_PROBLEMS_SHOWN]:
        out.write(f"{name}:{line}: {reason}\n")
    if len(problems) > MAX_PROBLEMS_SHOWN:
        out.write(f"{name}: {len(problems) - MAX_PROBLEMS_SHOWN:,} more problem(s) not shown\n")
    out.flush()
    if problems and strict:
        raise UserError(f"{len(problems)} problem(s) in {name}; nothing published (--strict)")
    require_broker(settings)
    topic = settings.topic("updates.raw")
    producer = make_producer(settings)
    errors: list[str] = []
    meter = _Meter(out, progress, len(data))
    counts = {"records": 0, "lines": 0, "bytes": 0, "problems": len(problems)}
    start = time.monotonic()
    source = os.path.basename(name).encode()
    for first, lines, payload in chunk_lines(data, fmt, chunk_bytes):
        if len(payload) > MAX_RECORD_BYTES:
            continue  # reported above: the broker would refuse it
        headers = [("cbgp-format", fmt.encode()), ("cbgp-source", source), ("cbgp-first-line", str(first).encode())]
        while True:
            try:
                producer.produce(topic, value=payload, headers=headers,
                                 on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                producer.poll(0.1)
        producer.poll(0)
        counts["records"] += 1
        counts["lines"] += lines
        counts["bytes"] += len(payload)
        meter.tick(counts["lines"], counts["bytes"])
    if producer.flush(60):
        errors.append("some records were not acknowledged within 60 s")
    if errors:
        raise UserError(f"publish to {topic} failed: {errors[0]} ({len(errors)} record(s) affected)")
    elapsed = time.monotonic() - start
    flagged = f", {len(problems)} with problems listed above" if problems else ""
    meter.done(f"published {counts['lines']:,} lines ({counts['bytes']:,} bytes, {fmt}{flagged}) in "
               f"{counts['records']} record(s) to {topic} in {elapsed:.1f} s "
               f"({counts['lines'] / max(elapsed, 1e-9):,.0f} lines/s)")
    return counts


# ---------------------------------------------------------------------------------------- dead letters


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


def deadletter_line(offset: int, record: dict[str, Any]) -> str:
    """One readable line for the DeadLetter record at ``offset`` of the deadletter topic."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record["at_ms"] / 1000))
    line = record.get("line")
    message = record["message"]
    if line is not None and message.startswith(f"line {line}: "):
        message = message[len(f"line {line}: "):]
    where = f"{record['source_topic']}[{record['partition']}]@{record['offset']}"
    at_line = f" line {line}" if line is not None else ""
    return (f"#{offset} {when} {record['service']} {where}{at_line}: {record['reason']}: {message} "
            f"-- {_excerpt(record['original'], line)}")


def print_deadletters(settings: KafkaSettings, start: int = 0, *, follow: bool = False, out: TextIO | None = None,
                      poll: Callable[[], bool] = lambda: True) -> int:
    """Print the dead letters from offset ``start`` (one line each, :func:`deadletter_line`) up to the end of
    the topic, or with ``follow`` until ``poll()`` is false / Ctrl-C.  Returns how many were printed."""
    out = sys.stdout if out is None else out
    topic = settings.topic("deadletter")
    # A read_committed client's high watermark is the last stable offset: an open transaction is not waited for.
    low, high = end_offsets(settings, topic).get(0, (0, 0))
    start = max(start, low)
    if not follow and start >= high:
        return 0
    consumer = make_consumer(settings, f"cbgp-deadletter-{uuid.uuid4().hex}", fetch_wait_max_ms=100)
    printed = 0
    try:
        consumer.assign([TopicPartition(topic, 0, start)])
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
            try:
                text = deadletter_line(msg.offset(), decode("DeadLetter", msg.value()))
            except CodecError as exc:
                text = f"#{msg.offset()} undecodable dead letter ({exc})"
            out.write(text + "\n")
            out.flush()
            printed += 1
        return printed
    finally:
        consumer.close()


# ---------------------------------------------------------------------------------------- admin requests


def admin_request(settings: KafkaSettings, command: dict[str, Any], wait: float = 30.0) -> dict[str, Any]:
    """Send one ``AdminCommand`` and return the registry's ``QueryStatus`` reply (matched by request_id).

    Raises :class:`UserError` if no reply arrives within ``wait`` seconds.
    """
    request_id = command.get("request_id") or uuid.uuid4().hex
    command = {"query_id": None, "sparql": None, "options": {}, **command, "request_id": request_id}
    status_topic = settings.topic("queries.status")
    # Take the reply topic's end *before* sending: the reply is necessarily after it.
    start = end_offsets(settings, status_topic).get(0, (0, 0))[1]
    consumer = make_consumer(settings, f"cbgp-cli-{request_id}", fetch_wait_max_ms=50)
    try:
        consumer.assign([TopicPartition(status_topic, 0, start)])
        producer = make_producer(settings)
        producer.produce(settings.topic("admin"), value=encode("AdminCommand", command))
        if producer.flush(wait):
            raise UserError(f"the broker at {settings.bootstrap_servers} did not acknowledge the command within {wait:g} s")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None or msg.value() is None:
                continue
            try:
                status = decode("QueryStatus", msg.value())
            except CodecError:
                continue  # someone else's garbage on the status topic is not our reply
            if status.get("request_id") == request_id:
                return status
        raise UserError(f"no reply from the registry within {wait:g} s (is `cbgp registry` running on "
                        f"{settings.bootstrap_servers} with topic prefix {settings.topic_prefix!r}?)")
    finally:
        consumer.close()


def format_status(status: dict[str, Any]) -> str:
    """One line for a reply: ``accepted: <class ...>`` or ``rejected: <message> (line L, column C)``."""
    kind = status["status"].lower()
    where = f" (line {status['line']}, column {status['column']})" if status.get("line") is not None else ""
    return f"{kind}: {status['message']}{where}"


# ---------------------------------------------------------------------------------------- answers


def _binding_json(binding: dict[str, dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {var: sparql_json_term(term) for var, term in binding.items()}


def _answer_json(record: dict[str, Any]) -> dict[str, Any]:
    """A watch line: named like ``cbgp replay``'s lines (``query``, ``seq``, ``sign``, ``binding``), plus the
    answer number ``n`` within the registration ``version``."""
    return {"query": record["query_id"], "version": record["version"], "n": record["n"], "seq": record["seq"],
            "sign": record["sign"], "binding": _binding_json(record["binding"]), "snapshot": record["snapshot"]}


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
                err.write(f"watch: warning: gap in answers of {query_id}: expected n={expected}, got n={n} "
                          f"({n - expected} missing)\n")
                err.flush()
            out.write(json.dumps(_answer_json(record)) + "\n")
            out.flush()
            printed += 1
            expected = n + 1
        return printed
    finally:
        consumer.close()


def current_answers(settings: KafkaSettings, query_id: str, version: int | None = None) -> list[tuple[dict[str, Any], int]]:
    """``[(binding, multiplicity)]`` of the query now, from ``answers.current`` (latest value per key wins);
    with ``version``, only that registration's answers (an older one's not yet retracted are not current)."""
    latest: dict[bytes, dict[str, Any] | None] = {}
    for msg in read_all(settings, settings.topic("answers.current"), timeout=60):
        key = msg.key() or b""
        try:
            owner = json.loads(key)[0]
        except (ValueError, IndexError, KeyError, TypeError):
            continue  # not a key this fleet writes
        if owner != query_id:
            continue
        if msg.value() is None:
            latest[key] = None
            continue
        try:
            latest[key] = decode("CurrentAnswer", msg.value())
        except CodecError:
            continue
    rows = []
    for record in latest.values():
        if record is not None and version is not None and record["version"] not in (0, version):
            continue
        if record is not None and record["multiplicity"] > 0:
            rows.append((_binding_json(record["binding"]), record["multiplicity"]))
    rows.sort(key=lambda row: json.dumps(row[0], sort_keys=True))
    return rows


def registered_plan(settings: KafkaSettings, query_id: str) -> dict[str, Any] | None:
    """The query's current ``QueryPlan`` from ``queries.plans``, or None if it is not registered."""
    plan = None
    for msg in read_all(settings, settings.topic("queries.plans"), timeout=60):
        if msg.key() == query_id.encode():
            try:
                plan = None if msg.value() is None else decode("QueryPlan", msg.value())
            except CodecError:
                continue
    return plan


def _require_plan(settings: KafkaSettings, query_id: str) -> dict[str, Any]:
    plan = registered_plan(settings, query_id)
    if plan is None:
        raise UserError(f"no query with id {query_id!r} is registered (`cbgp list` shows the registered ids)")
    return plan


def results_json(variables: list[str], rows: list[tuple[dict[str, Any], int]]) -> dict[str, Any]:
    """SPARQL 1.1 Query Results JSON; a binding with multiplicity m appears m times (bag semantics)."""
    return {"head": {"vars": variables},
            "results": {"bindings": [binding for binding, mult in rows for _ in range(mult)]}}


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


# ---------------------------------------------------------------------------------------- commands


def _options(values: list[str] | None) -> dict[str, str]:
    options = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--option expects KEY=VALUE (e.g. replace=true), got {item!r}")
        options[key.strip()] = value.strip()
    from services.queries import check_option_keys
    from cbgp.windows import WindowError

    try:
        check_option_keys(options)  # before sending: the registry would reject it too
    except WindowError as exc:
        raise UserError(f"--option: {exc.message}") from None
    return options


def user_commands(commands: argparse._SubParsersAction) -> dict[str, Handler]:
    """Register the user commands; return their handlers."""
    p_pub = add_kafka_flags(commands.add_parser("publish", help="send an updates file to updates.raw"))
    p_pub.add_argument("file", help="RDF Patch, N-Triples, N-Quads, Turtle, JSON lines or SPARQL Update; - = stdin")
    p_pub.add_argument("--format", help="input format (default: from the file name; required for stdin)")
    p_pub.add_argument("--strict", action="store_true",
                       help="publish nothing if the input has problems (default: publish, report them, exit 1)")
    p_pub.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES, help="target record size")
    p_pub.add_argument("--progress", action="store_true", help="progress line on stderr (default: when a terminal)")

    p_reg = add_kafka_flags(commands.add_parser("register", help="register a SPARQL query with the registry"))
    p_reg.add_argument("query_id", metavar="ID")
    p_reg.add_argument("file", metavar="FILE.rq", help="the query (- = standard input)")
    p_reg.add_argument("--option", action="append", metavar="KEY=VALUE", help="query option (repeatable), e.g. replace=true")
    p_reg.add_argument("--wait", type=float, default=30.0, metavar="S", help="seconds to wait for the reply (default 30)")

    p_unreg = add_kafka_flags(commands.add_parser("unregister", help="unregister a query"))
    p_unreg.add_argument("query_id", metavar="ID")
    p_unreg.add_argument("--wait", type=float, default=30.0, metavar="S")

    p_list = add_kafka_flags(commands.add_parser("list", help="list the registered queries"))
    p_list.add_argument("--wait", type=float, default=30.0, metavar="S")

    p_watch = add_kafka_flags(commands.add_parser("watch", help="print a query's answer deltas as JSON lines, live"))
    p_watch.add_argument("query_id", metavar="ID")
    p_watch.add_argument("--from", dest="start", type=int, default=1, metavar="N", help="first answer number (default 1)")
    p_watch.add_argument("--count", type=int, default=None, metavar="K", help="exit after K answers (default: run until Ctrl-C)")

    p_cur = add_kafka_flags(commands.add_parser("current", help="a query's current answers (SPARQL JSON results)"))
    p_cur.add_argument("query_id", metavar="ID")
    p_cur.add_argument("--table", action="store_true", help="a text table instead of JSON")

    p_dead = add_kafka_flags(commands.add_parser("deadletter", help="print the inputs the fleet rejected, one line each"))
    p_dead.add_argument("--from", dest="start", type=int, default=0, metavar="N",
                        help="first offset of the deadletter topic (default 0; each line starts with #offset)")
    p_dead.add_argument("--follow", action="store_true", help="keep printing new dead letters until Ctrl-C")

    def settings_of(args: argparse.Namespace) -> KafkaSettings:
        return quiet_librdkafka(KafkaSettings.from_args(args))  # librdkafka's log lines stay off the terminal

    def connect(args: argparse.Namespace) -> KafkaSettings:
        settings = settings_of(args)
        require_broker(settings)  # a wrong address: one line within seconds, not minutes of librdkafka logs
        return settings

    def guarded(fn: Callable[[argparse.Namespace], int], name: str) -> Handler:
        def handler(args: argparse.Namespace) -> int:
            try:
                return fn(args)
            except UserError as exc:
                print(f"cbgp {name}: error: {exc}", file=sys.stderr)
                return 1
            except BrokerUnreachable as exc:
                print(f"cbgp {name}: error: {exc}", file=sys.stderr)
                return 2
            except KafkaException as exc:
                err = exc.args[0] if exc.args else exc
                print(f"cbgp {name}: error: kafka: {err.str() if hasattr(err, 'str') else err}", file=sys.stderr)
                return 1
        return handler

    def run_publish(args: argparse.Namespace) -> int:
        counts = publish_file(settings_of(args), args.file, args.format, chunk_bytes=max(1, args.chunk_bytes),
                              progress=args.progress or sys.stderr.isatty(), strict=args.strict)
        if counts["problems"]:
            raise UserError(f"{counts['problems']} problem(s) in the input (listed above); ingest dead-letters "
                            "them: see `cbgp deadletter`")
        return 0

    def run_register(args: argparse.Namespace) -> int:
        try:
            sparql = sys.stdin.read() if args.file == STDIN else Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read {args.file}: {getattr(exc, 'strerror', None) or exc}") from None
        options = _options(args.option)  # a bad option is reported before any broker is contacted
        status = admin_request(connect(args), {"command": "REGISTER", "query_id": args.query_id,
                                               "sparql": sparql, "options": options}, args.wait)
        print(format_status(status))
        return 0 if status["status"] == "ACCEPTED" else 1

    def run_unregister(args: argparse.Namespace) -> int:
        status = admin_request(connect(args), {"command": "UNREGISTER", "query_id": args.query_id},
                               args.wait)
        print(format_status(status))
        return 0 if status["status"] == "UNREGISTERED" else 1

    def run_list(args: argparse.Namespace) -> int:
        status = admin_request(connect(args), {"command": "LIST"}, args.wait)
        if status["status"] != "LISTED":
            print(format_status(status))
            return 1
        for query_id in status["queries"]:
            print(query_id)
        print(status["message"], file=sys.stderr)
        return 0

    def run_watch(args: argparse.Namespace) -> int:
        settings = connect(args)
        plan = _require_plan(settings, args.query_id)  # else it would wait forever for answers that never come
        try:
            watch_answers(settings, args.query_id, max(1, args.start), count=args.count, version=plan["version"])
        except KeyboardInterrupt:
            pass  # Ctrl-C is how a live watch ends
        return 0

    def run_current(args: argparse.Namespace) -> int:
        settings = connect(args)
        plan = _require_plan(settings, args.query_id)  # answers left by an unregistered query are not current
        rows = current_answers(settings, args.query_id, plan["version"])
        variables = list(plan["projected"])
        if args.table:
            print(results_table(variables, rows))
        else:
            print(json.dumps(results_json(variables, rows), indent=2))
        return 0

    def run_deadletter(args: argparse.Namespace) -> int:
        try:
            print_deadletters(connect(args), max(0, args.start), follow=args.follow)
        except KeyboardInterrupt:
            pass  # Ctrl-C is how --follow ends
        return 0

    runs = {"publish": run_publish, "register": run_register, "unregister": run_unregister, "list": run_list,
            "watch": run_watch, "current": run_current, "deadletter": run_deadletter}
    return {name: guarded(fn, name) for name, fn in runs.items()}
