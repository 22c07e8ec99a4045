"""NVSwitch fabric state (nvidia-smi -q Fabric)."""

from __future__ import annotations

import ctypes
from typing import Any

from gpumon.backends.nvml.codes import NVML_SUCCESS, Unsupported
from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec
from gpumon.model.fields.modes import FABRIC_SECONDS
from gpumon.model.snapshot import Tier

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


READERS = (ReaderSpec("fabric", Tier.SLOW, read_fabric, FABRIC_SECONDS),)
