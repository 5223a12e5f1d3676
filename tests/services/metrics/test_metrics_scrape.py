"""Every service's /metrics, scraped like Prometheus would, names the fleet's metrics and moves with data."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fleet_support import QUERIES, Fleet, generate_patch, publish_patch, wait_answers

STAR = QUERIES["star"]  # partitioned over the workers by centre value
PATH = QUERIES["path"]  # a whole query, evaluated on the total order


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Samples of a /metrics page as {(name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


def names(samples: dict) -> set[str]:
    return {n for n, _ in samples}


def wait_healthy(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"service on port {port} never became ready")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_each_service_exposes_its_metrics_and_they_move_when_data_flows(kafka_settings, tmp_path: Path):
    ports = {name: free_port() for name in ("ingest", "registry", "worker", "answers")}
    with Fleet(kafka_settings, tmp_path / "logs") as fleet:
        fleet.start("ingest", "ingest", "--metrics-port", str(ports["ingest"]))
        fleet.start("registry", "registry", "--metrics-port", str(ports["registry"]),
                    "--web-port", str(free_port()), "--state-dir", str(tmp_path / "registry"))
        fleet.start("worker", "worker", "--metrics-port", str(ports["worker"]))
        fleet.start("answers", "answers", "--metrics-port", str(ports["answers"]))
        for port in ports.values():
            wait_healthy(port)
        before = {name: scrape(port) for name, port in ports.items()}

        env_cmd = [sys.executable, "-m", "services.commands.main"]
        env = {**os.environ, **kafka_settings.to_env()}
        for query_id, text in (("star", STAR), ("path", PATH)):
            (tmp_path / f"{query_id}.rq").write_text(text)
            done = subprocess.run([*env_cmd, "register", query_id, str(tmp_path / f"{query_id}.rq")],
                                  env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
        lines = generate_patch(400, seed=3)
        lines.insert(100, "A this line is malformed")
        publish_patch(kafka_settings, lines)
        wait_answers(kafka_settings, {"star": 1, "path": 1}, timeout=120)
        time.sleep(2)  # let the services finish the batch that produced them and update their gauges
        after = {name: scrape(port) for name, port in ports.items()}

    common = {"cbgp_updates_in_total", "cbgp_updates_out_total"}
    for service in ("ingest", "worker", "answers", "registry"):
        assert common <= names(after[service]), service
        assert value(after[service], "cbgp_updates_in_total", service=service) > \
            value(before[service], "cbgp_updates_in_total", service=service), service
        assert value(after[service], "cbgp_updates_out_total", service=service) > \
            value(before[service], "cbgp_updates_out_total", service=service), service
    for service in ("ingest", "worker", "answers"):
        assert value(after[service], "cbgp_processing_latency_seconds_count", service=service) > \
            value(before[service], "cbgp_processing_latency_seconds_count", service=service), service
        assert "cbgp_consumer_lag" in names(after[service]), service
        # every hop saw the updates' produce time: polled <= committed, both after the produce
        for point in ("polled", "committed"):
            assert value(after[service], "cbgp_hop_latency_seconds_count", service=service, point=point) > \
                value(before[service], "cbgp_hop_latency_seconds_count", service=service, point=point), (service, point)
        assert value(after[service], "cbgp_hop_latency_seconds_sum", service=service, point="polled") <= \
            value(after[service], "cbgp_hop_latency_seconds_sum", service=service, point="committed"), service
        # the wait in Kafka before this service's poll: every batch (also those of records no update is behind,
        # such as frontier marks, which have no hop latency)
        assert value(after[service], "cbgp_queue_wait_seconds_count", service=service) >= \
            value(after[service], "cbgp_hop_latency_seconds_count", service=service, point="polled") > 0, service
    assert value(after["ingest"], "cbgp_rejected_inputs_total", service="ingest", reason="malformed-rdf") >= 1
    assert value(after["worker"], "cbgp_state_entries") > 0
    assert value(after["worker"], "cbgp_state_bytes") > 0
    assert value(after["worker"], "cbgp_restore_progress_ratio") == len(
        [1 for (n, _), _v in after["worker"].items() if n == "cbgp_restore_progress_ratio"])  # all partitions: 1.0
    assert value(after["answers"], "cbgp_deltas_emitted_total", query="star", sign="+") >= 1
    # the seq release: every routed partition's frontier seen past the stream's start, the path's gate opened
    frontiers = [v for (n, _), v in after["answers"].items() if n == "cbgp_release_frontier_seq"]
    assert len(frontiers) == kafka_settings.partitions and min(frontiers) >= 0, frontiers
    assert "cbgp_gates_waiting" in names(after["answers"]) and value(after["answers"], "cbgp_gates_waiting") == 0
    assert value(after["answers"], "cbgp_answer_latency_seconds_count") > \
        value(before["answers"], "cbgp_answer_latency_seconds_count")
