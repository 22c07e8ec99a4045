"""What the poller keeps of each GPU between polls: its cached tier values, when each was read, lost and re-probed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumon.model.snapshot import ProcessSnapshot, Tier

POLLED_TIERS = (Tier.STATIC, Tier.SLOW, Tier.FAST)
"""Every tier, slowest first: the order a GPU's tiers are read and merged in."""


@dataclass
class GpuState:
    """One GPU as the poller knows it (changed in place by the poll thread only)."""

    uuid: str
    cache: dict[Tier, Mapping[str, Any]] = field(default_factory=dict)
    base: dict[str, Any] | None = None
    """Every field's default overlaid with the static and slow values; rebuilt when one of those is read."""
    read_at: dict[Tier, float] = field(default_factory=dict)
    """When each slower tier of this GPU was last read (monotonic seconds)."""
    lost_reason: str | None = None
    reprobe_at: float = 0.0
    reprobe_backoff: float = 5.0
    enriched: tuple[tuple[ProcessSnapshot, ...], tuple[ProcessSnapshot, ...], int] | None = None
    """(processes as the backend gave them when /proc was read, the latest with /proc facts, polls it may
    still serve)."""
