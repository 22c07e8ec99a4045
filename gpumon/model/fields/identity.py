"""Which GPU: index, UUID, liveness and identity (static tier; shown on ``gpumon_gpu_info``)."""

from __future__ import annotations

from dataclasses import dataclass

from gpumon.model.fields.spec import Tier, declare


@dataclass(frozen=True)
class GpuKey:
    """The GPU a snapshot is of, and whether it answers."""

    index: int
    uuid: str
    up: bool = True
    """False when the GPU is lost (GPU_IS_LOST, UNKNOWN, RESET_REQUIRED); then only identity is kept."""
    lost_reason: str | None = None


@dataclass(frozen=True)
class IdentityFields:
    """Identity of the board; gpumon_gpu_info carries them as labels (built by the collector)."""

    name: str | None = declare(
        Tier.STATIC, "Product name (name)", nvml="nvmlDeviceGetName", smi="name", fake="NVIDIA H200"
    )
    pci_bus_id: str | None = declare(
        Tier.STATIC,
        "PCI bus id, 0000:BB:DD.F (pci.bus_id)",
        nvml="nvmlDeviceGetPciInfo().busId",
        conversion="NVML form `00000000:BB:DD.F`",
        smi="pci.bus_id",
    )
    serial: str | None = declare(Tier.STATIC, "Board serial number (serial)", nvml="nvmlDeviceGetSerial", smi="serial")
    vbios_version: str | None = declare(
        Tier.STATIC,
        "VBIOS version (vbios_version)",
        nvml="nvmlDeviceGetVbiosVersion",
        smi="vbios_version",
        fake="96.00.AF.00.01",
    )
    compute_capability: str | None = declare(
        Tier.STATIC,
        "CUDA compute capability, e.g. 9.0 (compute_cap)",
        nvml="nvmlDeviceGetCudaComputeCapability",
        conversion='(9, 0) → `"9.0"`',
        smi="compute_cap",
        fake="9.0",
    )
    minor_number: int | None = declare(
        Tier.STATIC, "/dev/nvidiaN minor number", nvml="nvmlDeviceGetMinorNumber", smi="-q Minor Number"
    )
