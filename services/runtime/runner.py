"""One loop for every transactional data-path service: a :class:`Processor` driven by :func:`run_processor`.

In the spirit of Quix Streams' ``Application.run``: a service says what it reads, how a batch becomes outputs
and the input offsets to commit with them, and what it does when it is idle or once a batch has committed;
the runner owns the loop, the transaction, the readiness flag and the throughput metrics, the same for ingest,
the workers and the answers service.  :func:`services.runtime.life.run_service` starts a new life (a new processor,
its state restored from the logs) after a failed transaction.

Each processor's sources and sinks, as data, are ``TOPOLOGIES[processor.service]`` (``cbgp describe SERVICE``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from confluent_kafka import Producer, TopicPartition

from services.metrics.instruments import (HOP_LATENCY, PROCESSING_LATENCY, QUEUE_WAIT, TRANSACTION_STEP, UPDATES_IN,
                                          UPDATES_OUT)
from services.wire.records import Output
from services.kafka.client import broker_outages
from services.wire.loglines import kv
from services.wire.settings import ms_setting
from services.runtime.gc_tuning import HeapSettler
from services.runtime.life import Stopper, commit_transaction, set_life
from services.wire.topology import TOPOLOGIES, Topology

__all__ = ["Processor", "Step", "batch_deadline", "min_transaction_gap", "run_processor"]

log = logging.getLogger("cbgp.runtime")
# A turn (poll, process, commit, committed) longer than this is logged with its parts (event=slow-turn): where a
# stage stopped, and every answer behind it waited.
SLOW_TURN_SECONDS = ms_setting("CBGP_SLOW_TURN_MS", 250)

# The input offsets of one consumer group, for the transaction: (partitions at their next offset, with optional
# commit metadata; the group's metadata from its member).
GroupOffsets = tuple[Sequence[TopicPartition], Any]


@dataclass(slots=True)
class Step:
    """What one batch made: the records to produce and the input offsets to commit with them, atomically."""

    outputs: list[Output]
    offsets: list[GroupOffsets] = field(default_factory=list)  # empty: outputs only (nothing was consumed)
    inputs: int = 0  # input changes the batch held (cbgp_updates_in_total)
    detail: Any = None  # the processor's own note for committed() (e.g. the positions the offsets move to)
    origin_ms: int | None = None  # produce time (epoch ms) of the raw update behind the batch's oldest input
    input_ms: int | None = None  # produce time (epoch ms) of the batch's oldest input record (the stage before's)


class Processor(Protocol):
    """A data-path service as the runner drives it.

    ``open`` joins the input groups: their ``on_assign`` callbacks restore the state of the partitions
    assigned (during ``poll``), ``on_revoke`` stops processing the revoked ones.  ``process`` changes the
    state in memory only; it becomes durable when ``committed`` is called, after the transaction."""

    service: str  # the `cbgp` command: the metrics label and the topology's key
    producer: Producer  # transactional

    def open(self) -> None: ...

    def poll(self) -> Any: ...  # the next batch (possibly empty: process then returns None)

    def process(self, batch: Any) -> Step | None: ...  # None: nothing to commit

    def committed(self, step: Step) -> None: ...  # the step's transaction committed

    def idle(self) -> Step | None: ...  # nothing came: housekeeping, and possibly outputs of its own

    def close(self, clean: bool) -> None: ...  # leave the groups now, flush; clean: stopped, all committed


def min_transaction_gap() -> float:
    """``CBGP_MIN_TRANSACTION_MS`` in seconds: the least time from one committed transaction to the next poll
    (default 0).  A gap gathers more input into each transaction: fewer, fuller ones cost the services and the
    broker less per update, and every hop's answers wait up to that much longer (docs/benchmarks.md).  A value
    that is not a whole number of milliseconds is ignored, with one warning line."""
    return ms_setting("CBGP_MIN_TRANSACTION_MS", 0, minimum=0)


MAX_BATCH_SECONDS = ms_setting("CBGP_MAX_BATCH_MS", 100)


def batch_deadline() -> float:
    """When a batch whose processing starts now stops taking input (``time.monotonic()``, ``CBGP_MAX_BATCH_MS``
    later): it commits what it processed and gives the rest back to its input for the next transaction, so a
    backlog flows downstream in slices rather than as one long transaction every later stage waits for."""
    return time.monotonic() + MAX_BATCH_SECONDS


def topology(processor: Processor) -> Topology:
    return TOPOLOGIES[processor.service]


def run_processor(processor: Processor, stopper: Stopper, ready: list[bool]) -> None:
    """Poll -> process -> commit until stopped; one life of ``processor``.

    Steps per batch (exactly-once), in this order:
    0. with ``CBGP_MIN_TRANSACTION_MS`` (:func:`min_transaction_gap`), wait until that long after the last commit;
    1. poll a batch (rebalance callbacks restore assigned partitions here);
    2. process it: outputs and input offsets, the state changed in memory only;
    3. one transaction (``commit_transaction``): (a) produce the outputs, (b) add the input offsets of each
       group, (c) wait for every acknowledgement and commit.  A failure at (a) or (b) aborts: neither the
       outputs nor the offsets happened.  A failure at (c), or a broker lost meanwhile, leaves the outcome
       unknown.  Either way :class:`TransactionFailed` ends this life and the next one restores from the logs;
    4. ``committed``: only now may the processor treat the batch as durable (move its positions, checkpoint).
       A checkpoint is taken here (the state as of this commit, unless the broker was lost in this life), written
       off the loop (a thread for ingest, a forked child for the workers and answers), saved to the instance's
       disk once written, and its Kafka records ride in the first transaction after that (a step of its own when
       idle): then, at that transaction's step 4, the older ones are trimmed;
    5. at most every ``CBGP_GC_FREEZE_INTERVAL_MS``, what survives is frozen out of the collector's walks
       (:class:`services.runtime.gc_tuning.HeapSettler`): the state is not walked again.
    A stop request ends the loop between batches: ``close(clean=True)``, every transaction committed.
    """
    service = processor.service
    updates_in, updates_out = UPDATES_IN.labels(service), UPDATES_OUT.labels(service)
    latency = PROCESSING_LATENCY.labels(service)
    hops = [HOP_LATENCY.labels(service, point) for point in ("polled", "processed", "committed")]
    queued = QUEUE_WAIT.labels(service)
    steps = [TRANSACTION_STEP.labels(service, name) for name in ("process", "commit")]
    clean, life = False, broker_outages()  # an outage before this life's clients exist is not theirs
    set_life(life)  # (what require_broker_kept compares with, for a processor run without run_lives too)
    try:
        processor.open()
        ready[0] = True
        gap, last_commit = min_transaction_gap(), 0.0
        heap = HeapSettler()
        while not stopper.stopping:
            if gap:
                wait = last_commit + gap - time.monotonic()
                if wait > 0:
                    time.sleep(wait)  # (more input gathers meanwhile: fewer, fuller transactions)
            asked = time.monotonic()
            batch = processor.poll()  # step 1
            started, polled_at = time.monotonic(), time.time()
            step = processor.process(batch)  # step 2
            if step is None:
                step = processor.idle()
                if step is None:
                    continue
            processed = time.monotonic()
            commit_transaction(processor.producer, step.outputs, step.offsets, life=life)  # step 3 (a), (b), (c)
            last_commit = time.monotonic()
            processor.committed(step)  # step 4
            settled = heap.settle()  # step 5
            turn_end = time.monotonic()
            if turn_end - asked > SLOW_TURN_SECONDS:
                log.info(kv(event="slow-turn", seconds=f"{turn_end - asked:.3f}", poll_s=f"{started - asked:.3f}",
                            process_s=f"{processed - started:.3f}", commit_s=f"{last_commit - processed:.3f}",
                            committed_s=f"{turn_end - last_commit:.3f}", inputs=step.inputs, outputs=len(step.outputs),
                            settled=settled))
            if step.offsets:
                done = time.monotonic()
                updates_in.inc(step.inputs)
                updates_out.inc(len(step.outputs))
                latency.observe(done - started)
                steps[0].observe(processed - started)
                steps[1].observe(done - processed)
                if step.origin_ms is not None:
                    since = polled_at - step.origin_ms / 1000
                    for hop, seconds in zip(hops, (0.0, processed - started, done - started)):
                        hop.observe(max(0.0, since + seconds))
                if step.input_ms is not None:
                    queued.observe(max(0.0, polled_at - step.input_ms / 1000))
        clean = True
    finally:
        ready[0] = False
        processor.close(clean)
