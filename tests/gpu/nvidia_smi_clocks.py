"""A reader of ``nvidia-smi --query-gpu=index,clocks_event_reasons.active --format=csv,noheader`` (tests
only: gpumon itself never runs nvidia-smi): the hardware slowdowns each GPU reports active."""

from __future__ import annotations

HARDWARE_SLOWDOWNS = {
    "hw_slowdown": 0x8,  # nvmlClocksEventReasonHwSlowdown
    "sw_thermal_slowdown": 0x20,  # nvmlClocksEventReasonSwThermalSlowdown
    "hw_thermal_slowdown": 0x40,  # nvmlClocksEventReasonHwThermalSlowdown
    "hw_power_brake_slowdown": 0x80,  # nvmlClocksEventReasonHwPowerBrakeSlowdown
}
"""The clock-event reasons (nvml.h bits) that say the GPU itself is slowed: heat, its own hardware, the
board's power brake. (A power cap, 0x4, slows every GPU of a busy host alike: not one of them.)"""


def active_slowdowns(csv: str) -> dict[int, set[str]]:
    """``index, 0x…`` lines -> {GPU index: the HARDWARE_SLOWDOWNS active}; a line whose mask is not a
    number ([N/A], [Not Supported]) or that is not such a line is left out."""
    out: dict[int, set[str]] = {}
    for line in csv.splitlines():
        index, _, mask = (part.strip() for part in line.partition(","))
        try:
            gpu, bits = int(index), int(mask, 16)
        except ValueError:
            continue
        out[gpu] = {name for name, bit in HARDWARE_SLOWDOWNS.items() if bits & bit}
    return out
