"""Profiling counters stuck: a busy GPU whose GPM readings stay 0, or stop changing, is a finding.

dcgm-exporter's users found its profiling metrics reading 0 at 99 % utilization (NVIDIA/dcgm-exporter#662):
a dashboard then says the GPU does nothing while it is full. gpumon reads the same counters through NVML
GPM (``sm_active_ratio``, ``sm_occupancy_ratio``, ``tensor_active_ratio``, ``dram_active_ratio``; a new
sample every ``GPM_SECONDS``). Over ``WINDOW_SECONDS`` in which the GPU was busy
(``utilization_ratio`` at or above ``BUSY_RATIO``) in every poll, readings that were all 0, or exactly the
same every poll, are ``profiling_stuck`` (WARNING, no action on the GPU: its work is fine, the counters
that describe it are not; restarting the profiling client or the driver usually brings them back).

Pure: fed snapshots, asked for findings at a time the caller gives. A GPU without GPM (older than Hopper,
or GPM not read) is never judged.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gpumon.model.findings import WARNING, Finding
from gpumon.model.snapshot import GpuSnapshot, Snapshot

WINDOW_SECONDS = 300.0
"""How long the counters must be stuck: ten GPM samples at the daemon's 30 s."""
BUSY_RATIO = 0.9
"""utilization.gpu / 100 at or above this in every poll of the window: the GPU is busy."""
FIELDS = ("sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio", "dram_active_ratio")
"""The GPM readings looked at (those the GPU has)."""


@dataclass(frozen=True)
class _Poll:
    at_seconds: float
    busy: bool
    readings: tuple[float | None, ...]


class StuckProfiling:
    """Per GPU, the polls of the last ``WINDOW_SECONDS`` (and one before, so a window can be full)."""

    def __init__(self, window_seconds: float = WINDOW_SECONDS, busy_ratio: float = BUSY_RATIO) -> None:
        self.window_seconds = window_seconds
        self.busy_ratio = busy_ratio
        self._polls: dict[tuple[int, str | None], deque[_Poll]] = {}

    def observe(self, snapshot: Snapshot) -> None:
        for gpu in snapshot.gpus:
            key = (gpu.index, gpu.uuid)
            polls = self._polls.setdefault(key, deque())
            if not gpu.up or gpu.sm_active_ratio is None:
                polls.clear()  # no GPM now: a window starts again when it comes back
                continue
            polls.append(_Poll(snapshot.timestamp_seconds, self._busy(gpu), _readings(gpu)))
            while len(polls) > 1 and polls[1].at_seconds <= snapshot.timestamp_seconds - self.window_seconds:
                polls.popleft()
        for gone in set(self._polls) - {(g.index, g.uuid) for g in snapshot.gpus}:
            del self._polls[gone]

    def _busy(self, gpu: GpuSnapshot) -> bool:
        return gpu.utilization_ratio is not None and gpu.utilization_ratio >= self.busy_ratio

    def findings(self, now_seconds: float) -> list[Finding]:
        out = []
        for (index, uuid), polls in sorted(self._polls.items(), key=lambda kv: kv[0][0]):
            stuck = self._stuck(polls, now_seconds)
            if stuck is not None:
                out.append(
                    Finding(
                        kind="profiling_stuck",
                        severity=WARNING,
                        action="none",
                        summary=f"profiling counters {stuck} while busy for {self.window_seconds / 60:g} min",
                        gpu=index,
                        uuid=uuid,
                        evidence={
                            "readings": dict(zip(FIELDS, polls[-1].readings, strict=True)),
                            "window_seconds": self.window_seconds,
                            "busy_ratio": self.busy_ratio,
                            "polls": len(polls),
                        },
                    )
                )
        return out

    def _stuck(self, polls: deque[_Poll], now_seconds: float) -> str | None:
        """``stuck at 0`` / ``not changing``, or None: busy throughout a full window that ends now."""
        if not polls or polls[0].at_seconds > now_seconds - self.window_seconds:
            return None  # not a full window yet
        if now_seconds - polls[-1].at_seconds > self.window_seconds / 10 or not all(p.busy for p in polls):
            return None  # not read lately, or idle at some point: GPM is allowed to say little
        seen = [tuple(v for v in p.readings if v is not None) for p in polls]
        if all(v == 0 for values in seen for v in values):
            return "stuck at 0"
        if len(set(seen)) == 1:
            return "not changing"
        return None


def _readings(gpu: GpuSnapshot) -> tuple[float | None, ...]:
    return tuple(getattr(gpu, name) for name in FIELDS)
