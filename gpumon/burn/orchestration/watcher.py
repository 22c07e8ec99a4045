"""Telemetry during the burn, read through gpumon's own backend (never a set-call).

A thread of the agent reads ``Tier.FAST`` of every local GPU each second
(temperature.gpu, power.draw, clocks.sm, clocks_event_reasons.*) and ``Tier.SLOW`` every
10 s (enforced.power.limit, ECC counters, remapped rows), and summarises per GPU: peaks,
sustained (median) power under matmul load against the power limit, slowdowns seen and
error counters that grew while the burn ran.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumon.backends.base import GpuBackend, GpuLostError
from gpumon.burn.orchestration.interrupts import signals_deferred
from gpumon.burn.orchestration.soak import pulse_report, settle_report
from gpumon.model.snapshot import Tier

SLOWDOWN_FAULT_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown")
"""Clock-event reasons that fail a GPU when seen under burn load."""
SUSTAINED_SKIP_SECONDS = 3.0
"""Matmul samples of the first seconds are left out of the sustained-power median (ramp-up)."""


@dataclass(frozen=True)
class Sample:
    """One FAST read of one GPU."""

    t: float
    test: str
    temperature_celsius: float | None
    memory_temperature_celsius: float | None
    power_watts: float | None
    sm_clock_hertz: float | None
    clock_events: frozenset[str]
    pcie_link_generation: int | None = None


@dataclass
class GpuTelemetry:
    """Everything read from one GPU during the run."""

    index: int
    samples: list[Sample] = field(default_factory=list)
    first_slow: Mapping[str, Any] = field(default_factory=dict)
    last_slow: Mapping[str, Any] = field(default_factory=dict)
    static: Mapping[str, Any] = field(default_factory=dict)
    lost_reason: str | None = None
    read_errors: int = 0
    test_started_at: dict[str, float] = field(default_factory=dict)


class Watcher:
    """Reads the backend in its own thread until ``stop()``; ``current_test`` labels samples."""

    def __init__(
        self,
        backend: GpuBackend,
        gpus: tuple[int, ...],
        interval_seconds: float = 1.0,
        slow_interval_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.gpus = gpus
        self.interval_seconds = interval_seconds
        self.slow_interval_seconds = slow_interval_seconds
        self.clock = clock
        self.telemetry = {g: GpuTelemetry(index=g) for g in gpus}
        self.current_test: dict[int, str] = {g: "start" for g in gpus}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def set_test(self, gpu: int, test: str) -> None:
        with self._lock:
            if self.current_test.get(gpu) != test:
                self.current_test[gpu] = test
                if gpu in self.telemetry:
                    self.telemetry[gpu].test_started_at.setdefault(test, self.clock())

    def start(self) -> None:
        for g in self.gpus:
            self._read_tier(g, Tier.STATIC)
            slow = self._read_tier(g, Tier.SLOW)
            self.telemetry[g].first_slow = slow
            self.telemetry[g].last_slow = slow
        with signals_deferred():  # a Ctrl-C inside Thread.start leaves a thread that cannot be joined
            thread = threading.Thread(target=self._loop, name="gpumon-burn-watcher", daemon=True)
            thread.start()
            self._thread = thread

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout=10)
        for g in self.gpus:
            if self.telemetry[g].lost_reason is None:
                slow = self._read_tier(g, Tier.SLOW)
                if slow:
                    self.telemetry[g].last_slow = slow

    def latest(self, gpu: int) -> Sample | None:
        with self._lock:
            samples = self.telemetry[gpu].samples
            return samples[-1] if samples else None

    def _read_tier(self, gpu: int, tier: Tier) -> dict[str, Any]:
        tel = self.telemetry[gpu]
        if tel.lost_reason is not None:
            return {}
        try:
            values = dict(self.backend.read(gpu, tier))
        except GpuLostError as exc:
            tel.lost_reason = exc.reason
            return {}
        except Exception:
            tel.read_errors += 1
            return {}
        if tier is Tier.STATIC:
            tel.static = values
        return values

    def _loop(self) -> None:
        next_slow = self.clock() + self.slow_interval_seconds
        while not self._stop.is_set():
            for g in self.gpus:
                self._sample(g)
            if self.clock() >= next_slow:
                next_slow = self.clock() + self.slow_interval_seconds
                for g in self.gpus:
                    slow = self._read_tier(g, Tier.SLOW)
                    if slow:
                        self.telemetry[g].last_slow = slow
            self._stop.wait(self.interval_seconds)

    def _sample(self, gpu: int) -> None:
        values = self._read_tier(gpu, Tier.FAST)
        if not values:
            return
        clocks = values.get("clocks_hertz") or {}
        events = values.get("clock_events_active") or {}
        with self._lock:
            self.telemetry[gpu].samples.append(
                Sample(
                    t=self.clock(),
                    test=self.current_test.get(gpu, ""),
                    temperature_celsius=values.get("temperature_celsius"),
                    memory_temperature_celsius=values.get("memory_temperature_celsius"),
                    power_watts=values.get("power_watts"),
                    sm_clock_hertz=clocks.get("sm"),
                    clock_events=frozenset(k for k, v in events.items() if v),
                    pcie_link_generation=values.get("pcie_link_generation"),
                )
            )


def _peak(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _delta(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> dict[str, int]:
    if not before or not after:
        return {}
    out = {}
    for key, value in after.items():
        if isinstance(value, (int, float)) and isinstance(before.get(key), (int, float)):
            grown = int(value - before[key])
            if grown:
                out[key] = grown
    return out


def summarise(tel: GpuTelemetry) -> dict[str, Any]:
    """Peaks, sustained power vs limit, slowdowns and error growth of one GPU, JSON-ready."""
    samples = tel.samples
    power_limit = tel.last_slow.get("power_limit_watts") or tel.first_slow.get("power_limit_watts")
    matmul_start = tel.test_started_at.get("matmul")
    load = [
        s.power_watts
        for s in samples
        if s.test == "matmul"
        and s.power_watts is not None
        and (matmul_start is None or s.t >= matmul_start + SUSTAINED_SKIP_SECONDS)
    ]
    sustained = statistics.median(load) if load else None
    reasons_seen = sorted({r for s in samples for r in s.clock_events})
    clocks = [s.sm_clock_hertz for s in samples if s.test == "matmul" and s.sm_clock_hertz is not None]
    nvlink_before = tel.first_slow.get("nvlink_errors_total") or {}
    nvlink_after = tel.last_slow.get("nvlink_errors_total") or {}
    nvlink_grown = {link: d for link in nvlink_after if (d := _delta(nvlink_before.get(link), nvlink_after.get(link)))}
    pcie_under_load = [
        s.pcie_link_generation for s in samples if s.test in ("pcie", "matmul") and s.pcie_link_generation
    ]
    return {
        "samples": len(samples),
        "pcie_link_generation_under_load": max(pcie_under_load) if pcie_under_load else None,
        "pcie_link_generation_max": tel.static.get("pcie_link_generation_max"),
        "temperature_peak_celsius": _peak([s.temperature_celsius for s in samples]),
        "memory_temperature_peak_celsius": _peak([s.memory_temperature_celsius for s in samples]),
        "temperature_slowdown_threshold_celsius": tel.static.get("temperature_slowdown_threshold_celsius"),
        "power_peak_watts": _peak([s.power_watts for s in samples]),
        "power_sustained_watts": sustained,
        "power_limit_watts": power_limit,
        "power_sustained_ratio": (sustained / power_limit) if sustained and power_limit else None,
        "sm_clock_median_hertz": statistics.median(clocks) if clocks else None,
        "sm_clock_min_hertz": min(clocks) if clocks else None,
        "sm_clock_max_hertz": (tel.static.get("clocks_max_hertz") or {}).get("sm"),
        "clock_events_seen": reasons_seen,
        "slowdowns_seen": [r for r in reasons_seen if r in SLOWDOWN_FAULT_REASONS],
        "ecc_errors_grown": _delta(tel.first_slow.get("ecc_errors_total"), tel.last_slow.get("ecc_errors_total")),
        "remapped_rows_grown": _delta(tel.first_slow.get("remapped_rows"), tel.last_slow.get("remapped_rows")),
        "row_remap_pending": tel.last_slow.get("row_remap_pending"),
        "nvlink_errors_grown": nvlink_grown,
        "lost_reason": tel.lost_reason,
        "read_errors": tel.read_errors,
        "settle": settle_report(samples),
        "pulse": pulse_report(samples),
    }
