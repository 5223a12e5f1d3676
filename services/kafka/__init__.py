"""Thin wrappers around confluent-kafka, in the style of Quix Streams' ``kafka/`` package.

- ``config``: :class:`KafkaSettings` from CLI flags / ``CBGP_*`` env vars -> librdkafka configs.
- ``topics``: the topic catalogue as data, :func:`ensure_topics`, :func:`catalogue`.
- ``client``: producer/consumer factories and small read/produce helpers.
- ``broker``: :class:`EmbeddedBroker`, a noida-db process for tests and local runs.
- ``doctor``: :func:`run_doctor`, checks that a broker has what the fleet needs.
- ``checkpoint_log``: shard checkpoints as chunked records of the checkpoint topics; ``floor``: what
  ``cbgp topics floor`` prints; ``replay`` / ``truncation``: reading a log range, refusing deleted records.
"""

from services.kafka.broker import BrokerError, EmbeddedBroker
from services.kafka.client import (DeliveryError, broker_outages, consume_until, delete_topics, end_offsets,
                                   quiet_librdkafka, require_broker, unreachable_message,
                                   make_consumer, make_producer, produce_sync, read_all, wait_assignment)
from services.kafka.config import KafkaConfigError, KafkaSettings, add_kafka_flags
from services.kafka.doctor import Check, format_report, run_doctor
from services.kafka.topics import TOPICS, BrokerUnreachable, TopicError, TopicSpec, catalogue, ensure_topics

__all__ = [
    "BrokerError", "EmbeddedBroker",
    "DeliveryError", "broker_outages", "consume_until", "delete_topics", "end_offsets", "make_consumer",
    "make_producer", "produce_sync", "read_all", "wait_assignment", "quiet_librdkafka", "require_broker",
    "unreachable_message",
    "KafkaConfigError", "KafkaSettings", "add_kafka_flags",
    "Check", "format_report", "run_doctor",
    "TOPICS", "BrokerUnreachable", "TopicError", "TopicSpec", "catalogue", "ensure_topics",
]
