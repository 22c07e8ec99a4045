"""Clocks, performance state and clock events (throttling)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpumon.model.fields.spec import Dcgm, Metric, Tier, declare, declare_mapping, nonzero

VIOLATIONS_SECONDS = 30.0
"""The daemon (``gpumon run``) reads the violation (throttle time) counters at most this often
(~1 ms of CPU per GPU on an H100): cumulative, none is lost."""

if TYPE_CHECKING:
    pass

THROTTLE_REASONS = (
    "power",
    "thermal",
    "sync_boost",
    "board_limit",
    "low_utilization",
    "reliability",
    "total_app_clocks",
    "total_base_clocks",
)
"""Keys of ``throttle_seconds_total``: NVML_PERF_POLICY_* of nvmlDeviceGetViolationStatus."""


def _violation(reason: str, name: str, why: str) -> Dcgm:
    """NVML's nvmlViolationTime_t is in ns (measured: 15,420,040,352 where nvidia-smi -q says 15,420,040 us); DCGM serves it so since 4.1, dcgm-exporter's CSV since #589."""
    return Dcgm(name, "untyped", f"Throttling duration due to {why} (in ns).", unit="ns", key=reason, scale=1e9)


@dataclass(frozen=True)
class ClockFields:
    clocks_hertz: Mapping[str, float] | None = declare_mapping(
        Tier.FAST,
        "Current clocks by domain sm|memory|graphics, Hz (clocks.sm, clocks.mem, clocks.gr × 1e6)",
        nvml="nvmlDeviceGetClockInfo(SM / MEM / GRAPHICS)",
        conversion="MHz × 10⁶",
        smi="clocks.sm, clocks.mem, clocks.gr",
        metric=Metric(
            "gpumon_clock_hertz",
            "gauge",
            "Current clock by domain sm|memory|graphics, hertz (nvidia-smi clocks.sm, clocks.mem, clocks.gr).",
            labels=("domain",),
        ),
        dcgm=(
            Dcgm("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", unit="MHz", key="sm", scale=1e-6),
            Dcgm(
                "DCGM_FI_DEV_MEM_CLOCK",
                "gauge",
                "Memory clock frequency (in MHz).",
                unit="MHz",
                key="memory",
                scale=1e-6,
            ),
        ),
        fake={"sm": 345e6, "memory": 3201e6, "graphics": 345e6},
    )
    clocks_max_hertz: Mapping[str, float] | None = declare_mapping(
        Tier.STATIC,
        "Maximum clocks by domain, Hz (clocks.max.sm, clocks.max.mem, clocks.max.gr × 1e6)",
        nvml="nvmlDeviceGetMaxClockInfo",
        conversion="MHz × 10⁶",
        smi="clocks.max.sm …",
        metric=Metric(
            "gpumon_clock_max_hertz",
            "gauge",
            "Maximum clock by domain, hertz (nvidia-smi clocks.max.*).",
            labels=("domain",),
            detail="limits",
        ),
        fake={"sm": 1980e6, "memory": 3201e6, "graphics": 1980e6},
    )
    performance_state: int | None = declare(
        Tier.FAST,
        "Performance state 0 (max) – 15 (min) (pstate)",
        nvml="nvmlDeviceGetPerformanceState",
        conversion="32 (unknown) omitted",
        smi="pstate",
        metric=Metric(
            "gpumon_performance_state",
            "gauge",
            "Performance state, 0 (highest) to 15 (lowest) (nvidia-smi pstate).",
        ),
        dcgm=Dcgm("DCGM_FI_DEV_PSTATE", "gauge", "Performance state (P-State) 0-15, 0 is the highest."),
        fake=0,
    )
    clock_events_active: Mapping[str, bool] | None = declare_mapping(
        Tier.FAST,
        "Clock event (throttle) reasons this GPU reports, each active or not (clocks_event_reasons.*)",
        nvml="nvmlDeviceGetCurrentClocksEventReasons, only the bits of nvmlDeviceGetSupportedClocksEventReasons"
        " (read once; …ThrottleReasons in older bindings)",
        conversion="bitmask → bools",
        smi="clocks_event_reasons.*",
        metric=Metric(
            "gpumon_clock_event_active",
            "gauge",
            "1 while a clock event (throttle) reason holds the clocks down, per reason the GPU reports"
            " (nvidia-smi clocks_event_reasons.*).",
            labels=("reason",),
            detail="zero_rows",
            keep=nonzero,
        ),
        dcgm=(
            Dcgm(
                "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
                "gauge",
                "Current clock event reasons (bitmask of NVML reasons).",
                source="clock_events_active as NVML's bitmask",
                in_exporter=True,
            ),
            Dcgm(
                "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
                "gauge",
                "Current clock throttle reasons (bitmask; the name DCGM used before 3.3).",
                source="the same (DCGM's name before 3.3)",
                in_exporter=True,
            ),
        ),
    )
    throttle_seconds_total: Mapping[str, float] | None = declare_mapping(
        Tier.SLOW,
        "Time clocks were held below the requested value, by reason, s (violation counters, ns / 1e9)",
        nvml=(
            "nvmlDeviceGetFieldValues(NVML_FI_DEV_PERF_POLICY_*), one call (~0.6 ms); "
            "nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_*) (~0.7 ms each) where the driver lacks the fields"
        ),
        conversion="violation time ns / 10⁹",
        smi="-q Clocks Event Reasons counters",
        metric=Metric(
            "gpumon_throttle_seconds_total",
            "counter",
            "Time the clocks were held below the requested value, by reason, seconds (NVML violation status).",
            labels=("reason",),
            detail="zero_rows",
            keep=nonzero,
            read_every_seconds=VIOLATIONS_SECONDS,
        ),
        dcgm=(
            _violation("power", "DCGM_FI_DEV_POWER_VIOLATION", "power constraints"),
            _violation("thermal", "DCGM_FI_DEV_THERMAL_VIOLATION", "thermal constraints"),
            _violation("sync_boost", "DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "sync-boost constraints"),
            _violation("board_limit", "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION", "board limit constraints"),
            _violation("low_utilization", "DCGM_FI_DEV_LOW_UTIL_VIOLATION", "low utilization"),
            _violation("reliability", "DCGM_FI_DEV_RELIABILITY_VIOLATION", "reliability constraints"),
        ),
        fake={reason: 0.0 for reason in THROTTLE_REASONS},
    )
