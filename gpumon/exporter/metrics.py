"""The metric table: one row per per-GPU metric, read from GpuSnapshot fields.

Adding a metric: add the GpuSnapshot field (gpumon/snapshot.py), read it in the
backend, add one row here, regenerate the golden file (``make golden``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpumon.snapshot import GpuSnapshot, Tier

Sample = tuple[tuple[str, ...], float]
"""Extra label values (in the order of ``MetricRow.labels``) and the value."""


@dataclass(frozen=True)
class MetricRow:
    """One per-GPU metric family; every sample also gets the ``gpu`` and ``uuid`` labels."""

    name: str
    """Full exposition name; counters end in ``_total``."""
    kind: str
    """``gauge`` or ``counter``."""
    help: str
    tier: Tier
    samples: Callable[[GpuSnapshot], Iterable[Sample]]
    labels: tuple[str, ...] = ()
    plain_labels: bool = True
    """Label values come from fixed vocabularies (no escaping needed when rendering)."""


def _num(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return float(value)
    return None


def scalar(field: str) -> Callable[[GpuSnapshot], Iterable[Sample]]:
    """A single sample from a scalar field; nothing when the field is None."""

    def samples(gpu: GpuSnapshot) -> Iterable[Sample]:
        value = _num(getattr(gpu, field))
        return [] if value is None else [((), value)]

    return samples


def by_label(fields: Mapping[str, str]) -> Callable[[GpuSnapshot], Iterable[Sample]]:
    """One sample per (label value -> scalar field) pair that is not None."""

    def samples(gpu: GpuSnapshot) -> Iterable[Sample]:
        out = []
        for label, field in fields.items():
            value = _num(getattr(gpu, field))
            if value is not None:
                out.append(((label,), value))
        return out

    return samples


def mapping(
    field: str, keys: Callable[[str], tuple[str, ...]] = lambda k: (k,)
) -> Callable[[GpuSnapshot], Iterable[Sample]]:
    """One sample per key of a mapping field; ``keys`` splits a key into label values."""

    def samples(gpu: GpuSnapshot) -> Iterable[Sample]:
        values: Mapping[str, object] | None = getattr(gpu, field)
        if not values:
            return []
        out = []
        for key in sorted(values, key=_natural):
            value = _num(values[key])
            if value is not None:
                out.append((keys(key), value))
        return out

    return samples


def _natural(key: str) -> tuple[int, str]:
    return (int(key), "") if key.isdigit() else (1 << 30, key)


def _pcie_state(current: str, maximum: str) -> Callable[[GpuSnapshot], Iterable[Sample]]:
    return by_label({"current": current, "max": maximum})


def _nvlink_errors(gpu: GpuSnapshot) -> Iterable[Sample]:
    if not gpu.nvlink_errors_total:
        return []
    return [
        ((link, kind), float(count))
        for link in sorted(gpu.nvlink_errors_total, key=_natural)
        for kind, count in sorted(gpu.nvlink_errors_total[link].items())
    ]


def _p2p(gpu: GpuSnapshot) -> Iterable[Sample]:
    if gpu.p2p_status is None:
        return []
    return [((str(p.peer_index), p.capability), 1.0 if p.ok else 0.0) for p in gpu.p2p_status]


def _topology(gpu: GpuSnapshot) -> Iterable[Sample]:
    if not gpu.topology_level:
        return []
    return [((peer, level), 1.0) for peer, level in sorted(gpu.topology_level.items(), key=lambda kv: _natural(kv[0]))]


def _process_count(gpu: GpuSnapshot) -> Iterable[Sample]:
    return [] if gpu.processes is None else [((), float(len(gpu.processes)))]


def _process_memory(gpu: GpuSnapshot) -> Iterable[Sample]:
    if gpu.processes is None:
        return []
    known = [p.used_memory_bytes for p in gpu.processes if p.used_memory_bytes is not None]
    return [((), float(sum(known)))]


def _ecc_key(key: str) -> tuple[str, ...]:
    kind, _, scope = key.partition("_")
    return (kind, scope)


def _gpm_key(key: str) -> tuple[str, ...]:
    link, _, direction = key.partition("_")
    return (link, direction)


def _compute_mode(gpu: GpuSnapshot) -> Iterable[Sample]:
    return [] if gpu.compute_mode is None else [((gpu.compute_mode,), 1.0)]


def _fabric_state(gpu: GpuSnapshot) -> Iterable[Sample]:
    return [] if gpu.fabric_state is None else [((gpu.fabric_state,), 1.0)]


def gpu_rows() -> tuple[MetricRow, ...]:
    """Every per-GPU metric except gpumon_gpu_info and gpumon_gpu_up (built by the collector)."""
    F, S, T = Tier.FAST, Tier.SLOW, Tier.STATIC
    return (
        MetricRow(
            "gpumon_gpu_utilization_ratio",
            "gauge",
            "Share of time a kernel ran on the GPU, 0-1 (nvidia-smi utilization.gpu / 100).",
            F,
            scalar("utilization_ratio"),
        ),
        MetricRow(
            "gpumon_memory_bandwidth_utilization_ratio",
            "gauge",
            "Share of time device memory was read or written, 0-1 (nvidia-smi utilization.memory / 100).",
            F,
            scalar("memory_bandwidth_utilization_ratio"),
        ),
        MetricRow(
            "gpumon_memory_used_bytes",
            "gauge",
            "Framebuffer memory used, bytes (nvidia-smi memory.used).",
            F,
            scalar("memory_used_bytes"),
        ),
        MetricRow(
            "gpumon_memory_free_bytes",
            "gauge",
            "Framebuffer memory free, bytes (nvidia-smi memory.free).",
            F,
            scalar("memory_free_bytes"),
        ),
        MetricRow(
            "gpumon_memory_total_bytes",
            "gauge",
            "Framebuffer memory total, bytes (nvidia-smi memory.total).",
            F,
            scalar("memory_total_bytes"),
        ),
        MetricRow(
            "gpumon_memory_reserved_bytes",
            "gauge",
            "Framebuffer memory reserved by the driver, bytes (nvidia-smi memory.reserved).",
            F,
            scalar("memory_reserved_bytes"),
        ),
        MetricRow(
            "gpumon_temperature_celsius",
            "gauge",
            "Temperature by sensor gpu|memory, degrees Celsius (nvidia-smi temperature.gpu, temperature.memory).",
            F,
            by_label({"gpu": "temperature_celsius", "memory": "memory_temperature_celsius"}),
            ("sensor",),
        ),
        MetricRow(
            "gpumon_temperature_threshold_celsius",
            "gauge",
            "Temperature thresholds by kind slowdown|shutdown|gpu_max|memory_max, degrees Celsius (nvidia-smi -q Temperature).",
            T,
            by_label(
                {
                    "slowdown": "temperature_slowdown_threshold_celsius",
                    "shutdown": "temperature_shutdown_threshold_celsius",
                    "gpu_max": "temperature_max_operating_celsius",
                    "memory_max": "memory_temperature_max_operating_celsius",
                }
            ),
            ("kind",),
        ),
        MetricRow(
            "gpumon_power_watts", "gauge", "Power draw, watts (nvidia-smi power.draw).", F, scalar("power_watts")
        ),
        MetricRow(
            "gpumon_power_limit_watts",
            "gauge",
            "Enforced power limit, watts (nvidia-smi enforced.power.limit).",
            S,
            scalar("power_limit_watts"),
        ),
        MetricRow(
            "gpumon_energy_joules_total",
            "counter",
            "Energy consumed since the driver was loaded, joules (NVML total energy consumption).",
            S,
            scalar("energy_joules_total"),
        ),
        MetricRow(
            "gpumon_clock_hertz",
            "gauge",
            "Current clock by domain sm|memory|graphics, hertz (nvidia-smi clocks.sm, clocks.mem, clocks.gr).",
            F,
            mapping("clocks_hertz"),
            ("domain",),
        ),
        MetricRow(
            "gpumon_clock_max_hertz",
            "gauge",
            "Maximum clock by domain, hertz (nvidia-smi clocks.max.*).",
            T,
            mapping("clocks_max_hertz"),
            ("domain",),
        ),
        MetricRow(
            "gpumon_performance_state",
            "gauge",
            "Performance state, 0 (highest) to 15 (lowest) (nvidia-smi pstate).",
            F,
            scalar("performance_state"),
        ),
        MetricRow(
            "gpumon_clock_event_active",
            "gauge",
            "1 while a clock event (throttle) reason holds the clocks down, per reason the GPU reports (nvidia-smi clocks_event_reasons.*).",
            F,
            mapping("clock_events_active"),
            ("reason",),
        ),
        MetricRow(
            "gpumon_throttle_seconds_total",
            "counter",
            "Time the clocks were held below the requested value, by reason, seconds (NVML violation status).",
            S,
            mapping("throttle_seconds_total"),
            ("reason",),
        ),
        MetricRow(
            "gpumon_fan_speed_ratio",
            "gauge",
            "Fan speed by fan, 0-1 of its maximum (nvidia-smi fan.speed / 100).",
            F,
            mapping("fan_speed_ratios"),
            ("fan",),
        ),
        MetricRow(
            "gpumon_pcie_link_generation",
            "gauge",
            "PCIe link generation, state current|max (nvidia-smi pcie.link.gen.current / .max).",
            S,
            _pcie_state("pcie_link_generation", "pcie_link_generation_max"),
            ("state",),
        ),
        MetricRow(
            "gpumon_pcie_link_width",
            "gauge",
            "PCIe link width in lanes, state current|max (nvidia-smi pcie.link.width.current / .max).",
            S,
            _pcie_state("pcie_link_width", "pcie_link_width_max"),
            ("state",),
        ),
        MetricRow(
            "gpumon_pcie_replays_total",
            "counter",
            "PCIe replays since the driver was loaded (nvidia-smi -q Replays Since Reset).",
            S,
            scalar("pcie_replays_total"),
        ),
        MetricRow(
            "gpumon_pcie_bytes_total",
            "counter",
            "Bytes moved over PCIe since the driver was loaded, by direction tx|rx (NVML field values PCIE_COUNT_TX/RX_BYTES).",
            S,
            mapping("pcie_bytes_total"),
            ("direction",),
        ),
        MetricRow(
            "gpumon_pcie_throughput_bytes_per_second",
            "gauge",
            "PCIe throughput by direction tx|rx over a 20 ms sample, bytes per second (NVML PCIe throughput).",
            S,
            mapping("pcie_throughput_bytes_per_second"),
            ("direction",),
        ),
        MetricRow(
            "gpumon_ecc_mode_enabled",
            "gauge",
            "1 when ECC is enabled (nvidia-smi ecc.mode.current).",
            S,
            scalar("ecc_mode_enabled"),
        ),
        MetricRow(
            "gpumon_ecc_errors_total",
            "counter",
            "ECC errors by type corrected|uncorrected and scope volatile|aggregate (nvidia-smi ecc.errors.*.total).",
            S,
            mapping("ecc_errors_total", _ecc_key),
            ("type", "scope"),
        ),
        MetricRow(
            "gpumon_remapped_rows",
            "gauge",
            "Rows remapped by kind correctable|uncorrectable (nvidia-smi remapped_rows.*).",
            S,
            mapping("remapped_rows"),
            ("kind",),
        ),
        MetricRow(
            "gpumon_row_remap_pending",
            "gauge",
            "1 when a row remap waits for a GPU reset (nvidia-smi remapped_rows.pending).",
            S,
            scalar("row_remap_pending"),
        ),
        MetricRow(
            "gpumon_row_remap_failure",
            "gauge",
            "1 when a row remap failed (nvidia-smi remapped_rows.failure).",
            S,
            scalar("row_remap_failure"),
        ),
        MetricRow(
            "gpumon_retired_pages",
            "gauge",
            "Retired memory pages by cause single_bit|double_bit (nvidia-smi retired_pages.*; before Ampere).",
            S,
            mapping("retired_pages"),
            ("cause",),
        ),
        MetricRow(
            "gpumon_retired_pages_pending",
            "gauge",
            "1 when a page retirement waits for a reboot (nvidia-smi retired_pages.pending).",
            S,
            scalar("retired_pages_pending"),
        ),
        MetricRow(
            "gpumon_persistence_mode_enabled",
            "gauge",
            "1 when persistence mode is on (nvidia-smi persistence_mode).",
            S,
            scalar("persistence_mode_enabled"),
        ),
        MetricRow(
            "gpumon_mig_mode_enabled",
            "gauge",
            "1 when MIG mode is on (nvidia-smi mig.mode.current).",
            S,
            scalar("mig_mode_enabled"),
        ),
        MetricRow(
            "gpumon_compute_mode_info",
            "gauge",
            "Compute mode default|exclusive_process|prohibited as a label (nvidia-smi compute_mode).",
            S,
            _compute_mode,
            ("mode",),
        ),
        MetricRow(
            "gpumon_fabric_state_info",
            "gauge",
            "NVSwitch fabric registration state not_started|in_progress|completed as a label, on GPUs in a fabric (nvidia-smi -q Fabric State).",
            S,
            _fabric_state,
            ("state",),
        ),
        MetricRow(
            "gpumon_fabric_status_ok",
            "gauge",
            "1 when the fabric registration succeeded, 0 when it failed or is not done; on GPUs in a fabric (nvidia-smi -q Fabric Status).",
            S,
            scalar("fabric_status_ok"),
        ),
        MetricRow(
            "gpumon_nvlink_link_up",
            "gauge",
            "1 when the NVLink link is active (nvidia-smi nvlink --status).",
            F,
            mapping("nvlink_up"),
            ("link",),
        ),
        MetricRow(
            "gpumon_nvlink_errors_total",
            "counter",
            "NVLink errors by link and type replay|recovery|crc, as nvidia-smi nvlink -e shows them.",
            S,
            _nvlink_errors,
            ("link", "type"),
        ),
        MetricRow(
            "gpumon_p2p_status",
            "gauge",
            "1 when peer-to-peer with peer_gpu works for the capability read|write|nvlink|atomics (nvidia-smi topo -p2p).",
            T,
            _p2p,
            ("peer_gpu", "capability"),
        ),
        MetricRow(
            "gpumon_topology_info",
            "gauge",
            "Path to peer_gpu as level nvlink|internal|single|multiple|hostbridge|node|system (nvidia-smi topo -m).",
            T,
            _topology,
            ("peer_gpu", "level"),
        ),
        MetricRow(
            "gpumon_processes",
            "gauge",
            "Compute processes on the GPU (nvidia-smi --query-compute-apps).",
            F,
            _process_count,
        ),
        MetricRow(
            "gpumon_process_memory_bytes",
            "gauge",
            "GPU memory held by compute processes, bytes (sum of nvidia-smi used_memory).",
            F,
            _process_memory,
        ),
        MetricRow(
            "gpumon_sm_active_ratio",
            "gauge",
            "Share of time at least one warp was resident on an SM, 0-1 (NVML GPM; DCGM_FI_PROF_SM_ACTIVE).",
            S,
            scalar("sm_active_ratio"),
        ),
        MetricRow(
            "gpumon_sm_occupancy_ratio",
            "gauge",
            "Resident warps over the SM maximum, 0-1 (NVML GPM; DCGM_FI_PROF_SM_OCCUPANCY).",
            S,
            scalar("sm_occupancy_ratio"),
        ),
        MetricRow(
            "gpumon_tensor_active_ratio",
            "gauge",
            "Share of cycles the tensor pipes were active, 0-1 (NVML GPM; DCGM_FI_PROF_PIPE_TENSOR_ACTIVE).",
            S,
            scalar("tensor_active_ratio"),
        ),
        MetricRow(
            "gpumon_dram_active_ratio",
            "gauge",
            "Share of cycles device memory was transferring data, 0-1 (NVML GPM; DCGM_FI_PROF_DRAM_ACTIVE).",
            S,
            scalar("dram_active_ratio"),
        ),
        MetricRow(
            "gpumon_fp64_active_ratio",
            "gauge",
            "Share of cycles the FP64 pipe was active, 0-1 (NVML GPM).",
            S,
            scalar("fp64_active_ratio"),
        ),
        MetricRow(
            "gpumon_fp32_active_ratio",
            "gauge",
            "Share of cycles the FP32 pipe was active, 0-1 (NVML GPM).",
            S,
            scalar("fp32_active_ratio"),
        ),
        MetricRow(
            "gpumon_fp16_active_ratio",
            "gauge",
            "Share of cycles the FP16 pipe was active, 0-1 (NVML GPM).",
            S,
            scalar("fp16_active_ratio"),
        ),
        MetricRow(
            "gpumon_gpm_throughput_bytes_per_second",
            "gauge",
            "Throughput by link nvlink|pcie and direction tx|rx from NVML GPM, bytes per second.",
            S,
            mapping("gpm_throughput_bytes_per_second", _gpm_key),
            ("link", "direction"),
        ),
        MetricRow(
            "gpumon_xid_errors_total",
            "counter",
            "XID errors seen, by XID code, since the daemon started plus those found in the kernel log since boot.",
            Tier.DAEMON,
            mapping("xid_errors_total"),
            ("xid",),
        ),
        MetricRow(
            "gpumon_xid_last_timestamp_seconds",
            "gauge",
            "Unix time of the last XID error, by XID code.",
            Tier.DAEMON,
            mapping("xid_last_timestamp_seconds"),
            ("xid",),
        ),
    )
