"""Modes: persistence, MIG, compute; NVSwitch fabric registration (nvidia-smi -q Fabric); the recovery action
the driver recommends."""

from __future__ import annotations

import ctypes
from typing import Any

from gpumon.backends.nvml.codes import NVML_SUCCESS, Unsupported
from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec, field_values
from gpumon.model.fields.modes import FABRIC_SECONDS, MODES_SECONDS, RECOVERY_ACTIONS
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


FABRIC_STATES = {1: "not_started", 2: "in_progress", 3: "completed"}  # NVML_GPU_FABRIC_STATE_*; 0 = not supported


class GpuFabricInfoV1(ctypes.Structure):
    """nvml.h's nvmlGpuFabricInfo_t (v1): uuid[16], nvmlReturn_t status, cliqueId, unsigned char state."""

    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
    ]


def read_fabric(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetGpuFabricInfo: NVSwitch fabric state and status (nvidia-smi -q Fabric).

    GPUs outside an NVSwitch fabric say NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: omitted.
    On an NVSwitch system CUDA cannot start until the state is completed with success
    (nvidia-fabricmanager, or the NVLink switch's fabric manager, registers the GPU).
    """
    info = GpuFabricInfoV1()  # not the binding's struct: its layout differs between nvidia-ml-py versions
    ctx.nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
    state = int(info.state)
    if state not in FABRIC_STATES:
        raise Unsupported
    out["fabric_state"] = FABRIC_STATES[state]
    out["fabric_status_ok"] = int(info.status) == NVML_SUCCESS


READERS = (
    ReaderSpec("persistence_mode", Tier.SLOW, read_persistence_mode, MODES_SECONDS),
    ReaderSpec("mig_mode", Tier.SLOW, read_mig_mode, MODES_SECONDS),
    ReaderSpec("compute_mode", Tier.SLOW, read_compute_mode, MODES_SECONDS),
    ReaderSpec("recovery_action", Tier.SLOW, read_recovery_action),
    ReaderSpec("fabric", Tier.SLOW, read_fabric, FABRIC_SECONDS),
)
