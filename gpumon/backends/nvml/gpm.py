"""GPM profiling metrics (Hopper+), through gpumon.backends.gpm.GpmSampler."""

from __future__ import annotations

from typing import Any

from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec
from gpumon.model.fields.gpm import GPM_SECONDS
from gpumon.model.snapshot import Tier


def read_gpm(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """NVML GPM (Hopper+): SM/tensor/DRAM/FP activity and NVLink/PCIe throughput."""
    out.update(ctx.gpm.read(g.index, h))


# GPM (~64 µs a sample + metrics on H200, ~2 ms of CPU a read on an H100) measured too costly for
# every second: the daemon samples every GPM_SECONDS, the metrics are averages over it
# (dcgm-exporter's default collection interval is 30 s).
READERS = (ReaderSpec("gpm", Tier.SLOW, read_gpm, GPM_SECONDS),)
