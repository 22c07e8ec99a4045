"""Identity: name, PCI bus id, serial, VBIOS, compute capability, minor number."""

from __future__ import annotations

from typing import Any

from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec, opt, text
from gpumon.snapshot import Tier


def read_identity(ctx: Context, g: GpuState, h: Any) -> dict[str, Any]:
    """name, pci.bus_id (00000000:BB:DD.F), serial, vbios_version, compute_cap, minor number."""
    nv = ctx.nv
    out: dict[str, Any] = {"name": text(nv.nvmlDeviceGetName(h))}
    pci = opt(g, "identity.pci", nv.nvmlDeviceGetPciInfo, h)
    if pci is not None:
        g.pci_bus_id = text(pci.busId)
        out["pci_bus_id"] = g.pci_bus_id
    serial = opt(g, "identity.serial", nv.nvmlDeviceGetSerial, h)
    if serial:
        out["serial"] = text(serial)
    vbios = opt(g, "identity.vbios", nv.nvmlDeviceGetVbiosVersion, h)
    if vbios:
        out["vbios_version"] = text(vbios)
    cc = opt(g, "identity.cc", nv.nvmlDeviceGetCudaComputeCapability, h)
    if cc is not None:
        out["compute_capability"] = f"{int(cc[0])}.{int(cc[1])}"
    minor = opt(g, "identity.minor", nv.nvmlDeviceGetMinorNumber, h)
    if minor is not None:
        out["minor_number"] = int(minor)
    return out


READERS = (ReaderSpec("identity", Tier.STATIC, read_identity),)
