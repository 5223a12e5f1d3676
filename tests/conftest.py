"""Shared fixtures: each real dependency (broker, Spark) lives in its own module under tests/fixtures."""

pytest_plugins = ["tests.fixtures.broker", "tests.fixtures.spark"]
