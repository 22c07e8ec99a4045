"""The PCIe link: generation and width (current slow, max static), replays and traffic (slow)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpumon.model.fields.spec import Dcgm, Metric, MetricPart, Tier, declare, declare_mapping

PCIE_SECONDS = 30.0
"""The daemon (``gpumon run``) reads the PCIe link's generation and width, the replay counter and
the byte counters at most this often (dcgm-exporter's interval for every field): each call costs
0.1-0.6 ms of CPU per GPU on an H100, 0.012 % of a core per GPU together at every 10 s on
4 x H100 (docs/benchmarks.md). The counters are cumulative, none is lost; the throughput is their
rate over the interval. One-shot readers (once, health, burn) read them every time."""


@dataclass(frozen=True)
class PcieFields:
    pcie_link_generation: int | None = declare(
        Tier.SLOW,
        "Current PCIe generation (pcie.link.gen.current)",
        nvml="nvmlDeviceGetCurrPcieLinkGeneration",
        smi="pcie.link.gen.current",
        metric=Metric(
            "gpumon_pcie_link_generation",
            "gauge",
            "PCIe link generation, state current|max (nvidia-smi pcie.link.gen.current / .max).",
            labels=("state",),
            label="current",
            read_every_seconds=PCIE_SECONDS,
        ),
        dcgm=Dcgm("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe link generation."),
        fake=5,
    )
    pcie_link_generation_max: int | None = declare(
        Tier.STATIC,
        "Max PCIe generation of GPU and system (pcie.link.gen.max)",
        nvml="nvmlDeviceGetMaxPcieLinkGeneration",
        smi="pcie.link.gen.max",
        metric=MetricPart("gpumon_pcie_link_generation", "max"),
        fake=5,
    )
    pcie_link_width: int | None = declare(
        Tier.SLOW,
        "Current PCIe lanes (pcie.link.width.current)",
        nvml="nvmlDeviceGetCurrPcieLinkWidth",
        smi="pcie.link.width.current",
        metric=Metric(
            "gpumon_pcie_link_width",
            "gauge",
            "PCIe link width in lanes, state current|max (nvidia-smi pcie.link.width.current / .max).",
            labels=("state",),
            label="current",
            read_every_seconds=PCIE_SECONDS,
        ),
        dcgm=Dcgm("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe link width (lanes)."),
        fake=16,
    )
    pcie_link_width_max: int | None = declare(
        Tier.STATIC,
        "Max PCIe lanes (pcie.link.width.max)",
        nvml="nvmlDeviceGetMaxPcieLinkWidth",
        smi="pcie.link.width.max",
        metric=MetricPart("gpumon_pcie_link_width", "max"),
        fake=16,
    )
    pcie_replays_total: int | None = declare(
        Tier.SLOW,
        "PCIe replay counter (nvidia-smi -q: Replays Since Reset)",
        nvml="nvmlDeviceGetPcieReplayCounter",
        smi="-q Replays Since Reset",
        metric=Metric(
            "gpumon_pcie_replays_total",
            "counter",
            "PCIe replays since the driver was loaded (nvidia-smi -q Replays Since Reset).",
            read_every_seconds=PCIE_SECONDS,
        ),
        dcgm=Dcgm("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "untyped", "Total number of PCIe retries."),
        fake=0,
    )
    pcie_bytes_total: Mapping[str, int] | None = declare_mapping(
        Tier.SLOW,
        "Bytes moved over PCIe since the driver loaded, by direction tx|rx (NVML_FI_DEV_PCIE_COUNT_*_BYTES)",
        nvml="nvmlDeviceGetFieldValues(`NVML_FI_DEV_PCIE_COUNT_TX_BYTES`, `_RX_BYTES`), one call",
        smi="— (none; `dmon -s t` shows a rate)",
        metric=Metric(
            "gpumon_pcie_bytes_total",
            "counter",
            "Bytes moved over PCIe since the driver was loaded, by direction tx|rx"
            " (NVML field values PCIE_COUNT_TX/RX_BYTES).",
            labels=("direction",),
            read_every_seconds=PCIE_SECONDS,
        ),
        fake={"tx": 123_456_789_012, "rx": 98_765_432_109},
    )
    pcie_throughput_bytes_per_second: Mapping[str, float] | None = declare_mapping(
        Tier.SLOW,
        "PCIe throughput by direction tx|rx since the last read of the byte counters, bytes/s (nvidia-smi dmon -s t)",
        nvml="the rate of pcie_bytes_total between its reads (no call); nvmlDeviceGetPcieThroughput"
        " (a ~20 ms sample, the call blocks ~21-42 ms) where the driver lacks the byte counters",
        conversion="Δbytes / Δs; KB/s × 1024",
        smi="dmon -s t",
        metric=Metric(
            "gpumon_pcie_throughput_bytes_per_second",
            "gauge",
            "PCIe throughput by direction tx|rx since the last read of the byte counters, bytes per second"
            " (the rate of gpumon_pcie_bytes_total).",
            labels=("direction",),
            read_every_seconds=PCIE_SECONDS,
            detail="profiling",
        ),
        dcgm=(
            Dcgm(
                "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
                "untyped",
                "PCIe TX throughput over a short NVML sample (in KB/s).",
                unit="KB/s",
                key="tx",
                scale=1 / 1024,
            ),
            Dcgm(
                "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
                "untyped",
                "PCIe RX throughput over a short NVML sample (in KB/s).",
                unit="KB/s",
                key="rx",
                scale=1 / 1024,
            ),
        ),
    )
