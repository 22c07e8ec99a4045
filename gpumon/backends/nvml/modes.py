"""Modes: persistence, MIG, compute."""

from __future__ import annotations

from typing import Any

from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec
from gpumon.snapshot import Tier

COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


def read_persistence_mode(ctx: Context, g: GpuState, h: Any) -> dict[str, Any]:
    """nvmlDeviceGetPersistenceMode: persistence_mode."""
    return {"persistence_mode_enabled": bool(ctx.nv.nvmlDeviceGetPersistenceMode(h))}


def read_mig_mode(ctx: Context, g: GpuState, h: Any) -> dict[str, Any]:
    """nvmlDeviceGetMigMode: mig.mode.current."""
    current, _pending = ctx.nv.nvmlDeviceGetMigMode(h)
    return {"mig_mode_enabled": bool(current)}


def read_compute_mode(ctx: Context, g: GpuState, h: Any) -> dict[str, Any]:
    """nvmlDeviceGetComputeMode: compute_mode default|exclusive_process|prohibited."""
    mode = int(ctx.nv.nvmlDeviceGetComputeMode(h))
    return {"compute_mode": COMPUTE_MODES.get(mode, f"mode_{mode}")}


READERS = (
    ReaderSpec("persistence_mode", Tier.SLOW, read_persistence_mode),
    ReaderSpec("mig_mode", Tier.SLOW, read_mig_mode),
    ReaderSpec("compute_mode", Tier.SLOW, read_compute_mode),
)
