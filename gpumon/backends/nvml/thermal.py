"""Temperatures (GPU, memory) and the temperature thresholds."""

from __future__ import annotations

from typing import Any

from gpumon.backends.nvml.codes import Unsupported
from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec, field_value_of, gather
from gpumon.model.snapshot import Tier

TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
FI_DEV_MEMORY_TEMP = 82  # NVML_FI_DEV_MEMORY_TEMP
THRESHOLDS = {  # NVML_TEMPERATURE_THRESHOLD_*
    "temperature_shutdown_threshold_celsius": 0,
    "temperature_slowdown_threshold_celsius": 1,
    "memory_temperature_max_operating_celsius": 2,
    "temperature_max_operating_celsius": 3,
}


def read_temperature(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetTemperature(GPU): temperature.gpu, °C."""
    out["temperature_celsius"] = float(ctx.nv.nvmlDeviceGetTemperature(h, TEMPERATURE_GPU))


def read_memory_temperature(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP): temperature.memory, °C; 0 means absent."""
    celsius = field_value_of(ctx.nv, h, ctx.memory_temp_field)
    if celsius is None:
        raise Unsupported
    if celsius:
        out["memory_temperature_celsius"] = float(celsius)


def read_thresholds(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetTemperatureThreshold: slowdown, shutdown, GPU max, memory max, °C (0 = not reported)."""
    fn = ctx.nv.nvmlDeviceGetTemperatureThreshold
    calls = ((name, f"threshold.{name}", fn, (h, threshold)) for name, threshold in THRESHOLDS.items())
    out.update(gather(g, calls, float, zero_is_absent=True))


READERS = (
    ReaderSpec("temperature", Tier.FAST, read_temperature),
    ReaderSpec("memory_temperature", Tier.FAST, read_memory_temperature),
    ReaderSpec("thresholds", Tier.STATIC, read_thresholds),
)
