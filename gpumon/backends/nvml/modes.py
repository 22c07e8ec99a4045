"""Modes: persistence, MIG, compute; the recovery action the driver recommends."""

from __future__ import annotations

from typing import Any

from gpumon.backends.nvml.codes import Unsupported
from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec, field_values
from gpumon.model.fields.modes import MODES_SECONDS, RECOVERY_ACTIONS
from gpumon.model.snapshot import Tier

FI_DEV_GET_GPU_RECOVERY_ACTION = 230
"""NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvidia-smi gpu_recovery_action); absent from older drivers."""

COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}


def read_persistence_mode(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetPersistenceMode: persistence_mode."""
    out["persistence_mode_enabled"] = bool(ctx.nv.nvmlDeviceGetPersistenceMode(h))


def read_mig_mode(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetMigMode: mig.mode.current."""
    current, _pending = ctx.nv.nvmlDeviceGetMigMode(h)
    out["mig_mode_enabled"] = bool(current)


def read_compute_mode(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetComputeMode: compute_mode default|exclusive_process|prohibited."""
    mode = int(ctx.nv.nvmlDeviceGetComputeMode(h))
    out["compute_mode"] = COMPUTE_MODES.get(mode, f"mode_{mode}")


def read_recovery_action(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """Field value NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: gpu_recovery_action none|gpu_reset|node_reboot|..."""
    nv = ctx.nv
    fid = int(getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", FI_DEV_GET_GPU_RECOVERY_ACTION))
    (number,) = field_values(nv, h, [fid])
    if number is None:
        raise Unsupported  # a driver without the field
    action = int(number)
    out["recovery_action"] = RECOVERY_ACTIONS.get(action, f"action_{action}")


READERS = (
    ReaderSpec("persistence_mode", Tier.SLOW, read_persistence_mode, MODES_SECONDS),
    ReaderSpec("mig_mode", Tier.SLOW, read_mig_mode, MODES_SECONDS),
    ReaderSpec("compute_mode", Tier.SLOW, read_compute_mode, MODES_SECONDS),
    ReaderSpec("recovery_action", Tier.SLOW, read_recovery_action),
)
