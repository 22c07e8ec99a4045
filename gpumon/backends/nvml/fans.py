"""Fan speeds."""

from __future__ import annotations

from typing import Any

from gpumon.backends.nvml.codes import Unsupported
from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec, gather
from gpumon.model.snapshot import Tier


def read_fans(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetNumFans, then nvmlDeviceGetFanSpeed_v2 per fan: fan.speed % -> 0-1."""
    nv = ctx.nv
    if g.fan_count is None:
        g.fan_count = int(nv.nvmlDeviceGetNumFans(h))
    if g.fan_count <= 0:
        raise Unsupported
    fn = nv.nvmlDeviceGetFanSpeed_v2
    calls = ((str(fan), f"fan.{fan}", fn, (h, fan)) for fan in range(g.fan_count))
    out["fan_speed_ratios"] = gather(g, calls, lambda percent: percent / 100.0)


READERS = (ReaderSpec("fans", Tier.FAST, read_fans),)
