"""NVML's names for things that the backends, the exporters and the snapshot share.

A neutral module: it imports nothing from ``gpumon.backends`` or ``gpumon.exposition``, so the
DCGM-compatible exporter and the fake backend can use NVML's vocabulary without importing
the NVML backend.
"""

from __future__ import annotations

CLOCK_EVENT_BITS = {  # nvmlClocksEventReason* (= nvmlClocksThrottleReason*)
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
"""Clock-event reason (``clock_events_active`` key) -> its bit in nvmlDeviceGetCurrentClocksEventReasons."""
