"""Window specifications (RSP-QL style): :class:`WindowSpec`, ISO-8601 durations, and the register options
that declare a window.

`window_from_options` builds a spec from register options, or completes an RSP-QL spec (the one
`cbgp.windows.rspql.parse_rspql` found in the query text) with `lateness` / `late`.  The semantics of each kind are
in `cbgp.windows.windowed`, which evaluates them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from cbgp.query.sparql import QueryError

KINDS = ("sliding", "tumbling", "event")
LATE_POLICIES = ("drop", "admit")


class WindowError(QueryError):
    """A window specification, window clause or windowed query is invalid (a QueryError: same `message`,
    `line` / `column` in the query text when known, so callers report both alike)."""


# --- specification ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class WindowSpec:
    kind: str  # "sliding" | "tumbling" | "event"
    range_ms: int
    step_ms: int  # tumbling: step == range
    lateness_ms: int = 0  # default watermark = max event time seen - lateness
    late_policy: str = "drop"  # "drop" | "admit"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise WindowError(f"unknown window kind {self.kind!r}: expected one of {', '.join(KINDS)}")
        for name in ("range_ms", "step_ms", "lateness_ms"):
            value = getattr(self, name)
            if type(value) is not int:
                raise WindowError(f"{name} must be an integer number of milliseconds, not {value!r}")
        if self.range_ms <= 0:
            raise WindowError(f"the window range must be positive, not {self.range_ms} ms")
        if self.step_ms <= 0:
            raise WindowError(f"the window step must be positive, not {self.step_ms} ms")
        if self.lateness_ms < 0:
            raise WindowError(f"the allowed lateness cannot be negative ({self.lateness_ms} ms)")
        if self.kind == "tumbling" and self.step_ms != self.range_ms:
            raise WindowError(
                f"a tumbling window has step == range (got range {self.range_ms} ms, step {self.step_ms} ms); "
                f"use a sliding window for another step"
            )
        if self.late_policy not in LATE_POLICIES:
            raise WindowError(f"unknown late-data policy {self.late_policy!r}: expected drop or admit")

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "range_ms": self.range_ms,
            "step_ms": self.step_ms,
            "lateness_ms": self.lateness_ms,
            "late_policy": self.late_policy,
        }

    @classmethod
    def from_json(cls, data: dict) -> WindowSpec:
        if not isinstance(data, dict):
            raise WindowError(f"a window spec must be a JSON object, not {type(data).__name__}")
        known = {"kind", "range_ms", "step_ms", "lateness_ms", "late_policy"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise WindowError(f"unknown window spec field(s): {', '.join(unknown)}")
        missing = [k for k in ("kind", "range_ms", "step_ms") if k not in data]
        if missing:
            raise WindowError(f"window spec lacks field(s): {', '.join(missing)}")
        return cls(**data)


_DURATION = re.compile(
    r"P(?:(?P<W>\d+(?:\.\d+)?)W)?(?:(?P<D>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<H>\d+(?:\.\d+)?)H)?(?:(?P<M>\d+(?:\.\d+)?)M)?(?:(?P<S>\d+(?:\.\d+)?)S)?)?"
)
_UNIT_MS = {"W": 7 * 86_400_000, "D": 86_400_000, "H": 3_600_000, "M": 60_000, "S": 1000}


def parse_duration(text: str) -> int:
    """Milliseconds of an ISO-8601 duration as RSP-QL writes them: PT60S, PT1M30S, PT0.5S, PT2H, P1D, P1W."""
    if not isinstance(text, str):
        raise WindowError(f"a duration must be a string like PT60S, not {text!r}")
    upper = text.upper()
    match = _DURATION.fullmatch(upper)
    if match is None or upper in ("P", "PT") or upper.endswith("T"):
        if re.fullmatch(r"P(\d+Y)?(\d+M)?(\d+[WD])?(T.*)?", upper) and re.match(r"P(\d+Y|\d+M)", upper):
            raise WindowError(f"duration {text!r}: years and months have no fixed length; use days (P30D)")
        raise WindowError(f"invalid duration {text!r}: expected ISO-8601 like PT60S, PT1M30S, PT0.5S, PT2H or P1D")
    total = sum(Fraction(value) * _UNIT_MS[unit] for unit, value in match.groupdict().items() if value is not None)
    if total.denominator != 1:
        raise WindowError(f"duration {text!r} is not a whole number of milliseconds")
    return int(total)


def window_from_options(options: dict[str, str], base: WindowSpec | None = None) -> WindowSpec | None:
    """The window of a query registered with string options, or None.

    Options: `window` (sliding | tumbling | event), `range` (duration), `step`
    (duration, default = range), `lateness` (duration, default 0), `late`
    (drop | admit, default drop); other keys are not ours and are ignored.
    With `base` (the spec `parse_rspql` found in the query text) only
    `lateness` and `late` may be given: they complete that spec, and declaring
    the window a second time in the options is an error.
    """
    options = options or {}
    lateness = options.get("lateness")
    late = options.get("late")
    extra = {}
    if lateness is not None:
        extra["lateness_ms"] = _option_duration("lateness", lateness)
    if late is not None:
        if late not in LATE_POLICIES:
            raise WindowError(f"option late={late!r}: expected drop or admit")
        extra["late_policy"] = late
    shape_keys = [k for k in ("window", "range", "step") if k in options]
    if base is not None:
        if shape_keys:
            raise WindowError(
                f"the query text declares its window (FROM NAMED WINDOW); option(s) {', '.join(shape_keys)} "
                f"would declare it again: give only lateness / late"
            )
        return _replace(base, **extra)
    kind = options.get("window")
    if kind is None:
        if shape_keys or extra:
            given = ", ".join(shape_keys + [k for k in ("lateness", "late") if k in options])
            raise WindowError(f"option(s) {given} given without window=sliding|tumbling|event")
        return None
    if kind not in KINDS:
        raise WindowError(f"option window={kind!r}: expected sliding, tumbling or event")
    if "range" not in options:
        raise WindowError(f"option window={kind} needs a range (e.g. range=PT60S)")
    range_ms = _option_duration("range", options["range"])
    step_ms = _option_duration("step", options["step"]) if "step" in options else range_ms
    return WindowSpec(kind, range_ms, step_ms, **extra)


def _option_duration(name: str, value: str) -> int:
    try:
        return parse_duration(value)
    except WindowError as exc:
        raise WindowError(f"option {name}: {exc.message}") from None


def _replace(spec: WindowSpec, **changes: object) -> WindowSpec:
    data = spec.to_json()
    data.update(changes)
    return WindowSpec.from_json(data)
