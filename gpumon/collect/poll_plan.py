"""Which tiers of which GPU a poll reads: the fast tier always, a slower one when due, spread over polls."""

from __future__ import annotations

from collections.abc import Sequence

from gpumon.collect.poll_state import POLLED_TIERS, GpuState
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import Tier

FAST_ONLY: tuple[Tier, ...] = (Tier.FAST,)
"""The plan of a GPU that reads no slower tier in a poll: one tuple shared by every such GPU and poll (the
poller tells it by identity and reads that GPU as on a fast-only poll)."""


def plan_tiers(
    gpus: Sequence[GpuState], intervals: PollIntervals, now: float
) -> tuple[Sequence[Sequence[Tier]], tuple[Tier, ...], float]:
    """The tiers to read for each GPU in this poll, all the tiers read in it, and the monotonic time
    before which no slow or static read is due (``now``: monotonic seconds).

    Every GPU's fast tier, every poll. A slower tier is read for a GPU when its interval has
    passed, but spread over polls: at most ceil(GPUs × fast / interval) GPUs a poll (the ones
    waiting longest), so that one poll never carries the slow reads of every GPU (on H200
    PCIe throughput and NVLink error counters take ~100 ms per GPU). A GPU never read yet
    is read at once. The poller plans only once that time has come (most polls read the fast tier alone).
    A GPU with no slower tier to read gets ``FAST_ONLY`` itself (at 8 GPUs, 7 of the 8 in most planned polls).
    """
    slower: dict[int, list[Tier]] = {}
    count = len(gpus)
    next_due = float("inf")
    for tier, interval in ((Tier.STATIC, intervals.static_seconds), (Tier.SLOW, intervals.slow_seconds)):
        budget = max(1, -(-count * intervals.fast_seconds // interval))
        waiting = []
        for i, state in enumerate(gpus):
            if state.lost_reason is not None:
                continue  # re-probed with every tier when its backoff allows
            last = state.read_at.get(tier)
            if last is None:
                slower.setdefault(i, []).append(tier)
                next_due = min(next_due, now + interval - 1e-3)
            elif now - last >= interval - 1e-3:
                waiting.append((last, i))
            else:
                next_due = min(next_due, last + interval - 1e-3)
        waiting.sort()
        for _last, i in waiting[: int(budget)]:
            slower.setdefault(i, []).append(tier)
            next_due = min(next_due, now + interval - 1e-3)
        if len(waiting) > budget:
            next_due = now  # more GPUs wait: plan again next poll
    plan = [FAST_ONLY] * count
    planned = {Tier.FAST}
    for i, tiers in slower.items():
        planned.update(tiers)
        plan[i] = (*tiers, Tier.FAST)
    return plan, tuple(t for t in POLLED_TIERS if t in planned), next_due
