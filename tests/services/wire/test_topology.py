"""`cbgp describe`: every data-path service's topology agrees with the topic catalogue and the Helm chart.

No broker: the topologies are data (services.wire.topology), the catalogue is data (services.kafka.topics), and
the chart is rendered with helm (as tests/helm/test_helm_chart.py does).
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

from services.commands.main import main
from services.kafka.topics import TOPICS
from services.wire.topology import TOPOLOGIES
from tests.helm.test_helm_chart import by_kind, one, render

REPO = Path(__file__).resolve().parents[3]
CATALOGUE = {t.name: t for t in TOPICS}
DATA_PATH = ("ingest", "worker", "answers", "registry", "background", "spark-job", "gateway")
# The gateway is a front door: it writes what users write (updates.raw, admin) and reads their replies.
FRONT = ("gateway",)


def test_every_data_path_service_has_a_topology() -> None:
    assert set(TOPOLOGIES) == set(DATA_PATH)
    assert all(topology.loop for topology in TOPOLOGIES.values()), "each says what drives it (`cbgp describe`)"


@pytest.mark.parametrize("service", DATA_PATH)
def test_every_topic_a_topology_names_is_in_the_catalogue_with_the_same_key(service: str) -> None:
    topology = TOPOLOGIES[service]
    assert topology.sources and topology.sinks
    for edge in (*topology.sources, *topology.sinks):
        assert edge.topic in CATALOGUE, f"{service}: {edge.topic} is not in services/kafka/topics.py"
        assert edge.key == CATALOGUE[edge.topic].key, f"{service}: {edge.topic} key {edge.key!r}"
        if CATALOGUE[edge.topic].partitions == 1:
            assert "1 partition" in edge.partitioning, f"{service}: {edge.topic} has one partition"


def test_every_catalogue_topic_is_used_and_every_topic_written_is_read() -> None:
    used = set().union(*(t.topics() for t in TOPOLOGIES.values()))
    assert used == set(CATALOGUE), f"catalogue topics no topology uses: {set(CATALOGUE) - used}"
    fleet = [t for name, t in TOPOLOGIES.items() if name not in FRONT]
    written = {e.topic for t in fleet for e in t.sinks}
    read = {e.topic for t in fleet for e in t.sources}
    assert {e.topic for name in FRONT for e in TOPOLOGIES[name].sinks} == {"updates.raw", "admin"}
    # what no service reads is read by people: `cbgp watch/current/deadletter/register` (usercli)
    assert written - read == {"answers.current", "queries.status", "deadletter"}
    # what only users publish (`cbgp register`); updates.raw is also written by workers (derived streams)
    assert read - written == {"admin"}


@pytest.mark.parametrize("service", DATA_PATH)
def test_the_processor_a_topology_names_exists(service: str) -> None:
    for dotted in TOPOLOGIES[service].processor.split(", "):
        module, name = dotted.rsplit(".", 1)
        path = REPO / (module.replace(".", "/") + ".py")
        if not path.exists():  # a package: its __init__.py
            path = REPO / module.replace(".", "/") / "__init__.py"
        tree = ast.parse(path.read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        assert name in defined, f"{dotted} does not exist"


def test_describe_prints_each_service_as_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    for service in DATA_PATH:
        assert main(["describe", service]) == 0
        text = capsys.readouterr().out
        assert text.startswith(f"Topology: cbgp {service}\n") and "Sources:" in text and "Sinks:" in text
        for edge in TOPOLOGIES[service].sources:
            assert f"<- {edge.topic} " in text
        assert main(["describe", service, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["service"] == service
        assert [e["topic"] for e in data["sinks"]] == [e.topic for e in TOPOLOGIES[service].sinks]
        assert set(data["sinks"][0]) == {"topic", "key", "partitioning"}
    assert main(["describe", "--json"]) == 0
    assert [d["service"] for d in json.loads(capsys.readouterr().out)] == list(DATA_PATH)


def test_the_helm_chart_creates_exactly_the_catalogue_topics(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The chart's topics Job runs `cbgp topics create` with the services' topic settings; with the same
    environment `cbgp topics list` (no broker) names what it creates: exactly the catalogue, prefixed."""
    docs = render()
    job = one(docs, "Job", "rel-cbgp-topics")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["topics", "create"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    configs = [d["data"] for d in by_kind(docs, "ConfigMap") if "CBGP_TOPIC_PREFIX" in (d.get("data") or {})]
    assert configs  # the services' settings: they read the topics the Job creates
    for config in configs:
        assert {k: env[k] for k in ("CBGP_TOPIC_PREFIX", "CBGP_PARTITIONS")} == \
            {k: config[k] for k in ("CBGP_TOPIC_PREFIX", "CBGP_PARTITIONS")}
    for name in [k for k in os.environ if k.startswith("CBGP_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["topics", "list"]) == 0
    listed = [dict(field.split("=", 1) for field in line.split("  ") if "=" in field)
              for line in capsys.readouterr().out.splitlines()]
    prefix = env["CBGP_TOPIC_PREFIX"]
    assert sorted(entry["name"] for entry in listed) == sorted(prefix + t.name for t in TOPICS)
    for entry in listed:
        spec = CATALOGUE[entry["name"].removeprefix(prefix)]
        assert int(entry["partitions"]) == (spec.partitions or int(env["CBGP_PARTITIONS"]))
        assert int(entry["retention_ms"]) == spec.retention_ms  # the Job sets each topic's retention
