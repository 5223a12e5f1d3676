"""`make run` (python -m services.commands.run) as a real process: answers for the example queries, no orphans."""

from __future__ import annotations

import io
import json
import signal
import subprocess
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from services.runtime.supervise import ChildProcess

QUERIES = sorted(p.stem for p in (Path(__file__).parents[2] / "services" / "commands" / "demo" / "queries").glob("*.rq"))
# cbgp replay has no event times, so it evaluates the unwindowed examples; the fleet run covers them all
# cbgp replay has no endpoint: the SERVICE query is checked through the fleet (and tests/fleet/test_background_fleet_e2e.py)
UNWINDOWED = [q for q in QUERIES if not q.startswith(("windowed_", "service_"))]


def _survivors(pids: list[int], run_dir: Path) -> list[str]:
    """Processes still alive from the run: by pid, or anything whose command line names its run dir."""
    alive = [f"pid {pid}" for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if str(run_dir) in " ".join(proc.info["cmdline"] or []):
            alive.append(f"pid {proc.info['pid']}: {' '.join(proc.info['cmdline'])[:120]}")
    return alive


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_run_shows_answers_for_every_example_query_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    stderr_path = tmp_path / "run.stderr"
    with open(stderr_path, "w") as stderr:
        # (trimming every 3 s: the internal logs are cut while the Spark job's JVM still starts, below what its
        # duties will read first, which the floor must keep)
        child = subprocess.Popen([sys.executable, "-m", "services.commands.run", "--run-dir", str(run_dir), "--json",
                                  "--trim-interval", "3"],
                                 stdout=subprocess.PIPE, stderr=stderr, text=True,
                                 # no CBGP_* from the test environment: run.py must start its own broker
                                 env={k: v for k, v in os.environ.items() if not k.startswith("CBGP_")})
    # Until the live view shows every example query (the Spark job's first micro-batches, which serve the
    # multi-part and windowed ones, need a JVM and Python workers: a minute or more on a loaded machine).
    deadline = time.monotonic() + 360
    while time.monotonic() < deadline and child.poll() is None:
        if all(f"  {query}: " in stderr_path.read_text(errors="replace") for query in QUERIES):
            break
        time.sleep(2)
    # The services wake each other through the run's doorbell, which the run file names for cbgp publish.
    bell_dirs = [line.split("=", 1)[1] for line in (run_dir / "cbgp.env").read_text().splitlines()
                 if line.startswith("CBGP_DOORBELL_DIR=")]
    listening = [name for path in bell_dirs for name in os.listdir(path)]
    child.send_signal(signal.SIGTERM)  # the same ordered shutdown as Ctrl-C
    stdout, _ = child.communicate(timeout=100)
    proc = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr_path.read_text(errors="replace"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary == json.loads((run_dir / "summary.json").read_text())
    assert sorted(summary["queries"]) == QUERIES, proc.stderr[-3000:]
    for query, seen in summary["queries"].items():
        assert seen["answers"] > 0 and seen["last"], query
    # The live view printed the same per-query lines on stderr.
    assert all(f"  {query}: " in proc.stderr for query in QUERIES)
    assert {"ingest", "registry", "worker-0", "worker-1", "answers", "background", "spark-job"} <= set(summary["children"])
    assert all(child["exit"] == 0 for child in summary["children"].values()), summary["children"]
    pids = [c["pid"] for c in summary["children"].values()] + [summary["broker_pid"]]
    assert _survivors(pids, run_dir) == []
    assert len(bell_dirs) == 1 and len(listening) >= 5, listening  # ingest, each worker, answers, gateway
    assert not os.path.exists(bell_dirs[0])


@pytest.mark.timeout(60)
def test_a_child_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    stubborn = ChildProcess("stubborn", [sys.executable, "-c",
                                          "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                          "print('ready', flush=True)\ntime.sleep(600)"],
                            log_path=tmp_path / "stubborn.log").start()
    stubborn.wait_until(lambda: "ready" in stubborn.log_tail(), timeout=30)
    assert stubborn.stop(grace=1) == -signal.SIGKILL  # SIGTERM was ignored, so SIGKILL ended it
    assert not stubborn.alive() and not psutil.pid_exists(stubborn.pid)


def test_shipped_demo_stream_is_what_the_generator_writes() -> None:
    from services.commands.demo.generate import DEFAULT_PATH, generate

    text = DEFAULT_PATH.read_text(encoding="utf-8")
    assert text == generate()
    updates = [line for line in text.splitlines() if line[:2] in ("A ", "D ")]
    deletions = sum(line.startswith("D ") for line in updates)
    assert 2000 <= len(updates) <= 5000 and 0.15 <= deletions / len(updates) <= 0.30


def test_every_example_query_has_answers_on_the_demo_stream(tmp_path: Path) -> None:
    import io

    from cbgp.engine_cli import replay

    demo = Path(__file__).parents[2] / "services" / "commands" / "demo"
    out = io.StringIO()
    replay(str(demo / "updates.rdfp"), [(q, str(demo / "queries" / f"{q}.rq")) for q in UNWINDOWED], out)
    signs = {(json.loads(line)["query"], json.loads(line)["sign"]) for line in out.getvalue().splitlines()}
    assert signs == {(q, s) for q in UNWINDOWED for s in "+-"}  # every query gains and loses answers


# ---------------------------------------------------------------------------------------- the live view


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _answer(n: int, binding: dict) -> bytes:
    from services.codec import encode

    return encode("Answer", {"query_id": "people", "n": n, "seq": n, "sign": "+", "snapshot": False,
                             "produced_at_ms": 0, "binding": binding})


def _publish_view_inputs(settings) -> None:  # noqa: ANN001 - KafkaSettings
    from cbgp.change import Change
    from services.codec import encode_encoded_batch
    from services.kafka.client import make_producer

    producer = make_producer(settings)
    xsd_int = "http://www.w3.org/2001/XMLSchema#integer"
    producer.produce(settings.topic("answers"), key=b"people", partition=0, value=_answer(1, {
        "p": {"type": "uri", "value": "http://example.org/bob", "datatype": None, "lang": None},
        "name": {"type": "literal", "value": "Bob", "datatype": None, "lang": "en"},
        "age": {"type": "literal", "value": "42", "datatype": xsd_int, "lang": None}}))
    # one Kafka record holding three changes, one of them a refresh (the graph does not change)
    changes = [Change(1, 1, 11, 12, 13, 0), Change(2, 1, 21, 12, 13, 0), Change(3, 1, 11, 12, 13, 0, refresh=True)]
    producer.produce(settings.topic("updates.encoded"), partition=0,
                     value=encode_encoded_batch(changes, [(0, 0), (0, 0), (0, 1)], "raw"))
    assert producer.flush(10) == 0


def _view(settings, out, tmp_path: Path, wait: bool = True, **kw):  # noqa: ANN001, ANN202
    from services.commands.run import LiveView

    view = LiveView(settings, out, spark_status_path=tmp_path / "status.json", **kw)
    deadline = time.monotonic() + 30
    while wait and (view.total < 1 or view.changes < 2) and time.monotonic() < deadline:
        view.pump(0.5)
    return view


@pytest.mark.slow
def test_live_view_prints_terms_in_ntriples_form_and_counts_changes_not_records(kafka_settings, tmp_path: Path) -> None:
    _publish_view_inputs(kafka_settings)
    out = io.StringIO()
    view = _view(kafka_settings, out, tmp_path, summary_every=0)
    try:
        view.draw([], 3.0)
    finally:
        view.close()
    text = out.getvalue()
    assert '?name="Bob"@en' in text
    assert '?age="42"^^<http://www.w3.org/2001/XMLSchema#integer>' in text
    assert "?p=<http://example.org/bob>" in text
    assert "updates in 2 changes" in text  # three rows in one record, one a refresh


@pytest.mark.slow
def test_the_view_reads_only_the_newest_graph_changes_not_the_whole_stream(kafka_settings, tmp_path: Path) -> None:
    """updates.encoded is the stream itself: the view counts its changes from the log's last records, read when
    it draws, and reads the records committed since the last draw only."""
    from cbgp.change import Change
    from services.codec import encode_encoded_batch
    from services.commands.run import LiveView
    from services.kafka.client import make_producer

    producer = make_producer(kafka_settings)

    def publish(first: int, count: int) -> None:
        for seq in range(first, first + count):  # one record per change, as small transactions make them
            producer.produce(kafka_settings.topic("updates.encoded"), partition=0,
                             value=encode_encoded_batch([Change(seq, 1, seq, 2, 3, 0)], [(0, seq)], "raw"))
        assert producer.flush(10) == 0

    publish(1, 400)
    view = LiveView(kafka_settings, io.StringIO(), spark_status_path=tmp_path / "status.json")
    read: list[int] = []
    take, wait = view.tail.take, view.tail.wait
    view.tail.take = lambda: [msg for msg in take() if not read.append(msg.offset())]
    view.tail.wait = lambda timeout: [msg for msg in wait(timeout) if not read.append(msg.offset())]
    try:
        assert view.changes == 400
        assert 0 < len(read) <= LiveView.TAIL_RECORDS and min(read) >= 400 - LiveView.TAIL_RECORDS, read
        publish(401, 3)
        read.clear()
        view._tail_at = 0.0  # (the next draw)
        assert view.changes == 403
        assert sorted(read) == [400, 401, 402], read
    finally:
        view.close()


@pytest.mark.slow
def test_the_view_reads_an_answers_log_cut_by_retention(kafka_settings, tmp_path: Path) -> None:  # noqa: ANN001
    """answers keeps 7 days: the view (not a restore) starts where each log starts now instead of refusing."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from services.kafka.client import make_producer

    _publish_view_inputs(kafka_settings)
    producer = make_producer(kafka_settings)
    producer.produce(kafka_settings.topic("answers"), key=b"people", partition=0, value=_answer(2, {
        "p": {"type": "uri", "value": "http://example.org/eve", "datatype": None, "lang": None}}))
    assert producer.flush(10) == 0
    admin = AdminClient(kafka_settings.admin_config())
    for future in admin.delete_records([TopicPartition(kafka_settings.topic("answers"), 0, 1)],
                                       request_timeout=10).values():
        future.result(10)  # the first answer is gone
    view = _view(kafka_settings, io.StringIO(), tmp_path)
    try:
        assert view.total == 1 and view.changes == 2
    finally:
        view.close()


@pytest.mark.slow
def test_without_a_terminal_the_view_prints_a_line_only_when_something_changed(kafka_settings, tmp_path: Path) -> None:
    _publish_view_inputs(kafka_settings)
    out = io.StringIO()
    view = _view(kafka_settings, out, tmp_path, summary_every=0)
    try:
        for second in range(20):  # twenty ticks with nothing new
            view.pump(0.01)
            view.draw([], float(second))
        assert len(out.getvalue().splitlines()) == 2, out.getvalue()  # the summary and people's newest delta
        assert "\x1b" not in out.getvalue()
        from services.kafka.client import make_producer

        producer = make_producer(kafka_settings)
        producer.produce(kafka_settings.topic("answers"), key=b"people", partition=0, value=_answer(2, {}))
        assert producer.flush(10) == 0
        deadline = time.monotonic() + 30
        while view.total < 2 and time.monotonic() < deadline:
            view.pump(0.5)
        view.draw([], 21.0)
        lines = out.getvalue().splitlines()
        assert len(lines) == 4 and "answers out 2" in lines[-2] and lines[-1].startswith("  people: + #2"), lines
    finally:
        view.close()
    # and at most one summary per summary_every seconds, however much changes
    quiet = io.StringIO()
    view = _view(kafka_settings, quiet, tmp_path, summary_every=3600)
    try:
        for second in range(5):
            view.total += 1  # something changes every tick
            view.draw([], float(second))
    finally:
        view.close()
    assert len([line for line in quiet.getvalue().splitlines() if line.startswith("cbgp run")]) <= 1


@pytest.mark.slow
def test_on_a_terminal_the_frame_is_redrawn_only_when_something_changed(kafka_settings, tmp_path: Path) -> None:
    _publish_view_inputs(kafka_settings)
    out = _Terminal()
    view = _view(kafka_settings, out, tmp_path)
    try:
        view.draw([], 1.0)
        first = out.getvalue()
        for second in range(2, 10):
            view.draw([], float(second))
        assert out.getvalue() == first
    finally:
        view.close()


@pytest.mark.slow
def test_the_view_shows_a_failing_spark_query(kafka_settings, tmp_path: Path) -> None:
    job = ChildProcess("spark-job", [sys.executable, "-c", "import time; time.sleep(60)"]).start()
    try:
        (tmp_path / "status.json").write_text(json.dumps({"pid": job.pid, "reset": None, "error": None, "queries": {
            "windows": {"state": "failed", "failures": 3,
                        "error": "KafkaSourceError: cbgp.updates.encoded/0@151: Offset out of range"},
            "assembly": {"state": "running", "failures": 0, "error": None}}}))
        for out in (io.StringIO(), _Terminal()):
            view = _view(kafka_settings, out, tmp_path, wait=False, summary_every=0)
            try:
                view.draw([job], 5.0)
                view.draw([job], 6.0)
            finally:
                view.close()
            text = out.getvalue()
            assert text.count("spark windows query failed (3x, restarting): KafkaSourceError: "
                              "cbgp.updates.encoded/0@151: Offset out of range") == 1, text
            assert "assembly running" in text and "children 1/1 alive" in text.replace(":", "")
    finally:
        job.stop(grace=1)


def test_make_run_prints_every_service_port() -> None:
    from services.commands.run import port_lines, service_plan

    plan = service_plan({"ingest", "registry", "worker", "answers", "spark-job"}, 2, Path("/tmp/run"))
    text = port_lines("127.0.0.1:9092", plan, Path("/tmp/run/spark/status.json"))
    for name, _argv, ports in plan:
        for port in ports.values():
            assert f":{port}/" in text, (name, text)
        line = next(line for line in text.splitlines() if line.startswith(f"run: ports: {name}:"))
        assert line.split(":", 3)[3].strip() != "none"
    assert "127.0.0.1:9092" in text


def test_make_run_keeps_every_checkpoint_beside_its_broker() -> None:
    """Ingest, the workers and answers checkpoint into the run directory (cleared with the broker each run),
    not into the shared default ``.run/state``."""
    from services.commands.run import service_plan

    plan = service_plan({"ingest", "worker", "answers"}, 2, Path("/tmp/run"))
    dirs = {name: argv[argv.index("--state-dir") + 1] for name, argv, _ports in plan}
    assert dirs == {"ingest": "/tmp/run/ingest-state", "worker-0": "/tmp/run/worker-state",
                    "worker-1": "/tmp/run/worker-state", "answers": "/tmp/run/answers-state"}
