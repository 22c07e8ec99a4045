"""How busy the GPU is and how much framebuffer it uses (fast tier)."""

from __future__ import annotations

from dataclasses import dataclass

from gpumon.model.fields.spec import Dcgm, Metric, Tier, declare, nonzero

MIB = 1024 * 1024
_MEMORY_INFO = "nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2); v1 fallback (no reserved)"


@dataclass(frozen=True)
class UsageFields:
    utilization_ratio: float | None = declare(
        Tier.FAST,
        "GPU busy share 0-1 (utilization.gpu / 100)",
        nvml="nvmlDeviceGetUtilizationRates",
        conversion="% / 100",
        smi="utilization.gpu",
        metric=Metric(
            "gpumon_gpu_utilization_ratio",
            "gauge",
            "Share of time a kernel ran on the GPU, 0-1 (nvidia-smi utilization.gpu / 100).",
        ),
        dcgm=Dcgm("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", unit="%", scale=100),
        fake=0.0,
    )
    memory_bandwidth_utilization_ratio: float | None = declare(
        Tier.FAST,
        "Memory controller busy share 0-1 (utilization.memory / 100)",
        nvml="nvmlDeviceGetUtilizationRates",
        conversion="% / 100",
        smi="utilization.memory",
        metric=Metric(
            "gpumon_memory_bandwidth_utilization_ratio",
            "gauge",
            "Share of time device memory was read or written, 0-1 (nvidia-smi utilization.memory / 100).",
        ),
        dcgm=Dcgm("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", unit="%", scale=100),
        fake=0.0,
    )
    memory_used_bytes: int | None = declare(
        Tier.FAST,
        "Framebuffer used, bytes (memory.used MiB × 2^20)",
        nvml=_MEMORY_INFO,
        conversion="bytes",
        smi="memory.used",
        metric=Metric("gpumon_memory_used_bytes", "gauge", "Framebuffer memory used, bytes (nvidia-smi memory.used)."),
        dcgm=Dcgm("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", unit="MiB", whole_mib=True),
        fake=0,
    )
    memory_free_bytes: int | None = declare(
        Tier.FAST,
        "Framebuffer free, bytes (memory.free)",
        nvml=_MEMORY_INFO,
        conversion="bytes",
        smi="memory.free",
        metric=Metric("gpumon_memory_free_bytes", "gauge", "Framebuffer memory free, bytes (nvidia-smi memory.free)."),
        dcgm=Dcgm("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", unit="MiB", whole_mib=True),
        fake=(143771 - 550) * MIB,
    )
    memory_total_bytes: int | None = declare(
        Tier.FAST,
        "Framebuffer total, bytes (memory.total)",
        nvml=_MEMORY_INFO,
        conversion="bytes",
        smi="memory.total",
        metric=Metric(
            "gpumon_memory_total_bytes", "gauge", "Framebuffer memory total, bytes (nvidia-smi memory.total)."
        ),
        dcgm=Dcgm("DCGM_FI_DEV_FB_TOTAL", "gauge", "Framebuffer memory total (in MiB).", unit="MiB", whole_mib=True),
        fake=143771 * MIB,
    )
    memory_reserved_bytes: int | None = declare(
        Tier.FAST,
        "Framebuffer reserved by the driver, bytes (memory.reserved)",
        nvml=_MEMORY_INFO,
        conversion="bytes",
        smi="memory.reserved",
        metric=Metric(
            "gpumon_memory_reserved_bytes",
            "gauge",
            "Framebuffer memory reserved by the driver, bytes (nvidia-smi memory.reserved).",
            detail="limits",
        ),
        dcgm=Dcgm(
            "DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", unit="MiB", whole_mib=True
        ),
        fake=550 * MIB,
    )
    encoder_utilization_ratio: float | None = declare(
        Tier.FAST,
        "Video encoder busy share 0-1 (utilization.encoder / 100)",
        nvml="nvmlDeviceGetEncoderUtilization",
        conversion="% / 100",
        smi="utilization.encoder",
        metric=Metric(
            "gpumon_encoder_utilization_ratio",
            "gauge",
            "Share of time the video encoder was busy, 0-1 (nvidia-smi utilization.encoder / 100).",
            detail="zero_rows",
            keep=nonzero,
        ),
        dcgm=Dcgm("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", unit="%", scale=100),
        fake=0.0,
    )
    decoder_utilization_ratio: float | None = declare(
        Tier.FAST,
        "Video decoder busy share 0-1 (utilization.decoder / 100)",
        nvml="nvmlDeviceGetDecoderUtilization",
        conversion="% / 100",
        smi="utilization.decoder",
        metric=Metric(
            "gpumon_decoder_utilization_ratio",
            "gauge",
            "Share of time the video decoder was busy, 0-1 (nvidia-smi utilization.decoder / 100).",
            detail="zero_rows",
            keep=nonzero,
        ),
        dcgm=Dcgm("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", unit="%", scale=100),
        fake=0.0,
    )
