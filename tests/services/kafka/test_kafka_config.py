"""KafkaSettings: flags override env vars override defaults, and the rendered librdkafka configs carry the
fleet's reliability settings.  Pure (no broker)."""

import argparse

import pytest

from services.kafka.config import KafkaConfigError, KafkaSettings, add_kafka_flags
from services.kafka.topics import TOPICS, catalogue, spec


def parse(argv: list[str], env: dict[str, str]) -> KafkaSettings:
    return KafkaSettings.from_args(add_kafka_flags(argparse.ArgumentParser()).parse_args(argv), env=env)


def test_defaults_without_env_or_flags() -> None:
    s = parse([], {})
    assert (s.bootstrap_servers, s.topic_prefix, s.partitions, s.replication_factor) == ("127.0.0.1:9092", "cbgp.", 4, 1)
    assert s.topic("answers") == "cbgp.answers"


def test_env_vars_are_read_and_passthrough_keys_become_dotted() -> None:
    env = {"CBGP_BOOTSTRAP_SERVERS": "k1:9092,k2:9092", "CBGP_TOPIC_PREFIX": "prod.", "CBGP_PARTITIONS": "12",
           "CBGP_REPLICATION_FACTOR": "3", "CBGP_SECURITY_PROTOCOL": "SASL_SSL", "CBGP_SASL_MECHANISM": "SCRAM-SHA-512",
           "CBGP_SASL_USERNAME": "u", "CBGP_SASL_PASSWORD": "secret", "CBGP_SSL_CA_LOCATION": "/ca.pem",
           "CBGP_KAFKA_SOCKET_TIMEOUT_MS": "5000"}
    s = parse([], env)
    conf = s.client_config()
    assert conf == {"bootstrap.servers": "k1:9092,k2:9092", "security.protocol": "SASL_SSL",
                    "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u", "sasl.password": "secret",
                    "ssl.ca.location": "/ca.pem", "socket.timeout.ms": "5000"}
    assert s.topic("admin") == "prod.admin" and s.partitions == 12 and s.replication_factor == 3
    assert "secret" not in repr(s)


def test_flags_override_env() -> None:
    env = {"CBGP_BOOTSTRAP_SERVERS": "env:1", "CBGP_PARTITIONS": "12", "CBGP_TOPIC_PREFIX": "env."}
    s = parse(["--bootstrap-servers", "flag:2", "--partitions", "2", "--kafka-config", "client.id=x"], env)
    assert (s.bootstrap_servers, s.partitions, s.topic_prefix) == ("flag:2", 2, "env.")
    assert s.client_config()["client.id"] == "x"


def test_to_env_round_trips_into_a_child_process_environment() -> None:
    s = KafkaSettings(bootstrap_servers="h:1", topic_prefix="p.", partitions=3, extra={"socket.timeout.ms": "7"})
    assert KafkaSettings.from_env(s.to_env()) == s


@pytest.mark.parametrize("env, fragment", [
    ({"CBGP_PARTITIONS": "four"}, "CBGP_PARTITIONS: 'four' is not an integer"),
    ({"CBGP_PARTITIONS": "0"}, "partitions: 0 is not a positive integer"),
    ({"CBGP_SECURITY_PROTOCOL": "TLS"}, "security protocol: 'TLS'"),
    ({"CBGP_REBALANCE_TIMEOUT_MS": "3000"}, "rebalance timeout: 3000 ms is below the session timeout"),
])
def test_bad_env_values_give_a_one_line_error_naming_the_setting(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(KafkaConfigError) as info:
        KafkaSettings.from_env(env)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_bad_flag_is_an_argparse_error() -> None:
    with pytest.raises(SystemExit):
        parse(["--partitions", "-1"], {})
    with pytest.raises(KafkaConfigError, match="KEY=VALUE"):
        parse(["--kafka-config", "novalue"], {})


def test_producer_and_consumer_configs_carry_the_reliability_settings() -> None:
    s = KafkaSettings()
    p = s.producer_config()
    assert p["acks"] == "all" and p["enable.idempotence"] is True and p["linger.ms"] <= 10
    t = s.producer_config(idempotent=False, transactional_id="worker-0")
    assert t["transactional.id"] == "worker-0" and t["enable.idempotence"] is True
    c = s.consumer_config("g", auto_offset_reset="latest")
    assert c["group.id"] == "g" and c["session.timeout.ms"] == 6000 and c["heartbeat.interval.ms"] == 2000
    assert c["enable.auto.commit"] is False and c["isolation.level"] == "read_committed"
    assert c["auto.offset.reset"] == "latest"


def test_producers_compress_with_lz4_unless_the_passthrough_says_otherwise() -> None:
    assert KafkaSettings().producer_config()["compression.type"] == "lz4"
    chosen = KafkaSettings.from_env({"CBGP_KAFKA_COMPRESSION_TYPE": "zstd"})
    assert chosen.producer_config(transactional_id="w")["compression.type"] == "zstd"


def test_rebalance_timeout_reaches_consumers_only_and_child_processes() -> None:
    s = KafkaSettings.from_env({"CBGP_REBALANCE_TIMEOUT_MS": "20000"})
    assert s.consumer_config("g")["max.poll.interval.ms"] == 20000
    assert "max.poll.interval.ms" not in s.producer_config() and "max.poll.interval.ms" not in s.admin_config()
    assert KafkaSettings.from_env(s.to_env()) == s
    assert "max.poll.interval.ms" not in KafkaSettings().consumer_config("g")  # librdkafka's default elsewhere


def test_the_embedded_broker_settings_carry_its_join_workaround(tmp_path) -> None:  # noqa: ANN001
    from services.kafka.broker import EmbeddedBroker
    from services.kafka.broker import EMBEDDED_REBALANCE_TIMEOUT_MS

    s = EmbeddedBroker(tmp_path, port=1).settings(topic_prefix="e.")  # not started: settings only
    assert (s.bootstrap_servers, s.topic_prefix) == ("127.0.0.1:1", "e.")
    assert s.consumer_config("g")["max.poll.interval.ms"] == EMBEDDED_REBALANCE_TIMEOUT_MS


def test_catalogue_resolves_prefix_and_partitions() -> None:
    s = KafkaSettings(topic_prefix="z.", partitions=7)
    rows = {r["name"]: r for r in catalogue(s)}
    assert len(rows) == len(TOPICS) == 15
    assert rows["z.updates.encoded"]["partitions"] == 1 and rows["z.updates.routed"]["partitions"] == 7
    assert rows["z.answers.current"]["cleanup_policy"] == "compact"
    assert rows["z.dictionary"]["configs"]["cleanup.policy"] == "compact"
    with pytest.raises(KeyError, match="unknown topic 'nope'"):
        spec("nope")
