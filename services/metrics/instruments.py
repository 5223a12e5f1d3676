"""The fleet's Prometheus metric objects, defined once (served by ``services.metrics.exposition``).

The names and labels are an interface: dashboards, alerts and the Helm chart's probes use them, so rename
nothing.  This module holds no Kafka client and no HTTP server, so the Kafka-free transforms
(``services.worker.core``) count through the same objects the services' loops do.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.wire.settings import whole_setting

__all__ = [
    "UPDATES_IN", "UPDATES_OUT", "DELTAS_EMITTED", "STATE_ENTRIES", "STATE_BYTES", "CONSUMER_LAG",
    "PROCESSING_LATENCY", "REJECTED_INPUTS", "RESTORE_PROGRESS", "ANSWER_LATENCY", "RESTORE_MISSING_OFFSETS",
    "BACKGROUND_REFRESHES", "BACKGROUND_VIEW_TRIPLES", "BACKGROUND_ACCURACY", "CHECKPOINT_BYTES", "CHECKPOINT_TIME",
    "OTHER_QUERIES", "QueryLabels", "top_queries", "set_by_query", "PATH_PAIRS",
]

# Per-query series are bounded: a fleet of ten thousand queries must not make ten thousand series per metric.
# The first CBGP_METRICS_QUERY_LABELS queries a service sees (or the largest, for gauges) get a series of their
# own; the others are counted together under query="_other".
QUERY_LABELS_SETTING, DEFAULT_QUERY_LABELS = "CBGP_METRICS_QUERY_LABELS", 100
OTHER_QUERIES = "_other"


def _query_labels() -> int:
    return whole_setting(QUERY_LABELS_SETTING, DEFAULT_QUERY_LABELS, unit="queries")


class QueryLabels:
    """The label of a query in a counter: its id for the first ``maximum`` queries, ``_other`` for the rest;
    :meth:`forget` frees a place (an unregistered query)."""

    def __init__(self, maximum: int | None = None) -> None:
        self.maximum = _query_labels() if maximum is None else maximum
        self.named: set[str] = set()

    def label(self, query: str) -> str:
        if query in self.named:
            return query
        if len(self.named) < self.maximum:
            self.named.add(query)
            return query
        return OTHER_QUERIES

    def forget(self, query: str) -> bool:
        """True when ``query`` had a series of its own."""
        if query in self.named:
            self.named.discard(query)
            return True
        return False


def top_queries(values: dict[str, float], maximum: int | None = None) -> dict[str, float]:
    """A gauge's per-query values bounded: the ``maximum`` largest by themselves, the rest summed as ``_other``."""
    maximum = _query_labels() if maximum is None else maximum
    if len(values) <= maximum:
        return dict(values)
    ranked = sorted(values.items(), key=lambda item: (-item[1], item[0]))
    kept = dict(ranked[:maximum])
    kept[OTHER_QUERIES] = sum(v for _q, v in ranked[maximum:])
    return kept


def set_by_query(gauge: Gauge, values: dict[str, float]) -> None:
    """Set a per-query gauge (label ``query``) to ``values``, bounded by :func:`top_queries`, and drop the series
    of queries gone or out of the top."""
    kept = top_queries(values)
    for query, value in kept.items():
        gauge.labels(query).set(value)
    for labels in list(gauge._metrics):
        if labels[0] not in kept:
            gauge.remove(*labels)


# prometheus-client appends "_total" to counter names, so Counter("cbgp_updates_in") exposes
# cbgp_updates_in_total.

