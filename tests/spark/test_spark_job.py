"""``cbgp spark-job`` as a process: it compacts on its interval and stops cleanly on SIGTERM.

This runs the entry point in a child process (its own JVM), because signal handling and shutdown are
exactly what an in-process test cannot show: the process must exit 0 and leave no JVM or Python worker
behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from services.codec import encode
from services.kafka.client import make_producer, read_all
from services.kafka.config import KafkaSettings
from spark.job import build_parser

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def answer(q: str, n: int, sign: str, value: str) -> bytes:
    return encode("Answer", {"query_id": q, "n": n, "seq": n, "sign": sign, "snapshot": False, "produced_at_ms": 0,
                             "binding": {"x": {"type": "uri", "value": value}}})


def wait_for(predicate, timeout: float, what: str) -> None:  # noqa: ANN001 - a zero-argument predicate
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def test_parser_defaults_match_the_cli_contract() -> None:
    args = build_parser().parse_args([])
    assert args.master == "local[2]" and args.compact_interval == 60.0 and not args.once
    args = build_parser().parse_args(["--compact-interval", "5", "--master", "local[1]", "--once"])
    assert (args.compact_interval, args.master, args.once) == (5.0, "local[1]", True)


def test_job_compacts_periodically_and_exits_cleanly_on_sigterm(kafka_settings: KafkaSettings, tmp_path: Path) -> None:
    producer = make_producer(kafka_settings)
    topic = kafka_settings.topic("answers")
    for n, (sign, value) in enumerate([("+", "http://a"), ("+", "http://b"), ("-", "http://a")], start=1):
        producer.produce(topic, key=b"q1", value=answer("q1", n, sign, value))
    assert producer.flush(10) == 0

    env = {**os.environ, **kafka_settings.to_env()}
    log_path = tmp_path / "job.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spark.job", "--compact-interval", "1", "--master", "local[1]",
             "--state-dir", str(tmp_path / "state")],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
    manifest = tmp_path / "state" / "snapshot" / "manifest.json"
    try:
        wait_for(lambda: manifest.exists() and json.loads(manifest.read_text())["queries"].get("q1") == 3, 150,
                 "first compaction did not happen")
        # A later delta is picked up by a later trigger of the same running query.
        producer.produce(topic, key=b"q1", value=answer("q1", 4, "+", "http://c"))
        assert producer.flush(10) == 0
        wait_for(lambda: json.loads(manifest.read_text())["queries"].get("q1") == 4, 60,
                 "second compaction did not happen")
        # answers.current belongs to the answers service: the job's folds (a fold behind it) leave it alone
        assert read_all(kafka_settings, kafka_settings.topic("answers.current"), timeout=10) == []
        children = psutil.Process(proc.pid).children(recursive=True)
        assert any("java" in c.name() for c in children)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log_path.read_text()[-3000:]
        gone, alive = psutil.wait_procs(children, timeout=20)
        assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_second_run_against_a_fresh_broker_with_the_same_state_dir_answers_from_that_broker(tmp_path: Path) -> None:
    # `make run` twice = a fresh broker each time, the same .run/spark
    import pyarrow.parquet as pq

    from services.kafka.broker import EmbeddedBroker
    from services.kafka.topics import ensure_topics

    state = tmp_path / "state"
    runs = [["http://a", "http://b"], ["http://c", "http://d", "http://e"]]
    for i, values in enumerate(runs):
        with EmbeddedBroker(tmp_path / f"broker{i}") as broker:
            settings = broker.settings()
            ensure_topics(settings)
            producer = make_producer(settings)
            for n, value in enumerate(values, start=1):
                producer.produce(settings.topic("answers"), key=b"q1", partition=0, value=answer("q1", n, "+", value))
            assert producer.flush(10) == 0
            proc = subprocess.run([sys.executable, "-m", "spark.job", "--once", "--only", "compaction", "--master",
                                   "local[1]", "--state-dir", str(state)], env={**os.environ, **settings.to_env()},
                                  capture_output=True, text=True, timeout=200)
            assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((state / "snapshot" / "manifest.json").read_text())
    assert manifest["queries"] == {"q1": 3}
    rows = pq.read_table(state / "snapshot" / f"v{manifest['version']:06d}").to_pylist()
    text = json.dumps(rows, default=str)
    assert all(v in text for v in runs[1]) and not any(v in text for v in runs[0]), rows
    assert "started clean" in proc.stderr
    status = json.loads((state / "status.json").read_text())
    assert status["reset"] and status["queries"]["compaction"]["state"] in ("finished", "stopped")
