"""State stores and their checkpoints, apart from the Kafka plumbing and the services.

- :mod:`services.state.store`: an on-disk key-value store (RocksDB through rocksdict) whose every write is one
  atomic batch carrying its checkpoint record;
- :mod:`services.state.checkpointing`: what a checkpoint records (the input positions the state reflects),
  when one is due, and whether a saved one can serve a restore against the logs as they are now;
- :mod:`services.state.presence`: ingest's state (presence set, published terms) as store keys;
- :mod:`services.state.ondisk`: that state read and written in the store instead of held in memory
  (``cbgp ingest --state-on-disk``: state larger than memory);
- :mod:`services.state.shards`: the workers' shard and the answers service's partition checkpoints, on the
  instance's disk and (through ``services.kafka.checkpoint_log``) in Kafka, the newer taken on restore;
- :mod:`services.runtime.recovery`: the Kafka side, not imported here: the restore from a checkpoint plus the
  tails of the logs.

All but ``recovery`` are Kafka-free: a service reads positions and watermarks from the broker and hands them in
as numbers, so the decisions are tested without a broker (the Quix Streams split: ``state/`` and
``checkpointing/``).
"""
