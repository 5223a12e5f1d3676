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
