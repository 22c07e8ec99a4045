"""Power draw (fast), the enforced limit and energy (slow)."""

from __future__ import annotations

from dataclasses import dataclass

from gpumon.model.fields.spec import Dcgm, Metric, Tier, declare

ENERGY_SECONDS = 60.0
"""The daemon (``gpumon run``) reads the energy counter at most this often (~3.3 ms of CPU per GPU
on an H100): it is cumulative, an increase shows later, none is lost."""


@dataclass(frozen=True)
class PowerFields:
    power_watts: float | None = declare(
        Tier.FAST,
        "Power draw, W (power.draw)",
        nvml="nvmlDeviceGetPowerUsage",
        conversion="mW / 1000",
        smi="power.draw",
        metric=Metric("gpumon_power_watts", "gauge", "Power draw, watts (nvidia-smi power.draw)."),
        dcgm=Dcgm("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", unit="W"),
        fake=75.0,
    )
    power_limit_watts: float | None = declare(
        Tier.SLOW,
        "Enforced power limit, W (enforced.power.limit)",
        nvml="nvmlDeviceGetEnforcedPowerLimit",
        conversion="mW / 1000",
        smi="enforced.power.limit",
        metric=Metric(
            "gpumon_power_limit_watts", "gauge", "Enforced power limit, watts (nvidia-smi enforced.power.limit)."
        ),
        dcgm=Dcgm(
            "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
            "gauge",
            "Effective power limit that the driver enforces (in W).",
            unit="W",
        ),
        fake=700.0,
    )
    energy_joules_total: float | None = declare(
        Tier.SLOW,
        "Energy since driver load, J (total energy, mJ / 1000)",
        nvml="nvmlDeviceGetTotalEnergyConsumption (~3 ms)",
        conversion="mJ / 1000",
        smi="-q (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION)",
        metric=Metric(
            "gpumon_energy_joules_total",
            "counter",
            "Energy consumed since the driver was loaded, joules (NVML total energy consumption).",
            read_every_seconds=ENERGY_SECONDS,
        ),
        dcgm=Dcgm(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "untyped",
            "Total energy consumption since boot (in mJ).",
            unit="mJ",
            scale=1000,
        ),
        fake=1_000_000.0,
    )
