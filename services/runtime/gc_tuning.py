"""How often Python's cyclic garbage collector runs in every `cbgp` process (``CBGP_GC_THRESHOLD``).

The engine and the services allocate a tuple or a dict per change, binding and probe, and almost none of them
ever sits in a reference cycle: reference counting frees them.  Python's default collects the youngest
generation every 700 allocations and walks what survives each time; in the workers that walk was a quarter to a
third of the engine's CPU (docs/benchmarks.md, the collector).  Collecting every 50,000 allocations frees the
cycles that do occur (tracebacks, closures) a little later, and pays the walk 70 times less often.
"""

from __future__ import annotations

import gc
import os
import time
from typing import Callable

from services.metrics.instruments import FROZEN_OBJECTS
from services.wire.settings import whole_setting

SETTING = "CBGP_GC_THRESHOLD"
DEFAULT_THRESHOLD = 50_000
# The older generations are collected after this many collections of the younger one (Python: 10 and 10).
OLDER_THRESHOLDS = (20, 100)


def tune_gc(environ: dict[str, str] | os._Environ = os.environ) -> tuple[int, int, int]:
    """Set the collector's thresholds from ``CBGP_GC_THRESHOLD`` (allocations between collections of the youngest
    generation; ``0`` keeps Python's defaults); returns the thresholds in force.  A value that is not a whole
    number: the default, and one warning line that says so (``services.wire.settings``)."""
    threshold = whole_setting(SETTING, DEFAULT_THRESHOLD, unit="allocations", environ=environ)
    if threshold > 0:
        gc.set_threshold(threshold, *OLDER_THRESHOLDS)
    return gc.get_threshold()


FREEZE_SETTING = "CBGP_GC_FREEZE_INTERVAL_MS"
DEFAULT_FREEZE_INTERVAL_MS = 10_000


class HeapSettler:
    """Keeps a service's long-lived state out of the collector's walks: at most every ``CBGP_GC_FREEZE_INTERVAL_MS``
    (10 s; ``0`` never), after a committed transaction, it collects the two younger generations and freezes what
    survives (``gc.freeze``), so a later collection walks only what was allocated since.

    Why: with the threshold above, the middle generation gathers up to a million survivors before it is walked,
    and the oldest holds the whole state; in the workers' cores a middle collection took 220-318 ms once state had
    grown (bench/gc_pause_bench.py), a stall every stage waiting on that worker pays.  The cost: cyclic garbage
    that outlives a freeze is never collected (none was found in that bench's run); ``cbgp_gc_frozen_objects``
    shows what is frozen, which should follow the state's size."""

    def __init__(self, environ: dict[str, str] | os._Environ = os.environ,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = whole_setting(FREEZE_SETTING, DEFAULT_FREEZE_INTERVAL_MS, unit="milliseconds",
                                      environ=environ) / 1000
        self.clock = clock
        self.last: float | None = None  # (None: the first call settles: the state a restore built)

    def settle(self) -> bool:
        """Freeze what survives now if the interval has passed since the last time; True when it did."""
        if not self.interval:
            return False
        now = self.clock()
        if self.last is not None and now - self.last < self.interval:
            return False
        gc.collect(1)
        gc.freeze()
        self.last = self.clock()
        FROZEN_OBJECTS.set(gc.get_freeze_count())
        return True
