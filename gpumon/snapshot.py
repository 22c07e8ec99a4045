"""Plain data in the middle of gpumon: what one poll saw, in base units.

Nothing here touches hardware. Every per-GPU field is optional: ``None`` means the
field was not read (not supported by this GPU, or its tier was never read yet) and
the exporter omits the series — never 0, never NaN.

Each ``GpuSnapshot`` field carries ``metadata["tier"]``: ``fast`` (every poll),
``slow`` (costly calls, every ``slow_interval_seconds``), ``static`` (identity and
limits that do not change while the driver is loaded, re-read rarely) or ``daemon``
(filled by gpumon itself, not by a backend). Backends use it to know which fields
a tier covers; it is the single place a field's polling cost class is declared.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Tier(str, Enum):
    """How often a field is read from the backend."""

    FAST = "fast"
    SLOW = "slow"
    STATIC = "static"
    DAEMON = "daemon"


def _f(tier: Tier, doc: str) -> Any:
    return field(default=None, metadata={"tier": tier, "doc": doc})


def _m(tier: Tier, doc: str) -> Any:
    return field(default=None, metadata={"tier": tier, "doc": doc, "mapping": True})


@dataclass(frozen=True)
class ProcessSnapshot:
    """One compute process on one GPU (nvidia-smi --query-compute-apps)."""

    pid: int
    used_memory_bytes: int | None = None
    """GPU memory held by the process in bytes (``used_memory``); None when NVML hides it."""
    name: str | None = None
    """Command name from /proc/PID/comm (``process_name`` is the full path in nvidia-smi)."""
    user: str | None = None
    """Owner of the process (user name, or uid when the name is unknown)."""
    sm_utilization_ratio: float | None = None
    """Share of SM time used by this process, 0–1 (nvmlDeviceGetProcessUtilization)."""
    systemd_unit: str | None = None
    container_id: str | None = None
    pod_uid: str | None = None
    slurm_job_id: str | None = None


@dataclass(frozen=True)
class P2pStatus:
    """Peer-to-peer capability between this GPU and ``peer_index`` (nvidia-smi topo -p2p)."""

    peer_index: int
    capability: str
    """One of read, write, nvlink, atomics."""
    ok: bool


@dataclass(frozen=True)
class GpuSnapshot:
    """Everything gpumon knows about one GPU at one poll, in base units.

    Field docstrings name the matching ``nvidia-smi --query-gpu`` field.
    """

    index: int
    uuid: str
    up: bool = True
    """False when the GPU is lost (GPU_IS_LOST, UNKNOWN, RESET_REQUIRED); then only identity is kept."""
    lost_reason: str | None = None

    # identity (static)
    name: str | None = _f(Tier.STATIC, "Product name (name)")
    pci_bus_id: str | None = _f(Tier.STATIC, "PCI bus id, 0000:BB:DD.F (pci.bus_id)")
    serial: str | None = _f(Tier.STATIC, "Board serial number (serial)")
    vbios_version: str | None = _f(Tier.STATIC, "VBIOS version (vbios_version)")
    compute_capability: str | None = _f(Tier.STATIC, "CUDA compute capability, e.g. 9.0 (compute_cap)")
    minor_number: int | None = _f(Tier.STATIC, "/dev/nvidiaN minor number")

    # utilization (fast)
    utilization_ratio: float | None = _f(Tier.FAST, "GPU busy share 0-1 (utilization.gpu / 100)")
    memory_bandwidth_utilization_ratio: float | None = _f(
        Tier.FAST, "Memory controller busy share 0-1 (utilization.memory / 100)"
    )

    # memory (fast)
    memory_used_bytes: int | None = _f(Tier.FAST, "Framebuffer used, bytes (memory.used MiB × 2^20)")
    memory_free_bytes: int | None = _f(Tier.FAST, "Framebuffer free, bytes (memory.free)")
    memory_total_bytes: int | None = _f(Tier.FAST, "Framebuffer total, bytes (memory.total)")
    memory_reserved_bytes: int | None = _f(Tier.FAST, "Framebuffer reserved by the driver, bytes (memory.reserved)")

    # temperatures (fast) and thresholds (static)
    temperature_celsius: float | None = _f(Tier.FAST, "GPU core temperature, °C (temperature.gpu)")
    memory_temperature_celsius: float | None = _f(Tier.FAST, "HBM temperature, °C (temperature.memory)")
    temperature_slowdown_threshold_celsius: float | None = _f(
        Tier.STATIC, "Temperature at which the GPU slows down, °C (nvidia-smi -q: GPU Slowdown Temp)"
    )
    temperature_shutdown_threshold_celsius: float | None = _f(
        Tier.STATIC, "Temperature at which the GPU shuts down, °C (GPU Shutdown Temp)"
    )
    temperature_max_operating_celsius: float | None = _f(
        Tier.STATIC, "Maximum operating temperature of the GPU, °C (GPU Max Operating Temp)"
    )
    memory_temperature_max_operating_celsius: float | None = _f(
        Tier.STATIC, "Maximum operating temperature of the memory, °C (Memory Max Operating Temp)"
    )

    # power and energy
    power_watts: float | None = _f(Tier.FAST, "Power draw, W (power.draw)")
    power_limit_watts: float | None = _f(Tier.SLOW, "Enforced power limit, W (enforced.power.limit)")
    energy_joules_total: float | None = _f(Tier.SLOW, "Energy since driver load, J (total energy, mJ / 1000)")

    # clocks
    clocks_hertz: Mapping[str, float] | None = _m(
        Tier.FAST, "Current clocks by domain sm|memory|graphics, Hz (clocks.sm, clocks.mem, clocks.gr × 1e6)"
    )
    clocks_max_hertz: Mapping[str, float] | None = _m(
        Tier.STATIC, "Maximum clocks by domain, Hz (clocks.max.sm, clocks.max.mem, clocks.max.gr × 1e6)"
    )
    performance_state: int | None = _f(Tier.FAST, "Performance state 0 (max) – 15 (min) (pstate)")
    clock_events_active: Mapping[str, bool] | None = _m(
        Tier.FAST,
        "Clock event (throttle) reasons this GPU reports, each active or not (clocks_event_reasons.*)",
    )
    throttle_seconds_total: Mapping[str, float] | None = _m(
        Tier.SLOW, "Time clocks were held below the requested value, by reason, s (violation counters, ns / 1e9)"
    )
    fan_speed_ratios: Mapping[str, float] | None = _m(Tier.FAST, "Fan speed by fan index, 0-1 (fan.speed / 100)")

    # PCIe
    pcie_link_generation: int | None = _f(Tier.SLOW, "Current PCIe generation (pcie.link.gen.current)")
    pcie_link_generation_max: int | None = _f(Tier.STATIC, "Max PCIe generation of GPU and system (pcie.link.gen.max)")
    pcie_link_width: int | None = _f(Tier.SLOW, "Current PCIe lanes (pcie.link.width.current)")
    pcie_link_width_max: int | None = _f(Tier.STATIC, "Max PCIe lanes (pcie.link.width.max)")
    pcie_replays_total: int | None = _f(Tier.SLOW, "PCIe replay counter (nvidia-smi -q: Replays Since Reset)")
    pcie_bytes_total: Mapping[str, int] | None = _m(
        Tier.SLOW, "Bytes moved over PCIe since the driver loaded, by direction tx|rx (NVML_FI_DEV_PCIE_COUNT_*_BYTES)"
    )
    pcie_throughput_bytes_per_second: Mapping[str, float] | None = _m(
        Tier.SLOW, "PCIe throughput by direction tx|rx over a 20 ms sample, bytes/s (nvidia-smi dmon -s t, KB/s × 1024)"
    )

    # ECC and memory health
    ecc_mode_enabled: bool | None = _f(Tier.SLOW, "ECC mode currently enabled (ecc.mode.current)")
    ecc_errors_total: Mapping[str, int] | None = _m(
        Tier.SLOW,
        "ECC error counts keyed '<corrected|uncorrected>_<volatile|aggregate>' "
        "(ecc.errors.corrected.volatile.total, ...)",
    )
    remapped_rows: Mapping[str, int] | None = _m(
        Tier.SLOW, "Remapped rows by kind correctable|uncorrectable (remapped_rows.correctable / .uncorrectable)"
    )
    row_remap_pending: bool | None = _f(Tier.SLOW, "A row remap waits for a GPU reset (remapped_rows.pending)")
    row_remap_failure: bool | None = _f(Tier.SLOW, "A row remap failed (remapped_rows.failure)")
    retired_pages: Mapping[str, int] | None = _m(
        Tier.SLOW, "Retired pages by cause single_bit|double_bit (retired_pages.sbe / .dbe); pre-Ampere"
    )
    retired_pages_pending: bool | None = _f(Tier.SLOW, "A page retirement waits for reboot (retired_pages.pending)")

    # modes (slow: an administrator can change them while gpumon runs)
    persistence_mode_enabled: bool | None = _f(Tier.SLOW, "Persistence mode (persistence_mode)")
    mig_mode_enabled: bool | None = _f(Tier.SLOW, "MIG mode current (mig.mode.current)")
    compute_mode: str | None = _f(Tier.SLOW, "Compute mode default|exclusive_process|prohibited (compute_mode)")
    fabric_state: str | None = _f(
        Tier.SLOW, "NVSwitch fabric registration not_started|in_progress|completed (nvidia-smi -q Fabric State)"
    )
    fabric_status_ok: bool | None = _f(
        Tier.SLOW, "The fabric registration's status is success (nvidia-smi -q Fabric Status: Success)"
    )

    # NVLink
    nvlink_up: Mapping[str, bool] | None = _m(Tier.FAST, "NVLink state by link index (nvidia-smi nvlink --status)")
    nvlink_errors_total: Mapping[str, Mapping[str, int]] | None = _m(
        Tier.SLOW,
        "NVLink error counters by link index, then type replay|recovery|crc (nvidia-smi nvlink -e)",
    )

    # topology (static)
    p2p_status: tuple[P2pStatus, ...] | None = _f(Tier.STATIC, "P2P capability per peer (nvidia-smi topo -p2p r|w|n|a)")
    topology_level: Mapping[str, str] | None = _m(
        Tier.STATIC,
        "Topology level per peer GPU index: nvlink|internal|single|multiple|hostbridge|node|system (nvidia-smi topo -m)",
    )

    # processes (fast)
    processes: tuple[ProcessSnapshot, ...] | None = _f(Tier.FAST, "Compute processes (nvidia-smi --query-compute-apps)")

    # profiling (GPM, Hopper and newer; slow tier: averages between two samples one slow interval apart)
    sm_active_ratio: float | None = _f(Tier.SLOW, "SM active share 0-1 (GPM SM_UTIL; DCGM_FI_PROF_SM_ACTIVE)")
    sm_occupancy_ratio: float | None = _f(Tier.SLOW, "SM occupancy 0-1 (GPM SM_OCCUPANCY; DCGM_FI_PROF_SM_OCCUPANCY)")
    tensor_active_ratio: float | None = _f(
        Tier.SLOW, "Tensor pipe active share 0-1 (GPM ANY_TENSOR_UTIL; DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)"
    )
    dram_active_ratio: float | None = _f(
        Tier.SLOW, "DRAM bandwidth share 0-1 (GPM DRAM_BW_UTIL; DCGM_FI_PROF_DRAM_ACTIVE)"
    )
    fp64_active_ratio: float | None = _f(
        Tier.SLOW, "FP64 pipe active 0-1 (GPM FP64_UTIL; DCGM_FI_PROF_PIPE_FP64_ACTIVE)"
    )
    fp32_active_ratio: float | None = _f(
        Tier.SLOW, "FP32 pipe active 0-1 (GPM FP32_UTIL; DCGM_FI_PROF_PIPE_FP32_ACTIVE)"
    )
    fp16_active_ratio: float | None = _f(
        Tier.SLOW, "FP16 pipe active 0-1 (GPM FP16_UTIL; DCGM_FI_PROF_PIPE_FP16_ACTIVE)"
    )
    gpm_throughput_bytes_per_second: Mapping[str, float] | None = _m(
        Tier.SLOW, "NVLink/PCIe throughput from GPM keyed nvlink_tx|nvlink_rx|pcie_tx|pcie_rx, bytes/s"
    )

    # events (filled by the daemon from the XID event thread and the kernel log)
    xid_errors_total: Mapping[str, int] | None = _m(Tier.DAEMON, "XID events seen by XID code (DCGM_FI_DEV_XID_ERRORS)")
    xid_last_timestamp_seconds: Mapping[str, float] | None = _m(Tier.DAEMON, "Unix time of the last XID by code")

    @classmethod
    def base_fields(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """Every field's default overlaid with ``values``: the ``base`` that ``assemble`` takes."""
        return {**_defaults(), **values}

    @classmethod
    def assemble(
        cls, index: int, uuid: str, values: Mapping[str, Any], base: Mapping[str, Any] | None = None
    ) -> GpuSnapshot:
        """A live GPU's snapshot from field values, for the per-second path.

        Equal to ``GpuSnapshot(index=index, uuid=uuid, **base_values, **values)`` (tested), without
        running the generated ``__init__`` field by field: ~1 µs instead of ~9 µs for its 70 fields.
        ``base`` comes from ``base_fields`` (the slower tiers, built once per slow read).
        ``values`` and ``base`` must hold only field names of this class; the poller checks that.
        """
        snapshot = object.__new__(cls)
        fields_ = snapshot.__dict__
        fields_.update(_defaults() if base is None else base)
        fields_.update(values)
        fields_["index"] = index
        fields_["uuid"] = uuid
        return snapshot


