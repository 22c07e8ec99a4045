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
    kernel_usec: int | None = None
    """The kernel's own time of the record, µs since boot (kernel-log events only). With the boot id and
    the code it names the XID whatever source read it and whenever: a re-read of the log after a restart
    gives the same value, unlike ``timestamp_seconds`` (read time live, boot time + this at start)."""
    kernel_seq: int | None = None
    """The record's /dev/kmsg sequence number, where the source gives one (the journal does not)."""

    def identity(self, boot_id: str | None) -> str:
        """What names this XID across sources and restarts: the kernel's record (boot id, kernel time,
        bus, code) where known; else GPU, code and time to the microsecond (NVML events and the fake
        backend's, which are never read twice: two processes' own events stay two)."""
        if self.kernel_usec is not None:
            where = self.pci_bus_id if self.pci_bus_id is not None else self.gpu_index
            return f"k:{boot_id or '-'}:{self.kernel_usec}:{where}:{self.xid}"
        return f"{self.gpu_index}:{self.xid}:{self.timestamp_seconds:.6f}"
