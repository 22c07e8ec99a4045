"""What a long run's telemetry says about settling: when clocks, power and temperature settled under the soak,
when throttling began and why, and how far power swung on the pulse steps (JSON-ready, from watcher samples).

A series has settled at the first sample after which every value stays within its band of the
final level (the median of the soak's last third): SM clock 2 %, power 5 %, temperature 2 °C.
Throttle onset is the first soak sample with a clock-event reason that slows the GPU (power cap,
thermal or hardware slowdown, power brake), with the reason and seconds since the soak began.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

THROTTLE_REASONS = (
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "sw_thermal_slowdown",
    "hw_power_brake_slowdown",
)


def settle_report(samples: Sequence[Any], soak_test: str = "matmul") -> dict[str, Any]:
    """{"clock"|"power"|"temperature": {settled_after_seconds, level}, "throttle_onset": {reason, at_seconds} or
    None, "soak_seconds"}; {} when the soak has fewer than 6 samples."""
    soak = [s for s in samples if s.test == soak_test]
    if len(soak) < 6:
        return {}
    t0 = soak[0].t
    out: dict[str, Any] = {"soak_seconds": soak[-1].t - t0}
    series: dict[str, tuple[Callable[[Any], float | None], Callable[[float], float]]] = {
        "sm_clock_hertz": (lambda s: s.sm_clock_hertz, lambda level: 0.02 * level),
        "power_watts": (lambda s: s.power_watts, lambda level: 0.05 * level),
        "temperature_celsius": (lambda s: s.temperature_celsius, lambda _level: 2.0),
    }
    for name, (value_of, band_of) in series.items():
        points = [(s.t - t0, v) for s in soak if (v := value_of(s)) is not None]
        out[name] = _settled(points, band_of)
    onset = next((s for s in soak if s.clock_events & set(THROTTLE_REASONS)), None)
    out["throttle_onset"] = (
        {"reason": sorted(onset.clock_events & set(THROTTLE_REASONS)), "at_seconds": round(onset.t - t0, 1)}
        if onset is not None
        else None
    )
    return out


def _settled(points: list[tuple[float, float]], band_of: Callable[[float], float]) -> dict[str, float] | None:
    if len(points) < 6:
        return None
    level = statistics.median(v for _t, v in points[-max(2, len(points) // 3) :])
    band = band_of(level)
    last_out = max((i for i, (_t, v) in enumerate(points) if abs(v - level) > band), default=-1)
    settled_at = points[min(last_out + 1, len(points) - 1)][0]  # the first sample after the last one out of band
    return {"settled_after_seconds": round(settled_at, 1), "level": level}


def pulse_report(samples: Sequence[Any]) -> dict[str, Any]:
    """Power swing (min, max) and clock events seen while the load was stepped on and off."""
    steps = [s for s in samples if s.test == "pulse"]
    power = [s.power_watts for s in steps if s.power_watts is not None]
    clocks = [s.sm_clock_hertz for s in steps if s.sm_clock_hertz is not None]
    if not steps:
        return {}
    return {
        "power_min_watts": min(power) if power else None,
        "power_max_watts": max(power) if power else None,
        "sm_clock_min_hertz": min(clocks) if clocks else None,
        "sm_clock_max_hertz": max(clocks) if clocks else None,
        "clock_events_seen": sorted({r for s in steps for r in s.clock_events}),
    }
