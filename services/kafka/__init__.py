"""Thin wrappers around confluent-kafka, in the style of Quix Streams' ``kafka/`` package.

- ``config``: :class:`KafkaSettings` from CLI flags / ``CBGP_*`` env vars -> librdkafka configs.
- ``topics``: the topic catalogue as data and :func:`ensure_topics`.
- ``client``: producer/consumer factories and small read/produce helpers.
- ``broker``: :class:`EmbeddedBroker`, a noida-db process for tests and local runs.
- ``doctor``: :func:`run_doctor`, checks that a broker has what the fleet needs.
"""

from services.kafka.config import KafkaConfigError, KafkaSettings, add_kafka_flags

__all__ = ["KafkaConfigError", "KafkaSettings", "add_kafka_flags"]
