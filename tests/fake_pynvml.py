"""A fake ``pynvml`` module for testing gpumon's NVML backend without a GPU.

``FakeNvml`` has the function names, NVMLError classes (the real ones from nvidia-ml-py,
so codes and subclasses match) and NVML_* constants of the real binding, over per-GPU
tables (``FakeGpu``). It can:

* fail a function with any NVML code, on one GPU or all (``fail(name, code, gpu=...)``),
* lose a GPU (every call on its handle raises GPU_IS_LOST) and bring it back,
* fail ``nvmlInit`` (e.g. LibraryNotFound),
* count every call per function (``calls[name]``) to prove caching,
* queue XID (and other) events for the event set, and lose a GPU inside the wait.

Values are given in NVML's own units (mW, mJ, MHz, %, ns, KB/s, MiB/s for GPM).
"""

from __future__ import annotations

import ctypes
import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as _real

MIB = 1024 * 1024

NVMLError = _real.NVMLError
NOT_SUPPORTED = _real.NVML_ERROR_NOT_SUPPORTED
GPU_IS_LOST = _real.NVML_ERROR_GPU_IS_LOST
_POLICY_OF_FIELD = dict(zip(range(74, 82), (0, 1, 2, 3, 4, 5, 10, 11), strict=True))
"""NVML_FI_DEV_PERF_POLICY_POWER .. _TOTAL_BASE_CLOCKS (74-81) -> NVML_PERF_POLICY_*."""


@dataclass(frozen=True)
class FakeHandle:
    """What nvmlDeviceGetHandleByIndex returns: an opaque token naming a GPU."""

    index: int


