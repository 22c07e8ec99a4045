"""Rules for the telemetry the watcher summarised: GPU lost, slowdowns, ECC, row remaps, NVLink errors, PCIe, temperature."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumon.burn.verdict.judgement import GpuKey, Judgement

NVLINK_ERROR_TYPES = ("replay", "recovery", "crc")
"""The NVLink counters nvidia-smi nvlink -e shows as errors; growth of any other counter is not judged."""


def judge_telemetry(j: Judgement, key: GpuKey, tel: Mapping[str, Any]) -> None:
    if not tel:
        return
    if tel.get("lost_reason"):
        j.add("telemetry", key, "gpu_lost", False, f"GPU lost during the burn: {tel['lost_reason']}")
    slow = tel.get("slowdowns_seen") or []
    j.add(
        "telemetry",
        key,
        "slowdown",
        not slow,
        f"clock slowdown seen under load: {', '.join(slow)}"
        if slow
        else "no thermal/hardware slowdown"
        + (f" (seen: {', '.join(tel['clock_events_seen'])})" if tel.get("clock_events_seen") else ""),
    )
    ecc = tel.get("ecc_errors_grown") or {}
    unc = sum(v for k, v in ecc.items() if k.startswith("uncorrected"))
    if unc:
        j.add("telemetry", key, "ecc", False, f"{unc} uncorrectable ECC errors during the burn")
    elif ecc:
        j.add("telemetry", key, "ecc", True, f"corrected ECC errors during the burn: {ecc} (warning)")
    rows = tel.get("remapped_rows_grown") or {}
    if rows.get("uncorrectable") or tel.get("row_remap_pending"):
        j.add("telemetry", key, "row_remap", False, f"rows remapped during the burn: {rows}; reset the GPU")
    grown = tel.get("nvlink_errors_grown") or {}
    nvl = {
        link: errors
        for link, counters in grown.items()
        if (errors := {t: n for t, n in counters.items() if t in NVLINK_ERROR_TYPES and n > 0})
    }
    if nvl:
        links = "; ".join(
            f"link {link}: " + ", ".join(f"{t} +{n}" for t, n in sorted(errors.items())) for link, errors in nvl.items()
        )
        j.add("telemetry", key, "nvlink_errors", True, f"NVLink errors grew (nvidia-smi nvlink -e): {links} (warning)")
    gen, gen_max = tel.get("pcie_link_generation_under_load"), tel.get("pcie_link_generation_max")
    if gen is not None and gen_max is not None:
        j.add(
            "telemetry",
            key,
            "pcie_link_generation",
            gen >= gen_max,
            f"PCIe gen {gen} under load (max {gen_max})",
            gen,
            "generation",
            gen_max,
        )
    temp, limit = tel.get("temperature_peak_celsius"), tel.get("temperature_slowdown_threshold_celsius")
    if temp is not None and limit is not None:
        j.add(
            "telemetry",
            key,
            "temperature",
            temp < limit,
            f"peak {temp:.0f} °C (slowdown at {limit:.0f} °C)",
            temp,
            "celsius",
            limit,
        )
