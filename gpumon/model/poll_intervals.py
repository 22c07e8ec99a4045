"""How often each tier is read: shared by the poller, the exposition (which says when a slow tier's
families go stale) and the daemon settings."""

from __future__ import annotations

from dataclasses import dataclass

from gpumon.model.snapshot import Tier


@dataclass(frozen=True)
class PollIntervals:
    """How often each tier is read, in seconds."""

    fast_seconds: float = 1.0
    slow_seconds: float = 10.0
    static_seconds: float = 300.0

    def of(self, tier: Tier) -> float:
        return {Tier.FAST: self.fast_seconds, Tier.SLOW: self.slow_seconds, Tier.STATIC: self.static_seconds}[tier]