@dataclass
class FakeGpu:
    """One simulated GPU, in NVML units. Defaults: an idle H200 SXM."""

    index: int
    uuid: str = ""
    name: str = "NVIDIA H200"
    bus_id: str = ""
    serial: str = "1650024010001"
    vbios: str = "96.00.AF.00.01"
    compute_capability: tuple[int, int] = (9, 0)
    minor_number: int = 0
    util_gpu_percent: int = 37
    util_memory_percent: int = 12
    memory_total: int = 143771 * MIB
    memory_reserved: int = 550 * MIB
    memory_used: int = 2048 * MIB
    temperature: int = 31
    memory_temperature: int | None = 36
    """None -> the field value reports NOT_SUPPORTED."""
    pcie_bytes: dict[int, int] = field(
        default_factory=lambda: {
            _real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: 5_000_000_000,
            _real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: 7_000_000_000,
        }
    )
    """Field id -> bytes; a missing id reports NOT_SUPPORTED."""
    thresholds: dict[int, int] = field(default_factory=lambda: {0: 95, 1: 90, 2: 95, 3: 87})
    power_mw: int = 75_500
    power_limit_mw: int = 700_000
    energy_mj: int = 1_234_567_890
    clocks_mhz: dict[int, int] = field(default_factory=lambda: {0: 1980, 1: 1980, 2: 3201})
    max_clocks_mhz: dict[int, int] = field(default_factory=lambda: {0: 1980, 1: 1980, 2: 3201})
    pstate: int = 0
    clock_events_supported: int = 0x1FF
    clock_events_current: int = 0x1 | 0x4
    violations_ns: dict[int, int] = field(default_factory=lambda: {0: 2_500_000_000, 1: 0})
    """NVML_PERF_POLICY_* -> violation time, ns; a missing policy reports NOT_SUPPORTED (API and field alike)."""
    violation_fields: bool = True
    """The driver has the NVML_FI_DEV_PERF_POLICY_* fields (74-81) for those counters; False: every one of
    them reports NOT_SUPPORTED (an older driver: nvmlDeviceGetViolationStatus only)."""
    fans_percent: list[int] = field(default_factory=list)
    """Empty -> nvmlDeviceGetNumFans returns 0 (SXM boards have no fan)."""
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_gen_max: int = 5
    pcie_width_max: int = 16
    pcie_replays: int = 3
    pcie_throughput_kb: dict[int, int] = field(default_factory=lambda: {0: 1000, 1: 2000})
    ecc_mode: tuple[int, int] = (1, 1)
    ecc_counts: dict[tuple[int, int], int] = field(default_factory=lambda: {(0, 0): 1, (1, 0): 0, (0, 1): 5, (1, 1): 2})
    remapped_rows: tuple[int, int, int, int] = (0, 1, 0, 0)
    remap_histogram: tuple[int, int, int, int, int] | None = (3072, 0, 0, 0, 0)
    """Banks at max, high, partial, low, none spare-row availability; None -> NOT_SUPPORTED."""
    recovery_action: int | None = 0
    field_errors: dict[int, int] = field(default_factory=dict)
    """Field id -> the nvmlReturn its field value answers with instead of its value (e.g. UNKNOWN)."""
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION's value; None -> the field reports NOT_SUPPORTED (older drivers)."""
    video_percent: tuple[int, int] | None = (0, 0)
    """Encoder and decoder utilization, %; None -> NOT_SUPPORTED."""
    retired_pages: dict[int, list[int]] | None = None
    """None -> NOT_SUPPORTED (Hopper)."""
    persistence: int = 1
    mig_mode: tuple[int, int] = (0, 0)
    compute_mode: int = 0
    fabric_state: int = 3
    """NVML_GPU_FABRIC_STATE_*: 3 completed (an HGX board's NVSwitch fabric), 0 not supported."""
    fabric_status: int = 0
    nvlink_states: list[int] = field(default_factory=list)
    nvlink_remote_bus_ids: list[str] = field(default_factory=list)
    nvlink_errors: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0, 2: 4, 3: 1460, 4: 2219})
    """nvmlDeviceGetNvLinkErrorCounter by NVML_NVLINK_ERROR_DL_*: as on an H200, DL_CRC_DATA (3) and DL_ECC_DATA (4)
    count corrected events on a healthy link, which nvidia-smi nvlink -e does not show."""
    nvlink_error_fields: dict[int, int] = field(default_factory=lambda: {161: 0, 162: 0, 163: 4})
    """NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY/_RECOVERY/_CRC per link (field values, scopeId = link); {} = unsupported."""
    """counter type -> count, the same on every link."""
    p2p: dict[tuple[int, int], int] = field(default_factory=dict)
    """(peer index, capability index) -> NVML_P2P_STATUS_*; missing -> OK."""
    p2p_errors: set[int] = field(default_factory=set)
    """Capability indices whose call fails with a ctypes argument error (as READ did in DESIGN.md)."""
    topology: dict[int, int] = field(default_factory=dict)
    """peer index -> NVML_TOPOLOGY_*; missing -> SYSTEM."""
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    """(pid, used bytes or None)."""
    process_samples: list[tuple[int, int, int]] = field(default_factory=list)
    """(pid, timestamp µs, smUtil %) samples NVML would report."""
    gpm_supported: bool = True
    gpm_metrics: dict[int, float] = field(default_factory=dict)
    """GPM metric id -> value (percent or MiB/s); missing -> the metric reports NOT_SUPPORTED."""
    supported_events: int = 0x8 | 0x2 | 0x1

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = f"GPU-{self.index:08x}-1111-2222-3333-444444444444"
        if not self.bus_id:
            self.bus_id = f"00000000:{0x18 + 0x10 * self.index:02X}:00.0"
        self.minor_number = self.index


