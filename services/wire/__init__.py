"""What travels between services, with no Kafka client: records, idempotence keys, registrations and
the topology of each service."""
