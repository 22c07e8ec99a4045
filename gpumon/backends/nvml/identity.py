"""Identity: name, PCI bus id, serial, VBIOS, compute capability, minor number."""

from __future__ import annotations

from typing import Any

from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec, opt, text
from gpumon.model.snapshot import Tier


def read_identity(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """name, pci.bus_id (00000000:BB:DD.F), serial, vbios_version, compute_cap, minor number."""
    nv = ctx.nv
    fields: dict[str, Any] = {"name": text(nv.nvmlDeviceGetName(h))}  # written into out after the last call
    pci = opt(g, "identity.pci", nv.nvmlDeviceGetPciInfo, h)
    if pci is not None:
        g.pci_bus_id = text(pci.busId)
        fields["pci_bus_id"] = g.pci_bus_id
    serial = opt(g, "identity.serial", nv.nvmlDeviceGetSerial, h)
    if serial:
        fields["serial"] = text(serial)
    vbios = opt(g, "identity.vbios", nv.nvmlDeviceGetVbiosVersion, h)
    if vbios:
        fields["vbios_version"] = text(vbios)
    cc = opt(g, "identity.cc", nv.nvmlDeviceGetCudaComputeCapability, h)
    if cc is not None:
        fields["compute_capability"] = f"{int(cc[0])}.{int(cc[1])}"
    minor = opt(g, "identity.minor", nv.nvmlDeviceGetMinorNumber, h)
    if minor is not None:
        fields["minor_number"] = int(minor)
    out.update(fields)


READERS = (ReaderSpec("identity", Tier.STATIC, read_identity),)
