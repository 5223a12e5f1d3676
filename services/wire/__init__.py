"""What travels between services, and between them and their operators, with no Kafka client: records,
idempotence keys, registrations, the topology of each service, log lines and whole-number settings."""
