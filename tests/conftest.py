"""Shared fixtures: each real dependency (broker, Spark) lives in its own module under tests/fixtures."""

pytest_plugins = ["tests.fixtures.broker", "tests.fixtures.spark"]

import os

# Fleet tests that run no Spark job have the workers multiply multi-part queries themselves (the
# deployment option for fleets without Spark).  The default Spark path is run by tests/test_run.py (`make run`,
# started without any CBGP_* variable) and tests/test_spark_assembly.py (the Spark assembly query itself).
os.environ.setdefault("CBGP_ASSEMBLY", "worker")
