"""Budgeted maintenance of a local view (Dehghanzadeh et al., sections 3-5).

How it works: docs/design/internals.md, cbgp.background.maintenance.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import math
import random
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol

from cbgp.background.view import ViewChange, Key, LocalView

PROPOSERS = ("WSJ", "GNR", "WST", "BST")
RANKERS = ("RND", "LRU", "WBM", "WBM*", "WBMP")
POLICIES = ("WST", "GNR-RND", "GNR-LRU", "WSJ-RND", "WSJ-LRU", "WSJ-WBM", "WSJ-WBM*", "BST")
ORACLE_POLICIES = ("WSJ-WBM*", "BST")


_POOL: concurrent.futures.ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _refresh_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="cbgp-refresh")
        return _POOL


@dataclass(frozen=True)
class WindowShape:
    omega: float  # width
    beta: float  # slide

    @property
    def tumbling(self) -> bool:
        return self.omega == self.beta


class Remote(Protocol):
    def fetch(self, key: Key) -> Any: ...


class Oracle(Protocol):
    """True change times of the background data (evaluation runs only: BST, WBM*, true accuracy)."""

    def stale(self, key: Key, since: float, t: float) -> bool: ...  # a change in (since, t]

    def next_change(self, key: Key, t: float) -> float: ...  # first change after t, math.inf if none


# --------------------------------------------------------------------------------------------------- formulas
def remaining_life(t_i: float | None, t: float, shape: WindowShape) -> int:
    """Eq. 3: future evaluations (windows) that still hold the compatible window mapping; 0 if none."""
    if t_i is None:
        return 0
    return max(0, math.ceil((t_i + shape.omega - t) / shape.beta))


def renewed_best_before(tau: float, interval: float, t: float, renew: str = "restart") -> float:
    """Eq. 4 with catch-up: tau + k*I for the smallest k >= 1 with tau + k*I > t; ``renew="now"``: t + I;
    ``renew="restart"``: Eq. 4, tau + I, while that is after t, else t + I (an entry overdue by a whole interval
    starts again from the refresh: max(tau, t) + I for that case)."""
    if renew == "now":
        return t + interval
    if renew == "restart":
        return tau + interval if tau + interval > t else t + interval
    if math.isinf(tau):
        return tau
    if interval <= 0 or math.isinf(interval):
        return math.inf if math.isinf(interval) else t
    k = max(1, math.floor((t - tau) / interval) + 1)
    nxt = tau + k * interval
    while nxt <= t:  # float rounding
        nxt += interval
    return nxt


def validity(tau_next: float, t: float, shape: WindowShape) -> int:
    """V: evaluations the entry stays (possibly) fresh if refreshed at t."""
    if math.isinf(tau_next):
        return 1 << 30
    return math.ceil((tau_next - t) / shape.beta)


def refresh_budget(rho: float, query_time: float, refresh_time: float) -> int:
    """Eq. 2: the largest gamma with r_q + gamma * r_r <= rho."""
    if refresh_time <= 0:
        return 1 << 30
    return max(0, math.floor((rho - query_time) / refresh_time))


def estimated_accuracy(candidates: int, possibly_stale: Iterable[Key], refreshed: Iterable[Key]) -> float:
    """R4: 1 - |PS \\ E| / |C| (1.0 for an empty C)."""
    if candidates <= 0:
        return 1.0
    left = set(possibly_stale) - set(refreshed)
    return 1.0 - len(left) / candidates


@dataclass(frozen=True)
class Score:
    key: Key
    life: int  # L
    best_before_next: float  # tau_next
    validity: int  # V
    score: int


def wbm_scores(view: LocalView, candidates: Mapping[Key, float | None], t: float, shape: WindowShape,
               oracle: Oracle | None = None, renew: str = "restart") -> list[Score]:
    """Scores of the possibly stale candidates (WBM), or of the truly stale ones with true times (WBM*)."""
    scores = []
    for key, t_i in candidates.items():
        entry = view.entry(key)
        if oracle is None:
            if entry.best_before > t:
                continue
            tau_next = renewed_best_before(entry.best_before, entry.interval, t, renew)
        else:
            if not oracle.stale(key, entry.refreshed_at, t):
                continue
            tau_next = oracle.next_change(key, t)
        life = remaining_life(t_i, t, shape)
        v = validity(tau_next, t, shape)
        score = v if shape.tumbling else min(life, v)
        scores.append(Score(key, life, tau_next, v, score))
    return scores


def _shuffled(keys: Iterable[Key], rng: random.Random) -> list[Key]:
    keys = list(keys)
    rng.shuffle(keys)
    return keys


# ------------------------------------------------------------------------------------------------- elections
@dataclass(frozen=True)
class Election:
    key: Key
    best_before_next: float | None = None  # None: the renewed best-before from the view's estimate
    score: float | None = None


def elect(ranker: str, view: LocalView, candidates: Mapping[Key, float | None], t: float, gamma: int,
          shape: WindowShape, rng: random.Random, oracle: Oracle | None = None, spare: str = "likely",
          renew: str = "restart", tiebreak: str = "random") -> list[Election]:
    if gamma <= 0 or not candidates:
        return []
    if ranker == "RND":
        keys = list(candidates)
        return [Election(k) for k in rng.sample(keys, min(gamma, len(keys)))]
    if ranker == "LRU":
        keys = _shuffled(candidates, rng)  # random among equally old
        keys.sort(key=lambda k: view.entry(k).refreshed_at)
        return [Election(k) for k in keys[:gamma]]
    if ranker in ("WBM", "WBM*"):
        if ranker == "WBM*" and oracle is None:
            raise ValueError("WBM* needs an oracle of the true change times")
        scores = wbm_scores(view, candidates, t, shape, oracle if ranker == "WBM*" else None, renew)
        order = {s.key: i for i, s in enumerate(scores)}
        draw = {k: rng.random() for k in order}
        if tiebreak == "stale" and ranker == "WBM":
            # equal scores: the entry longest overdue relative to its interval first (then at random)
            def overdue(key: Key) -> float:
                entry = view.entry(key)
                return (t - entry.refreshed_at) / max(entry.interval, 1e-12)

            scores.sort(key=lambda s: (-s.score, -overdue(s.key), draw[s.key]))
        else:
            scores.sort(key=lambda s: (-s.score, draw[s.key]))
        chosen = [Election(s.key, s.best_before_next, s.score) for s in scores[:gamma]]
        if spare == "likely" and ranker == "WBM" and len(chosen) < gamma:
            # spare budget: the other candidates, most probably stale first (longest since the last look,
            # relative to the change interval), ties at random
            rest = [k for k in _shuffled(candidates, rng) if k not in order]
            rest.sort(key=lambda k: -(t - view.entry(k).refreshed_at) / max(view.entry(k).interval, 1e-12))
            chosen += [Election(k) for k in rest[: gamma - len(chosen)]]
        return chosen
    if ranker == "WBMP":
        # WBM with a soft PS: min(L, V) weighted by the probability that the entry is stale now (from its
        # estimated rate), over every candidate, instead of min(L, V) over those past their best-before
        weighted = []
        for key, t_i in candidates.items():
            entry = view.entry(key)
            tau_next = t + entry.interval  # memoryless changes: fresh for about I from the refresh on
            life, v = remaining_life(t_i, t, shape), validity(tau_next, t, shape)
            gain = v if shape.tumbling else min(life, v)
            weighted.append(((1.0 - view.fresh_probability(key, t)) * gain, rng.random(), key, tau_next))
        weighted.sort(key=lambda w: (-w[0], w[1]))
        return [Election(key, tau_next, score) for score, _, key, tau_next in weighted[:gamma] if score > 0]
    raise ValueError(f"unknown ranker {ranker!r} (one of {', '.join(RANKERS)})")


def propose(proposer: str, view: LocalView, window: Mapping[Key, float], t: float,
            oracle: Oracle | None = None) -> dict[Key, float | None]:
    if proposer == "WSJ":
        return {k: t_i for k, t_i in window.items() if k in view}
    if proposer == "GNR":
        return {k: window.get(k) for k in view}
    if proposer == "WST":
        return {}
    if proposer == "BST":
        if oracle is None:
            raise ValueError("BST needs an oracle of the true change times")
        return {k: t_i for k, t_i in window.items()
                if k in view and oracle.stale(k, view.entry(k).refreshed_at, t)}
    raise ValueError(f"unknown proposer {proposer!r} (one of {', '.join(PROPOSERS)})")


@dataclass(frozen=True)
class Policy:
    proposer: str
    ranker: str | None

    @property
    def name(self) -> str:
        return self.proposer if self.proposer in ("WST", "BST") else f"{self.proposer}-{self.ranker}"

    @property
    def needs_oracle(self) -> bool:
        return self.proposer == "BST" or self.ranker == "WBM*"

    @classmethod
    def parse(cls, name: str) -> "Policy":
        name = name.strip().upper()
        if name in ("WST", "BST"):
            return cls(name, None if name == "WST" else "RND")
        proposer, _, ranker = name.partition("-")
        if proposer not in ("WSJ", "GNR") or ranker not in RANKERS:
            raise ValueError(f"unknown policy {name!r}: WST, BST or WSJ|GNR-RND|LRU|WBM|WBM*")
        return cls(proposer, ranker)


# ------------------------------------------------------------------------------------------------ maintainer
@dataclass(frozen=True)
class Alert:
    """R4: the estimated accuracy at the allowed gamma is below alpha."""

    t: float
    estimate: float
    alpha: float
    gamma: int
    possibly_stale: int
    candidates: int


@dataclass
class Evaluation:
    t: float
    answers: dict[Key, Any]  # the join: window key -> view value
    candidates: int  # |C|
    window_candidates: int  # |C_w|: window keys in the view
    possibly_stale: int  # |PS| among C_w
    gamma: int  # allowed this evaluation
    elected: list[Key]
    refreshed: list[Key]
    changes: list[ViewChange]
    latency: float  # seconds, wall clock
    query_time: float
    refresh_times: list[float] = field(default_factory=list)
    failures: int = 0
    estimate: float = 1.0  # 1 - |PS \ E| / |C_w| (from best-before times)
    expected: float = 1.0  # mean P(fresh) over C_w after the refreshes (from the estimated change rates)
    alert: Alert | None = None


class Maintainer:
    """Runs one policy over one view against one remote; ``evaluate`` is one window evaluation."""

    def __init__(self, view: LocalView, remote: Remote, policy: Policy | str, shape: WindowShape, *,
                 gamma: int | None = None, rho: float | None = None, alpha: float | None = None,
                 oracle: Oracle | None = None, seed: int = 0, spare: str = "likely", renew: str = "restart",
                 tiebreak: str = "random", estimator: str = "rate",
                 clock: Callable[[], float] = time.perf_counter, refresh_time_hint: float | None = None):
        self.view = view
        self.remote = remote
        self.policy = Policy.parse(policy) if isinstance(policy, str) else policy
        if self.policy.needs_oracle and oracle is None:
            raise ValueError(f"{self.policy.name} is an oracle policy: give it the true change times")
        self.shape = shape
        self.gamma = gamma
        self.rho = rho  # seconds
        self.alpha = alpha
        self.oracle = oracle
        self.rng = random.Random(seed)
        self.spare = spare
        self.renew = renew
        self.tiebreak = tiebreak
        self.estimator = estimator  # which estimate the alert judges: "rate" (expected) or "ps" (estimate)
        self.clock = clock
        # r_q and r_r of Eq. 2: medians of the last 32 measurements (seconds), so that one stall of the
        # machine or the endpoint does not starve the budget; None until measured
        self._query_times: deque[float] = deque(maxlen=32)
        self._refresh_times: deque[float] = deque([refresh_time_hint] if refresh_time_hint else [], maxlen=32)
        self._probe = False
        # with the real clock and a rho, each refresh is bounded by the deadline in a pool thread
        self.hard_deadline = rho is not None and clock is time.perf_counter
        self.remote_calls = 0
        try:  # a remote whose fetch takes a timeout is given what is left of rho
            self._remote_timeout = "timeout" in inspect.signature(remote.fetch).parameters
        except (TypeError, ValueError):
            self._remote_timeout = False

    def allowed_gamma(self) -> int:
        limits = [] if self.gamma is None else [self.gamma]
        if self.rho is not None and self.refresh_time is not None:
            limits.append(refresh_budget(self.rho, self.query_time or 0.0, self.refresh_time))
        return min(limits) if limits else 1 << 30

    @property
    def query_time(self) -> float | None:
        return statistics.median(self._query_times) if self._query_times else None

    @property
    def refresh_time(self) -> float | None:
        return statistics.median(self._refresh_times) if self._refresh_times else None

    def evaluate(self, t: float, window: Mapping[Key, float]) -> Evaluation:
        start = self.clock()
        view, policy = self.view, self.policy
        window_keys = [k for k in window if k in view]
        candidates = propose(policy.proposer, view, window, t, self.oracle)
        gamma = self.allowed_gamma() if policy.proposer != "WST" else 0
        probe = gamma == 0 and self._probe and policy.proposer != "WST" and self.gamma != 0
        if probe:
            gamma = 1  # Eq. 2 allowed nothing twice running: one refresh, bounded by the timeout, re-measures
        elected = elect(policy.ranker or "RND", view, candidates, t, gamma, self.shape, self.rng,
                        self.oracle, self.spare, self.renew, self.tiebreak) if candidates else []
        stale_before = view.possibly_stale(window_keys, t)
        refreshed: list[Key] = []
        changes: list[ViewChange] = []
        times: list[float] = []
        failures = 0
        refresh_time, query_time_estimate = self.refresh_time, self.query_time or 0.0
        for choice in elected:
            now = self.clock()
            if self.rho is not None and refresh_time is not None and not probe:
                if (now - start) + refresh_time + query_time_estimate * 0.5 > self.rho:
                    break  # the deadline: the next refresh would likely overrun rho
            entry = view.entry(choice.key)
            self.remote_calls += 1
            left = None if self.rho is None else max(0.001, self.rho - (now - start) - query_time_estimate - 0.002)
            try:
                if left is not None and self.hard_deadline:
                    # the call runs in a pool thread and is abandoned at the deadline (its answer is dropped):
                    # a socket timeout alone does not bound a call that stalls between reads
                    args = {"timeout": left} if self._remote_timeout else {}
                    future = _refresh_pool().submit(self.remote.fetch, choice.key, **args)
                    value = future.result(timeout=left)
                elif left is not None and self._remote_timeout:
                    value = self.remote.fetch(choice.key, timeout=left)
                else:
                    value = self.remote.fetch(choice.key)
            except concurrent.futures.TimeoutError:
                failures += 1
                took = self.clock() - now
                times.append(took)
                self._refresh_times.append(took)  # a lower bound of the call's time: the budget shrinks
                break  # rho is spent
            except Exception:  # noqa: BLE001 - a failed refresh leaves the entry as it was
                failures += 1
                times.append(self.clock() - now)
                continue
            took = self.clock() - now
            times.append(took)
            self._refresh_times.append(took)
            if choice.best_before_next is not None:
                best_before = choice.best_before_next
            else:
                best_before = renewed_best_before(entry.best_before, entry.interval, t, self.renew)
            change = view.apply_refresh(choice.key, value, t, best_before)
            refreshed.append(choice.key)
            if change is not None:
                changes.append(change)
        answers = {k: view.value(k) for k in window_keys}  # the join (1:1: one view entry per window key)
        latency = self.clock() - start
        query_time = max(0.0, latency - sum(times))
        self._query_times.append(query_time)
        self._probe = gamma == 0 and not elected
        estimate = estimated_accuracy(len(window_keys), stale_before, refreshed)
        expected = (sum(view.fresh_probability(k, t) for k in window_keys) / len(window_keys)) if window_keys else 1.0
        judged = expected if self.estimator == "rate" else estimate
        alert = None
        if self.alpha is not None and judged < self.alpha:
            alert = Alert(t, judged, self.alpha, gamma, len(stale_before), len(window_keys))
        view.pool()  # off the clock: between evaluations
        return Evaluation(t, answers, len(candidates), len(window_keys), len(stale_before), gamma,
                          [c.key for c in elected], refreshed, changes, latency, query_time, times, failures,
                          estimate, expected, alert)
