"""The idempotence keys of ``deltas.parts``: which writer owns which keys, in one place.

How it works: docs/design/internals.md, services.wire.idempotence.
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
