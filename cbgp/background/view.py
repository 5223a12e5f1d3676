"""The local view R of a SERVICE pattern (Dehghanzadeh et al., section 4): one entry per join key.

How it works: docs/design/internals.md, cbgp.background.view.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Mapping

Key = Hashable


@dataclass
class Entry:
    key: Key
    value: Any
    best_before: float
    refreshed_at: float
    interval: float
    observations: list[tuple[float, bool]] = field(default_factory=list)
    refreshes: int = 0
    changes_seen: int = 0
    interval_fixed: bool = False  # set by hand (tests, known rates): not re-estimated


@dataclass(frozen=True)
class ViewChange:
    """A refresh found a new value for ``key`` at time ``t``: the query's input changes from old to new."""

    key: Key
    old: Any
    new: Any
    t: float


def estimate_rate(observations: Iterable[tuple[float, bool]], prior_interval: float, weight: float = 1.0) -> float:
    """Posterior-mode change rate (per time unit) from (elapsed, changed) looks; see the module docstring."""
    changed = [d for d, c in observations if c and d > 0]
    unchanged_total = sum(d for d, c in observations if not c and d > 0)
    prior_interval = max(prior_interval, 1e-12)

    def slope(lam: float) -> float:
        total = weight * (1.0 / lam - prior_interval) - unchanged_total
        for d in changed:
            x = lam * d
            total += d / math.expm1(x) if x < 700 else 0.0  # d e^-x / (1 - e^-x) = d / (e^x - 1)
        return total

    lo, hi = 1e-12, 1.0 / prior_interval
    while slope(hi) > 0 and hi < 1e12:
        hi *= 4.0
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if slope(mid) > 0:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.0001:
            break
    return math.sqrt(lo * hi)


