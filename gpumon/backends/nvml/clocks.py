"""Clocks (current and max), the performance state, clock events (throttle reasons) and violation times."""

from __future__ import annotations

from typing import Any

from gpumon.backends.nvml.codes import UNSUPPORTED_CODES, Unsupported, code_of
from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec, field_values, function, gather, opt
from gpumon.model.fields.clocks import VIOLATIONS_SECONDS
from gpumon.model.nvml_vocabulary import CLOCK_EVENT_BITS
from gpumon.model.snapshot import Tier

CLOCK_DOMAINS = {"graphics": 0, "sm": 1, "memory": 2}  # NVML_CLOCK_GRAPHICS / _SM / _MEM
_CLOCK_KEYS = tuple(("clock." + domain, domain, clock_type) for domain, clock_type in CLOCK_DOMAINS.items())
PSTATE_UNKNOWN = 32
PERF_POLICIES = {  # NVML_PERF_POLICY_*
    "power": 0,
    "thermal": 1,
    "sync_boost": 2,
    "board_limit": 3,
    "low_utilization": 4,
    "reliability": 5,
    "total_app_clocks": 10,
    "total_base_clocks": 11,
}
PERF_POLICY_FIELDS = {name: 74 + i for i, name in enumerate(PERF_POLICIES)}
"""NVML_FI_DEV_PERF_POLICY_POWER .. _TOTAL_BASE_CLOCKS (74-81): the same eight violation counters (ns) as
nvmlDeviceGetViolationStatus, in the order of PERF_POLICIES."""


def read_clocks(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetClockInfo per domain: clocks.sm / clocks.mem / clocks.gr, MHz -> Hz."""
    # gather's rule, written out: this runs every second for every GPU (0.5 µs a GPU less)
    clock_info = ctx.nv.nvmlDeviceGetClockInfo
    unsupported = g.unsupported
    clocks = {}
    for key, domain, clock_type in _CLOCK_KEYS:
        if key in unsupported:
            continue
        try:
            clocks[domain] = clock_info(h, clock_type) * 1e6
        except Exception as exc:
            if code_of(exc) not in UNSUPPORTED_CODES:
                raise
            unsupported.add(key)
    if not clocks:
        raise Unsupported
    out["clocks_hertz"] = clocks


def read_performance_state(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetPerformanceState: pstate 0-15 (32 = unknown, omitted)."""
    pstate = int(ctx.nv.nvmlDeviceGetPerformanceState(h))
    if pstate != PSTATE_UNKNOWN:
        out["performance_state"] = pstate


def read_clock_events(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetCurrentClocksEventReasons, limited to the reasons the GPU supports."""
    if g.clock_event_bits is None:
        nv = ctx.nv
        supported_fn = function(
            nv, "nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetSupportedClocksThrottleReasons"
        )
        supported = int(supported_fn(h))
        g.clock_event_bits = tuple((name, bit) for name, bit in CLOCK_EVENT_BITS.items() if supported & bit)
        g.clock_events_current = function(
            nv, "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"
        )
    if not g.clock_event_bits:
        raise Unsupported
    current = int(g.clock_events_current(h))
    if current != g.clock_events_last[0]:  # usually unchanged from one second to the next
        g.clock_events_last = (current, {name: bool(current & bit) for name, bit in g.clock_event_bits})
    out["clock_events_active"] = g.clock_events_last[1]


def read_max_clocks(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetMaxClockInfo: clocks.max.sm / .mem / .gr, MHz -> Hz (0 = not reported)."""
    fn = ctx.nv.nvmlDeviceGetMaxClockInfo
    calls = ((domain, f"max_clock.{domain}", fn, (h, clock_type)) for domain, clock_type in CLOCK_DOMAINS.items())
    out["clocks_max_hertz"] = gather(g, calls, lambda mhz: float(mhz) * 1e6, zero_is_absent=True)


def read_violations(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """Time held below the requested clocks per NVML_PERF_POLICY_*: violationTime ns -> s.

    One nvmlDeviceGetFieldValues call for the eight NVML_FI_DEV_PERF_POLICY_* fields: on an H200 it
    costs 0.59 ms of CPU, where eight nvmlDeviceGetViolationStatus calls cost 5.7 ms (the driver spins
    in each; docs/benchmarks.md). A driver that has none of those fields is asked with
    nvmlDeviceGetViolationStatus per policy (~0.7 ms each) from then on.
    """
    if "violation.fields" not in g.unsupported:
        by_field = _violations_by_field(ctx.nv, g, h)
        if by_field:
            out["throttle_seconds_total"] = by_field
            return
    fn = ctx.nv.nvmlDeviceGetViolationStatus
    calls = ((name, f"violation.{name}", fn, (h, policy)) for name, policy in PERF_POLICIES.items())
    out["throttle_seconds_total"] = gather(g, calls, lambda v: int(v.violationTime) / 1e9)


def _violations_by_field(nv: Any, g: GpuState, h: Any) -> dict[str, float] | None:
    """The violation counters (s) the NVML_FI_DEV_PERF_POLICY_* fields give; None when the driver has none
    of them (remembered as ``violation.fields``: the per-policy calls from then on)."""
    ns = opt(g, "violation.fields", field_values, nv, h, PERF_POLICY_FIELDS.values())
    if ns is None:
        return None
    seconds = {name: value / 1e9 for name, value in zip(PERF_POLICY_FIELDS, ns, strict=True) if value is not None}
    if not seconds:
        g.unsupported.add("violation.fields")
        return None
    return seconds


READERS = (
    ReaderSpec("clocks", Tier.FAST, read_clocks),
    ReaderSpec("performance_state", Tier.FAST, read_performance_state),
    ReaderSpec("clock_events", Tier.FAST, read_clock_events),
    ReaderSpec("violations", Tier.SLOW, read_violations, VIOLATIONS_SECONDS),
    ReaderSpec("max_clocks", Tier.STATIC, read_max_clocks),
)
