"""Plain data for GPU events."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class XidEvent:
    """One XID error, from NVML's event thread or from the kernel log.

    ``gpu_index`` is None when only the PCI bus id is known (kernel log lines) and
    the GPU could not be matched; ``pci_bus_id`` is in NVML's form 00000000:BB:DD.F.
    """

    xid: int
    timestamp_seconds: float
    """Unix time the event happened (or was seen, when the source gives no time)."""
    source: str
    """``nvml`` (event thread) or ``kernel_log`` (journal / /dev/kmsg backfill)."""
    gpu_index: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    message: str | None = None
    """The kernel log line or NVML event data, for annotations."""
