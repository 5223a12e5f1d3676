"""Whole-number settings from the environment, read the same way by every service and the ``cbgp`` command.

A value that is not a whole number (at least ``minimum``) is never guessed at: the default is used, and one log
line says which setting, the value and the default (``event=setting-ignored``).  No Kafka here: the ``cbgp``
command reads its settings before it knows whether it needs a client.
"""

from __future__ import annotations

import logging
import os
from typing import Mapping

from services.wire.loglines import kv

__all__ = ["ms_setting", "whole_setting"]

log = logging.getLogger("cbgp.runtime")


def whole_setting(name: str, default: int, *, minimum: int = 0, unit: str = "",
                  environ: Mapping[str, str] = os.environ) -> int:
    """``name`` from ``environ`` as a whole number of at least ``minimum`` (``unit`` names what it counts, for the
    warning); unset: ``default``; anything else: ``default`` and one warning line."""
    raw = environ.get(name, "").strip()
    if raw.isascii() and raw.isdigit() and int(raw) >= minimum:
        return int(raw)
    if raw:
        above = f" above {minimum - 1}" if minimum > 0 else ""
        log.warning(kv(event="setting-ignored", setting=name, value=raw,
                       reason=f"not a whole number of {unit or 'units'}{above}: using {default}"))
    return default


def ms_setting(name: str, default_ms: int, minimum: int = 1) -> float:
    """A time from the environment in whole milliseconds, as seconds (see :func:`whole_setting`)."""
    return whole_setting(name, default_ms, minimum=minimum, unit="milliseconds") / 1000
