"""Shared fixtures: each real dependency (broker, Spark, the doorbell) lives in its own module under tests/fixtures."""

pytest_plugins = ["tests.fixtures.broker", "tests.fixtures.spark", "tests.fixtures.doorbell"]

import os

# Fleet tests that run no Spark job have the workers multiply multi-part queries themselves (the
# deployment option for fleets without Spark).  The default Spark path is run by tests/fleet/test_run.py (`make run`,
# started without any CBGP_* variable) and tests/spark/test_spark_assembly.py (the Spark assembly query itself).
os.environ.setdefault("CBGP_ASSEMBLY", "worker")
# Services' local state stores (ingest's checkpoint) go to a throw-away directory, not the checkout's .run/state.
if "CBGP_STATE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["CBGP_STATE_DIR"] = tempfile.mkdtemp(prefix="cbgp-test-state-")
    atexit.register(shutil.rmtree, os.environ["CBGP_STATE_DIR"], True)  # (xdist workers inherit it: not theirs)
# SERVICE endpoints the tests register (a local Virtuoso or pyoxigraph endpoint, and the names of in-memory remotes);
# a fleet allows none by default (tests/cbgp/background/test_hostile_endpoint.py checks the refusal).
os.environ.setdefault("CBGP_SERVICE_ALLOW", "http://127.0.0.1,http://localhost,http://e,http://endpoint.example,"
                                            "http://example.org,http://other.example,http://s,http://x")
# The fleet's checkpoint key: services that checkpoint refuse to start without one (services.wire.sealed).
os.environ.setdefault("CBGP_CHECKPOINT_SECRET", "test-fleet-checkpoint-key-0123456789")
