"""The idempotence keys of ``deltas.parts``: which writer owns which keys, in one place.

Every ``PartDelta`` carries a key ``(source_partition, source_offset, index)``.  The answers service keeps,
per query registration and per ``source_partition``, the last ``(source_offset, index)`` it took, and drops a
delta whose pair is not greater: a writer that re-runs a batch after a crash (a worker restoring from the logs,
a Spark batch re-executed from its checkpoint) reproduces the same keys, so its duplicates are dropped and
nothing is numbered twice.  That only works if no two writers share a ``source_partition``, so the ranges are:

==========================  ============================================  =====================  ===================
``source_partition``        writer                                         ``source_offset``      ``index``
==========================  ============================================  =====================  ===================
``P >= 0``                  state worker, routed partition ``P`` of        offset in              i-th delta of that
                            ``updates.routed`` (by-centre queries)          ``updates.routed/P``   offset (see below)
``-1`` (WHOLE)              state worker, whole queries read from          offset in              as above
                            ``updates.encoded`` (the total order)          ``updates.encoded``
``-2`` (WINDOWS)            Spark job, event-time windows                  instant (epoch ms)     i-th delta of it
``-100 - p`` (ASSEMBLY)     Spark job, multi-part assembly of input        offset of the update's i-th delta of it
                            partition ``p`` of ``deltas.parts``            last part delta
``-3`` (PRODUCT)            answers service, a by-centre product's         seq of the update      i-th delta of it
                            parts multiplied after the seq-ordered
                            release (``services.answers.release``)
==========================  ============================================  =====================  ===================

A state worker numbers a record's deltas per engine query (a query, or a product's part), in sorted order,
so two workers that both hold a routed partition for a moment during a rebalance give a delta the same key
even when they hold different sets of queries.  Snapshot deltas (a query's answers over the state restored by
replay, sent once when a shard first serves it) take ``(last replayed offset, SNAPSHOT_INDEX_BASE + i)``, i
counted per query: after every live delta of that offset and before every delta of the next one, so the
"(offset, index) only grows" rule keeps them.  (A by-centre registration's last replayed offset is the one
before its point in the routed log, the same for every owner: ``WorkerCore.registration_seq``.)  Live
indexes stay below 2^30 (a record holds far fewer deltas).

Sources below ``ORDERED_SOURCE_BELOW`` (all the negative ones) are one totally ordered stream each: the
answers service releases their deltas as they come, while routed sources (``>= 0``) are held until every
routed partition has passed their seq (``services.answers.release``).  The keys are per registration version: a
new registration's snapshot may carry lower keys than the last live delta of the old one.
"""

from __future__ import annotations

__all__ = ["SNAPSHOT_INDEX_BASE", "WHOLE_SOURCE_PARTITION", "WINDOW_SOURCE_PARTITION", "ASSEMBLY_SOURCE_BASE",
           "PRODUCT_SOURCE_PARTITION",
           "ORDERED_SOURCE_BELOW", "assembly_source_partition"]

SNAPSHOT_INDEX_BASE = 1 << 30  # index of the i-th snapshot delta of an offset: SNAPSHOT_INDEX_BASE + i
WHOLE_SOURCE_PARTITION = -1  # state workers' whole queries (updates.encoded)
WINDOW_SOURCE_PARTITION = -2  # the Spark job's event-time windows
PRODUCT_SOURCE_PARTITION = -3  # a by-centre product's answers, multiplied by the answers service's release
ASSEMBLY_SOURCE_BASE = -100  # the Spark job's assembly: ASSEMBLY_SOURCE_BASE - input partition of deltas.parts
ORDERED_SOURCE_BELOW = 0  # source partitions below this are one ordered stream each (passed straight through)


def assembly_source_partition(input_partition: int) -> int:
    """The ``source_partition`` of what the Spark assembly makes of ``deltas.parts`` partition ``input_partition``."""
    return ASSEMBLY_SOURCE_BASE - input_partition
