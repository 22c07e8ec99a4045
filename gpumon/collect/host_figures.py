"""The host's own figures in each snapshot: CPU busy share and memory in use, from psutil."""

from __future__ import annotations

from typing import Any

import psutil

MIN_CPU_SECONDS = 0.5
"""The least CPU time (all CPUs together) between two reads that gives a host CPU share."""


class HostFigureReader:
    """Host CPU busy share since the previous call, and memory in use, from psutil (a few µs a call).

    The first call has no previous one to measure from, so it gives no CPU share (the series
    is omitted until there is a real value, never a made-up 0).
    """

    def __init__(self) -> None:
        self._last_cpu: tuple[float, float] | None = None
        """(busy seconds, total seconds) of all CPUs at the previous call."""

    def __call__(self) -> dict[str, Any]:
        vm = psutil.virtual_memory()
        out: dict[str, Any] = {
            "memory_used_bytes": int(vm.total - vm.available),
            "memory_total_bytes": int(vm.total),
        }
        times = psutil.cpu_times()
        total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)  # guest is in user
        busy = total - times.idle - getattr(times, "iowait", 0.0)
        if self._last_cpu is None:
            self._last_cpu = (busy, total)
        elif total - self._last_cpu[1] >= MIN_CPU_SECONDS:  # shorter: too few clock ticks to mean anything
            share = (busy - self._last_cpu[0]) / (total - self._last_cpu[1])
            out["cpu_utilization_ratio"] = round(min(1.0, max(0.0, share)), 4)
            self._last_cpu = (busy, total)
        return out
