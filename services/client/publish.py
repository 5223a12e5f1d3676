"""``cbgp publish``: an updates file sent to ``updates.raw`` in records of whole lines (RDF Patch transactions
never split, patch prefixes repeated), each checked with ingest's parsers and limits before it is sent.

Each record names its format (``cbgp-format``), file and first line, and its publish and number (``cbgp-publish``,
``cbgp-record``): the producer is not idempotent (librdkafka's idempotent producer sends nothing for its first
half second), keeps one request in flight so that a retry never reorders, and ingest drops a retried copy by its
number (``services.ingest.retries``).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator, TextIO

from cbgp.inputs.sparql_update import UPDATE_FORMAT
from services.kafka.config import KafkaSettings
from services.kafka.client import make_producer, require_broker
from services.kafka.doorbell import doorbell
from services.client.errors import UserError
from services.wire.records import NUMBER_HEADER, PUBLISH_HEADER

DEFAULT_CHUNK_BYTES = 256 * 1024
# Kafka's default message.max.bytes is ~1 MB: a record larger than this would be refused by the broker.
MAX_RECORD_BYTES = 900 * 1024


def _is_patch_tx(line: bytes) -> str | None:
    word = line.lstrip()[:2]
    return {b"TX": "open", b"TC": "close", b"TA": "close"}.get(word)


def _is_patch_prefix(line: bytes) -> bool:
    stripped = line.lstrip()
    return stripped.startswith(b"PA ") or stripped.startswith(b"PA\t") or stripped.lower().startswith(b"@prefix")


# A patch line that starts with a row's operation is neither a transaction mark nor a prefix (checked first: most
# lines are rows).
_PATCH_DATA = (b"A", b"D")


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
    patch = fmt == "patch"
    for line_no, line in enumerate(data.splitlines(keepends=True), 1):
        if not body:
            first = line_no
        body.append(line)
        size += len(line)
        if patch and line[:1] not in _PATCH_DATA:
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

    def clear(self) -> None:
        """Wipe the progress line, so that a line printed next starts at the left edge."""
        if self.enabled and self.last > self.start:
            self.out.write("\r" + " " * 72 + "\r")

    def done(self, summary: str) -> None:
        self.clear()
        self.out.write(summary + "\n")
        self.out.flush()


STDIN = "-"
# At most this many problems are printed one per line; the rest are counted in the summary.
MAX_PROBLEMS_SHOWN = 100


def _record_kind(fmt: str) -> str:
    return {"turtle": "Turtle file", UPDATE_FORMAT: "SPARQL Update request"}.get(fmt, "patch transaction or line")


def check_record(payload: bytes, fmt: str, first: int = 1, head_lines: int = 0) -> list[tuple[int, str]]:
    """What ingest would dead-letter in one record ``payload`` of :func:`chunk_lines` (and whether the broker
    would refuse it), found locally with ingest's own parsers and limits: ``[(line, reason)]`` in line order,
    lines counted in the input the record starts at line ``first`` of; its first ``head_lines`` lines are the
    repeated patch prefixes (their problems were reported with the record they first came in)."""
    from cbgp.inputs.formats import InputError, parse_input
    from cbgp.inputs.sparql_update import UpdateRequestError, check_request
    from cbgp.query.limits import limit
    from services.ingest.core import oversized_term, position_problem
    from cbgp.terms import DEFAULT_MAX_TERM_BYTES, MAX_TERM_SETTING

    found: list[tuple[int, str]] = []
    max_term_bytes = limit(MAX_TERM_SETTING, DEFAULT_MAX_TERM_BYTES)
    if fmt == UPDATE_FORMAT:
        try:
            check_request(payload.decode("utf-8"))
        except UnicodeDecodeError as exc:
            found.append((payload.count(b"\n", 0, exc.start) + 1, f"SPARQL Update request is not UTF-8 "
                          f"(byte {exc.start})"))
        except UpdateRequestError as exc:
            found.append((exc.line or 1, str(exc)))
    else:
        for item in parse_input(payload, fmt):
            if isinstance(item, InputError):
                found.append((item.line, item.message + (f" (column {item.column})" if item.column else "")))
                continue
            problem = position_problem(item.s, item.p, item.o, item.g)
            if problem is None:
                problem = oversized_term(item.s, item.p, item.o, item.g, max_term_bytes)
            if problem is not None:
                found.append((item.line, problem))
    problems = [(first + line - 1 - head_lines, reason) for line, reason in found if line > head_lines]
    if len(payload) > MAX_RECORD_BYTES:
        problems.append((first, f"a {_record_kind(fmt)} of {len(payload):,} bytes starts here, over the "
                         f"{MAX_RECORD_BYTES:,}-byte record limit: not sent; split it"
                         + (" (or convert Turtle to N-Triples)" if fmt == "turtle" else "")))
    problems.sort(key=lambda p: p[0])
    return problems


def checked_records(data: bytes, fmt: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES
                    ) -> Iterator[tuple[int, int, bytes, list[tuple[int, str]]]]:
    """:func:`chunk_lines`'s records, each with its problems (:func:`check_record`): ``(first_line,
    line_count, payload, problems)``.  A record is checked as ingest reads it, so ``cbgp publish`` can send
    each one as soon as it is checked."""
    for first, lines, payload in chunk_lines(data, fmt, chunk_bytes):
        body_lines = payload.count(b"\n") + (0 if payload.endswith(b"\n") or not payload else 1)
        yield first, lines, payload, check_record(payload, fmt, first, max(0, body_lines - lines))


def check_input(data: bytes, fmt: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[tuple[int, str]]:
    """Every problem of ``data`` (:func:`checked_records`), in line order, lines counted in ``data``."""
    return [problem for *_record, problems in checked_records(data, fmt, chunk_bytes) for problem in problems]


def _read_input(path: str, fmt: str | None, stdin: Any = None) -> tuple[bytes, str, str]:
    """``(data, format, name to show)`` of ``path`` (``-``: standard input)."""
    from cbgp.inputs.formats import FORMATS, detect_format, sniff_format

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
                fmt = sniff_format(data)
                if fmt is None:
                    raise UserError(f"cannot tell the format of {path} from its name or its first lines: pass "
                                    f"--format ({', '.join(known)})") from None
                print(f"{path}: read as {fmt} from its first lines (pass --format to say otherwise)", file=sys.stderr)
    return data, fmt, path


def publish_file(settings: KafkaSettings, path: str, fmt: str | None = None, *,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, progress: bool = False, out: TextIO | None = None,
                 strict: bool = False, stdin: Any = None) -> dict[str, int]:
    """Check ``path`` (``-``: ``stdin``, default standard input) and send it to ``updates.raw`` (see the module
    docstring); returns ``{records, lines, bytes, problems}``.

    Each record is checked (:func:`checked_records`) and sent at once, so ingest starts on the first while the
    rest is checked; each problem found is printed to ``out`` (default: stderr at call time) as
    ``FILE:LINE: reason`` before its record is sent.  The input is sent as it is (ingest dead-letters the bad
    parts), except records over the size limit.  With ``strict`` the whole input is checked first and nothing is
    sent if anything is wrong (:class:`UserError`).  Progress and the summary go to ``out`` too."""
    out = sys.stderr if out is None else out
    data, fmt, name = _read_input(path, fmt, stdin)
    records: Iterable[tuple[int, int, bytes, list[tuple[int, str]]]] = checked_records(data, fmt, chunk_bytes)
    meter = _Meter(out, progress, len(data))
    shown = 0

    def report(problems: list[tuple[int, str]]) -> None:
        nonlocal shown
        printed = problems[:max(0, MAX_PROBLEMS_SHOWN - shown)]
        shown += len(problems)
        if printed:
            meter.clear()
            out.writelines(f"{name}:{line}: {reason}\n" for line, reason in printed)
            out.flush()

    counts = {"records": 0, "lines": 0, "bytes": 0, "problems": 0}
    if strict:
        records = list(records)
        for *_record, problems in records:
            report(problems)
            counts["problems"] += len(problems)
        if counts["problems"]:
            _more_not_shown(out, name, shown)
            raise UserError(f"{counts['problems']} problem(s) in {name}; nothing published (--strict)")
    require_broker(settings)
    topic = settings.topic("updates.raw")
    producer = make_producer(settings, idempotent=False, max_in_flight_requests_per_connection=1)
    errors: list[str] = []
    start = time.monotonic()
    source = os.path.basename(name).encode()
    publish_id = uuid.uuid4().hex.encode()
    bell = doorbell()

    def delivered(err: Any, msg: Any) -> None:
        if err:
            errors.append(str(err))
        else:
            bell.ring([(topic, msg.partition())])  # (wakes ingest from its deep pause: services.kafka.doorbell)

    for first, lines, payload, problems in records:
        if not strict:
            report(problems)
            counts["problems"] += len(problems)
        if len(payload) > MAX_RECORD_BYTES:
            continue  # reported: the broker would refuse it
        headers = [("cbgp-format", fmt.encode()), ("cbgp-source", source), ("cbgp-first-line", str(first).encode()),
                   (PUBLISH_HEADER, publish_id), (NUMBER_HEADER, str(counts["records"] + 1).encode())]
        while True:
            try:
                producer.produce(topic, value=payload, headers=headers, on_delivery=delivered)
                break
            except BufferError:  # local queue full: let deliveries drain, then retry
                producer.poll(0.1)
        producer.poll(0)
        counts["records"] += 1
        counts["lines"] += lines
        counts["bytes"] += len(payload)
        meter.tick(counts["lines"], counts["bytes"])
    _more_not_shown(out, name, shown)
    if producer.flush(60):
        errors.append("some records were not acknowledged within 60 s")
    if errors:
        raise UserError(f"publish to {topic} failed: {errors[0]} ({len(errors)} record(s) affected)")
    elapsed = time.monotonic() - start
    problems = counts["problems"]
    flagged = f", {problems} with problems listed above" if problems else ""
    meter.done(f"published {counts['lines']:,} line{'' if counts['lines'] == 1 else 's'} ({counts['bytes']:,} bytes, {fmt}{flagged}) in "
               f"{counts['records']} record(s) to {topic} in {elapsed:.1f} s "
               f"({counts['lines'] / max(elapsed, 1e-9):,.0f} lines/s)")
    return counts


def _more_not_shown(out: TextIO, name: str, shown: int) -> None:
    if shown > MAX_PROBLEMS_SHOWN:
        out.write(f"{name}: {shown - MAX_PROBLEMS_SHOWN:,} more problem(s) not shown\n")
        out.flush()
