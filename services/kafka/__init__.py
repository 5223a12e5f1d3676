"""Thin wrappers around confluent-kafka, in the style of Quix Streams' ``kafka/`` package.

- ``config``: :class:`KafkaSettings` from CLI flags / ``CBGP_*`` env vars -> librdkafka configs.
- ``topics``: the topic catalogue as data, :func:`ensure_topics`, :func:`catalogue`.
- ``client``: producer/consumer factories and small read/produce helpers.
- ``broker``: :class:`EmbeddedBroker`, a noida-db process for tests and local runs.
- ``doctor``: :func:`run_doctor`, checks that a broker has what the fleet needs.
- ``checkpoint_log``: shard checkpoints as chunked records of the checkpoint topics; ``floor``: what
  ``cbgp topics floor`` prints; ``replay`` / ``truncation``: reading a log range, refusing deleted records.
"""
