"""dcgm-exporter's metric names, labels and units, from gpumon's snapshots (``--compat dcgm``).

So that dashboards and alert rules written for NVIDIA's dcgm-exporter work unchanged:
the same ``DCGM_FI_*`` names, the same units (MHz, MiB, %, mJ, µs) and the same
per-GPU label set as dcgm-exporter's GPU template: ``gpu`` (index), ``UUID``,
``pci_bus_id``, ``device`` (``nvidia<index>``), ``modelName``, ``Hostname`` (omitted
when empty, as dcgm-exporter does with ``--no-hostname``) and ``DCGM_FI_DRIVER_VERSION``.

Two deliberate differences, both documented in docs/dcgm-compat.md:

* dcgm-exporter declares some fields ``counter`` although their names do not end in
  ``_total`` (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, ..._REMAPPED_ROWS, ECC totals).
  The Prometheus client and OpenMetrics require a counter's samples to end in
  ``_total``, so gpumon types them ``untyped``: same names, same values, and
  ``rate()`` / ``increase()`` work on them as before.
* DCGM_FI_DEV_XID_ERRORS is the code of the last XID (0 when none), as in DCGM; the
  count of every XID is in ``gpumon_xid_errors_total``.

A series is omitted when its snapshot field is None (not supported, not read yet, or
the GPU is lost), like dcgm-exporter skips blank values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import Metric

from gpumon.events.catalog import XidCatalog
from gpumon.nvml_vocabulary import CLOCK_EVENT_BITS
from gpumon.snapshot import GpuSnapshot, Snapshot
from gpumon.store import SnapshotStore

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# CLOCK_EVENT_BITS (NVML's nvmlClocksEventReason* values) come from the NVML backend: one table of them.

Value = Callable[[GpuSnapshot], float | None]


@dataclass(frozen=True)
class DcgmField:
    """One DCGM_FI_* family computed from a GpuSnapshot."""

    name: str
    kind: str
    """``gauge`` or ``untyped`` (dcgm-exporter's counters without a ``_total`` suffix)."""
    help: str
    value: Value


def _get(mapping: Mapping[str, float] | Mapping[str, int] | None, key: str) -> float | None:
    if mapping is None:
        return None
    value = mapping.get(key)
    return None if value is None else float(value)


def _scaled(field: str, factor: float) -> Value:
    def value(gpu: GpuSnapshot) -> float | None:
        raw = getattr(gpu, field)
        if raw is None:
            return None
        return float(raw) * factor

    return value


def _mib(field: str) -> Value:
    def value(gpu: GpuSnapshot) -> float | None:
        raw = getattr(gpu, field)
        return None if raw is None else float(int(raw) // MIB)

    return value


def _key(field: str, key: str, factor: float = 1.0) -> Value:
    def value(gpu: GpuSnapshot) -> float | None:
        v = _get(getattr(gpu, field), key)
        return None if v is None else v * factor

    return value


def _flag(field: str) -> Value:
    def value(gpu: GpuSnapshot) -> float | None:
        raw = getattr(gpu, field)
        return None if raw is None else (1.0 if raw else 0.0)

    return value


def _nvlink_sum(kind: str) -> Value:
    def value(gpu: GpuSnapshot) -> float | None:
        if not gpu.nvlink_errors_total:
            return None
        counts = [link[kind] for link in gpu.nvlink_errors_total.values() if kind in link]
        return float(sum(counts)) if counts else None

    return value


def _fan_percent(gpu: GpuSnapshot) -> float | None:
    if not gpu.fan_speed_ratios:
        return None
    return 100.0 * sum(gpu.fan_speed_ratios.values()) / len(gpu.fan_speed_ratios)


def clock_events_mask(active: Mapping[str, bool] | None) -> float | None:
    """NVML's bitmask of the active clock event (throttle) reasons; None when unknown."""
    if active is None:
        return None
    return float(sum(bit for reason, bit in CLOCK_EVENT_BITS.items() if active.get(reason)))


def _clock_mask(gpu: GpuSnapshot) -> float | None:
    return clock_events_mask(gpu.clock_events_active)


def _pcie_rate(gpm_key: str, direction: str) -> Value:
    """GPM's PCIe rate where the GPU has it, else NVML's sampled PCIe throughput; bytes/s."""

    def value(gpu: GpuSnapshot) -> float | None:
        v = _get(gpu.gpm_throughput_bytes_per_second, gpm_key)
        return v if v is not None else _get(gpu.pcie_throughput_bytes_per_second, direction)

    return value


def dcgm_fields() -> tuple[DcgmField, ...]:
    """Every DCGM_FI_* family gpumon can fill, in dcgm-exporter's units."""
    g, u = "gauge", "untyped"
    return (
        DcgmField("DCGM_FI_DEV_SM_CLOCK", g, "SM clock frequency (in MHz).", _key("clocks_hertz", "sm", 1e-6)),
        DcgmField("DCGM_FI_DEV_MEM_CLOCK", g, "Memory clock frequency (in MHz).", _key("clocks_hertz", "memory", 1e-6)),
        DcgmField("DCGM_FI_DEV_MEMORY_TEMP", g, "Memory temperature (in C).", _scaled("memory_temperature_celsius", 1)),
        DcgmField("DCGM_FI_DEV_GPU_TEMP", g, "GPU temperature (in C).", _scaled("temperature_celsius", 1)),
        DcgmField(
            "DCGM_FI_DEV_SLOWDOWN_TEMP",
            g,
            "Slowdown temperature (in C).",
            _scaled("temperature_slowdown_threshold_celsius", 1),
        ),
        DcgmField(
            "DCGM_FI_DEV_SHUTDOWN_TEMP",
            g,
            "Shutdown temperature (in C).",
            _scaled("temperature_shutdown_threshold_celsius", 1),
        ),
        DcgmField(
            "DCGM_FI_DEV_GPU_MAX_OP_TEMP",
            g,
            "Maximum operating temperature of the GPU (in C).",
            _scaled("temperature_max_operating_celsius", 1),
        ),
        DcgmField(
            "DCGM_FI_DEV_MEM_MAX_OP_TEMP",
            g,
            "Maximum operating temperature of the memory (in C).",
            _scaled("memory_temperature_max_operating_celsius", 1),
        ),
        DcgmField("DCGM_FI_DEV_POWER_USAGE", g, "Power draw (in W).", _scaled("power_watts", 1)),
        DcgmField(
            "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
            g,
            "Effective power limit that the driver enforces (in W).",
            _scaled("power_limit_watts", 1),
        ),
        DcgmField(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            u,
            "Total energy consumption since boot (in mJ).",
            _scaled("energy_joules_total", 1000),
        ),
        DcgmField(
            "DCGM_FI_DEV_PSTATE",
            g,
            "Performance state (P-State) 0-15, 0 is the highest.",
            _scaled("performance_state", 1),
        ),
        DcgmField("DCGM_FI_DEV_FAN_SPEED", g, "Fan speed (in %), the mean of the GPU's fans.", _fan_percent),
        DcgmField("DCGM_FI_DEV_GPU_UTIL", g, "GPU utilization (in %).", _scaled("utilization_ratio", 100)),
        DcgmField(
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            g,
            "Memory utilization (in %).",
            _scaled("memory_bandwidth_utilization_ratio", 100),
        ),
        DcgmField("DCGM_FI_DEV_FB_TOTAL", g, "Framebuffer memory total (in MiB).", _mib("memory_total_bytes")),
        DcgmField("DCGM_FI_DEV_FB_FREE", g, "Framebuffer memory free (in MiB).", _mib("memory_free_bytes")),
        DcgmField("DCGM_FI_DEV_FB_USED", g, "Framebuffer memory used (in MiB).", _mib("memory_used_bytes")),
        DcgmField("DCGM_FI_DEV_FB_RESERVED", g, "Framebuffer memory reserved (in MiB).", _mib("memory_reserved_bytes")),
        DcgmField(
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", g, "Current clock event reasons (bitmask of NVML reasons).", _clock_mask
        ),
        DcgmField(
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
            g,
            "Current clock throttle reasons (bitmask; the name DCGM used before 3.3).",
            _clock_mask,
        ),
        DcgmField(
            "DCGM_FI_DEV_POWER_VIOLATION",
            u,
            "Throttling duration due to power constraints (in us).",
            _key("throttle_seconds_total", "power", 1e6),
        ),
        DcgmField(
            "DCGM_FI_DEV_THERMAL_VIOLATION",
            u,
            "Throttling duration due to thermal constraints (in us).",
            _key("throttle_seconds_total", "thermal", 1e6),
        ),
        DcgmField(
            "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
            u,
            "Throttling duration due to sync-boost constraints (in us).",
            _key("throttle_seconds_total", "sync_boost", 1e6),
        ),
        DcgmField(
            "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
            u,
            "Throttling duration due to board limit constraints (in us).",
            _key("throttle_seconds_total", "board_limit", 1e6),
        ),
        DcgmField(
            "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
            u,
            "Throttling duration due to low utilization (in us).",
            _key("throttle_seconds_total", "low_utilization", 1e6),
        ),
        DcgmField(
            "DCGM_FI_DEV_RELIABILITY_VIOLATION",
            u,
            "Throttling duration due to reliability constraints (in us).",
            _key("throttle_seconds_total", "reliability", 1e6),
        ),
        DcgmField("DCGM_FI_DEV_PCIE_LINK_GEN", g, "PCIe link generation.", _scaled("pcie_link_generation", 1)),
        DcgmField("DCGM_FI_DEV_PCIE_LINK_WIDTH", g, "PCIe link width (lanes).", _scaled("pcie_link_width", 1)),
        DcgmField(
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", u, "Total number of PCIe retries.", _scaled("pcie_replays_total", 1)
        ),
        DcgmField(
            "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
            u,
            "PCIe TX throughput over a short NVML sample (in KB/s).",
            _key("pcie_throughput_bytes_per_second", "tx", 1 / 1024),
        ),
        DcgmField(
            "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
            u,
            "PCIe RX throughput over a short NVML sample (in KB/s).",
            _key("pcie_throughput_bytes_per_second", "rx", 1 / 1024),
        ),
        DcgmField(
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            u,
            "Total number of single-bit volatile ECC errors.",
            _key("ecc_errors_total", "corrected_volatile"),
        ),
        DcgmField(
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            u,
            "Total number of double-bit volatile ECC errors.",
            _key("ecc_errors_total", "uncorrected_volatile"),
        ),
        DcgmField(
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
            u,
            "Total number of single-bit persistent ECC errors.",
            _key("ecc_errors_total", "corrected_aggregate"),
        ),
        DcgmField(
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
            u,
            "Total number of double-bit persistent ECC errors.",
            _key("ecc_errors_total", "uncorrected_aggregate"),
        ),
        DcgmField(
            "DCGM_FI_DEV_RETIRED_SBE",
            u,
            "Total number of retired pages due to single-bit errors.",
            _key("retired_pages", "single_bit"),
        ),
        DcgmField(
            "DCGM_FI_DEV_RETIRED_DBE",
            u,
            "Total number of retired pages due to double-bit errors.",
            _key("retired_pages", "double_bit"),
        ),
        DcgmField(
            "DCGM_FI_DEV_RETIRED_PENDING", u, "Pages pending retirement (1 when any).", _flag("retired_pages_pending")
        ),
        DcgmField(
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            u,
            "Number of remapped rows for uncorrectable errors.",
            _key("remapped_rows", "uncorrectable"),
        ),
        DcgmField(
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            u,
            "Number of remapped rows for correctable errors.",
            _key("remapped_rows", "correctable"),
        ),
        DcgmField(
            "DCGM_FI_DEV_ROW_REMAP_FAILURE", g, "Whether remapping of rows has failed.", _flag("row_remap_failure")
        ),
        DcgmField(
            "DCGM_FI_DEV_ROW_REMAP_PENDING",
            g,
            "Whether remapping of rows is pending a GPU reset.",
            _flag("row_remap_pending"),
        ),
        DcgmField(
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
            u,
            "Total number of NVLink flow-control CRC errors (nvidia-smi nvlink -e: CRC Errors).",
            _nvlink_sum("crc"),
        ),
        DcgmField(
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
            u,
            "Total number of NVLink retries.",
            _nvlink_sum("replay"),
        ),
        DcgmField(
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
            u,
            "Total number of NVLink recovery errors.",
            _nvlink_sum("recovery"),
        ),
        DcgmField(
            "DCGM_FI_PROF_SM_ACTIVE",
            g,
            "The ratio of cycles an SM has at least 1 warp assigned.",
            _scaled("sm_active_ratio", 1),
        ),
        DcgmField(
            "DCGM_FI_PROF_SM_OCCUPANCY",
            g,
            "The ratio of number of warps resident on an SM.",
            _scaled("sm_occupancy_ratio", 1),
        ),
        DcgmField(
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            g,
            "Ratio of cycles the tensor (HMMA) pipe is active.",
            _scaled("tensor_active_ratio", 1),
        ),
        DcgmField(
            "DCGM_FI_PROF_DRAM_ACTIVE",
            g,
            "Ratio of cycles the device memory interface is active sending or receiving data.",
            _scaled("dram_active_ratio", 1),
        ),
        DcgmField(
            "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
            g,
            "Ratio of cycles the fp64 pipes are active.",
            _scaled("fp64_active_ratio", 1),
        ),
        DcgmField(
            "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
            g,
            "Ratio of cycles the fp32 pipes are active.",
            _scaled("fp32_active_ratio", 1),
        ),
        DcgmField(
            "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
            g,
            "Ratio of cycles the fp16 pipes are active.",
            _scaled("fp16_active_ratio", 1),
        ),
        DcgmField(
            "DCGM_FI_PROF_PCIE_TX_BYTES",
            g,
            "The rate of data transmitted over the PCIe bus, headers and payload, in bytes per second.",
            _pcie_rate("pcie_tx", "tx"),
        ),
        DcgmField(
            "DCGM_FI_PROF_PCIE_RX_BYTES",
            g,
            "The rate of data received over the PCIe bus, headers and payload, in bytes per second.",
            _pcie_rate("pcie_rx", "rx"),
        ),
        DcgmField(
            "DCGM_FI_PROF_NVLINK_TX_BYTES",
            g,
            "The rate of data transmitted over NVLink, in bytes per second.",
            _key("gpm_throughput_bytes_per_second", "nvlink_tx"),
        ),
        DcgmField(
            "DCGM_FI_PROF_NVLINK_RX_BYTES",
            g,
            "The rate of data received over NVLink, in bytes per second.",
            _key("gpm_throughput_bytes_per_second", "nvlink_rx"),
        ),
    )


def last_xid(gpu: GpuSnapshot) -> int | None:
    """The code of the most recent XID on the GPU (DCGM_FI_DEV_XID_ERRORS); 0 when none; None when not tracked."""
    if gpu.xid_last_timestamp_seconds is None and gpu.xid_errors_total is None:
        return None
    last = gpu.xid_last_timestamp_seconds or {}
    if not last:
        return 0
    code, _ = max(last.items(), key=lambda item: (item[1], int(item[0]) if item[0].isdigit() else -1))
    return int(code) if code.isdigit() else 0


class DcgmCompatCollector:
    """A prometheus_client collector yielding dcgm-exporter's families from the latest snapshot."""

    def __init__(self, store: SnapshotStore, hostname: str, catalog: XidCatalog | None = None) -> None:
        """``hostname``: the ``Hostname`` label (dcgm-exporter uses the node name); "" leaves it out.

        ``catalog``: gives ``err_msg`` on DCGM_FI_DEV_XID_ERRORS, as newer dcgm-exporters do.
        """
        self._store = store
        self._hostname = hostname
        self._catalog = catalog
        self._fields = dcgm_fields()

    def set_catalog(self, catalog: XidCatalog) -> None:
        """Use ``catalog`` for ``err_msg`` from the next scrape on (a reload changed ``xid_catalog``)."""
        self._catalog = catalog

    def _labels(self, gpu: GpuSnapshot, snapshot: Snapshot) -> dict[str, str]:
        labels = {
            "gpu": str(gpu.index),
            "UUID": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id or "",
            "device": f"nvidia{gpu.index}",
            "modelName": gpu.name or "",
        }
        if self._hostname:
            labels["Hostname"] = self._hostname
        if snapshot.host.driver_version:
            labels["DCGM_FI_DRIVER_VERSION"] = snapshot.host.driver_version
        return labels

    def collect(self) -> Iterator[Metric]:
        snapshot = self._store.latest()
        if snapshot is None:
            return
        gpus = [(gpu, self._labels(gpu, snapshot)) for gpu in snapshot.gpus if gpu.up]
        for spec in self._fields:
            family = Metric(spec.name, spec.help, spec.kind)
            for gpu, labels in gpus:
                value = spec.value(gpu)
                if value is not None:
                    family.add_sample(spec.name, labels, value)
            if family.samples:
                yield family
        xid = Metric("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", "gauge")
        for gpu, labels in gpus:
            code = last_xid(gpu)
            if code is None:
                continue
            extra = {"err_code": str(code)}
            if self._catalog is not None:
                extra["err_msg"] = "No Error" if code == 0 else self._catalog.lookup(code).meaning
            xid.add_sample("DCGM_FI_DEV_XID_ERRORS", {**labels, **extra}, float(code))
        if xid.samples:
            yield xid
