"""Build the SparkSession every Spark entry point and test uses.

How it works: docs/design/internals.md, spark.session.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

from pyspark.sql import SparkSession

# Spark's streaming state store for stateful operators.  RocksDB because transformWithState* (needed
# later for window expiry) refuses the default HDFS-backed provider.
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"

# C1 compiler only and the serial GC: local jobs are short, so JIT warm-up and GC threads cost more
# than they give back (4.1 s vs 5.0 s start, 2.8 s vs 3.6 s first job, measured in the notes).
FAST_JVM_FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",  # progress bars garble logs and test output
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.extraJavaOptions": FAST_JVM_FLAGS,
    "spark.executor.extraJavaOptions": FAST_JVM_FLAGS,
    "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
    # Arrow for mapInPandas / toPandas; the data sources' read() may also yield Arrow batches.
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Python sides of Spark's local sockets wait this long (default 15 s): on a loaded 2-core machine
    # (make run starts the whole fleet at once) a worker can take longer than that to get scheduled.
    "spark.python.authenticate.socketTimeout": "120s",
    # Streaming queries here are small and frequent: don't keep 100 batches of metadata around.
    "spark.sql.streaming.minBatchesToRetain": "10",
    # RocksDB state (transformWithStateInPandas, spark.window_stream / spark.assembly_stream): a batch's commit writes a
    # changelog of what it changed instead of a snapshot of every file, and writes do not read the old
    # value back just to keep a row count, so a commit costs what the batch changed, not the state size.
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
}


def _prepare_environment() -> None:
    """Environment the JVM and its Python workers need; must happen before the JVM starts."""
    # Without it Spark resolves the hostname to a non-loopback address and warns (or binds wrongly).
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Workers must run this interpreter (the venv's), or they miss pyarrow and the project packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def register_data_sources(spark: SparkSession) -> None:
    """Make ``format("cbgpkafka")`` available in this session."""
    from spark.kafka_io import KafkaDataSource

    spark.dataSource.register(KafkaDataSource)


def build_session(
    master: str = "local[2]",
    app_name: str = "cbgp-spark",
    extra_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return a SparkSession with the project's settings and the Kafka data source registered.

    ``extra_conf`` overrides the defaults (e.g. more shuffle partitions on a cluster).  If a session
    is already active in this process, Spark returns it; static settings then keep their first value.
    """
    _prepare_environment()
    builder = SparkSession.builder.master(master).appName(app_name)
    conf = dict(DEFAULT_CONF)
    conf.update(extra_conf or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register_data_sources(spark)
    return spark
