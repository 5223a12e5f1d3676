"""PySpark side of the product: Kafka I/O through the Python Data Source API, compaction, the Spark job.

- ``session``: :func:`build_session`, a SparkSession with the project's settings and data sources registered.
- ``kafka_io``: :class:`KafkaDataSource` (format ``cbgpkafka``), a Kafka source and sink on confluent-kafka,
  because Spark's own Kafka connector needs jars that cannot be installed offline.
- ``windows`` / ``assembly``: the stateful queries (``transformWithStateInPandas``); ``state_log``: their keyed
  state (a base snapshot plus one appended row per batch) and the per-worker evaluator cache.
- ``compaction``: folds the ``answers`` delta log into a current-answer snapshot and ``answers.current``.
- ``job``: ``cbgp spark-job``, the long-running Structured Streaming query.
"""
