"""Power draw, the enforced power limit and the energy counter."""

from __future__ import annotations

from typing import Any

from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec
from gpumon.model.fields.power import ENERGY_SECONDS
from gpumon.model.snapshot import Tier


def read_power(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetPowerUsage: power.draw, mW -> W."""
    out["power_watts"] = ctx.nv.nvmlDeviceGetPowerUsage(h) / 1000.0


def read_power_limit(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetEnforcedPowerLimit: enforced.power.limit, mW -> W."""
    out["power_limit_watts"] = ctx.nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0


def read_energy(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetTotalEnergyConsumption: energy since driver load, mJ -> J (~3 ms)."""
    out["energy_joules_total"] = ctx.nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0


READERS = (
    ReaderSpec("power", Tier.FAST, read_power),
    ReaderSpec("power_limit", Tier.SLOW, read_power_limit),
    ReaderSpec("energy", Tier.SLOW, read_energy, ENERGY_SECONDS),
)
