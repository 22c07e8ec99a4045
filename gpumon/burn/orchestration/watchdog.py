"""gpumon's own watchdog: from each rank's last progress, decide whether a rank is hung and which.

A rank that stops making progress while computing is hung. A rank waiting in a collective
is only waiting for the others, as long as some rank still makes progress; when every rank
still running is stuck in a collective, the collective itself hung and all of them are named.
"""

from __future__ import annotations

from dataclasses import dataclass

HUNG_TOGETHER_FRACTION = 0.75
"""Once one rank is hung, others computing without progress for this share of the limit are named too."""


@dataclass(frozen=True)
class RankView:
    """What the agents know of one rank."""

    rank: int
    gpu: int
    node: int
    test: str
    collective: str | None
    """The collective the rank waits in, None while it computes."""
    age_seconds: float
    """Seconds since its last progress message."""
    ready: bool
    done: bool


@dataclass(frozen=True)
class Hang:
    """The watchdog's finding: the ranks to blame and one line saying why."""

    ranks: tuple[int, ...]
    message: str


def _name(v: RankView, multi_node: bool) -> str:
    where = f"node {v.node} GPU {v.gpu}" if multi_node else f"GPU {v.gpu}"
    return f"rank {v.rank} ({where})"


def decide(views: list[RankView], heartbeat_timeout: float, startup_timeout: float) -> Hang | None:
    """The hung ranks, or None while everyone makes progress or waits for someone who does."""
    multi_node = len({v.node for v in views}) > 1
    running = [v for v in views if not v.done]
    culprits = [
        v
        for v in running
        if (not v.ready and v.age_seconds > startup_timeout)
        or (v.ready and v.collective is None and v.age_seconds > heartbeat_timeout)
    ]
    if culprits:
        # Ranks that stopped together (one fault on two nodes, a shared PCIe switch) pass the limit
        # a beat apart: name every computing rank well past three quarters of it, not only the first.
        culprits += [
            v
            for v in running
            if v not in culprits
            and v.ready
            and v.collective is None
            and v.age_seconds > HUNG_TOGETHER_FRACTION * heartbeat_timeout
        ]
    if culprits:
        waiting = [v for v in running if v not in culprits and v.collective is not None]
        parts = []
        for v in culprits:
            limit = heartbeat_timeout if v.ready else startup_timeout
            state = f"in {v.test}" if v.ready else "starting up"
            parts.append(
                f"{_name(v, multi_node)} hung {state}: no progress for {v.age_seconds:.0f} s (limit {limit:.0f} s)"
            )
        if waiting:
            parts.append("waiting for it: " + ", ".join(f"rank {v.rank}" for v in waiting))
        return Hang(tuple(v.rank for v in culprits), "; ".join(parts))
    if running and all(
        v.collective is not None and v.age_seconds > (heartbeat_timeout if v.ready else startup_timeout)
        for v in running
    ):
        ops = sorted({f"{v.collective} in {v.test}" for v in running})
        names = ", ".join(_name(v, multi_node) for v in running)
        return Hang(
            tuple(v.rank for v in running),
            f"collective hung ({'; '.join(ops)}): no progress for {min(v.age_seconds for v in running):.0f} s "
            f"on {names}",
        )
    return None