@dataclass(frozen=True)
class HostSnapshot:
    """Host-wide facts: driver and a few psutil figures alerts need."""

    driver_version: str | None = None
    """NVIDIA driver version (driver_version)."""
    cuda_driver_version: str | None = None
    """CUDA version the driver supports, e.g. 13.0 (nvidia-smi header 'CUDA Version')."""
    nvml_version: str | None = None
    cpu_utilization_ratio: float | None = None
    """Host CPU busy share 0-1 since the previous poll (psutil.cpu_percent / 100)."""
    memory_used_bytes: int | None = None
    """Host memory in use, bytes (psutil total - available)."""
    memory_total_bytes: int | None = None


@dataclass(frozen=True)
class TierStats:
    """Cost and health of the last read of one tier."""

    duration_seconds: float
    errors_total: int
    last_timestamp_seconds: float


@dataclass(frozen=True)
class Snapshot:
    """What one poll saw of the whole host."""

    timestamp_seconds: float
    """Unix time the poll finished."""
    monotonic_seconds: float
    """time.monotonic() when the poll finished; ages are measured against it."""
    nvml_up: bool
    nvml_error: str | None = None
    host: HostSnapshot = field(default_factory=HostSnapshot)
    gpus: tuple[GpuSnapshot, ...] = ()
    tiers: Mapping[str, TierStats] = field(default_factory=dict)


