"""What a receiver's sender reports about itself: delivery outcomes and whether its worker delivers.

``ReceiverStats`` counts alerts by outcome and keeps the last error; ``judge_health`` says whether
the worker thread is up, stuck (alerts queued and no delivery attempt for ``STUCK_AFTER_BACKOFFS``
× (max backoff + timeout) past the planned retry) or stopped (its thread ended). Both are shown
by ``/api/alerts`` (``sender_json``) and the sender self-metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpumon.alerts.config import RetryConfig

STUCK_AFTER_BACKOFFS = 3
"""A worker with queued alerts and no attempt for this many × (max backoff + timeout) past its planned retry is stuck."""


def describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, short; never raises (even for a broken ``__str__``)."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:
        text = type(exc).__name__
    return text if len(text) < 300 else text[:297] + "..."


@dataclass
class ReceiverStats:
    """Counts of alerts by outcome: sent, failed (an attempt to retry), dropped (4xx), overflow (queue full)."""

    outcomes: dict[str, int] = field(default_factory=lambda: {"sent": 0, "failed": 0, "dropped": 0, "overflow": 0})
    last_error: str = ""
    """Why the last attempt failed; cleared by a successful delivery."""
    last_success_at: float | None = None
    errors: int = 0
    """Unexpected exceptions the worker thread survived (a bug: see the log)."""
    last_attempt_at: float | None = None
    """Unix seconds of the worker's last delivery attempt (or its start)."""


@dataclass(frozen=True)
class SenderHealth:
    """Whether a receiver's worker thread delivers: ``up``, ``stuck`` or ``stopped``."""

    state: str
    """up | stuck (alerts queued, no attempt for too long) | stopped (the thread ended or never started)."""
    problem: str = ""
    """One line saying what is wrong; empty when up."""

    @property
    def up(self) -> bool:
        return self.state == "up"


def judge_health(
    running: bool, queued: int, now: float, progress_at: float, planned_retry_at: float, retry: RetryConfig
) -> SenderHealth:
    """The worker's health: ``running``, whether its thread is alive; ``queued``, alerts waiting.

    Monotonic seconds: ``now``; ``progress_at``, when it last attempted a delivery, started or got
    alerts into an empty queue; ``planned_retry_at``, when the retry after its last failure is due."""
    if not running:
        return SenderHealth("stopped", "the sender thread is not running; restart gpumon")
    if not queued:
        return SenderHealth("up")
    allowed = STUCK_AFTER_BACKOFFS * (retry.max_backoff_seconds + retry.timeout_seconds)
    if now - max(progress_at, planned_retry_at) <= allowed:
        return SenderHealth("up")
    return SenderHealth("stuck", f"no delivery attempt for {now - progress_at:.0f} s with {queued} alert(s) queued")


def sender_json(health: SenderHealth, stats: ReceiverStats) -> dict[str, Any]:
    """The worker's health for ``/api/alerts``: sender (up/stuck/stopped), its problem, errors, last attempt."""
    return {
        "sender": health.state,
        "sender_problem": health.problem,
        "sender_errors": stats.errors,
        "last_attempt_at": stats.last_attempt_at,
    }