UPDATES_IN = Counter("cbgp_updates_in", "Records a service consumed from its input topic.", ["service"])
UPDATES_OUT = Counter("cbgp_updates_out", "Records a service produced to its output topic(s).", ["service"])
DELTAS_EMITTED = Counter("cbgp_deltas_emitted", "Answer deltas emitted, per query and sign (+/-).", ["query", "sign"])
STATE_ENTRIES = Gauge("cbgp_state_entries", "Star-state entries held for a partition.", ["partition"])
STATE_BYTES = Gauge("cbgp_state_bytes", "Approximate bytes of star state held for a partition.", ["partition"])
CONSUMER_LAG = Gauge("cbgp_consumer_lag", "High watermark minus consumer position.", ["topic", "partition"])
PROCESSING_LATENCY = Histogram(
    "cbgp_processing_latency_seconds", "Time to process one polled batch, poll to commit.", ["service"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
# Where the time between an update's produce and its answers goes, hop by hop: from the produce of the raw update
# behind a batch's oldest input to the service polling that batch, having processed it, and having committed its
# outputs (the next hop's "polled" minus this hop's "committed" is the time the records waited in Kafka).
# Buckets fine enough between 10 and 200 ms that a quantile is not an interpolation across a 50 ms bucket.
HOP_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
               1.0, 2.5, 5.0, 10.0, 30.0)
HOP_LATENCY = Histogram(
    "cbgp_hop_latency_seconds", "Produce of the raw update behind a batch's oldest input to this service's point "
    "(polled, processed, committed) for that batch.", ["service", "point"], buckets=HOP_BUCKETS,
)
# The time a batch's input waited in Kafka: from the produce of its oldest record (by the stage before, or by the
# user for ingest) to this service's poll.  Unlike the hop latency it does not include the stages before.
QUEUE_WAIT = Histogram(
    "cbgp_queue_wait_seconds", "Produce of a batch's oldest input record to this service's poll of it.", ["service"],
    buckets=HOP_BUCKETS,
)
TRANSACTION_STEP = Histogram(
    "cbgp_transaction_step_seconds", "Time of one step of a batch's transaction (process: the state in memory; "
    "commit: produce, offsets and the broker's acknowledgements).", ["service", "step"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
REJECTED_INPUTS = Counter("cbgp_rejected_inputs", "Inputs sent to the dead-letter topic, by reason code.",
                          ["service", "reason"])
PATH_PAIRS = Gauge("cbgp_path_pairs", "Pairs the property-path closures of one query hold in this process (bound: "
                   "CBGP_MAX_PATH_PAIRS; the largest queries by themselves, the rest as _other).", ["query"])
FROZEN_OBJECTS = Gauge("cbgp_gc_frozen_objects", "Objects the collector no longer walks (frozen after a transaction: "
                       "the long-lived state; CBGP_GC_FREEZE_INTERVAL_MS).")
RESTORE_PROGRESS = Gauge("cbgp_restore_progress_ratio", "State restore progress of a partition, 0..1.", ["partition"])
RESTORE_MISSING_OFFSETS = Gauge(
    "cbgp_restore_missing_offsets", "Offsets a restore needed that the log no longer has (deleted by retention or "
    "delete_records); the service refused to rebuild its state and stopped.", ["topic", "partition"])
CHECKPOINT_BYTES = Gauge("cbgp_checkpoint_bytes", "Bytes of the last checkpoint of a shard kind (routed, whole, "
                         "deltas), summed over the shards it saved.", ["kind"])
CHECKPOINT_TIME = Gauge("cbgp_checkpoint_last_timestamp_seconds", "Unix time of the last checkpoint of a shard kind "
                        "(alert on time() minus it, under load, far above --checkpoint-interval).", ["kind"])
ANSWER_LATENCY = Histogram(
    "cbgp_answer_latency_seconds", "Event (or ingest) time of a change to the emission of the answers it caused.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
BACKGROUND_REFRESHES = Counter("cbgp_background_refreshes", "Remote calls of the background service, by view graph "
                               "and kind (fill, refresh, discover, failed).", ["graph", "kind"])
BACKGROUND_VIEW_TRIPLES = Gauge("cbgp_background_view_triples", "Triples a SERVICE view graph holds.", ["graph"])
BACKGROUND_ACCURACY = Gauge("cbgp_background_estimated_accuracy", "A view's expected share of fresh entries after "
                            "its last refresh round (Dehghanzadeh et al.'s estimate).", ["graph"])