@functools.cache
def _defaults() -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(GpuSnapshot) if f.default is not dataclasses.MISSING}


@functools.cache
def _tiers_by_field() -> dict[str, Tier | None]:
    return {
        f.name: (f.metadata["tier"] if isinstance(f.metadata.get("tier"), Tier) else None)
        for f in dataclasses.fields(GpuSnapshot)
    }


def field_tier(name: str) -> Tier | None:
    """The tier a GpuSnapshot field is read in, or None for identity fields. KeyError for unknown names."""
    return _tiers_by_field()[name]


def fields_of_tier(tier: Tier) -> frozenset[str]:
    """Names of the GpuSnapshot fields read in ``tier``."""
    return frozenset(f.name for f in dataclasses.fields(GpuSnapshot) if f.metadata.get("tier") == tier)


def numeric_field_names() -> frozenset[str]:
    """Scalar numeric/bool fields that alert rules may compare (``field: temperature_celsius``)."""
    out = set()
    for f in dataclasses.fields(GpuSnapshot):
        if f.metadata.get("mapping") or f.name in ("processes", "p2p_status"):
            continue
        if f.type in ("float | None", "int | None", "bool | None", "bool", "int"):
            out.add(f.name)
    return frozenset(out)


def to_jsonable(snapshot: Snapshot) -> dict[str, Any]:
    """The snapshot as plain JSON-ready data (``gpumon once --json``); None fields dropped."""

    def clean(value: Any) -> Any:
        if isinstance(value, Enum):
            return value.value
        if isinstance(value, Mapping):
            return {str(k): clean(v) for k, v in value.items() if v is not None}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    raw = dataclasses.asdict(snapshot)
    raw["gpus"] = [{k: clean(v) for k, v in g.items() if v is not None} for g in raw["gpus"]]
    raw["host"] = {k: v for k, v in raw["host"].items() if v is not None}
    raw["tiers"] = clean(raw["tiers"])
    return clean(raw)  # type: ignore[no-any-return]
