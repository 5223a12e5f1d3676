"""What the user commands say about bad input and a wrong broker address:
``publish`` checks its input with ingest's parsers and limits, ``deadletter`` shows what the fleet rejected,
``-`` reads standard input, and an unreachable broker is one line within seconds, exit code 2."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from services.commands.main import main as cbgp
from services.codec import decode
from services.ingest.core import IngestProcessor, RawRecord
from services.kafka.config import KafkaSettings
from services.kafka.client import make_producer, read_all
from services.kafka.broker import free_port
from services.runtime.supervise import cbgp_command
from cbgp.inputs.formats import sniff_format
from services.client.publish import check_input, checked_records

EX = "http://ex.org/"
BAD_PATCH = (f"A <{EX}s> <{EX}p> <{EX}o1> .\n"
             f"A <{EX}s> <{EX}p> .\n"                     # 2: two terms
             f"A <{EX}s> <{EX}p> <{EX}o3> .\n"
             f"A \"lit\" <{EX}p> <{EX}o4> .\n"            # 4: literal subject
             f"A <{EX}s> <{EX}p> <{EX}o5> .\n")
BIG_LITERAL = "x" * 600_000
BAD_UPDATE = f'PREFIX ex: <{EX}>\nINSERT DATA {{\n  ex:s ex:p "unterminated .\n}}\n'


def flags(settings: KafkaSettings) -> list[str]:
    return ["--bootstrap-servers", settings.bootstrap_servers, "--topic-prefix", settings.topic_prefix]


def _ingest_dead_lines(data: bytes, fmt: str) -> list[int | None]:
    """The lines the real ingest transform dead-letters for ``data`` sent as one record."""
    processor = IngestProcessor(KafkaSettings(topic_prefix="x."), 4, 4)
    outputs = processor.process(RawRecord(data, {"cbgp-format": fmt.encode()}))
    return [decode("DeadLetter", o.value)["line"] for o in outputs if o.topic == "x.deadletter"]


def test_check_input_reports_what_ingest_dead_letters() -> None:
    patch = BAD_PATCH.encode()
    problems = check_input(patch, "patch")
    assert [line for line, _ in problems] == [2, 4] == _ingest_dead_lines(patch, "patch")
    assert "literal" in problems[1][1]

    big = f'<{EX}s> <{EX}p> <{EX}o> .\n<{EX}s> <{EX}p> "{BIG_LITERAL}" .\n'.encode()
    problems = check_input(big, "ntriples")
    assert [line for line, _ in problems] == [2] == _ingest_dead_lines(big, "ntriples")
    assert "a term of 600,002 bytes is over the limit of 65,536 (CBGP_MAX_TERM_BYTES)" in problems[0][1]

    update = BAD_UPDATE.encode()
    problems = check_input(update, "sparql-update")
    assert len(problems) == 1 and problems[0][0] == 3 and "syntax error at line 3" in problems[0][1]
    assert len(_ingest_dead_lines(update, "sparql-update")) == 1
    assert check_input(f'INSERT DATA {{ <{EX}s> <{EX}p> "ok" }}'.encode(), "sparql-update") == []

    # A record the broker would refuse is a problem too (at its first line), never sent.
    huge = "".join(f'A <{EX}s> <{EX}p> "{i}{"y" * 100}" .\n' for i in range(10_000))
    problems = check_input(f"TX .\n{huge}TC .\n".encode(), "patch")
    assert [line for line, _ in problems] == [1] and "record limit" in problems[0][1]


def test_records_checked_one_by_one_find_what_one_whole_check_finds_at_the_same_lines() -> None:
    """cbgp publish checks and sends record by record: split into many records (patch prefixes repeated at the
    head of each), the problems and their lines are those of the input checked as one record, and each record's
    are the lines the real ingest dead-letters in it."""
    lines = [f"PA ex: <{EX}> .\n"]
    for i in range(1, 400):
        if i % 37 == 0:
            lines.append(f"A ex:s{i} ex:p .\n")                      # two terms
        elif i % 53 == 0:
            lines.append(f'A "lit" ex:p ex:o{i} .\n')                # a literal subject
        elif i % 61 == 0:
            lines.append(f"TX .\nA ex:s{i} ex:p ex:o .\nA ex:s{i} ex:p ex:o \"open .\nTC .\n")  # 4 lines
        else:
            lines.append(f"A ex:s{i} ex:p ex:o{i} .\n")
    data = "".join(lines).encode()
    whole = check_input(data, "patch", chunk_bytes=len(data) + 1)
    assert len(whole) == 10 + 7 + 6 and len({line for line, _ in whole}) == len(whole)
    assert check_input(data, "patch", chunk_bytes=500) == whole
    records = list(checked_records(data, "patch", chunk_bytes=500))
    assert len(records) >= 20 and all(r[2].startswith(lines[0].encode()) for r in records)
    for first, count, payload, problems in records:
        dead = [first + line - 1 - (payload.count(b"\n") - count) for line in _ingest_dead_lines(payload, "patch")]
        assert [line for line, _ in problems] == dead
    assert [line for line, _ in whole] == [line for *_r, problems in records for line, _ in problems]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_publish_reports_each_problem_publishes_the_rest_and_fails(kafka_settings: KafkaSettings, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "changes.rdfp"
    path.write_text(BAD_PATCH)
    assert cbgp(["publish", str(path), "--strict", *flags(kafka_settings)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": ", 1)[0] for line in err[:2]] == [f"{path}:2", f"{path}:4"]
    assert err[2] == f"cbgp publish: error: 2 problem(s) in {path}; nothing published (--strict)"
    assert read_all(kafka_settings, kafka_settings.topic("updates.raw")) == []

    assert cbgp(["publish", str(path), *flags(kafka_settings)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": ", 1)[0] for line in err[:2]] == [f"{path}:2", f"{path}:4"]
    assert "published 5 lines" in err[2] and "2 with problems" in err[2]
    assert err[3].startswith("cbgp publish: error: 2 problem(s)") and "cbgp deadletter" in err[3]
    records = read_all(kafka_settings, kafka_settings.topic("updates.raw"))
    assert b"".join(m.value() for m in records) == BAD_PATCH.encode()  # the good lines reach ingest

    # A name that does not say the format: read from the first lines, and said so; a problem names its column.
    text = tmp_path / "changes.txt"
    text.write_text(f'<{EX}s> <{EX}p> <{EX}o> .\n<{EX}s> <{EX}p> "open .\n')
    assert cbgp(["publish", str(text), "--strict", *flags(kafka_settings)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"{text}: read as ntriples from its first lines (pass --format to say otherwise)"
    assert err[1] == f"{text}:2: unterminated string literal (column {len(f'<{EX}s> <{EX}p> ') + 1})"
    text.write_text(f'<{EX}s> <{EX}p> <{EX}o> .\n')
    assert cbgp(["publish", str(text), *flags(kafka_settings)]) == 0
    assert "published 1 line (" in capsys.readouterr().err
    text.write_text("hello\n")
    assert cbgp(["publish", str(text), *flags(kafka_settings)]) == 1
    assert "cannot tell the format of" in capsys.readouterr().err


@pytest.mark.parametrize("data, fmt", [
    (f"# changes\nA <{EX}s> <{EX}p> <{EX}o> .\n", "patch"), (f"TX .\nA <{EX}s> <{EX}p> <{EX}o> .\nTC .\n", "patch"),
    (f'<{EX}s> <{EX}p> "x"@en .\n', "ntriples"), (f"<{EX}s> <{EX}p> <{EX}o> <{EX}g> .\n", "nquads"),
    (f"@prefix ex: <{EX}> .\nex:s ex:p ex:o .\n", "turtle"), (f"PREFIX ex: <{EX}>\nex:s ex:p \"INSERT\" .\n", "turtle"),
    (f"<{EX}s> <{EX}p> <{EX}o> ;\n  <{EX}q> <{EX}o> .\n", "turtle"),
    (f"PREFIX ex: <{EX}>\nDELETE DATA {{ ex:s ex:p ex:o }}\n", "sparql-update"),
    (f'{{"op": "+", "s": "<{EX}s>", "p": "<{EX}p>", "o": "<{EX}o>"}}\n', "jsonl"), ("plain words\n", None)])
def test_a_format_is_told_from_the_first_lines(data: str, fmt: str | None) -> None:
    assert sniff_format(data.encode()) == fmt


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_publish_and_register_read_standard_input(kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    triples = f"<{EX}a> <{EX}p> <{EX}b> .\n<{EX}b> <{EX}p> <{EX}c> .\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(triples.encode())))
    assert cbgp(["publish", "-", "--format", "ntriples", *flags(kafka_settings)]) == 0
    assert "published 2 lines" in capsys.readouterr().err
    (msg,) = read_all(kafka_settings, kafka_settings.topic("updates.raw"))
    assert msg.value() == triples.encode() and dict(msg.headers())["cbgp-format"] == b"ntriples"

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert cbgp(["publish", "-", *flags(kafka_settings)]) == 1
    assert "pass --format" in capsys.readouterr().err

    query = f"SELECT ?x WHERE {{ ?x <{EX}p> <{EX}b> }}"
    monkeypatch.setattr(sys, "stdin", io.StringIO(query))
    assert cbgp(["register", "q", "-", "--wait", "1", *flags(kafka_settings)]) == 1  # no registry running
    assert "no reply from the registry" in capsys.readouterr().err
    (command,) = [decode("AdminCommand", m.value()) for m in read_all(kafka_settings, kafka_settings.topic("admin"))]
    assert (command["command"], command["query_id"], command["sparql"]) == ("REGISTER", "q", query)


def _put_dead_letters(settings: KafkaSettings, data: bytes, fmt: str, offset: int) -> None:
    """Dead letters as ingest writes them, for a raw record at ``offset`` of updates.raw: in a transaction, whose
    commit marker takes an offset of the topic (so offsets skip; the printed numbers must not)."""
    processor = IngestProcessor(settings, 4, 4)
    raw = RawRecord(data, {"cbgp-format": fmt.encode()}, settings.topic("updates.raw"), 0, offset)
    producer = make_producer(settings, transactional_id=f"test-deadletters-{offset}")
    producer.begin_transaction()
    for out in processor.process(raw):
        if out.topic == settings.topic("deadletter"):
            producer.produce(out.topic, out.value)
    producer.commit_transaction(30)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_deadletter_prints_one_readable_line_per_rejection(kafka_settings: KafkaSettings, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    _put_dead_letters(kafka_settings, BAD_PATCH.encode(), "patch", 7)
    _put_dead_letters(kafka_settings, BAD_UPDATE.encode(), "sparql-update", 8)
    assert cbgp(["deadletter", *flags(kafka_settings)]) == 0
    lines = capsys.readouterr().out.splitlines()
    raw = kafka_settings.topic("updates.raw")
    assert len(lines) == 3
    assert lines[0].startswith("#1 ") and f" ingest {raw}[0]@7 line 2: malformed-rdf: an A row needs" in lines[0]
    assert lines[0].endswith(f'-- "A <{EX}s> <{EX}p> ."')
    assert f"{raw}[0]@7 line 4: malformed-rdf: a literal cannot be the subject" in lines[1]
    assert lines[2].startswith("#3 ") and f"{raw}[0]@8: invalid-update: syntax error at line 3" in lines[2]
    assert lines[2].endswith('-- "PREFIX ex: <http://ex.org/>\\nINSERT DATA {\\n  ex:s ex:p \\"unterminated .\\n}"')

    assert cbgp(["deadletter", "--from", "3", *flags(kafka_settings)]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["#3"]

    # (stderr to a file, not an unread pipe: the client's log lines on a loaded broker can fill a pipe, and a
    # follower blocked writing to it never ends)
    with open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen(cbgp_command("deadletter", "--follow", "--from", "3", *flags(kafka_settings)),
                                stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert proc.stdout.readline().startswith("#3 ")
        _put_dead_letters(kafka_settings, b"A <x> .\n", "patch", 9)  # arrives while it follows
        assert proc.stdout.readline().startswith("#4 ")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0, (tmp_path / "stderr").read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_every_command_says_in_one_line_that_the_broker_cannot_be_reached(tmp_path: Path) -> None:
    (tmp_path / "ok.nt").write_text(f"<{EX}a> <{EX}p> <{EX}b> .\n")
    (tmp_path / "q.rq").write_text(f"SELECT ?x WHERE {{ ?x <{EX}p> <{EX}b> }}")
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    commands: list[list[str]] = [["publish", str(tmp_path / "ok.nt")], ["register", "q", str(tmp_path / "q.rq")],
                                 ["unregister", "q"], ["list"], ["watch", "q"], ["current", "q"], ["deadletter"],
                                 ["topics", "create"], ["doctor"]]
    results: dict[str, tuple[int, float, str, str]] = {}
    for batch in (commands[0:3], commands[3:6], commands[6:9]):  # three at a time: the machine has 2 cores
        started = time.monotonic()
        procs: dict[str, Any] = {c[0]: subprocess.Popen(cbgp_command(*c, "--bootstrap-servers", address),
                                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                                 for c in batch}
        for name, proc in procs.items():
            try:
                out, err = proc.communicate(timeout=max(1.0, started + 40 - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            results[name] = (proc.returncode, time.monotonic() - started, out, err)
    for name, (code, elapsed, out, err) in results.items():
        assert code == 2, (name, code, err)
        lines = err.splitlines()
        assert len(lines) == 1, (name, err[:2000])
        assert f"cannot reach the Kafka broker at {address} (Connection refused)" in lines[0], (name, lines[0])
        assert "CBGP_BOOTSTRAP_SERVERS" in lines[0]
        assert out == "", (name, out)
    # Each waits 5 s for the broker's answer.
    assert max(elapsed for _c, elapsed, _o, _e in results.values()) < 12, {n: round(r[1], 1) for n, r in results.items()}


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_deadletter_does_not_wait_forever_behind_an_open_transaction(kafka_settings: KafkaSettings,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    _put_dead_letters(kafka_settings, b"A <x> .\n", "patch", 1)
    producer = make_producer(kafka_settings, transactional_id=kafka_settings.topic("open-txn"))
    producer.begin_transaction()
    producer.produce(kafka_settings.topic("deadletter"), value=b"not yet committed")
    producer.flush(10)  # stored, never committed: read_committed readers stop before it
    started = time.monotonic()
    assert cbgp(["deadletter", *flags(kafka_settings)]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["#1"]
    assert time.monotonic() - started < 10
    producer.abort_transaction(10)
