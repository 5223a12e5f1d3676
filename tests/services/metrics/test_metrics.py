"""The metrics/probe HTTP server and the fixed metric names other teams' dashboards rely on."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import REGISTRY

from services.metrics import instruments as metrics
from services.metrics.exposition import forget_consumer_lag, record_consumer_lag, start_metrics_server

pytestmark = pytest.mark.timeout(30)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_readyz_follows_the_ready_callback_and_healthz_is_always_ok() -> None:
    state = {"ready": False}
    with start_metrics_server(0, ready=lambda: state["ready"], host="127.0.0.1") as server:
        assert server.port > 0
        assert get(server.url + "/healthz") == (200, "ok\n")
        assert get(server.url + "/readyz")[0] == 503
        state["ready"] = True
        assert get(server.url + "/readyz") == (200, "ready\n")
        assert get(server.url + "/nope")[0] == 404


def test_a_failing_readiness_check_is_a_503_with_the_reason_not_a_crash() -> None:
    def broken() -> bool:
        raise RuntimeError("state store missing")

    with start_metrics_server(0, ready=broken, host="127.0.0.1") as server:
        assert get(server.url + "/readyz") == (503, "not ready: RuntimeError: state store missing\n")
        assert get(server.url + "/healthz")[0] == 200


def test_metrics_endpoint_exposes_the_fixed_names_with_their_labels() -> None:
    metrics.UPDATES_IN.labels("ingest").inc(3)
    metrics.UPDATES_OUT.labels("ingest").inc()
    metrics.DELTAS_EMITTED.labels("q1", "+").inc(2)
    metrics.STATE_ENTRIES.labels("0").set(42)
    metrics.STATE_BYTES.labels("0").set(4096)
    metrics.CONSUMER_LAG.labels("cbgp.updates.routed", "1").set(7)
    metrics.PROCESSING_LATENCY.labels("worker").observe(0.003)
    metrics.REJECTED_INPUTS.labels("ingest", "malformed-rdf").inc()
    metrics.RESTORE_PROGRESS.labels("2").set(0.5)
    metrics.ANSWER_LATENCY.observe(0.2)
    with start_metrics_server(0, host="127.0.0.1") as server:
        status, body = get(server.url + "/metrics")
    assert status == 200
    for line in [
        'cbgp_updates_in_total{service="ingest"}',
        'cbgp_updates_out_total{service="ingest"}',
        'cbgp_deltas_emitted_total{query="q1",sign="+"}',
        'cbgp_state_entries{partition="0"} 42.0',
        'cbgp_state_bytes{partition="0"} 4096.0',
        'cbgp_consumer_lag{partition="1",topic="cbgp.updates.routed"} 7.0',
        'cbgp_processing_latency_seconds_bucket{le="0.005",service="worker"}',
        'cbgp_rejected_inputs_total{reason="malformed-rdf",service="ingest"}',
        'cbgp_restore_progress_ratio{partition="2"} 0.5',
        'cbgp_answer_latency_seconds_count',
    ]:
        assert line in body, line


def test_a_scrape_may_ask_for_some_series_only() -> None:
    """``?name[]=`` as the Prometheus client libraries read it: only those series (a poller of one counter does
    not pay for the whole page), several names allowed; without it, the whole page."""
    metrics.DELTAS_EMITTED.labels("q1", "+").inc()
    metrics.UPDATES_IN.labels("ingest").inc()
    with start_metrics_server(0, host="127.0.0.1") as server:
        _status, one = get(server.url + "/metrics?name[]=cbgp_deltas_emitted_total")
        _status, two = get(server.url + "/metrics?name[]=cbgp_deltas_emitted_total&name[]=cbgp_updates_in_total")
        _status, whole = get(server.url + "/metrics")
    samples = [line.split("{")[0] for line in one.splitlines() if line and not line.startswith("#")]
    assert samples and set(samples) == {"cbgp_deltas_emitted_total"}
    assert 'cbgp_updates_in_total{service="ingest"}' in two and 'cbgp_deltas_emitted_total{query="q1"' in two
    assert "process_cpu_seconds_total" in whole and "process_cpu_seconds_total" not in two
    assert len(one) < len(whole) / 5


def test_stop_frees_the_port() -> None:
    server = start_metrics_server(0, host="127.0.0.1")
    url = server.url
    server.stop()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url + "/healthz", timeout=2)


@pytest.mark.slow
def test_consumer_lag_is_high_watermark_minus_position(kafka_settings) -> None:  # type: ignore[no-untyped-def]
    from confluent_kafka import TopicPartition

    from services.kafka.client import consume_until, make_consumer, make_producer

    topic = kafka_settings.topic("updates.encoded")
    producer = make_producer(kafka_settings)
    for i in range(10):
        producer.produce(topic, value=str(i).encode())
    producer.flush(10)
    consumer = make_consumer(kafka_settings, "lag")
    consumer.assign([TopicPartition(topic, 0, 6)])  # as if offsets 0..5 were processed
    assert [m.offset() for m in consume_until(consumer, 1)] == [6]  # position is now 7
    record_consumer_lag(consumer)
    consumer.close()
    assert REGISTRY.get_sample_value("cbgp_consumer_lag", {"topic": topic, "partition": "0"}) == 10 - 7


def test_the_lag_of_a_partition_given_up_is_no_longer_shown() -> None:
    class Reader:  # what record_consumer_lag asks of a consumer: the high watermarks it has seen
        def get_watermark_offsets(self, tp, cached=False, timeout=None):
            return 0, 10

    def lag(partition: int) -> float | None:
        return REGISTRY.get_sample_value("cbgp_consumer_lag", {"topic": "t-given-up", "partition": str(partition)})

    reader, other = Reader(), Reader()
    record_consumer_lag(reader, {("t-given-up", 0): 3, ("t-given-up", 1): 4}, whole=True)
    record_consumer_lag(other, {("t-kept", 0): 9}, whole=True)
    assert (lag(0), lag(1)) == (7, 6)
    record_consumer_lag(reader, {("t-given-up", 0): 5})  # one partition's lag (at its end): the others stay
    assert (lag(0), lag(1)) == (5, 6)
    record_consumer_lag(reader, {("t-given-up", 1): 8}, whole=True)  # partition 0 went to another member
    assert (lag(0), lag(1)) == (None, 2)
    record_consumer_lag(reader, {("t-given-up", 2): 9})  # a partition read to its end, then given up too
    assert lag(2) == 1
    record_consumer_lag(reader, {}, whole=True)  # and then partitions 1 and 2
    assert (lag(0), lag(1), lag(2)) == (None, None, None)
    assert REGISTRY.get_sample_value("cbgp_consumer_lag", {"topic": "t-kept", "partition": "0"}) == 1  # another's
    forget_consumer_lag(other)  # the other reader closes: its series go, and nothing remembers it
    assert REGISTRY.get_sample_value("cbgp_consumer_lag", {"topic": "t-kept", "partition": "0"}) is None


def test_per_query_series_are_bounded() -> None:
    """Ten thousand queries must not make ten thousand series: the first N get their own, the rest share one."""
    from services.metrics.instruments import OTHER_QUERIES, QueryLabels, top_queries

    labels = QueryLabels(maximum=3)
    assert [labels.label(f"q{i}") for i in range(5)] == ["q0", "q1", "q2", OTHER_QUERIES, OTHER_QUERIES]
    assert labels.forget("q1") and not labels.forget("q4")
    assert labels.label("q9") == "q9" and labels.label("q1") == OTHER_QUERIES
    values = {f"q{i}": float(i) for i in range(10)}
    assert top_queries(values, maximum=3) == {"q9": 9.0, "q8": 8.0, "q7": 7.0, OTHER_QUERIES: sum(range(7))}
    assert top_queries({"a": 1.0}, maximum=3) == {"a": 1.0}


@pytest.mark.parametrize("command, line", [
    (["answers", "--metrics-port", "{port}"], "cbgp: error: cannot serve metrics on 127.0.0.1:{port}: Address "
     "already in use (--metrics-port, CBGP_METRICS_HOST)"),
    (["gateway", "--auth", "none", "--port", "{port}"], "cbgp: error: cannot listen on 127.0.0.1:{port}: Address "
     "already in use (--host, --port)"),
    (["gateway", "--auth", "none", "--port", "0", "--metrics-port", "{port}"], "cbgp: error: cannot serve metrics "
     "on 127.0.0.1:{port}"),
])
def test_a_taken_port_stops_a_service_with_one_line_naming_the_port_and_flag(command: list[str], line: str) -> None:
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {"PATH": "/usr/bin", "CBGP_CHECKPOINT_SECRET": "k" * 32}
        done = subprocess.run([sys.executable, "-m", "services.commands.main",
                               *[a.format(port=port) for a in command], "--bootstrap-servers", "127.0.0.1:9"],
                              capture_output=True, text=True, timeout=60, env=env, cwd=Path(__file__).parents[3])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert line.format(port=port) in done.stderr.strip().splitlines()[-1]
