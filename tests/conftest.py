"""Shared fixtures: each real dependency (broker, Spark) lives in its own module under tests/fixtures."""

pytest_plugins = ["tests.fixtures.broker", "tests.fixtures.spark"]

import os

# Fleet tests that run no Spark job have the workers multiply multi-part queries themselves (the
# deployment option for fleets without Spark); tests/test_spark_fleet.py runs the default Spark path.
os.environ.setdefault("CBGP_ASSEMBLY", "worker")
