"""Profiling from NVML GPM (Hopper and newer): averages between two samples one slow interval apart."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpumon.model.fields.spec import Dcgm, Metric, Tier, declare, declare_mapping

if TYPE_CHECKING:
    from gpumon.model.snapshot import GpuSnapshot


def _gpm(metric: str) -> str:
    return f"GPM {metric}: nvmlGpmMetricsGet over the nvmlGpmSampleGet samples of the previous and this slow read"


_RATIO = "% / 100; from the 2nd read"
_SMI = "— (DCGM_FI_PROF_*)"
_UNIT = "ratio 0–1"
GPM_SECONDS = 30.0
"""The daemon (``gpumon run``) takes a GPM sample at most this often (~2 ms of CPU per GPU and read
on an H100): the profiling metrics are averages over it, dcgm-exporter's default interval."""


def _gpm_key(key: str) -> tuple[str, ...]:
    link, _, direction = key.partition("_")
    return (link, direction)


def _nvlink_total_mb(gpu: GpuSnapshot) -> float | None:
    """NVLink bytes/s both ways from GPM, in MB/s: what DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL shows on Hopper."""
    gpm = gpu.gpm_throughput_bytes_per_second
    if gpm is None or ("nvlink_tx" not in gpm and "nvlink_rx" not in gpm):
        return None
    return (gpm.get("nvlink_tx", 0.0) + gpm.get("nvlink_rx", 0.0)) / 1e6


def _pcie_rate(gpm_key: str, direction: str) -> Callable[[GpuSnapshot], float | None]:
    """GPM's PCIe rate where the GPU has it, else NVML's sampled PCIe throughput; bytes/s."""

    def value(gpu: GpuSnapshot) -> float | None:
        gpm, sampled = gpu.gpm_throughput_bytes_per_second, gpu.pcie_throughput_bytes_per_second
        v = None if gpm is None else gpm.get(gpm_key)
        if v is None:
            v = None if sampled is None else sampled.get(direction)
        return None if v is None else float(v)

    return value


