"""Temperatures (fast tier) and the thresholds the GPU acts on (static tier)."""

from __future__ import annotations

from dataclasses import dataclass

from gpumon.model.fields.spec import Dcgm, Metric, MetricPart, Sample, Tier, declare

_THRESHOLD = "nvmlDeviceGetTemperatureThreshold"
_THRESHOLDS = "gpumon_temperature_threshold_celsius"


def _slowdown(sample: Sample) -> bool:
    """Without the ``limits`` opt-in, the slowdown threshold alone (the alerts' and dashboards' margin)."""
    return sample[0] == ("slowdown",)


@dataclass(frozen=True)
class ThermalFields:
    temperature_celsius: float | None = declare(
        Tier.FAST,
        "GPU core temperature, °C (temperature.gpu)",
        nvml="nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)",
        conversion="°C",
        smi="temperature.gpu",
        metric=Metric(
            "gpumon_temperature_celsius",
            "gauge",
            "Temperature by sensor gpu|memory, degrees Celsius (nvidia-smi temperature.gpu, temperature.memory).",
            labels=("sensor",),
            label="gpu",
        ),
        dcgm=Dcgm("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", unit="C"),
        fake=30.0,
    )
    memory_temperature_celsius: float | None = declare(
        Tier.FAST,
        "HBM temperature, °C (temperature.memory)",
        nvml="nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)",
        conversion="°C; 0 = absent",
        smi="temperature.memory",
        metric=MetricPart("gpumon_temperature_celsius", "memory"),
        dcgm=Dcgm("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", unit="C"),
        fake=36.0,
    )
    temperature_slowdown_threshold_celsius: float | None = declare(
        Tier.STATIC,
        "Temperature at which the GPU slows down, °C (nvidia-smi -q: GPU Slowdown Temp)",
        nvml=f"{_THRESHOLD}(SLOWDOWN)",
        conversion="°C; 0 = absent",
        smi="-q GPU Slowdown Temp",
        metric=Metric(
            _THRESHOLDS,
            "gauge",
            "Temperature thresholds by kind slowdown|shutdown|gpu_max|memory_max, degrees Celsius"
            " (nvidia-smi -q Temperature).",
            labels=("kind",),
            label="slowdown",
            detail="limits",
            keep=_slowdown,
        ),
        dcgm=Dcgm("DCGM_FI_DEV_SLOWDOWN_TEMP", "gauge", "Slowdown temperature (in C).", unit="C"),
        fake=90.0,
    )
    temperature_shutdown_threshold_celsius: float | None = declare(
        Tier.STATIC,
        "Temperature at which the GPU shuts down, °C (GPU Shutdown Temp)",
        nvml=f"{_THRESHOLD}(SHUTDOWN)",
        conversion="°C; 0 = absent",
        smi="-q GPU Shutdown Temp",
        metric=MetricPart(_THRESHOLDS, "shutdown"),
        dcgm=Dcgm("DCGM_FI_DEV_SHUTDOWN_TEMP", "gauge", "Shutdown temperature (in C).", unit="C"),
        fake=95.0,
    )
    temperature_max_operating_celsius: float | None = declare(
        Tier.STATIC,
        "Maximum operating temperature of the GPU, °C (GPU Max Operating Temp)",
        nvml=f"{_THRESHOLD}(GPU_MAX)",
        conversion="°C; 0 = absent",
        smi="-q GPU Max Operating Temp",
        metric=MetricPart(_THRESHOLDS, "gpu_max"),
        dcgm=Dcgm("DCGM_FI_DEV_GPU_MAX_OP_TEMP", "gauge", "Maximum operating temperature of the GPU (in C).", unit="C"),
        fake=87.0,
    )
    memory_temperature_max_operating_celsius: float | None = declare(
        Tier.STATIC,
        "Maximum operating temperature of the memory, °C (Memory Max Operating Temp)",
        nvml=f"{_THRESHOLD}(MEM_MAX)",
        conversion="°C; 0 = absent",
        smi="-q Memory Max Operating Temp",
        metric=MetricPart(_THRESHOLDS, "memory_max"),
        dcgm=Dcgm(
            "DCGM_FI_DEV_MEM_MAX_OP_TEMP", "gauge", "Maximum operating temperature of the memory (in C).", unit="C"
        ),
        fake=95.0,
    )
