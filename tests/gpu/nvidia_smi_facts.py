"""What ``nvidia-smi -q -x`` says of each GPU, in its own units, as a small JSON kept beside a recording.

``python tests/gpu/nvidia_smi_facts.py BEFORE.xml AFTER.xml > NAME.nvidia-smi.json``: the facts of
two ``nvidia-smi -q -x`` taken just before and just after ``gpumon record`` (tests/gpu/record_host.sh
takes them). Values that do not move (memory total, power limit, maximum clocks, PCIe link) are kept
once; values that do (temperature, power, utilization, memory used) as the [lowest, highest] of the
two. No serial number or UUID is kept. tests/test_replay_real_hosts.py compares the replay of the
recording with them: a reader that converts a unit wrongly disagrees with nvidia-smi.
"""

from __future__ import annotations

import json
import re
import sys
import xml.etree.ElementTree as ET
from typing import Any

STEADY = {
    "product_name": "product_name",
    "pci_bus_id": "pci/pci_bus_id",
    "vbios_version": "vbios_version",
    "memory_total_mib": "fb_memory_usage/total",
    "memory_reserved_mib": "fb_memory_usage/reserved",
    "power_limit_watts": "gpu_power_readings/current_power_limit",
    "max_sm_clock_mhz": "max_clocks/sm_clock",
    "max_memory_clock_mhz": "max_clocks/mem_clock",
    "max_graphics_clock_mhz": "max_clocks/graphics_clock",
    "pcie_link_gen_current": "pci/pci_gpu_link_info/pcie_gen/current_link_gen",
    "pcie_link_gen_max": "pci/pci_gpu_link_info/pcie_gen/max_link_gen",
    "pcie_link_width_current": "pci/pci_gpu_link_info/link_widths/current_link_width",
    "pcie_link_width_max": "pci/pci_gpu_link_info/link_widths/max_link_width",
    "ecc_mode": "ecc_mode/current_ecc",
    "persistence_mode": "persistence_mode",
    "compute_mode": "compute_mode",
    "row_remapper_max_banks": "remapped_rows/row_remapper_histogram/row_remapper_histogram_max",
}
MOVING = {
    "temperature_c": "temperature/gpu_temp",
    "memory_temperature_c": "temperature/memory_temp",
    "power_draw_average_watts": "gpu_power_readings/average_power_draw",
    "utilization_gpu_percent": "utilization/gpu_util",
    "memory_used_mib": "fb_memory_usage/used",
    "sm_clock_mhz": "clocks/sm_clock",
    "memory_clock_mhz": "clocks/mem_clock",
    "sw_power_cap_us": "clocks_event_reasons_counters/clocks_event_reasons_counters_sw_power_cap",
    "hw_thermal_slowdown_us": "clocks_event_reasons_counters/clocks_event_reasons_counters_hw_therm_slowdown",
}


def value(text: str | None) -> Any:
    """``"143771 MiB"`` -> 143771, ``"700.00 W"`` -> 700.0, ``"15420040 us"`` -> 15420040, ``"16x"`` -> 16, other text as it is."""
    if text is None:
        return None
    text = text.strip()
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)\s*(?:MiB|W|MHz|C|%|x|us|bank\(s\))?", text)
    if m is None:
        return text
    number = m.group(1)
    return float(number) if "." in number else int(number)


def gpus(xml_text: str) -> list[dict[str, Any]]:
    """Per GPU of one ``nvidia-smi -q -x``: every STEADY and MOVING fact."""
    root = ET.fromstring(xml_text)
    out = []
    for gpu in root.findall("gpu"):
        facts = {name: value(gpu.findtext(path)) for name, path in {**STEADY, **MOVING}.items()}
        out.append(facts)
    return out


def facts(before: str, after: str) -> dict[str, Any]:
    """The facts of two ``nvidia-smi -q -x`` around a recording (see the module docstring)."""
    root = ET.fromstring(before)
    merged = []
    for b, a in zip(gpus(before), gpus(after), strict=True):
        one = {name: b[name] for name in STEADY}
        for name in MOVING:
            pair = [v for v in (b[name], a[name]) if isinstance(v, int | float)]
            one[name] = [min(pair), max(pair)] if pair else None
        merged.append(one)
    return {
        "driver_version": root.findtext("driver_version"),
        "cuda_version": root.findtext("cuda_version"),
        "gpus": merged,
    }


if __name__ == "__main__":
    with open(sys.argv[1]) as b, open(sys.argv[2]) as a:
        print(json.dumps(facts(b.read(), a.read()), indent=1))
