"""Kafka connection settings shared by every service, from CLI flags or ``CBGP_*`` environment variables.

How it works: docs/design/internals.md, services.kafka.config.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

__all__ = ["KafkaConfigError", "KafkaSettings", "add_kafka_flags", "parse_topic_configs", "format_topic_configs"]

ENV_PREFIX = "CBGP_"
PASSTHROUGH_PREFIX = "CBGP_KAFKA_"
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")

# Kafka's (and noida-db's) minimum group session timeout is 6 s; a shorter one is rejected at JoinGroup
# with INVALID_SESSION_TIMEOUT.  6 s also bounds how long a killed worker's partitions stay orphaned.
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 2000
# Small linger: batching helps throughput, and 5 ms is invisible next to a consumer's poll loop.
LINGER_MS = 5
# lz4 costs little CPU and shrinks what brokers store and serve 2-3x (the embedded noida-db rewrites all it
# stores about once a second, so there it also cuts broker CPU); CBGP_KAFKA_COMPRESSION_TYPE overrides it.
COMPRESSION = "lz4"


class KafkaConfigError(ValueError):
    """A Kafka setting (flag or environment variable) has an invalid value."""


@dataclass(frozen=True)
class KafkaSettings:
    """How to reach the broker and how the fleet's topics are named and sized."""

    bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = "cbgp."
    partitions: int = 4
    replication_factor: int = 1
    security_protocol: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_ca_location: str | None = None
    # Consumers' max.poll.interval.ms, which is also the rebalance timeout sent in JoinGroup (and bounds
    # how long librdkafka waits for a JoinGroup answer).  None: librdkafka's default (300 s).
    rebalance_timeout_ms: int | None = None
    # Extra librdkafka properties, applied to every client (after ours, so a user can override anything).
    extra: Mapping[str, str] = field(default_factory=dict)
    # Topic configs over the catalogue's, per unprefixed topic name: {"updates.raw": {"retention.ms": "..."}}.
    # Applied when a topic is created and expected of existing topics (services.kafka.topics.wanted_configs).
    topic_configs: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise KafkaConfigError("bootstrap servers: empty; expected host:port[,host:port...]")
        for name in ("partitions", "replication_factor"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise KafkaConfigError(f"{name}: {value!r} is not a positive integer")
        if self.rebalance_timeout_ms is not None and (
                not isinstance(self.rebalance_timeout_ms, int) or self.rebalance_timeout_ms < SESSION_TIMEOUT_MS):
            raise KafkaConfigError(f"rebalance timeout: {self.rebalance_timeout_ms!r} ms is below the session "
                                   f"timeout ({SESSION_TIMEOUT_MS} ms), which librdkafka refuses")
        if self.security_protocol is not None and self.security_protocol.upper() not in SECURITY_PROTOCOLS:
            raise KafkaConfigError(
                f"security protocol: {self.security_protocol!r} is not one of {', '.join(SECURITY_PROTOCOLS)}"
            )

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "KafkaSettings":
        """Settings from ``CBGP_*`` environment variables (``env`` defaults to ``os.environ``).

        Keyword ``overrides`` that are not ``None`` win over the environment (this is how flags apply).
        """
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name, var in _ENV_VARS.items():
            raw = env.get(var)
            if raw is not None and raw != "":
                values[name] = _parse_int(var, raw) if name in _INT_FIELDS else raw
        extra = {
            key[len(PASSTHROUGH_PREFIX):].lower().replace("_", "."): value
            for key, value in env.items()
            if key.startswith(PASSTHROUGH_PREFIX) and len(key) > len(PASSTHROUGH_PREFIX)
        }
        extra.update(overrides.pop("extra", None) or {})
        topic_configs = parse_topic_configs("CBGP_TOPIC_CONFIG", env.get("CBGP_TOPIC_CONFIG", ""))
        for name, configs in (overrides.pop("topic_configs", None) or {}).items():
            topic_configs[name] = {**topic_configs.get(name, {}), **configs}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(extra=extra, topic_configs=topic_configs, **values)

    @classmethod
    def from_args(cls, args: argparse.Namespace, env: Mapping[str, str] | None = None) -> "KafkaSettings":
        """Settings from flags added by :func:`add_kafka_flags`; unset flags fall back to the environment."""
        extra: dict[str, str] = {}
        for item in getattr(args, "kafka_config", None) or []:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise KafkaConfigError(f"--kafka-config: {item!r} is not KEY=VALUE (e.g. socket.timeout.ms=5000)")
            extra[key.strip()] = value
        flags = {name: getattr(args, name, None) for name in _ENV_VARS}
        topic_configs = parse_topic_configs("--topic-config", ";".join(getattr(args, "topic_config", None) or []))
        return cls.from_env(env, extra=extra, topic_configs=topic_configs, **flags)

    def with_prefix(self, topic_prefix: str) -> "KafkaSettings":
        """A copy addressing another set of topics (tests use one fresh prefix per test)."""
        return replace(self, topic_prefix=topic_prefix)

    # ------------------------------------------------------------------ rendering

    def topic(self, name: str) -> str:
        """The broker-side name of catalogue topic ``name`` (``updates.raw`` -> ``cbgp.updates.raw``)."""
        return f"{self.topic_prefix}{name}"

    def client_config(self) -> dict[str, Any]:
        """Connection and security properties common to admin clients, producers and consumers."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers}
        if self.security_protocol:
            conf["security.protocol"] = self.security_protocol.upper()
        if self.sasl_mechanism:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username is not None:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password
        if self.ssl_ca_location:
            conf["ssl.ca.location"] = self.ssl_ca_location
        conf.update(self.extra)
        return conf

    def producer_config(self, idempotent: bool = True, transactional_id: str | None = None) -> dict[str, Any]:
        """Producer properties: acks=all and (by default) idempotence, so retries never duplicate or reorder.

        A ``transactional_id`` implies idempotence (librdkafka requires it) and fences older producers that
        used the same id -- that is how a restarted worker stops its zombie predecessor.
        """
        conf = self.client_config()
        conf.update({"acks": "all", "linger.ms": LINGER_MS, "enable.idempotence": idempotent or bool(transactional_id),
                     "compression.type": COMPRESSION})
        if transactional_id:
            conf["transactional.id"] = transactional_id
        conf.update(self.extra)  # the user's explicit passthrough wins over our defaults
        return conf

    def consumer_config(self, group: str, **overrides: Any) -> dict[str, Any]:
        """Consumer properties for group ``group``: manual commits, read_committed, start from earliest.

        ``overrides`` use librdkafka names with ``_`` for ``.`` (``auto_offset_reset="latest"``), or pass a
        dict with dotted keys via ``**{"auto.offset.reset": "latest"}``.
        """
        conf = self.client_config()
        conf.update(
            {
                "group.id": group,
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
                # Offsets are committed by the service, only after its effects are durable (architecture §5).
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
            }
        )
        if self.rebalance_timeout_ms is not None:
            conf["max.poll.interval.ms"] = self.rebalance_timeout_ms
        conf.update(self.extra)
        conf.update({key.replace("_", "."): value for key, value in overrides.items()})
        return conf

    def admin_config(self) -> dict[str, Any]:
        """AdminClient properties."""
        return self.client_config()

    def to_env(self) -> dict[str, str]:
        """The ``CBGP_*`` variables that recreate these settings in a child process."""
        env = {var: str(getattr(self, name)) for name, var in _ENV_VARS.items() if getattr(self, name) is not None}
        env.update({PASSTHROUGH_PREFIX + key.replace(".", "_").upper(): str(v) for key, v in self.extra.items()})
        if self.topic_configs:
            env["CBGP_TOPIC_CONFIG"] = format_topic_configs(self.topic_configs)
        return env


def parse_topic_configs(where: str, raw: str) -> dict[str, dict[str, str]]:
    """``TOPIC:KEY=VALUE[;TOPIC:KEY=VALUE...]`` -> ``{topic: {key: value}}`` (later entries win)."""
    result: dict[str, dict[str, str]] = {}
    for item in raw.split(";"):
        if not item.strip():
            continue
        topic, colon, rest = item.strip().partition(":")
        key, equals, value = rest.partition("=")
        if not colon or not equals or not topic.strip() or not key.strip():
            raise KafkaConfigError(f"{where}: {item.strip()!r} is not TOPIC:KEY=VALUE "
                                   "(e.g. updates.raw:retention.ms=86400000)")
        result.setdefault(topic.strip(), {})[key.strip()] = value.strip()
    return result


def format_topic_configs(configs: Mapping[str, Mapping[str, str]]) -> str:
    """The ``CBGP_TOPIC_CONFIG`` form of ``configs`` (inverse of :func:`parse_topic_configs`)."""
    return ";".join(f"{topic}:{key}={value}" for topic, kv in sorted(configs.items()) for key, value in sorted(kv.items()))


_ENV_VARS = {
    "bootstrap_servers": "CBGP_BOOTSTRAP_SERVERS",
    "topic_prefix": "CBGP_TOPIC_PREFIX",
    "partitions": "CBGP_PARTITIONS",
    "replication_factor": "CBGP_REPLICATION_FACTOR",
    "security_protocol": "CBGP_SECURITY_PROTOCOL",
    "sasl_mechanism": "CBGP_SASL_MECHANISM",
    "sasl_username": "CBGP_SASL_USERNAME",
    "sasl_password": "CBGP_SASL_PASSWORD",
    "ssl_ca_location": "CBGP_SSL_CA_LOCATION",
    "rebalance_timeout_ms": "CBGP_REBALANCE_TIMEOUT_MS",
}
_INT_FIELDS = {"partitions", "replication_factor", "rebalance_timeout_ms"}


def _parse_int(where: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise KafkaConfigError(f"{where}: {raw!r} is not an integer") from None


def _positive_int(raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a positive integer")
    return value


def add_kafka_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the shared Kafka flags (``--bootstrap-servers --topic-prefix --partitions ...``) to ``parser``.

    Every flag defaults to ``None`` so that :meth:`KafkaSettings.from_args` can fall back to the environment.
    """
    group = parser.add_argument_group("kafka", "broker connection (flags override CBGP_* environment variables)")
    group.add_argument("--bootstrap-servers", metavar="HOST:PORT", help="env CBGP_BOOTSTRAP_SERVERS")
    group.add_argument("--topic-prefix", metavar="PREFIX", help="env CBGP_TOPIC_PREFIX (default 'cbgp.')")
    group.add_argument("--partitions", type=_positive_int, metavar="N", help="env CBGP_PARTITIONS (default 4)")
    group.add_argument("--replication-factor", type=_positive_int, metavar="N",
                       help="env CBGP_REPLICATION_FACTOR (default 1)")
    group.add_argument("--security-protocol", choices=SECURITY_PROTOCOLS, help="env CBGP_SECURITY_PROTOCOL")
    group.add_argument("--sasl-mechanism", help="env CBGP_SASL_MECHANISM")
    group.add_argument("--sasl-username", help="env CBGP_SASL_USERNAME")
    group.add_argument("--sasl-password", help="env CBGP_SASL_PASSWORD (prefer the env var: flags show in ps)")
    group.add_argument("--ssl-ca-location", metavar="PATH", help="env CBGP_SSL_CA_LOCATION")
    group.add_argument("--rebalance-timeout-ms", type=_positive_int, metavar="MS",
                       help="consumers' max.poll.interval.ms; env CBGP_REBALANCE_TIMEOUT_MS (default librdkafka's)")
    group.add_argument("--kafka-config", action="append", metavar="KEY=VALUE",
                       help="extra librdkafka property (repeatable); env CBGP_KAFKA_<KEY>")
    group.add_argument("--topic-config", action="append", metavar="TOPIC:KEY=VALUE",
                       help="topic config over the catalogue's, e.g. updates.raw:retention.ms=86400000 (repeatable; "
                       "env CBGP_TOPIC_CONFIG, ';'-separated); a finite retention on a log a restore replays is refused")
    return parser