class FakeNvml:
    """Stands in for the ``pynvml`` module (pass it to NvmlBackend)."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.calls: Counter[str] = Counter()
        self.nvlink_counters_asked: set[int] = set()
        """NVML_NVLINK_ERROR_DL_* values passed to nvmlDeviceGetNvLinkErrorCounter."""
        self.failures: dict[tuple[str, int | None], int] = {}
        self.lost: set[int] = set()
        self.init_error: int | None = None
        self.driver_version = "580.159.04"
        self.cuda_version = 13000
        self.nvml_version = "13.580.159.04"
        self.initialised = 0
        self.events: deque[tuple[int, int, int]] = deque()
        self.lose_in_wait: int | None = None
        self.gpm_samples_live = 0
        self._cond = threading.Condition()
        self._handles = {g.index: FakeHandle(g.index) for g in gpus}
        self._sample_seq = 0
        # constants and classes of the real binding
        for name in dir(_real):
            if name.startswith(("NVML_", "nvmlClocks", "nvmlEventType", "nvmlMemory_v")):
                setattr(self, name, getattr(_real, name))
        self.NVMLError = _real.NVMLError
        for name in dir(_real):
            if name.startswith("NVMLError_"):
                setattr(self, name, getattr(_real, name))

    # ---- fault injection ------------------------------------------------
    def fail(self, function: str, code: int, gpu: int | None = None) -> None:
        """Make ``function`` raise NVMLError(code) on GPU ``gpu`` (None: every GPU)."""
        self.failures[(function, gpu)] = code

    def heal(self, function: str, gpu: int | None = None) -> None:
        self.failures.pop((function, gpu), None)

    def push_event(self, gpu: int, xid: int, event_type: int = 0x8) -> None:
        """Queue an event for the event set (XID critical error by default)."""
        with self._cond:
            self.events.append((gpu, event_type, xid))
            self._cond.notify_all()

    def _call(self, name: str, handle: FakeHandle | None = None) -> FakeGpu | None:
        self.calls[name] += 1
        gpu = None if handle is None else handle.index
        if gpu is not None and gpu in self.lost:
            raise NVMLError(GPU_IS_LOST)
        code = self.failures.get((name, gpu), self.failures.get((name, None)))
        if code is not None:
            raise NVMLError(code)
        return None if gpu is None else self.gpus[gpu]

    def _gpu(self, name: str, handle: FakeHandle) -> FakeGpu:
        gpu = self._call(name, handle)
        assert gpu is not None
        return gpu

    # ---- init / system --------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._call("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._call("nvmlSystemGetNVMLVersion")
        return self.nvml_version

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._call("nvmlDeviceGetHandleByIndex")
        if index >= len(self.gpus):
            raise NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[index]

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        self._call("nvmlDeviceGetIndex")
        return handle.index

    # ---- identity ---------------------------------------------------------
    def nvmlDeviceGetUUID(self, h: FakeHandle) -> str:
        return self._gpu("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetName(self, h: FakeHandle) -> str:
        return self._gpu("nvmlDeviceGetName", h).name

    def nvmlDeviceGetPciInfo(self, h: FakeHandle) -> Any:
        g = self._gpu("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=g.bus_id, busIdLegacy=g.bus_id[4:])

    def nvmlDeviceGetSerial(self, h: FakeHandle) -> str:
        return self._gpu("nvmlDeviceGetSerial", h).serial

    def nvmlDeviceGetVbiosVersion(self, h: FakeHandle) -> str:
        return self._gpu("nvmlDeviceGetVbiosVersion", h).vbios

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeHandle) -> tuple[int, int]:
        return self._gpu("nvmlDeviceGetCudaComputeCapability", h).compute_capability

    def nvmlDeviceGetMinorNumber(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetMinorNumber", h).minor_number

    # ---- fast -------------------------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, h: FakeHandle) -> Any:
        g = self._gpu("nvmlDeviceGetUtilizationRates", h)
        return SimpleNamespace(gpu=g.util_gpu_percent, memory=g.util_memory_percent)

    def nvmlDeviceGetMemoryInfo(self, h: FakeHandle, version: int | None = None) -> Any:
        if version:
            g = self._gpu("nvmlDeviceGetMemoryInfo_v2", h)
            free = g.memory_total - g.memory_reserved - g.memory_used
            return SimpleNamespace(
                version=version, total=g.memory_total, reserved=g.memory_reserved, free=free, used=g.memory_used
            )
        g = self._gpu("nvmlDeviceGetMemoryInfo", h)
        used = g.memory_used + g.memory_reserved
        return SimpleNamespace(total=g.memory_total, free=g.memory_total - used, used=used)

    def nvmlDeviceGetTemperature(self, h: FakeHandle, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperature", h).temperature

    def nvmlDeviceGetFieldValues(self, h: FakeHandle, field_ids: list[int]) -> list[Any]:
        g = self._gpu("nvmlDeviceGetFieldValues", h)
        out = []
        for requested in field_ids:
            field_id, link = requested if isinstance(requested, tuple) else (requested, 0)
            if field_id in g.field_errors:
                out.append(
                    SimpleNamespace(fieldId=field_id, nvmlReturn=g.field_errors[field_id], valueType=1, value=None)
                )
            elif field_id in g.nvlink_error_fields and link < len(g.nvlink_states):
                out.append(
                    SimpleNamespace(
                        fieldId=field_id,
                        nvmlReturn=0,
                        valueType=_real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                        value=SimpleNamespace(ullVal=g.nvlink_error_fields[field_id]),
                    )
                )
            elif field_id == 230 and g.recovery_action is not None:  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
                out.append(
                    SimpleNamespace(
                        fieldId=field_id,
                        nvmlReturn=0,
                        valueType=_real.NVML_VALUE_TYPE_UNSIGNED_INT,
                        value=SimpleNamespace(uiVal=g.recovery_action),
                    )
                )
            elif field_id == _real.NVML_FI_DEV_MEMORY_TEMP and g.memory_temperature is not None:
                out.append(
                    SimpleNamespace(
                        fieldId=field_id,
                        nvmlReturn=0,
                        valueType=_real.NVML_VALUE_TYPE_UNSIGNED_INT,
                        value=SimpleNamespace(uiVal=g.memory_temperature),
                    )
                )
            elif g.violation_fields and _POLICY_OF_FIELD.get(field_id, -1) in g.violations_ns:
                out.append(
                    SimpleNamespace(
                        fieldId=field_id,
                        nvmlReturn=0,
                        valueType=_real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                        value=SimpleNamespace(ullVal=g.violations_ns[_POLICY_OF_FIELD[field_id]]),
                    )
                )
            elif field_id in g.pcie_bytes:
                out.append(
                    SimpleNamespace(
                        fieldId=field_id,
                        nvmlReturn=0,
                        valueType=_real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                        value=SimpleNamespace(ullVal=g.pcie_bytes[field_id]),
                    )
                )
            else:
                out.append(SimpleNamespace(fieldId=field_id, nvmlReturn=NOT_SUPPORTED, valueType=1, value=None))
        return out

    def nvmlDeviceGetTemperatureThreshold(self, h: FakeHandle, threshold: int) -> int:
        return self._gpu("nvmlDeviceGetTemperatureThreshold", h).thresholds[threshold]

    def nvmlDeviceGetPowerUsage(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetClockInfo(self, h: FakeHandle, clock_type: int) -> int:
        return self._gpu("nvmlDeviceGetClockInfo", h).clocks_mhz[clock_type]

    def nvmlDeviceGetMaxClockInfo(self, h: FakeHandle, clock_type: int) -> int:
        return self._gpu("nvmlDeviceGetMaxClockInfo", h).max_clocks_mhz[clock_type]

    def nvmlDeviceGetPerformanceState(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetPerformanceState", h).pstate

    def nvmlDeviceGetSupportedClocksEventReasons(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetSupportedClocksEventReasons", h).clock_events_supported

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", h).clock_events_current

    def nvmlDeviceGetNumFans(self, h: FakeHandle) -> int:
        return len(self._gpu("nvmlDeviceGetNumFans", h).fans_percent)

    def nvmlDeviceGetFanSpeed_v2(self, h: FakeHandle, fan: int) -> int:
        return self._gpu("nvmlDeviceGetFanSpeed_v2", h).fans_percent[fan]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkGeneration", h).pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkWidth", h).pcie_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkGeneration", h).pcie_gen_max

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkWidth", h).pcie_width_max

    def nvmlDeviceGetNvLinkState(self, h: FakeHandle, link: int) -> int:
        g = self._gpu("nvmlDeviceGetNvLinkState", h)
        if link >= len(g.nvlink_states):
            raise NVMLError(NOT_SUPPORTED if not g.nvlink_states else _real.NVML_ERROR_INVALID_ARGUMENT)
        return g.nvlink_states[link]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: FakeHandle, link: int) -> Any:
        g = self._gpu("nvmlDeviceGetNvLinkRemotePciInfo", h)
        return SimpleNamespace(busId=g.nvlink_remote_bus_ids[link])

    def nvmlDeviceGetNvLinkErrorCounter(self, h: FakeHandle, link: int, counter: int) -> int:
        g = self._gpu("nvmlDeviceGetNvLinkErrorCounter", h)
        self.nvlink_counters_asked.add(counter)
        if counter not in g.nvlink_errors:
            raise NVMLError(NOT_SUPPORTED)
        return g.nvlink_errors[counter]

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeHandle) -> list[Any]:
        g = self._gpu("nvmlDeviceGetComputeRunningProcesses", h)
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
            for pid, used in g.processes
        ]

    def nvmlDeviceGetProcessUtilization(self, h: FakeHandle, timestamp: int) -> list[Any]:
        g = self._gpu("nvmlDeviceGetProcessUtilization", h)
        samples = [
            SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
            for pid, ts, sm in g.process_samples
            if ts > timestamp
        ]
        if not samples:
            raise NVMLError(_real.NVML_ERROR_NOT_FOUND)
        return samples

    # ---- slow -------------------------------------------------------------
    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", h).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetTotalEnergyConsumption", h).energy_mj

    def nvmlDeviceGetViolationStatus(self, h: FakeHandle, policy: int) -> Any:
        g = self._gpu("nvmlDeviceGetViolationStatus", h)
        if policy not in g.violations_ns:
            raise NVMLError(NOT_SUPPORTED)
        return SimpleNamespace(referenceTime=123, violationTime=g.violations_ns[policy])

    def nvmlDeviceGetPcieReplayCounter(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetPcieReplayCounter", h).pcie_replays

    def nvmlDeviceGetPcieThroughput(self, h: FakeHandle, counter: int) -> int:
        return self._gpu("nvmlDeviceGetPcieThroughput", h).pcie_throughput_kb[counter]

    def nvmlDeviceGetEccMode(self, h: FakeHandle) -> list[int]:
        return list(self._gpu("nvmlDeviceGetEccMode", h).ecc_mode)

    def nvmlDeviceGetTotalEccErrors(self, h: FakeHandle, error_type: int, counter_type: int) -> int:
        return self._gpu("nvmlDeviceGetTotalEccErrors", h).ecc_counts[(error_type, counter_type)]

    def nvmlDeviceGetRemappedRows(self, h: FakeHandle) -> tuple[int, int, int, int]:
        return self._gpu("nvmlDeviceGetRemappedRows", h).remapped_rows

    def nvmlDeviceGetRowRemapperHistogram(self, h: FakeHandle) -> Any:
        g = self._gpu("nvmlDeviceGetRowRemapperHistogram", h)
        if g.remap_histogram is None:
            raise NVMLError(NOT_SUPPORTED)
        return SimpleNamespace(**dict(zip(("max", "high", "partial", "low", "none"), g.remap_histogram, strict=True)))

    def nvmlDeviceGetEncoderUtilization(self, h: FakeHandle) -> list[int]:
        g = self._gpu("nvmlDeviceGetEncoderUtilization", h)
        if g.video_percent is None:
            raise NVMLError(NOT_SUPPORTED)
        return [g.video_percent[0], 100_000]

    def nvmlDeviceGetDecoderUtilization(self, h: FakeHandle) -> list[int]:
        g = self._gpu("nvmlDeviceGetDecoderUtilization", h)
        if g.video_percent is None:
            raise NVMLError(NOT_SUPPORTED)
        return [g.video_percent[1], 100_000]

    def nvmlDeviceGetRetiredPages(self, h: FakeHandle, cause: int) -> list[int]:
        g = self._gpu("nvmlDeviceGetRetiredPages", h)
        if g.retired_pages is None:
            raise NVMLError(NOT_SUPPORTED)
        return g.retired_pages.get(cause, [])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: FakeHandle) -> int:
        g = self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", h)
        if g.retired_pages is None:
            raise NVMLError(NOT_SUPPORTED)
        return 0

    def nvmlDeviceGetPersistenceMode(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetPersistenceMode", h).persistence

    def nvmlDeviceGetMigMode(self, h: FakeHandle) -> list[int]:
        return list(self._gpu("nvmlDeviceGetMigMode", h).mig_mode)

    def nvmlDeviceGetComputeMode(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetComputeMode", h).compute_mode

    def nvmlDeviceGetGpuFabricInfo(self, h: FakeHandle, info_ref: Any) -> int:
        gpu = self._gpu("nvmlDeviceGetGpuFabricInfo", h)
        info = info_ref._obj  # ctypes.byref(a struct with the C layout of nvmlGpuFabricInfo_t)
        info.state = gpu.fabric_state
        info.status = gpu.fabric_status
        return 0

    # ---- topology -------------------------------------------------------
    def nvmlDeviceGetP2PStatus(self, h1: FakeHandle, h2: FakeHandle, capability: int) -> int:
        g = self._gpu("nvmlDeviceGetP2PStatus", h1)
        self._call("nvmlDeviceGetP2PStatus.peer", h2)
        if not isinstance(capability, int) or capability in g.p2p_errors:
            raise ctypes.ArgumentError(f"argument 3: <class 'TypeError'>: wrong type ({capability!r})")
        return g.p2p.get((h2.index, capability), _real.NVML_P2P_STATUS_OK)

    def nvmlDeviceGetTopologyCommonAncestor(self, h1: FakeHandle, h2: FakeHandle) -> int:
        g = self._gpu("nvmlDeviceGetTopologyCommonAncestor", h1)
        return g.topology.get(h2.index, _real.NVML_TOPOLOGY_SYSTEM)

    # ---- GPM ------------------------------------------------------------
    class c_nvmlGpmMetricsGet_t:  # the binding's name
        def __init__(self) -> None:
            self.version = 0
            self.numMetrics = 0
            self.sample1: Any = None
            self.sample2: Any = None
            self.metrics = [
                SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(_real.NVML_GPM_METRIC_MAX)
            ]

    def nvmlGpmQueryDeviceSupport(self, h: FakeHandle) -> Any:
        g = self._gpu("nvmlGpmQueryDeviceSupport", h)
        return SimpleNamespace(version=1, isSupportedDevice=int(g.gpm_supported))

    def nvmlGpmSampleAlloc(self) -> Any:
        self._call("nvmlGpmSampleAlloc")
        self.gpm_samples_live += 1
        return SimpleNamespace(gpu=None, seq=None)

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._call("nvmlGpmSampleFree")
        self.gpm_samples_live -= 1

    def nvmlGpmSampleGet(self, h: FakeHandle, sample: Any) -> Any:
        self._gpu("nvmlGpmSampleGet", h)
        self._sample_seq += 1
        sample.gpu, sample.seq = h.index, self._sample_seq
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._call("nvmlGpmMetricsGet")
        assert request.version == _real.NVML_GPM_METRICS_GET_VERSION
        first, second = request.sample1, request.sample2
        assert first.gpu == second.gpu and first.seq < second.seq, "samples must be of one GPU, oldest first"
        g = self.gpus[first.gpu]
        for i in range(request.numMetrics):
            metric = request.metrics[i]
            if metric.metricId in g.gpm_metrics:
                metric.nvmlReturn, metric.value = 0, g.gpm_metrics[metric.metricId]
            else:
                metric.nvmlReturn, metric.value = NOT_SUPPORTED, 0.0
        return request

    # ---- events -----------------------------------------------------------
    def nvmlEventSetCreate(self) -> Any:
        self._call("nvmlEventSetCreate")
        return SimpleNamespace(registered={}, freed=False)

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._call("nvmlEventSetFree")
        event_set.freed = True

    def nvmlDeviceGetSupportedEventTypes(self, h: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetSupportedEventTypes", h).supported_events

    def nvmlDeviceRegisterEvents(self, h: FakeHandle, event_types: int, event_set: Any) -> None:
        g = self._gpu("nvmlDeviceRegisterEvents", h)
        if event_types & ~g.supported_events:
            raise NVMLError(NOT_SUPPORTED)
        event_set.registered[h.index] = event_types

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._call("nvmlEventSetWait_v2")
        assert not event_set.freed, "waiting on a freed event set"
        with self._cond:
            deadline_ok = self._cond.wait_for(lambda: self._ready(event_set), timeout_ms / 1000.0)
            if self.lose_in_wait is not None:
                gpu, self.lose_in_wait = self.lose_in_wait, None
                self.lost.add(gpu)
                raise NVMLError(GPU_IS_LOST)
            if not deadline_ok:
                raise NVMLError(_real.NVML_ERROR_TIMEOUT)
            for i, (gpu, event_type, data) in enumerate(self.events):
                if event_type & event_set.registered.get(gpu, 0):
                    del self.events[i]
                    return SimpleNamespace(
                        device=self._handles[gpu],
                        eventType=event_type,
                        eventData=data,
                        gpuInstanceId=0xFFFFFFFF,
                        computeInstanceId=0xFFFFFFFF,
                    )
            raise NVMLError(_real.NVML_ERROR_TIMEOUT)

    def _ready(self, event_set: Any) -> bool:
        if self.lose_in_wait is not None:
            return True
        return any(t & event_set.registered.get(gpu, 0) for gpu, t, _ in self.events)


def h200_pair() -> FakeNvml:
    """Two H200 SXM GPUs joined by 18 NVLink links each (links end at the other GPU)."""
    gpus = [FakeGpu(index=i) for i in range(2)]
    for g in gpus:
        peer = gpus[1 - g.index]
        g.nvlink_states = [1] * 18
        g.nvlink_remote_bus_ids = [peer.bus_id] * 18
        g.topology = {peer.index: _real.NVML_TOPOLOGY_SYSTEM}
    return FakeNvml(gpus)
