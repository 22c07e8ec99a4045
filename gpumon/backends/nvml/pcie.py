"""PCIe: link generation and width (current and max), replays, bytes moved, throughput."""

from __future__ import annotations

from typing import Any

from gpumon.backends.nvml.codes import Unsupported
from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec, field_values, gather
from gpumon.model.fields.pcie import PCIE_SECONDS
from gpumon.model.snapshot import Tier

PCIE_UTIL = {"tx": 0, "rx": 1}  # NVML_PCIE_UTIL_TX_BYTES / _RX_BYTES
PCIE_COUNT_FIELDS = {"tx": ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197), "rx": ("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198)}


def read_pcie_link(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetCurrPcieLinkGeneration / Width: pcie.link.gen.current, pcie.link.width.current."""
    nv = ctx.nv
    calls = (
        ("pcie_link_generation", "pcie.gen", nv.nvmlDeviceGetCurrPcieLinkGeneration, (h,)),
        ("pcie_link_width", "pcie.width", nv.nvmlDeviceGetCurrPcieLinkWidth, (h,)),
    )
    out.update(gather(g, calls, int))


def read_pcie_max(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetMaxPcieLinkGeneration / Width: pcie.link.gen.max, pcie.link.width.max."""
    nv = ctx.nv
    calls = (
        ("pcie_link_generation_max", "pcie.gen_max", nv.nvmlDeviceGetMaxPcieLinkGeneration, (h,)),
        ("pcie_link_width_max", "pcie.width_max", nv.nvmlDeviceGetMaxPcieLinkWidth, (h,)),
    )
    out.update(gather(g, calls, int))


def read_pcie_replays(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetPcieReplayCounter (nvidia-smi -q: Replays Since Reset)."""
    out["pcie_replays_total"] = int(ctx.nv.nvmlDeviceGetPcieReplayCounter(h))


def read_pcie_bytes(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetFieldValues(NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES): bytes moved over PCIe since
    the driver loaded, one call for both (no nvidia-smi query field; DCGM_FI_PROF_PCIE_*_BYTES is a rate).
    From the second read on, also the PCIe throughput: the counters' rate since the last read (no
    call of its own; a counter that went back, a driver reload, gives no rate that read)."""
    nv = ctx.nv
    ids = {direction: int(getattr(nv, const, default)) for direction, (const, default) in PCIE_COUNT_FIELDS.items()}
    got = field_values(nv, h, ids.values())
    moved = {direction: int(n) for direction, n in zip(ids, got, strict=True) if n is not None}
    if not moved:
        raise Unsupported
    out["pcie_bytes_total"] = moved
    now = ctx.clock()
    last, g.pcie_bytes_last = g.pcie_bytes_last, (now, moved)
    if last is None or now <= last[0]:
        return
    seconds, before = now - last[0], last[1]
    rates = {
        direction: (count - before[direction]) / seconds
        for direction, count in moved.items()
        if direction in before and count >= before[direction]
    }
    if rates:
        out["pcie_throughput_bytes_per_second"] = rates


def read_pcie_throughput(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """Where the driver lacks the PCIe byte counters only: nvmlDeviceGetPcieThroughput tx/rx, KB/s
    over a ~20 ms sample -> bytes/s (the call blocks ~21-42 ms, ~2 ms of it CPU on an H100). With the
    counters (``read_pcie_bytes`` runs first) this reader is unsupported: they give the throughput."""
    if "pcie_bytes" not in g.unsupported:
        raise Unsupported
    fn = ctx.nv.nvmlDeviceGetPcieThroughput
    calls = ((direction, f"pcie_throughput.{direction}", fn, (h, counter)) for direction, counter in PCIE_UTIL.items())
    out["pcie_throughput_bytes_per_second"] = gather(g, calls, lambda kb: float(kb) * 1024.0)


# PCIe link state (~14 µs a call on H200 in a tight loop, 0.1-0.6 ms a call on H100 at the daemon's
# cadence) measured too costly for every second, and for every slow read: at most every PCIE_SECONDS.
READERS = (
    ReaderSpec("pcie_link", Tier.SLOW, read_pcie_link, PCIE_SECONDS),
    ReaderSpec("pcie_replays", Tier.SLOW, read_pcie_replays, PCIE_SECONDS),
    ReaderSpec("pcie_bytes", Tier.SLOW, read_pcie_bytes, PCIE_SECONDS),
    ReaderSpec("pcie_throughput", Tier.SLOW, read_pcie_throughput, PCIE_SECONDS),
    ReaderSpec("pcie_max", Tier.STATIC, read_pcie_max),
)
