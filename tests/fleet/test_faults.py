"""Fault injection: kill -9 every kind of service in rotation, rebalance, restart the broker, while a stream
with deletions flows; the answers must still equal the oracle's, numbered 1..N with no duplicates.

The schedule and the checks are in ``tests/fault_support.py``.  ``CBGP_FAULT_KILLS`` (default 8: ingest,
a worker, answers and the registry twice each), ``CBGP_FAULT_SERVICES`` (default
``ingest,worker,answers,registry``), ``CBGP_FAULT_BROKER_RESTARTS``
(default 1), ``CBGP_FAULT_LINES`` and ``CBGP_FAULT_SEED`` make the run longer or different;
``bench/faults_run.py`` is the long version (30 kills).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from services.kafka.broker import EmbeddedBroker
from services.kafka.topics import ensure_topics
from tests.fault_support import FaultConfig, FaultRun
from tests.fixtures.broker import fresh_settings

pytestmark = [pytest.mark.slow]


def run_and_check(broker: EmbeddedBroker, tmp_path: Path, cfg: FaultConfig) -> None:
    settings = fresh_settings(broker)
    ensure_topics(settings)
    run = FaultRun(broker, settings, tmp_path, cfg, log=lambda s: print(s, file=sys.stderr))
    report = run.run()
    run.check()
    print(report.table(), file=sys.stderr)
    assert not report.problems, "\n".join(report.problems)
    # The run did what it claims: every service was killed, the group changed, the broker restarted.
    assert sum(report.kills.values()) == cfg.kills
    if cfg.kills >= len(cfg.services):
        assert set(report.kills) == set(cfg.services)
    assert report.broker_restarts == cfg.broker_restarts and report.rebalances == 2
    assert report.answers_lost == 0 and report.duplicates_delivered == 0 and report.answers_extra == 0
    assert report.answers > 0


@pytest.mark.timeout(600)
def test_answers_survive_kill_9_of_each_service_in_rotation_and_rebalances(embedded_broker: EmbeddedBroker,
                                                                          tmp_path: Path) -> None:
    cfg = FaultConfig.from_env()
    cfg.broker_restarts = 0  # not with static members on noida-db: see FaultConfig.static_members
    run_and_check(embedded_broker, tmp_path, cfg)


@pytest.mark.timeout(600)
def test_records_below_the_floor_deleted_and_every_data_path_service_killed_at_once(
        embedded_broker: EmbeddedBroker, tmp_path: Path) -> None:
    """The retention run (``FaultRun.run_below_floor``): half the stream, checkpoints, every record below
    ``cbgp topics floor`` deleted (updates.routed and updates.encoded included), ingest, the workers and answers
    killed -9 at once and restarted -- with their disks lost, as on other machines -- then a late registration of
    each placement (a star, a single-centre path, a multi-centre path, a product, an operator query by centre, a
    whole operator query), then the rest of the
    stream: the answers equal the oracle's, answers.current too, numbered 1..N with no gap or duplicate.  The
    restarted services restore from their checkpoints in Kafka, and the late registrations from ingest's
    snapshot (the logs record both)."""
    cfg = FaultConfig.from_env(kills=0, broker_restarts=0)
    settings = fresh_settings(embedded_broker)
    ensure_topics(settings)
    run = FaultRun(embedded_broker, settings, tmp_path, cfg, log=lambda s: print(s, file=sys.stderr))
    deleted = run.run_below_floor(lose_disks=("ingest", "worker", "answers"),
                                  late=("star", "path", "path3", "product", "optional", "likers"))
    report = run.check()
    assert not report.problems, "\n".join(report.problems)
    assert report.answers_lost == 0 and report.duplicates_delivered == 0 and report.answers_extra == 0
    assert deleted.get(settings.topic("updates.raw")), "the floor let retention delete the consumed raw updates"
    assert deleted.get(settings.topic("deltas.parts")), "the floor let retention delete checkpointed deltas"
    assert deleted.get(settings.topic("answers")), "the floor let retention delete answers the checkpoints cover"
    assert deleted.get(settings.topic("updates.routed")), "the floor let retention delete routed changes"
    assert deleted.get(settings.topic("updates.encoded")), "the floor let retention delete encoded changes"
    logs = {name: (tmp_path / "logs" / f"{name}.log").read_text(errors="replace") for name in ("answers", "w0", "w1")}
    assert "checkpoint=used-kafka" in logs["answers"] and "checkpoint=used-kafka" in logs["w0"]
    assert "event=base-loaded partition=" in logs["w0"], "a late registration moved ingest's snapshot to its point"
    assert "event=base-loaded log=updates.encoded" in logs["w0"] + logs["w1"], "and a whole one to its position"
    assert "event=checkpoint-loaded source=kafka" in (tmp_path / "logs" / "ingest.log").read_text(errors="replace")


@pytest.mark.timeout(600)
def test_answers_survive_broker_restarts_mid_stream(embedded_broker: EmbeddedBroker, tmp_path: Path) -> None:
    """Three graceful broker restarts, each a moment after a slice of the stream is published (so the fleet's
    transactions are open when the broker stops), plus a worker added and removed.  Every service starts a
    new life with fresh clients after losing the broker, restores from what the broker kept, and the
    answers still equal the oracle's.  Dynamic group members: after a restart noida-db 0.2.3 does not let a
    static member back into its group."""
    cfg = FaultConfig.from_env(broker_restarts=3)
    cfg.kills, cfg.static_members = 0, False  # kills need static members (see tests/fault_support.py)
    run_and_check(embedded_broker, tmp_path, cfg)


@pytest.mark.timeout(300)
def test_services_started_before_their_broker_wait_for_it(tmp_path: Path) -> None:
    """Pods start in any order: a registry and an ingest started while no broker listens say they are
    waiting, and once the broker is up they create the topics and serve, in the same processes."""
    from services.kafka.broker import free_port
    from services.runtime.supervise import http_ok
    from services.client.requests import admin_request
    from tests.fleet_support import QUERIES, Fleet

    broker = EmbeddedBroker(tmp_path / "broker", port=free_port())  # clients need its port before it starts
    settings = fresh_settings(broker)
    registry_metrics = free_port()
    try:
        with Fleet(settings, tmp_path / "logs") as fleet:
            registry = fleet.start("registry", "registry", "--metrics-port", str(registry_metrics),
                                   "--web-port", str(free_port()), "--state-dir", str(tmp_path / "state"))
            ingest = fleet.start("ingest", "ingest", "--instance-id", "i1")
            deadline = time.monotonic() + 90
            while not all("event=waiting-for-broker" in fleet.log_text(n) for n in ("registry", "ingest")):
                assert time.monotonic() < deadline, "the services did not report that they wait for the broker"
                assert registry.poll() is None and ingest.poll() is None, "a service gave up on the broker"
                time.sleep(0.5)
            broker.start()
            ready = {"registry": f"http://127.0.0.1:{registry_metrics}/readyz",
                     "ingest": fleet.metrics_url("ingest").replace("/metrics", "/readyz")}
            deadline = time.monotonic() + 120
            while not all(http_ok(url) for url in ready.values()):
                assert time.monotonic() < deadline, "the services did not become ready once the broker was up"
                time.sleep(0.5)
            reply = admin_request(settings, {"command": "REGISTER", "query_id": "star", "sparql": QUERIES["star"]})
            assert reply["status"] == "ACCEPTED"
            assert registry.poll() is None and ingest.poll() is None  # the same processes did it
    finally:
        broker.stop()


# ---------------------------------------------------------------------------------------- backpressure

RSS_BOUND_MB = 400  # generous: a worker holds ~100 MB at rest (Python, librdkafka, pyoxigraph, engine state)
LITERAL = "x" * 400


@pytest.mark.timeout(400)
def test_memory_stays_bounded_when_producers_outpace_the_fleet(kafka_settings, tmp_path: Path) -> None:
    """20k updates (~8 MB of raw records) are published before one ingest, one worker and the answers
    service start, so the whole stream is a backlog when they do; from their start until they have caught
    up, their RSS is sampled every 20 ms: it must stay under RSS_BOUND_MB, because each consumes in batches
    it commits before fetching more (librdkafka's prefetch queue is bounded too), so a backlog waits on the
    broker, not in the services' memory.  The answers at the end are the replay's."""
    import threading

    import psutil

    from tests.fleet_support import (QUERIES, Fleet, final_answers, generate_patch, publish_patch, publish_plan,
                                     read_answers, replay)

    lines = [line.replace('"@en', f' {LITERAL}"@en') for line in generate_patch(20_000, seed=61, subjects=400)]
    queries = {"star": QUERIES["star"], "names": QUERIES["names"]}
    expected = replay(tmp_path, lines, queries)
    peaks: dict[str, float] = {}
    samples: dict[str, int] = {}
    with Fleet(kafka_settings, tmp_path / "logs") as fleet:
        for name, text in queries.items():
            publish_plan(kafka_settings, name, text)
        # The whole stream first: a backlog the fleet meets at once, however fast it has become.
        publish_patch(kafka_settings, lines, per_message=50)
        fleet.start("ingest", "ingest", "--instance-id", "i1")
        fleet.start("w0", "worker", "--worker-id", "w0")
        fleet.start("answers", "answers", "--instance-id", "a1")
        procs = {name: psutil.Process(fleet.procs[name].pid) for name in ("ingest", "w0", "answers")}
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                for name, proc in procs.items():
                    try:
                        rss = proc.memory_info().rss / 2**20
                    except psutil.Error:
                        continue
                    peaks[name] = max(peaks.get(name, 0.0), rss)
                    samples[name] = samples.get(name, 0) + 1
                done.wait(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            want = {q: len(d) for q, d in expected.items()}
            deadline = time.monotonic() + 300
            got = read_answers(kafka_settings)
            while any(len(got.get(q, [])) < n for q, n in want.items()) and time.monotonic() < deadline:
                time.sleep(1.0)
                got = read_answers(kafka_settings)
        finally:
            done.set()
            sampler.join(5)
        print(f"peak RSS MB: { {k: round(v) for k, v in peaks.items()} } over {samples} samples", file=sys.stderr)
        for query, deltas in expected.items():
            folded: Counter = Counter()
            for a in got.get(query, []):
                folded[a["key"]] += 1 if a["sign"] == "+" else -1
            assert +folded == final_answers(deltas), f"{query}: the fleet did not catch up correctly"
        assert min(samples.values()) > 20, "the sampler must have run from the start to the catch-up"
        for name, peak in peaks.items():
            assert peak < RSS_BOUND_MB, f"{name} peaked at {peak:.0f} MB while catching up (bound {RSS_BOUND_MB} MB)"
