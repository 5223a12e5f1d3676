"""When to stop trying: a service that fails on one input dead-letters it and goes on, but one that fails on every
input (a bug, a dependency gone) stops with one line instead of dead-lettering the whole stream or restarting
into the same failure forever, as Kafka Streams' exception handlers let an application choose."""

from __future__ import annotations

from cbgp.query.limits import limit

SETTING, DEFAULT_MAX_CONSECUTIVE = "CBGP_MAX_CONSECUTIVE_FAILURES", 100
EXIT_TOO_MANY_FAILURES = 4  # the exit code of a service stopped by this policy (3 is a truncated log)


class TooManyFailures(RuntimeError):
    """Every one of the last N inputs failed in a way no check foresaw: stop, with the last reason."""


class ConsecutiveFailures:
    """Counts the inputs that failed in a row; :meth:`failed` raises :class:`TooManyFailures` at the limit."""

    def __init__(self, service: str, maximum: int | None = None) -> None:
        self.service = service
        self.maximum = maximum if maximum is not None else limit(SETTING, DEFAULT_MAX_CONSECUTIVE)
        self.count = 0

    def failed(self, why: str) -> None:
        self.count += 1
        if self.count >= self.maximum:
            raise TooManyFailures(f"{self.service}: the last {self.count} inputs in a row failed (the last: {why}); "
                                  f"stopping rather than dead-lettering everything ({SETTING}={self.maximum})")

    def succeeded(self) -> None:
        self.count = 0
