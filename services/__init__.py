"""The Kafka fleet: ingest, registry, state workers and answers services, plus their shared plumbing.

Everything that talks to a broker lives under this package; the algorithm (``cbgp``) never imports it.
Shared plumbing: ``services.kafka`` (configuration, topics, clients, embedded broker, doctor),
``services.codec`` (Avro single-object encoding) and ``services.metrics.exposition`` (Prometheus endpoints).
"""