class LocalView:
    """R = {(mu_i, tau_i)}: background values keyed by the join key, with best-before times and intervals."""

    def __init__(self, prior_interval: float, *, max_observations: int = 64, pool_observations: int = 2048,
                 stale_probability: float | None = None, prior_weight: float = 1.0):
        self.prior_interval = float(prior_interval)  # the initial guess (mean), before any observation
        self.pooled_interval = float(prior_interval)
        self.prior_weight = prior_weight  # 1: the prior is worth one look of length prior_interval
        # I = the mean time between changes (1/lambda) by default; with stale_probability q, the time by which
        # the entry is stale with probability q: -ln(1 - q) / lambda (q = 0.5: the median).
        self.scale = 1.0 if stale_probability is None else -math.log(1.0 - stale_probability)
        self.max_observations = max_observations
        self._entries: dict[Key, Entry] = {}
        self._recent: deque[tuple[float, bool]] = deque(maxlen=pool_observations)  # for pool()

    # ------------------------------------------------------------------------------------------- contents
    def fill(self, rows: Mapping[Key, Any], t: float) -> None:
        """The bulk SERVICE evaluation at registration: every best-before is the initial time (the paper)."""
        for key, value in rows.items():
            self._entries[key] = Entry(key, value, float(t), float(t), self.scale * self.pooled_interval)

    def discover(self, rows: Mapping[Key, Any], t: float) -> tuple[list[Key], list[Key]]:
        """A bulk evaluation read again for its key set: keys new at the endpoint join as at the fill (best-before
        ``t``), keys gone from it leave; the values of the keys already here are left to the refresh policy (its
        budget decides what is refreshed).  Returns (added, removed)."""
        added = [key for key in rows if key not in self._entries]
        removed = [key for key in self._entries if key not in rows]
        for key in added:
            self._entries[key] = Entry(key, rows[key], float(t), float(t), self.scale * self.pooled_interval)
        for key in removed:
            del self._entries[key]
        return added, removed

    def put(self, key: Key, value: Any, *, best_before: float, refreshed_at: float,
            interval: float | None = None) -> Entry:
        """Set one entry by hand (tests, restored state); a given interval is kept fixed."""
        entry = Entry(key, value, float(best_before), float(refreshed_at),
                      float(interval) if interval is not None else self.scale * self.pooled_interval,
                      interval_fixed=interval is not None)
        self._entries[key] = entry
        return entry

    def __contains__(self, key: Key) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self):
        return iter(self._entries)

    def entry(self, key: Key) -> Entry:
        return self._entries[key]

    def value(self, key: Key) -> Any:
        return self._entries[key].value

    def entries(self) -> Iterable[Entry]:
        return self._entries.values()

    def compatible(self, keys: Iterable[Key]) -> list[Key]:
        """The view entries that join with the given window keys (one per key: the 1:1 class)."""
        return [k for k in keys if k in self._entries]

    def possibly_stale(self, keys: Iterable[Key], t: float) -> list[Key]:
        """PS: the keys whose best-before time is at or before t."""
        return [k for k in keys if self._entries[k].best_before <= t]

    def fresh_probability(self, key: Key, t: float) -> float:
        """P(no change since the last look) under the entry's estimated Poisson rate."""
        entry = self._entries[key]
        rate = self.scale / max(entry.interval, 1e-12)
        return math.exp(-rate * max(0.0, t - entry.refreshed_at))

    # -------------------------------------------------------------------------------------------- refresh
    def apply_refresh(self, key: Key, value: Any, t: float, best_before: float | None = None) -> ViewChange | None:
        """Store a fresh value read at time t; learn from whether it changed; return the ViewChange if any."""
        entry = self._entries[key]
        changed = value != entry.value
        elapsed = t - entry.refreshed_at
        if elapsed > 0 and entry.value is not None:  # None: a placeholder never read from the remote
            entry.observations.append((elapsed, changed))
            if len(entry.observations) > self.max_observations:
                del entry.observations[0]
            self._recent.append((elapsed, changed))
        old = entry.value
        entry.value = value
        entry.refreshed_at = float(t)
        entry.refreshes += 1
        if best_before is not None:
            entry.best_before = float(best_before)
        if changed:
            entry.changes_seen += 1
        if not entry.interval_fixed:
            entry.interval = self.scale / estimate_rate(entry.observations, self.pooled_interval, self.prior_weight)
        return ViewChange(key, old, value, float(t)) if changed else None

    # ----------------------------------------------------------------------------------------- checkpoint
    def snapshot(self) -> dict[str, Any]:
        """The view as JSON-able data (for a checkpoint); keys must be strings, values rows or JSON values."""
        return {
            "prior_interval": self.prior_interval, "pooled_interval": self.pooled_interval, "scale": self.scale,
            "prior_weight": self.prior_weight, "max_observations": self.max_observations,
            "recent": [list(o) for o in self._recent], "pool_observations": self._recent.maxlen,
            "entries": [{"key": e.key, "value": _encode_value(e.value), "best_before": e.best_before,
                         "refreshed_at": e.refreshed_at, "interval": e.interval,
                         "observations": [list(o) for o in e.observations], "refreshes": e.refreshes,
                         "changes_seen": e.changes_seen, "interval_fixed": e.interval_fixed}
                        for e in self._entries.values()],
        }

    @classmethod
    def restore(cls, data: Mapping[str, Any]) -> "LocalView":
        view = cls(data["prior_interval"], max_observations=data["max_observations"],
                   pool_observations=data["pool_observations"], prior_weight=data["prior_weight"])
        view.scale = data["scale"]
        view.pooled_interval = data["pooled_interval"]
        view._recent.extend((d, bool(c)) for d, c in data["recent"])
        for e in data["entries"]:
            view._entries[e["key"]] = Entry(
                e["key"], _decode_value(e["value"]), e["best_before"], e["refreshed_at"], e["interval"],
                [(d, bool(c)) for d, c in e["observations"]], e["refreshes"], e["changes_seen"], e["interval_fixed"])
        return view

    def pool(self) -> float:
        """Re-estimate the pooled prior interval from the view's last looks (once per evaluation, off the clock)."""
        if self._recent:
            self.pooled_interval = 1.0 / estimate_rate(self._recent, self.prior_interval)
            for entry in self._entries.values():
                if not entry.observations and not entry.interval_fixed:
                    entry.interval = self.scale * self.pooled_interval
        return self.pooled_interval


def _encode_value(value: Any) -> dict[str, Any]:
    if value is None:
        return {"none": True}
    if isinstance(value, frozenset):  # SparqlRemote's rows: tuples of (variable, term)
        return {"rows": sorted([list(pair) for pair in row] for row in value)}
    return {"value": value}


def _decode_value(data: Mapping[str, Any]) -> Any:
    if data.get("none"):
        return None
    if "rows" in data:
        return frozenset(tuple(tuple(pair) for pair in row) for row in data["rows"])
    return data["value"]