@dataclass(frozen=True)
class GpmFields:
    sm_active_ratio: float | None = declare(
        Tier.SLOW,
        "SM active share 0-1 (GPM SM_UTIL; DCGM_FI_PROF_SM_ACTIVE)",
        nvml=_gpm("SM_UTIL"),
        conversion=_RATIO,
        smi=_SMI,
        metric=Metric(
            "gpumon_sm_active_ratio",
            "gauge",
            "Share of time at least one warp was resident on an SM, 0-1 (NVML GPM; DCGM_FI_PROF_SM_ACTIVE).",
            read_every_seconds=GPM_SECONDS,
        ),
        dcgm=Dcgm(
            "DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned.", unit=_UNIT
        ),
    )
    sm_occupancy_ratio: float | None = declare(
        Tier.SLOW,
        "SM occupancy 0-1 (GPM SM_OCCUPANCY; DCGM_FI_PROF_SM_OCCUPANCY)",
        nvml=_gpm("SM_OCCUPANCY"),
        conversion=_RATIO,
        smi=_SMI,
        metric=Metric(
            "gpumon_sm_occupancy_ratio",
            "gauge",
            "Resident warps over the SM maximum, 0-1 (NVML GPM; DCGM_FI_PROF_SM_OCCUPANCY).",
            detail="profiling",
            read_every_seconds=GPM_SECONDS,
        ),
        dcgm=Dcgm("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM.", unit=_UNIT),
    )
    tensor_active_ratio: float | None = declare(
        Tier.SLOW,
        "Tensor pipe active share 0-1 (GPM ANY_TENSOR_UTIL; DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)",
        nvml=_gpm("ANY_TENSOR_UTIL"),
        conversion=_RATIO,
        smi=_SMI,
        metric=Metric(
            "gpumon_tensor_active_ratio",
            "gauge",
            "Share of cycles the tensor pipes were active, 0-1 (NVML GPM; DCGM_FI_PROF_PIPE_TENSOR_ACTIVE).",
            read_every_seconds=GPM_SECONDS,
        ),
        dcgm=Dcgm(
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.", unit=_UNIT
        ),
    )
    dram_active_ratio: float | None = declare(
        Tier.SLOW,
        "DRAM bandwidth share 0-1 (GPM DRAM_BW_UTIL; DCGM_FI_PROF_DRAM_ACTIVE)",
        nvml=_gpm("DRAM_BW_UTIL"),
        conversion=_RATIO,
        smi=_SMI,
        metric=Metric(
            "gpumon_dram_active_ratio",
            "gauge",
            "Share of cycles device memory was transferring data, 0-1 (NVML GPM; DCGM_FI_PROF_DRAM_ACTIVE).",
            read_every_seconds=GPM_SECONDS,
        ),
        dcgm=Dcgm(
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "gauge",
            "Ratio of cycles the device memory interface is active sending or receiving data.",
            unit=_UNIT,
        ),
    )
    fp64_active_ratio: float | None = declare(
        Tier.SLOW,
        "FP64 pipe active 0-1 (GPM FP64_UTIL; DCGM_FI_PROF_PIPE_FP64_ACTIVE)",
        nvml=_gpm("FP64_UTIL"),
        conversion=_RATIO,
        smi=_SMI,
        metric=Metric(
            "gpumon_fp64_active_ratio",
            "gauge",
            "Share of cycles the FP64 pipe was active, 0-1 (NVML GPM).",
            detail="profiling",
            read_every_seconds=GPM_SECONDS,
        ),
        dcgm=Dcgm("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active.", unit=_UNIT),
    )
    fp32_active_ratio: float | None = declare(
        Tier.SLOW,
        "FP32 pipe active 0-1 (GPM FP32_UTIL; DCGM_FI_PROF_PIPE_FP32_ACTIVE)",
        nvml=_gpm("FP32_UTIL"),
        conversion=_RATIO,
        smi=_SMI,
        metric=Metric(
            "gpumon_fp32_active_ratio",
            "gauge",
            "Share of cycles the FP32 pipe was active, 0-1 (NVML GPM).",
            detail="profiling",
            read_every_seconds=GPM_SECONDS,
        ),
        dcgm=Dcgm("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active.", unit=_UNIT),
    )
    fp16_active_ratio: float | None = declare(
        Tier.SLOW,
        "FP16 pipe active 0-1 (GPM FP16_UTIL; DCGM_FI_PROF_PIPE_FP16_ACTIVE)",
        nvml=_gpm("FP16_UTIL"),
        conversion=_RATIO,
        smi=_SMI,
        metric=Metric(
            "gpumon_fp16_active_ratio",
            "gauge",
            "Share of cycles the FP16 pipe was active, 0-1 (NVML GPM).",
            detail="profiling",
            read_every_seconds=GPM_SECONDS,
        ),
        dcgm=Dcgm("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active.", unit=_UNIT),
    )
    gpm_throughput_bytes_per_second: Mapping[str, float] | None = declare_mapping(
        Tier.SLOW,
        "NVLink/PCIe throughput from GPM keyed nvlink_tx|nvlink_rx|pcie_tx|pcie_rx, bytes/s",
        nvml=_gpm("NVLINK_TOTAL_TX/RX_PER_SEC, PCIE_TX/RX_PER_SEC"),
        conversion="MiB/s × 2²⁰; from the 2nd read",
        metric=Metric(
            "gpumon_gpm_throughput_bytes_per_second",
            "gauge",
            "Throughput by link nvlink|pcie and direction tx|rx from NVML GPM, bytes per second.",
            labels=("link", "direction"),
            keys=_gpm_key,
            detail="profiling",
            read_every_seconds=GPM_SECONDS,
        ),
        dcgm=(
            Dcgm(
                "DCGM_FI_PROF_PCIE_TX_BYTES",
                "gauge",
                "The rate of data transmitted over the PCIe bus, headers and payload, in bytes per second.",
                unit="bytes/s",
                value=_pcie_rate("pcie_tx", "tx"),
                source="gpm_throughput_bytes_per_second[pcie_tx], else pcie_throughput_bytes_per_second[tx]",
            ),
            Dcgm(
                "DCGM_FI_PROF_PCIE_RX_BYTES",
                "gauge",
                "The rate of data received over the PCIe bus, headers and payload, in bytes per second.",
                unit="bytes/s",
                value=_pcie_rate("pcie_rx", "rx"),
                source="gpm_throughput_bytes_per_second[pcie_rx], else pcie_throughput_bytes_per_second[rx]",
            ),
            Dcgm(
                "DCGM_FI_PROF_NVLINK_TX_BYTES",
                "gauge",
                "The rate of data transmitted over NVLink, in bytes per second.",
                unit="bytes/s",
                key="nvlink_tx",
            ),
            Dcgm(
                "DCGM_FI_PROF_NVLINK_RX_BYTES",
                "gauge",
                "The rate of data received over NVLink, in bytes per second.",
                unit="bytes/s",
                key="nvlink_rx",
            ),
            Dcgm(
                "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                "untyped",
                "NVLink bandwidth over all links, both directions (in MB/s).",
                unit="MB/s",
                value=_nvlink_total_mb,
                source="gpm_throughput_bytes_per_second[nvlink_tx + nvlink_rx] / 10⁶",
            ),
        ),
    )
    graphics_active_ratio: float | None = declare(
        Tier.SLOW,
        "Graphics or compute engine active share 0-1 (GPM GRAPHICS_UTIL; DCGM_FI_PROF_GR_ENGINE_ACTIVE)",
        nvml=_gpm("GRAPHICS_UTIL"),
        conversion=_RATIO,
        smi=_SMI,
        metric=Metric(
            "gpumon_graphics_active_ratio",
            "gauge",
            "Share of time the graphics or compute engine was active, 0-1 (NVML GPM; DCGM_FI_PROF_GR_ENGINE_ACTIVE).",
            read_every_seconds=GPM_SECONDS,
        ),
        dcgm=Dcgm(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "gauge",
            "Ratio of time the graphics engine is active.",
            unit=_UNIT,
        ),
    )
