"""Prometheus metrics: the metric objects and the small HTTP server that serves them with the probes."""
