"""One continuous query with a SERVICE clause: local answers in, joined answer deltas out (item 1).

How it works: docs/design/internals.md, cbgp.background.service_query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from cbgp.background.maintenance import Evaluation, Maintainer, Policy, WindowShape
from cbgp.background.remote import SparqlRemote
from cbgp.background.service_clause import BackgroundJoin, ServiceError, split_service
from cbgp.background.view import LocalView

USABLE = ("WSJ-WBM", "WSJ-WBMP", "WSJ-LRU", "WSJ-RND", "GNR-LRU", "GNR-RND", "GNR-WBM", "WST")  # no oracle outside a bench


@dataclass(frozen=True)
class ServiceOptions:
    policy: str = "WSJ-WBM"
    rho_ms: float = 100.0
    alpha: float | None = None
    refresh_ms: float = 60_000.0
    gamma: int | None = None
    prior_interval_ms: float = 600_000.0
    discover_ms: float = 600_000.0  # the fleet's views: how often the endpoint's key set is read again

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> "ServiceOptions":
        values: dict[str, Any] = {}
        for name, value in options.items():
            if not name.startswith("service."):
                continue
            key = name[len("service."):]
            try:
                if key == "policy":
                    policy = Policy.parse(value).name
                    if policy not in USABLE:
                        raise ValueError(f"{policy} needs the true change times (benchmarks only)")
                    values["policy"] = policy
                elif key in ("rho_ms", "refresh_ms", "prior_interval_ms", "discover_ms"):
                    values[key] = float(value)
                    if values[key] <= 0:
                        raise ValueError("must be positive")
                elif key == "alpha":
                    values[key] = float(value)
                    if not 0 <= values[key] <= 1:
                        raise ValueError("must be within [0, 1]")
                elif key == "gamma":
                    values[key] = int(value)
                    if values[key] < 0:
                        raise ValueError("must be >= 0")
                else:
                    raise ValueError("unknown option (policy, rho_ms, alpha, refresh_ms, gamma, prior_interval_ms, "
                                     "discover_ms)")
            except ValueError as exc:
                raise ServiceError(f"option {name}={value!r}: {exc}") from None
        return cls(**values)


class ServiceQuery:
    def __init__(self, text: str, options: ServiceOptions | Mapping[str, str] | None = None, *, now: float = 0.0,
                 window: WindowShape | None = None, remote_factory: Callable[..., Any] = SparqlRemote,
                 seed: int = 0):
        self.plan = split_service(text)
        if len(self.plan.services) != 1:
            raise ServiceError("one SERVICE clause per query is supported for now")
        if not isinstance(options, ServiceOptions):
            options = ServiceOptions.from_options(options or {})
        self.options = options
        (self.service,) = self.plan.services
        if not self.service.join_vars:
            raise ServiceError("the SERVICE pattern shares no variable with the rest of the query (a cross "
                               "product with the endpoint's data is not kept in a view)")
        self.join_var = self.service.join_vars[0]
        policy = options.policy
        if self.plan.maintenance == "plain" and "WBM" in policy:
            policy = "GNR-LRU"  # WBM's scores assume one background mapping per key
        self.policy = policy
        self.window = window or WindowShape(options.refresh_ms, options.refresh_ms)
        self.remote = remote_factory(self.service.endpoint, self.service.pattern, self.join_var,
                                     prefixes=self.plan.prologue)
        self.view = LocalView(prior_interval=options.prior_interval_ms)
        self.view.fill(self.remote.fill(), now)
        if self.plan.maintenance == "budgeted" and any(len(v) > 1 for v in map(self.view.value, self.view)):
            self.plan = type(self.plan)(**{**self.plan.__dict__, "maintenance": "plain",
                                           "status": "SERVICE answered from a local view refreshed by GNR-LRU "
                                                     "(the endpoint has several mappings for some key)"})
            self.policy = "GNR-LRU" if "WBM" in policy else policy
        self.maintainer = Maintainer(self.view, self.remote, self.policy, self.window, gamma=options.gamma,
                                     rho=options.rho_ms / 1000.0, alpha=options.alpha, seed=seed)
        self.join = BackgroundJoin(self.view, self.join_var, self.plan.projected or None)
        self._entered: dict[Any, float] = {}  # join key -> time its current local answers started
        self._count: dict[Any, int] = {}
        self.last: Evaluation | None = None
        self.alerts = 0

    @property
    def local_text(self) -> str:
        return self.plan.local_text

    def local_deltas(self, t: float, deltas: Iterable[tuple[int, Mapping[str, str]]]) -> list[tuple[int, tuple]]:
        out: list[tuple[int, tuple]] = []
        for diff, row in deltas:
            key = row.get(self.join_var)
            count = self._count.get(key, 0) + diff
            if count > 0:
                self._count[key] = count
                if diff > 0:
                    self._entered[key] = t  # the latest answer's time: the key stays at least that long
            else:
                self._count.pop(key, None)
                self._entered.pop(key, None)
            if key is not None and key not in self.view:
                # a key the bulk fill did not have: a placeholder, possibly stale at once, that the maintenance
                # refreshes within the budget (no remote call on the data path)
                self.view.put(key, None, best_before=t, refreshed_at=t)
            out += self.join.local_delta(row, diff)
        return out

    def evaluate(self, t: float) -> tuple[list[tuple[int, tuple]], Evaluation]:
        evaluation = self.maintainer.evaluate(t, dict(self._entered))
        out = [d for change in evaluation.changes for d in self.join.refresh_change(change)]
        self.last = evaluation
        self.alerts += evaluation.alert is not None
        return out, evaluation

    def status(self) -> dict[str, Any]:
        last = self.last
        return {
            "service": self.service.endpoint, "maintenance": self.plan.maintenance, "status": self.plan.status,
            "policy": self.policy, "rho_ms": self.options.rho_ms, "alpha": self.options.alpha,
            "view_entries": len(self.view), "remote_calls": self.maintainer.remote_calls + 1,
            "gamma": None if last is None else last.gamma,
            "estimated_accuracy": None if last is None else round(last.expected, 4),
            "alerts": self.alerts,
        }


def describe(text: str, options: Mapping[str, str]) -> str:
    """Validate a query with SERVICE for the registry, without contacting the endpoint: the maintenance class,
    the policy and budget it would get.  Raises ServiceError, or cbgp.query.sparql.QueryError for the local part."""
    from cbgp.query.sparql import parse_query

    plan = split_service(text)
    if len(plan.services) != 1:
        raise ServiceError("one SERVICE clause per query is supported for now")
    if not plan.services[0].join_vars:
        raise ServiceError("the SERVICE pattern shares no variable with the rest of the query")
    parse_query(plan.local_text)
    chosen = ServiceOptions.from_options(options)
    policy = chosen.policy if plan.maintenance == "budgeted" or "WBM" not in chosen.policy else "GNR-LRU"
    alpha = f", alert below alpha {chosen.alpha:g}" if chosen.alpha is not None else ""
    return f"{plan.status}; policy {policy}, rho {chosen.rho_ms:g} ms{alpha}"
