"""The exceptions a protected call can see."""

from __future__ import annotations

# isolated: this worker's reporter (its host) is isolated, the shared breaker closed
# (BreakerConfig.min_reporters, docs/one-sick-host.md)
# ramp: the breaker closed a moment ago and admits a share of calls rising to all of them
# (BreakerConfig.ramp_seconds, docs/recovery.md); retry_after is short
REASONS = ("open", "half_open_full", "forced_open", "bulkhead", "isolated", "ramp")


class BreakerOpen(Exception):
    """The breaker refused the call; nothing was sent to the protected service.

    ``retry_after`` is in seconds (None when unknown, e.g. forced open),
    ``breaker`` is the breaker's name, ``reason`` one of REASONS.
    """

    def __init__(self, retry_after: float | None, breaker: str, reason: str) -> None:
        self.retry_after = retry_after
        self.breaker = breaker
        self.reason = reason
        when = "" if retry_after is None else f", retry after {retry_after:.3f}s"
        super().__init__(f"breaker {breaker!r} refused the call ({reason}{when})")
