"""The ramp after a close, as each worker admits it (BreakerConfig.ramp_seconds).

When a breaker closes, every worker of every host would send its full traffic
at once to a service that has just recovered. With ``ramp_seconds`` set, the
close stamps the state with ``ramp_until`` (lua/includes/ramp.lua) and every
reply carries it: until then each worker admits a share of its calls, rising
linearly from ``ramp_from`` to 1, and decides it from memory, by its estimate
of the Redis time, so the ramp costs no round trip per call. The rule is a
credit, not chance: each call adds the share of the moment, a whole credit
admits one call and is spent. A worker so admits exactly its share (within one
call, whatever its rate), and the workers together the same share of their
calls. A call that asks Redis for a bulkhead slot with the ramp undecided (no
subscription, its first call after a change) has it decided by the acquire
script instead, by the same rule with one credit for the breaker, before the
slot is taken (lua/includes/ramp.lua ramp_admits). docs/recovery.md draws it.
"""

from __future__ import annotations

from breaker_redis.base.config import LIVE_FIELD

RAMP_FROM: float = LIVE_FIELD["ramp_from"].default  # what a config that omits ramp_from means
UNIT = 1_000_000  # one call's credit: integers, so no rounding drifts over many calls
RETRY_SECONDS = 1.0  # a call the ramp refused: retry after at most this


def ramp_share(ramp_until: int, ramp_ms: int, ramp_from: float, now_ms: int) -> float:
    """The share of calls admitted at now_ms (Redis ms): ramp_from at the close, 1 at
    ramp_until, linear between (1.0 without a ramp or once it is over)."""
    left = ramp_until - now_ms
    if left <= 0 or ramp_ms <= 0:
        return 1.0
    return max(ramp_from, 1.0 - (1.0 - ramp_from) * left / ramp_ms)


class Credit:
    """One worker's credit in the ramp of one breaker; a new close (epoch) starts it at 0."""

    __slots__ = ("credit", "epoch")

    def __init__(self) -> None:
        self.epoch = self.credit = 0

    def admits(self, epoch: int, share: float) -> bool:
        """Whether the call made now, when ``share`` of the calls are admitted, is."""
        if epoch != self.epoch:
            self.epoch, self.credit = epoch, 0
        credit = self.credit + round(share * UNIT)
        admitted = credit >= UNIT
        self.credit = credit - UNIT if admitted else credit
        return admitted
