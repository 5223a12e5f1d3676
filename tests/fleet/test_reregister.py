"""Re-registration end to end: a re-registered id does not inherit the old query's answers.

The scenario of the issue, through the CLI against a real fleet (embedded broker, registry, ingest, a worker,
answers): register ``late``, publish, unregister (``current`` fails in one line, answers.current has no live
key of ``late``), register ``late`` with a different query: ``current`` returns only the new rows and
``watch --from 1`` starts with the new registration's first answer.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from services.commands.main import main as cbgp
from services.kafka.config import KafkaSettings
from services.kafka.topics import ensure_topics
from services.kafka.broker import free_port
from tests.fleet_support import Fleet, read_current

EX = "http://ex.org/"
DATA = "".join(f"A <{EX}s{i}> <{EX}p> <{EX}o{i}> .\n" for i in range(5)) + \
    "".join(f"A <{EX}t> <{EX}q> <{EX}v{i}> .\n" for i in range(3))
OLD_ROWS = sorted(f"{EX}s{i}" for i in range(5))
NEW_ROWS = sorted(f"{EX}v{i}" for i in range(3))


def flags(settings: KafkaSettings) -> list[str]:
    return ["--bootstrap-servers", settings.bootstrap_servers, "--topic-prefix", settings.topic_prefix]


def current(settings: KafkaSettings, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cbgp(["current", "late", *flags(settings)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def rows_of(out: str, var: str) -> list[str]:
    return sorted(b[var]["value"] for b in json.loads(out)["results"]["bindings"])


def eventually(check, timeout: float = 90.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {what}")
        time.sleep(0.5)


def wait_ready(fleet: Fleet, name: str, timeout: float = 90.0, port: int | None = None) -> None:
    base = f"http://127.0.0.1:{port}/metrics" if port is not None else fleet.metrics_url(name, timeout)
    url = base.removesuffix("/metrics") + "/readyz"

    def ready() -> bool:
        try:
            return urllib.request.urlopen(url, timeout=5).status == 200
        except OSError:
            return False

    eventually(ready, timeout, f"{name} ready")


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_re_registered_id_starts_a_new_answer_stream(kafka_settings: KafkaSettings, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    settings = kafka_settings
    ensure_topics(settings)
    f = flags(settings)
    old_query, new_query = tmp_path / "old.rq", tmp_path / "new.rq"
    old_query.write_text(f"SELECT ?x WHERE {{ ?x <{EX}p> ?o }}")
    new_query.write_text(f"SELECT ?y WHERE {{ <{EX}t> <{EX}q> ?y }}")
    data = tmp_path / "data.rdfp"
    data.write_text(DATA)
    with Fleet(settings, tmp_path / "logs") as fleet:
        registry_port = free_port()
        fleet.start("registry", "registry", "--web-port", str(free_port()), "--state-dir", str(tmp_path / "state"),
                    "--metrics-port", str(registry_port))
        fleet.start("ingest", "ingest", "--instance-id", "i1")
        fleet.start("w0", "worker", "--worker-id", "w0")
        fleet.start("answers", "answers", "--instance-id", "a1")
        wait_ready(fleet, "registry", port=registry_port)
        for name in ("ingest", "w0", "answers"):
            wait_ready(fleet, name)

        assert cbgp(["register", "late", str(old_query), *f]) == 0
        assert capsys.readouterr().out.startswith("accepted:")
        assert cbgp(["publish", str(data), *f]) == 0
        capsys.readouterr()

        def old_rows_current() -> bool:
            code, out, _err = current(settings, capsys)
            return code == 0 and rows_of(out, "x") == OLD_ROWS

        eventually(old_rows_current, what="the first registration's answers")

        # Unregister: current fails in one line, and the answers service retracts every current answer.
        assert cbgp(["unregister", "late", *f]) == 0
        capsys.readouterr()
        code, out, err = current(settings, capsys)
        assert code != 0 and out == ""
        assert err.count("\n") == 1 and "'late'" in err and "registered" in err
        eventually(lambda: not read_current(settings).get("late"), 60, "answers.current without live keys of late")

        # Register the id again with another query: a new stream, with none of the old rows.
        assert cbgp(["register", "late", str(new_query), *f]) == 0
        assert capsys.readouterr().out.startswith("accepted:")

        def new_rows_current() -> bool:
            code, out, _err = current(settings, capsys)
            return code == 0 and json.loads(out)["head"]["vars"] == ["y"] and rows_of(out, "y") == NEW_ROWS

        eventually(new_rows_current, what="the second registration's answers")
        assert set(read_current(settings)["late"]) == {json.dumps({"y": f"<{v}>"}, separators=(",", ":"))
                                                        for v in NEW_ROWS}

        assert cbgp(["watch", "late", "--from", "1", "--count", "1", *f]) == 0
        first = json.loads(capsys.readouterr().out.splitlines()[0])
        assert first["version"] == 2 and first["n"] == 1 and first["sign"] == "+" and first["snapshot"]
        assert set(first["binding"]) == {"y"} and first["binding"]["y"]["value"] in NEW_ROWS
