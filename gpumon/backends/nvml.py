"""The real backend: NVML through nvidia-ml-py (``pynvml``).

This is the only module of gpumon that imports ``pynvml`` (in ``NvmlBackend.from_system``);
everything else receives the module object, so tests hand in ``tests/fake_pynvml.py``.

How a read works
----------------
``read(index, tier)`` runs the small *readers* of that tier (one group of NVML calls each,
see ``NvmlBackend.reader_names``) and merges what they return, in base units: bytes,
watts (NVML: mW), joules (mJ), hertz (MHz), ratios 0-1 (percent), seconds (ns).

* NOT_SUPPORTED, FUNCTION_NOT_FOUND and NOT_FOUND mean "absent": the reader (or the single
  call inside it) is remembered per GPU and never asked again; its fields are omitted.
  (A failed call costs ~160 µs on an H200, far more than a successful one.)
* GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND (NVML says the GPU is gone): ``GpuLostError``.
  The next read of that GPU re-acquires its handle (nvmlDeviceGetHandleByIndex), checks the
  UUID and re-probes everything, so a GPU that comes back after a reset reports again.
* The GPU is also lost when its liveness reads fail ``LIVENESS_FAILURES_LOST`` (3) FAST reads
  in a row: memory info and utilization (``LIVENESS_READERS``), the two calls every GPU
  answers; a read where at least one of them answers proves the GPU alive. A GPU that was
  lost must pass its liveness reads once before it counts as up again (no flapping).
* UNKNOWN (and any other error of one call) is that reader's error, not a lost GPU: its
  fields are left out of the read, the rest of the read is kept, and it is counted per GPU
  and reader (``read_errors()``) and per tier (``take_errors()``).
* UNINITIALIZED, DRIVER_NOT_LOADED, LIB_RM_VERSION_MISMATCH: ``NvmlUnavailableError`` (NVML
  itself is gone, e.g. the driver was upgraded under us): the caller should shut down and
  ``init()`` again with backoff.
* A function missing from an older nvidia-ml-py (AttributeError on the module) is treated
  like NOT_SUPPORTED.
* Any other error inside one reader does not spoil the others: the read returns what the
  other readers got, the error is logged (warning the first time per GPU and reader) and
  counted per tier for ``take_errors()`` -> {"fast": n, ...}, which the poller adds to its
  poll errors. ``read`` never raises for such partial failures, even if every reader failed.

gpumon never changes a card: only getters here, no setter, clear, reset, clock/power/ECC/MIG call.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumon.backends.base import GpuLostError, NvmlUnavailableError
from gpumon.backends.gpm import GpmSampler
from gpumon.events.model import XidEvent
from gpumon.snapshot import HostSnapshot, P2pStatus, ProcessSnapshot, Tier

log = logging.getLogger(__name__)

# NVML return codes (nvml.h; ABI-stable, the same numbers pynvml's NVML_ERROR_* constants hold).
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_GPU_NOT_FOUND = 28
NVML_ERROR_UNKNOWN = 999

UNSUPPORTED_CODES = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NOT_FOUND})
LOST_CODES = frozenset({NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED, NVML_ERROR_GPU_NOT_FOUND})
"""NVML's own word that a GPU is gone. UNKNOWN is not one: it is one call's error."""
LIVENESS_READERS = frozenset({"memory", "utilization"})
"""FAST readers whose calls (nvmlDeviceGetMemoryInfo, nvmlDeviceGetUtilizationRates) every GPU answers."""
LIVENESS_FAILURES_LOST = 3
"""FAST reads in a row in which every liveness reader failed that make a GPU lost."""
NVML_GONE_CODES = frozenset(
    {NVML_ERROR_UNINITIALIZED, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIB_RM_VERSION_MISMATCH}
)

# Enumerations (nvml.h values).
_TEMPERATURE_GPU = 0  # NVML_TEMPERATURE_GPU
_THRESHOLDS = {  # NVML_TEMPERATURE_THRESHOLD_*
    "temperature_shutdown_threshold_celsius": 0,
    "temperature_slowdown_threshold_celsius": 1,
    "memory_temperature_max_operating_celsius": 2,
    "temperature_max_operating_celsius": 3,
}
_CLOCK_DOMAINS = {"graphics": 0, "sm": 1, "memory": 2}  # NVML_CLOCK_GRAPHICS / _SM / _MEM
CLOCK_EVENT_BITS = {  # nvmlClocksEventReason* (= nvmlClocksThrottleReason*)
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
PERF_POLICIES = {  # NVML_PERF_POLICY_*
    "power": 0,
    "thermal": 1,
    "sync_boost": 2,
    "board_limit": 3,
    "low_utilization": 4,
    "reliability": 5,
    "total_app_clocks": 10,
    "total_base_clocks": 11,
}
_PCIE_UTIL = {"tx": 0, "rx": 1}  # NVML_PCIE_UTIL_TX_BYTES / _RX_BYTES
_ECC_COUNTERS = {  # (NVML_MEMORY_ERROR_TYPE_*, NVML_VOLATILE_ECC / NVML_AGGREGATE_ECC)
    "corrected_volatile": (0, 0),
    "uncorrected_volatile": (1, 0),
    "corrected_aggregate": (0, 1),
    "uncorrected_aggregate": (1, 1),
}
_RETIREMENT_CAUSES = {"single_bit": 0, "double_bit": 1}  # NVML_PAGE_RETIREMENT_CAUSE_*
_COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
NVLINK_ERROR_FIELDS = {"replay": 161, "recovery": 162, "crc": 163}
"""NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY / _RECOVERY / _CRC (scopeId = link): nvidia-smi nvlink -e's three errors."""
NVLINK_ERROR_COUNTERS = {"replay": 0, "recovery": 1, "crc": 2}
"""NVML_NVLINK_ERROR_DL_REPLAY / _RECOVERY / _CRC_FLIT for nvmlDeviceGetNvLinkErrorCounter (drivers without the
fields). DL_CRC_DATA (3) and DL_ECC_DATA (4) are not read: on Hopper they count events the link corrects, grow by
hundreds a minute on healthy links, and nvidia-smi nvlink -e does not show them as errors."""
P2P_CAPABILITIES = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3}  # NVML_P2P_CAPS_INDEX_*
_P2P_STATUS_OK = 0
TOPOLOGY_LEVELS = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}
_PSTATE_UNKNOWN = 32
_FABRIC_STATES = {1: "not_started", 2: "in_progress", 3: "completed"}  # NVML_GPU_FABRIC_STATE_*; 0 = not supported
_NVLINK_MAX_LINKS_DEFAULT = 18
_FI_DEV_MEMORY_TEMP = 82  # NVML_FI_DEV_MEMORY_TEMP
_FIELD_VALUE_ATTRIBUTES = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
"""c_nvmlFieldValue_t.value member by valueType (NVML_VALUE_TYPE_DOUBLE, _UNSIGNED_INT, ...)."""
_VALUE_NOT_AVAILABLE = 2**64 - 1

EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
_EVENT_EXTRA = {  # other types registered where supported; logged, not returned
    0x2: "double-bit ECC error",  # nvmlEventTypeDoubleBitEccError
    0x800: "DRAM retirement failure",  # nvmlEventTypeDramRetirementFailure
}
_MAX_EVENTS_PER_WAIT = 64

Reader = Callable[["_Gpu", Any], dict[str, Any]]


class _GpuFabricInfoV1(ctypes.Structure):
    """nvml.h's nvmlGpuFabricInfo_t (v1): uuid[16], nvmlReturn_t status, cliqueId, unsigned char state."""

    _fields_ = [
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_ubyte),
    ]


class _Unsupported(Exception):
    """Raised by a reader whose fields this GPU does not have (remember, omit)."""


@dataclass
class _Gpu:
    """What the backend remembers about one GPU."""

    index: int
    handle: Any | None
    """The NVML handle, None while the GPU is lost (re-acquired on the next read)."""
    uuid: str | None
    generation: int = 0
    """Bumped each time the handle is re-acquired after a loss."""
    confirmed: bool = True
    """A read of this handle succeeded (the GPU really answers)."""
    lost_reason: str | None = None
    pci_bus_id: str | None = None
    unsupported: set[str] = field(default_factory=set)
    """Readers and single calls NVML said this GPU does not support."""
    warned: set[str] = field(default_factory=set)
    nvlink_count: int | None = None
    fan_count: int | None = None
    clock_event_bits: tuple[tuple[str, int], ...] | None = None
    """The clock-event reasons this GPU supports (name, bit), from the first read."""
    clock_events_current: Callable[..., Any] = lambda _h: 0
    """The binding's nvmlDeviceGetCurrentClocksEventReasons (or the older Throttle spelling)."""
    clock_events_last: tuple[int, Mapping[str, bool]] = (-1, {})
    """The last reasons bitmask read and its decoded form (shared by snapshots: never mutated)."""
    memory_v1: bool = False
    process_util_timestamp: int = 0
    liveness_failures: int = 0
    """FAST reads in a row in which every liveness reader failed (kept across a re-acquired handle)."""

    def reset_caches(self) -> None:
        self.unsupported = set()
        self.warned = set()
        self.nvlink_count = None
        self.fan_count = None
        self.clock_event_bits = None
        self.clock_events_last = (-1, {})
        self.memory_v1 = False
        self.process_util_timestamp = 0


class NvmlBackend:
    """GpuBackend over NVML. See the module docstring for the error policy.

    ``read`` and the other calls run on the polling thread; ``wait_events`` runs on the
    event thread. NVML itself is thread-safe; the shared state here is guarded by a lock.
    """

    name = "nvml"

    def __init__(self, pynvml: Any, *, import_error: str | None = None) -> None:
        self._nv = pynvml
        self._import_error = import_error
        self._lock = threading.Lock()
        self._inited = False
        self._gpus: dict[int, _Gpu] = {}
        self._errors: Counter[str] = Counter()
        self._reader_errors: Counter[tuple[int, str]] = Counter()
        self._gpm = GpmSampler(pynvml)
        self._memory_temp_field = int(getattr(pynvml, "NVML_FI_DEV_MEMORY_TEMP", _FI_DEV_MEMORY_TEMP))
        self._stop = threading.Event()
        # event thread state, guarded by _event_lock
        self._event_lock = threading.Lock()
        self._event_set: Any | None = None
        self._event_handles: dict[Any, int] = {}
        self._event_registered: dict[int, int] = {}
        """index -> generation registered in the current event set."""
        self._event_excluded: dict[int, int] = {}
        """index -> generation that could not be registered because the GPU was lost."""
        self._event_unsupported: set[int] = set()
        self._events_lost: list[tuple[int, str]] = []
        self._event_last_error: str | None = None
        self._readers: dict[Tier, tuple[tuple[str, Reader], ...]] = {
            Tier.FAST: (
                ("utilization", self._read_utilization),
                ("memory", self._read_memory),
                ("temperature", self._read_temperature),
                ("memory_temperature", self._read_memory_temperature),
                ("power", self._read_power),
                ("clocks", self._read_clocks),
                ("performance_state", self._read_performance_state),
                ("clock_events", self._read_clock_events),
                ("fans", self._read_fans),
                ("nvlink_state", self._read_nvlink_state),
                ("processes", self._read_processes),
            ),
            # PCIe link state (~14 µs a call on H200) and GPM (~64 µs a sample + metrics) measured too
            # costly for every second: the fast tier stays under 100 µs per GPU. GPM metrics are then
            # averages over the slow interval (dcgm-exporter's default collection interval is 30 s).
            Tier.SLOW: (
                ("pcie_link", self._read_pcie_link),
                ("gpm", self._read_gpm),
                ("power_limit", self._read_power_limit),
                ("energy", self._read_energy),
                ("violations", self._read_violations),
                ("pcie_replays", self._read_pcie_replays),
                ("pcie_bytes", self._read_pcie_bytes),
                ("pcie_throughput", self._read_pcie_throughput),
                ("ecc_mode", self._read_ecc_mode),
                ("ecc_errors", self._read_ecc_errors),
                ("remapped_rows", self._read_remapped_rows),
                ("retired_pages", self._read_retired_pages),
                ("persistence_mode", self._read_persistence_mode),
                ("mig_mode", self._read_mig_mode),
                ("compute_mode", self._read_compute_mode),
                ("fabric", self._read_fabric),
                ("nvlink_errors", self._read_nvlink_errors),
            ),
            Tier.STATIC: (
                ("identity", self._read_identity),
                ("thresholds", self._read_thresholds),
                ("max_clocks", self._read_max_clocks),
                ("pcie_max", self._read_pcie_max),
                ("p2p", self._read_p2p),
                ("topology", self._read_topology),
            ),
        }

    @classmethod
    def from_system(cls) -> NvmlBackend:
        """The backend over the installed nvidia-ml-py. A missing module fails at ``init()``."""
        try:
            import pynvml
        except ImportError as exc:
            return cls(None, import_error=str(exc))
        return cls(pynvml)

    # ---- lifecycle --------------------------------------------------------
    def init(self) -> None:
        """nvmlInit once, then find the GPUs. Raises NvmlUnavailableError with a one-line reason."""
        with self._lock:
            if self._inited:
                return
            nv = self._nv
            if nv is None:
                raise NvmlUnavailableError(f"cannot import pynvml (nvidia-ml-py): {self._import_error}")
            try:
                nv.nvmlInit()
            except Exception as exc:
                raise NvmlUnavailableError(_init_message(exc)) from None
            try:
                count = int(nv.nvmlDeviceGetCount())
            except Exception as exc:
                _quiet(nv.nvmlShutdown)
                raise NvmlUnavailableError(f"nvmlDeviceGetCount failed: {exc}") from None
            gpus: dict[int, _Gpu] = {}
            for index in range(count):
                try:
                    handle = nv.nvmlDeviceGetHandleByIndex(index)
                    uuid = _text(nv.nvmlDeviceGetUUID(handle))
                    gpus[index] = _Gpu(index=index, handle=handle, uuid=uuid)
                except Exception as exc:
                    if _code(exc) in NVML_GONE_CODES:
                        _quiet(nv.nvmlShutdown)
                        raise NvmlUnavailableError(_init_message(exc)) from None
                    log.warning("GPU %d does not answer at start: %s", index, exc)
                    gpus[index] = _Gpu(index=index, handle=None, uuid=None, confirmed=False, lost_reason=str(exc))
            self._gpus = gpus
            self._errors = Counter()
            self._reader_errors = Counter()
            self._gpm = GpmSampler(nv)
            self._stop.clear()
            self._inited = True
        log.info("NVML initialised: %d GPU(s)", count)

    def shutdown(self) -> None:
        """Free the event set and GPM samples, then nvmlShutdown. Safe when init failed."""
        self._stop.set()
        # An event wait in progress ends within its timeout; never free the set under it.
        got_event_lock = self._event_lock.acquire(timeout=5.0)
        try:
            if got_event_lock and self._event_set is not None and self._inited:
                _quiet(self._nv.nvmlEventSetFree, self._event_set)
            if got_event_lock:
                self._reset_event_state()
        finally:
            if got_event_lock:
                self._event_lock.release()
        with self._lock:
            if not self._inited:
                return
            self._gpm.shutdown()
            try:
                self._nv.nvmlShutdown()
            except Exception as exc:
                log.debug("nvmlShutdown failed: %s", exc)
            self._inited = False
            self._gpus = {}

    # ---- GpuBackend -------------------------------------------------------
    def device_count(self) -> int:
        return len(self._gpus)

    def uuid(self, index: int) -> str:
        """The GPU's UUID (nvidia-smi uuid); cached, so a lost GPU keeps its identity."""
        g = self._gpu(index)
        if g.uuid is not None:
            return g.uuid
        if g.handle is None:
            raise GpuLostError(index, g.lost_reason or "GPU did not answer")
        try:
            g.uuid = _text(self._nv.nvmlDeviceGetUUID(g.handle))
        except Exception as exc:
            raise GpuLostError(index, str(exc)) from exc
        return g.uuid

    def host(self) -> HostSnapshot:
        """Driver version (driver_version), CUDA driver version ("13.0") and NVML version."""
        nv = self._nv
        driver = _try(lambda: _text(nv.nvmlSystemGetDriverVersion()))
        nvml_version = _try(lambda: _text(nv.nvmlSystemGetNVMLVersion()))
        cuda = _try(lambda: _cuda_version(int(nv.nvmlSystemGetCudaDriverVersion_v2())))
        return HostSnapshot(driver_version=driver, cuda_driver_version=cuda, nvml_version=nvml_version)

    def read(self, index: int, tier: Tier) -> Mapping[str, Any]:
        """Fields of ``tier`` for GPU ``index`` in base units; unsupported fields absent.

        Raises GpuLostError (GPU gone), NvmlUnavailableError (NVML gone). Other NVML
        errors leave a partial result and an entry for ``take_errors()``.
        """
        g = self._gpu_for_read(index)
        out = self._run_readers(g, tier, self._readers.get(tier, ()), check_liveness=tier is Tier.FAST)
        if not g.confirmed:
            with self._lock:
                g.confirmed = True
            log.info("GPU %d (%s) answers again", index, g.uuid)
        return out

    def take_errors(self) -> dict[str, int]:
        """Reader errors since the last call, counted by tier ("fast", "slow", "static"); then reset.

        A reader that failed with something other than NOT_SUPPORTED or GPU lost left its
        fields out of the read (its message is logged: warning the first time per GPU and
        reader, debug after); the poller adds these counts to its per-tier poll errors.
        """
        if not self._errors:  # the usual case, every poll: no lock, no new Counter
            return {}
        with self._lock:
            errors, self._errors = self._errors, Counter()
        return dict(errors)

    def read_errors(self) -> dict[tuple[int, str, str], int]:
        """Reader errors since init by (GPU index, UUID, reader name), cumulative (never reset).

        Exported as ``gpumon_read_errors_total{gpu, uuid, reader}``: which fields of which GPU
        failed (UNKNOWN, TIMEOUT, ...) and how often, without marking the GPU lost.
        """
        with self._lock:
            counts = dict(self._reader_errors)
            uuids = {i: g.uuid or "" for i, g in self._gpus.items()}
        return {(index, uuids.get(index, ""), name): n for (index, name), n in counts.items()}

    def gpm_supported(self, index: int) -> bool | None:
        """Whether GPU ``index`` offers NVML GPM profiling metrics; None until a FAST read probed it."""
        return self._gpm.supported(index)

    def reader_names(self, tier: Tier) -> tuple[str, ...]:
        """Names of the reader groups of ``tier`` in the order ``read`` runs them."""
        return tuple(name for name, _ in self._readers.get(tier, ()))

    def read_group(self, index: int, name: str) -> dict[str, Any]:
        """Run one reader group alone (for benchmarks and debugging); same rules as ``read``."""
        g = self._gpu_for_read(index)
        for tier, readers in self._readers.items():
            for reader_name, reader in readers:
                if reader_name == name:
                    return self._run_readers(g, tier, ((name, reader),))
        raise KeyError(name)

    # ---- events -----------------------------------------------------------
    def wait_events(self, timeout_seconds: float) -> list[XidEvent]:
        """Block up to ``timeout_seconds`` for XID events on any GPU.

        One NVML event set is created on the first call and every GPU that supports
        nvmlEventTypeXidCriticalError is registered (plus double-bit ECC and DRAM
        retirement failure where supported; those are logged, not returned). A GPU lost
        inside the wait raises GpuLostError for that GPU; the set is rebuilt without it
        and keeps serving the others, and the GPU is registered again once reads of it
        succeed again.
        """
        timeout_seconds = max(0.0, timeout_seconds)
        if not self._event_lock.acquire(timeout=timeout_seconds):
            return []
        try:
            if not self._inited or self._stop.is_set():
                self._stop.wait(timeout_seconds)
                return []
            if self._events_lost:
                index, reason = self._events_lost.pop(0)
                raise GpuLostError(index, reason)
            self._refresh_event_set()
            if self._event_set is None or not self._event_registered:
                self._stop.wait(timeout_seconds)
                return []
            try:
                first = self._nv.nvmlEventSetWait_v2(self._event_set, int(timeout_seconds * 1000))
            except Exception as exc:
                return self._on_wait_error(exc, timeout_seconds)
            received = [first]
            while len(received) < _MAX_EVENTS_PER_WAIT:  # drain a burst without waiting
                try:
                    received.append(self._nv.nvmlEventSetWait_v2(self._event_set, 0))
                except Exception:
                    break
            now = time.time()
            events = []
            for data in received:
                event = self._to_xid_event(data, now)
                if event is not None:
                    events.append(event)
            return events
        finally:
            self._event_lock.release()

    # ---- internals: GPUs and readers ---------------------------------------
    def _gpu(self, index: int) -> _Gpu:
        with self._lock:
            if not self._inited:
                raise NvmlUnavailableError("the NVML backend is not initialised")
            g = self._gpus.get(index)
        if g is None:
            raise IndexError(f"no GPU with index {index} (NVML sees {len(self._gpus)})")
        return g

    def _gpu_for_read(self, index: int) -> _Gpu:
        """The GPU's state, re-acquiring the handle of a GPU that was lost."""
        g = self._gpu(index)
        if g.handle is not None:
            return g
        nv = self._nv
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nv.nvmlDeviceGetUUID(handle))
        except Exception as exc:
            if _code(exc) in NVML_GONE_CODES:
                raise NvmlUnavailableError(f"NVML went away: {exc}") from exc
            raise GpuLostError(index, g.lost_reason or str(exc)) from exc
        if g.uuid is not None and uuid != g.uuid:
            raise GpuLostError(index, f"index {index} now names {uuid}, not {g.uuid}")
        with self._lock:
            g.handle = handle
            g.uuid = uuid
            g.generation += 1
            g.confirmed = False
            g.reset_caches()
        self._gpm.forget(index)
        return g

    def _mark_lost(self, g: _Gpu, reason: str, *, polling_thread: bool = True) -> None:
        """Drop the handle; the next read re-acquires it. GPM state belongs to the polling thread."""
        with self._lock:
            was_up = g.handle is not None and g.confirmed
            g.handle = None
            g.confirmed = False
            g.lost_reason = reason
        if polling_thread:
            self._gpm.forget(g.index)
        if was_up:
            log.warning("GPU %d (%s) lost: %s", g.index, g.uuid, reason)

    def _run_readers(
        self, g: _Gpu, tier: Tier, readers: Iterable[tuple[str, Reader]], *, check_liveness: bool = False
    ) -> dict[str, Any]:
        """Run ``readers`` on ``g``, skipping the unsupported ones; each failure is sorted by _reader_failed.

        ``check_liveness`` (a whole FAST read): when every liveness reader that ran failed, count
        it; LIVENESS_FAILURES_LOST in a row (or one, while the GPU is not yet confirmed after a
        loss) make the GPU lost.
        """
        out: dict[str, Any] = {}
        unsupported = g.unsupported
        h = g.handle  # one handle for the whole read: if the GPU is lost meanwhile, NVML says so
        live_ran = live_failed = 0
        live_error = ""
        for name, reader in readers:
            if name in unsupported:
                continue
            liveness = check_liveness and name in LIVENESS_READERS
            try:
                out.update(reader(g, h))
            except Exception as exc:
                self._reader_failed(g, tier, name, exc)
                if liveness and name not in g.unsupported:
                    live_failed += 1
                    live_error = live_error or f"{name}: {exc}"
            if liveness and name not in g.unsupported:
                live_ran += 1
        if live_ran:
            self._check_liveness(g, live_ran == live_failed, live_error)
        return out

    def _check_liveness(self, g: _Gpu, failed: bool, error: str) -> None:
        """Count FAST reads in a row whose liveness reads all failed; raise GpuLostError at the limit."""
        if not failed:
            g.liveness_failures = 0
            return
        g.liveness_failures += 1
        if g.liveness_failures >= LIVENESS_FAILURES_LOST or not g.confirmed:
            reason = f"{error} ({g.liveness_failures} read(s) in a row without an answer to its liveness reads)"
            self._mark_lost(g, reason)
            raise GpuLostError(g.index, reason)

    def _reader_failed(self, g: _Gpu, tier: Tier, name: str, exc: Exception) -> None:
        """Sort a reader's exception: unsupported (remember), lost / NVML gone (raise), else count it."""
        if isinstance(exc, _Unsupported):
            g.unsupported.add(name)
            log.debug("GPU %d: %s not supported; not asked again", g.index, name)
            return
        code = _code(exc)
        if code in LOST_CODES:
            self._mark_lost(g, str(exc))
            raise GpuLostError(g.index, str(exc)) from exc
        if code in NVML_GONE_CODES:
            raise NvmlUnavailableError(f"NVML went away: {exc}") from exc
        if code in UNSUPPORTED_CODES:
            g.unsupported.add(name)
            log.debug("GPU %d: %s not supported (%s); not asked again", g.index, name, exc)
            return
        if _missing_in_binding(exc, self._nv):
            g.unsupported.add(name)
            log.info("GPU %d: %s omitted: this nvidia-ml-py has no %s", g.index, name, getattr(exc, "name", "?"))
            return
        self._record_error(g, tier, name, exc)

    def _record_error(self, g: _Gpu, tier: Tier, name: str, exc: Exception) -> None:
        """Keep a reader's error for take_errors(); warn the first time per GPU and reader."""
        message = f"GPU {g.index} {name}: {type(exc).__name__}: {exc}"
        if name not in g.warned:
            g.warned.add(name)
            log.warning("%s (fields omitted; logged once, counted each time)", message)
        else:
            log.debug("%s", message)
        with self._lock:
            self._errors[tier.value] += 1
            self._reader_errors[(g.index, name)] += 1

    def _opt(self, g: _Gpu, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, or None when this single call is unsupported on this GPU (remembered)."""
        if key in g.unsupported:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            if _code(exc) in UNSUPPORTED_CODES:
                g.unsupported.add(key)
                return None
            raise

    def _handle(self, g: _Gpu) -> Any:
        handle = g.handle
        if handle is None:  # lost between the check and the call: report it as lost
            raise GpuLostError(g.index, g.lost_reason or "GPU lost")
        return handle

    # ---- FAST readers ----------------------------------------------------
    def _read_utilization(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetUtilizationRates: utilization.gpu / utilization.memory (%) -> 0-1."""
        u = self._nv.nvmlDeviceGetUtilizationRates(h)
        return {"utilization_ratio": u.gpu / 100.0, "memory_bandwidth_utilization_ratio": u.memory / 100.0}

    def _read_memory(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetMemoryInfo (v2 for reserved, else v1): memory.used/free/total/reserved, bytes."""
        nv = self._nv
        version = getattr(nv, "nvmlMemory_v2", None)
        if not g.memory_v1 and version is not None:
            try:
                m = nv.nvmlDeviceGetMemoryInfo(h, version=version)
                return {
                    "memory_used_bytes": int(m.used),
                    "memory_free_bytes": int(m.free),
                    "memory_total_bytes": int(m.total),
                    "memory_reserved_bytes": int(m.reserved),
                }
            except TypeError:  # a binding without the version argument
                pass
            except Exception as exc:
                if _code(exc) not in UNSUPPORTED_CODES | {NVML_ERROR_ARGUMENT_VERSION_MISMATCH}:
                    raise
            g.memory_v1 = True
        m = nv.nvmlDeviceGetMemoryInfo(h)
        return {"memory_used_bytes": int(m.used), "memory_free_bytes": int(m.free), "memory_total_bytes": int(m.total)}

    def _read_temperature(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetTemperature(GPU): temperature.gpu, °C."""
        return {"temperature_celsius": float(self._nv.nvmlDeviceGetTemperature(h, _TEMPERATURE_GPU))}

    def _read_memory_temperature(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP): temperature.memory, °C; 0 means absent."""
        value = self._nv.nvmlDeviceGetFieldValues(h, [self._memory_temp_field])[0]
        code = int(value.nvmlReturn)
        if code in UNSUPPORTED_CODES:
            raise _Unsupported
        if code != NVML_SUCCESS:
            raise _nvml_error(self._nv, code)
        celsius = _field_value(value)
        return {"memory_temperature_celsius": float(celsius)} if celsius else {}

    def _read_power(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetPowerUsage: power.draw, mW -> W."""
        return {"power_watts": self._nv.nvmlDeviceGetPowerUsage(h) / 1000.0}

    def _read_clocks(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetClockInfo per domain: clocks.sm / clocks.mem / clocks.gr, MHz -> Hz."""
        # _opt's rule, written out: this runs every second for every GPU (0.5 µs a GPU less than _opt)
        clock_info = self._nv.nvmlDeviceGetClockInfo
        unsupported = g.unsupported
        clocks = {}
        for domain, clock_type in _CLOCK_DOMAINS.items():
            key = "clock." + domain
            if key in unsupported:
                continue
            try:
                clocks[domain] = clock_info(h, clock_type) * 1e6
            except Exception as exc:
                if _code(exc) not in UNSUPPORTED_CODES:
                    raise
                unsupported.add(key)
        if not clocks:
            raise _Unsupported
        return {"clocks_hertz": clocks}

    def _read_performance_state(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetPerformanceState: pstate 0-15 (32 = unknown, omitted)."""
        pstate = int(self._nv.nvmlDeviceGetPerformanceState(h))
        return {"performance_state": pstate} if pstate != _PSTATE_UNKNOWN else {}

    def _read_clock_events(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetCurrentClocksEventReasons, limited to the reasons the GPU supports."""
        nv = self._nv
        if g.clock_event_bits is None:
            supported_fn = _function(
                nv, "nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetSupportedClocksThrottleReasons"
            )
            supported = int(supported_fn(h))
            g.clock_event_bits = tuple((name, bit) for name, bit in CLOCK_EVENT_BITS.items() if supported & bit)
            g.clock_events_current = _function(
                nv, "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"
            )
        if not g.clock_event_bits:
            raise _Unsupported
        current = int(g.clock_events_current(h))
        if current != g.clock_events_last[0]:  # usually unchanged from one second to the next
            g.clock_events_last = (current, {name: bool(current & bit) for name, bit in g.clock_event_bits})
        return {"clock_events_active": g.clock_events_last[1]}

    def _read_fans(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetNumFans, then nvmlDeviceGetFanSpeed_v2 per fan: fan.speed % -> 0-1."""
        nv = self._nv
        if g.fan_count is None:
            g.fan_count = int(nv.nvmlDeviceGetNumFans(h))
        if g.fan_count <= 0:
            raise _Unsupported
        fans = {}
        for fan in range(g.fan_count):
            speed = self._opt(g, f"fan.{fan}", nv.nvmlDeviceGetFanSpeed_v2, h, fan)
            if speed is not None:
                fans[str(fan)] = speed / 100.0
        if not fans:
            raise _Unsupported
        return {"fan_speed_ratios": fans}

    def _read_pcie_link(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetCurrPcieLinkGeneration / Width: pcie.link.gen.current, pcie.link.width.current."""
        nv = self._nv
        out = {}
        gen = self._opt(g, "pcie.gen", nv.nvmlDeviceGetCurrPcieLinkGeneration, h)
        if gen is not None:
            out["pcie_link_generation"] = int(gen)
        width = self._opt(g, "pcie.width", nv.nvmlDeviceGetCurrPcieLinkWidth, h)
        if width is not None:
            out["pcie_link_width"] = int(width)
        if not out:
            raise _Unsupported
        return out

    def _nvlink_count(self, g: _Gpu) -> int:
        """Number of NVLink links: links 0.. until the first NOT_SUPPORTED / INVALID_ARGUMENT (cached)."""
        if g.nvlink_count is None:
            nv, h = self._nv, self._handle(g)
            count = 0
            for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", _NVLINK_MAX_LINKS_DEFAULT))):
                try:
                    nv.nvmlDeviceGetNvLinkState(h, link)
                except Exception as exc:
                    if _code(exc) in UNSUPPORTED_CODES | {NVML_ERROR_INVALID_ARGUMENT}:
                        break
                    raise
                count += 1
            g.nvlink_count = count
        return g.nvlink_count

    def _read_nvlink_state(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetNvLinkState per link (nvidia-smi nvlink --status): up or not."""
        count = self._nvlink_count(g)
        if count == 0:
            raise _Unsupported
        return {"nvlink_up": {str(link): bool(self._nv.nvmlDeviceGetNvLinkState(h, link)) for link in range(count)}}

    def _read_processes(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetComputeRunningProcesses (pid, used_memory bytes) plus per-process SM share.

        The SM share comes from nvmlDeviceGetProcessUtilization (samples newer than the last
        seen timestamp; NOT_FOUND = no new samples). Name, user and cgroup are added elsewhere.
        """
        nv = self._nv
        procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
        sm_share: dict[int, float] = {}
        if procs:
            try:
                sm_share = self._process_sm_share(g, h)
            except Exception as exc:
                if _code(exc) in LOST_CODES | NVML_GONE_CODES:
                    raise
                self._record_error(g, Tier.FAST, "process_utilization", exc)
        out = []
        for p in procs:
            pid = int(p.pid)
            used = p.usedGpuMemory
            used_bytes = None if used is None or int(used) >= _VALUE_NOT_AVAILABLE else int(used)
            out.append(ProcessSnapshot(pid=pid, used_memory_bytes=used_bytes, sm_utilization_ratio=sm_share.get(pid)))
        return {"processes": tuple(out)}

    def _process_sm_share(self, g: _Gpu, h: Any) -> dict[int, float]:
        if "process_utilization" in g.unsupported:
            return {}
        try:
            samples = self._nv.nvmlDeviceGetProcessUtilization(h, g.process_util_timestamp)
        except Exception as exc:
            code = _code(exc)
            if code in (NVML_ERROR_NOT_FOUND, NVML_SUCCESS):  # no sample since the last timestamp
                return {}
            if code in UNSUPPORTED_CODES:
                g.unsupported.add("process_utilization")
                return {}
            raise
        latest: dict[int, tuple[int, float]] = {}
        for s in samples:
            stamp = int(s.timeStamp)
            pid = int(s.pid)
            if pid not in latest or stamp >= latest[pid][0]:
                latest[pid] = (stamp, min(int(s.smUtil) / 100.0, 1.0))
            g.process_util_timestamp = max(g.process_util_timestamp, stamp)
        return {pid: share for pid, (_, share) in latest.items()}

    def _read_gpm(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """NVML GPM (Hopper+): SM/tensor/DRAM/FP activity and NVLink/PCIe throughput."""
        return self._gpm.read(g.index, h)

    # ---- SLOW readers -----------------------------------------------------
    def _read_power_limit(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetEnforcedPowerLimit: enforced.power.limit, mW -> W."""
        return {"power_limit_watts": self._nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0}

    def _read_energy(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetTotalEnergyConsumption: energy since driver load, mJ -> J (~3 ms)."""
        return {"energy_joules_total": self._nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0}

    def _read_violations(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetViolationStatus per NVML_PERF_POLICY_*: violationTime ns -> s (~0.7 ms each)."""
        nv = self._nv
        seconds = {}
        for name, policy in PERF_POLICIES.items():
            v = self._opt(g, f"violation.{name}", nv.nvmlDeviceGetViolationStatus, h, policy)
            if v is not None:
                seconds[name] = int(v.violationTime) / 1e9
        if not seconds:
            raise _Unsupported
        return {"throttle_seconds_total": seconds}

    def _read_pcie_replays(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetPcieReplayCounter (nvidia-smi -q: Replays Since Reset)."""
        return {"pcie_replays_total": int(self._nv.nvmlDeviceGetPcieReplayCounter(h))}

    def _read_pcie_bytes(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetFieldValues(NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES): bytes moved over PCIe since
        the driver loaded, one call for both (no nvidia-smi query field; DCGM_FI_PROF_PCIE_*_BYTES is a rate)."""
        ids = {
            "tx": int(getattr(self._nv, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197)),
            "rx": int(getattr(self._nv, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198)),
        }
        values = self._nv.nvmlDeviceGetFieldValues(h, list(ids.values()))
        out = {}
        for direction, value in zip(ids, values, strict=True):
            code = int(value.nvmlReturn)
            if code == NVML_SUCCESS:
                out[direction] = int(_field_value(value))
            elif code not in UNSUPPORTED_CODES:
                raise _nvml_error(self._nv, code)
        if not out:
            raise _Unsupported
        return {"pcie_bytes_total": out}

    def _read_pcie_throughput(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetPcieThroughput tx/rx: KB/s over ~20 ms -> bytes/s (blocks ~21 ms)."""
        nv = self._nv
        out = {}
        for direction, counter in _PCIE_UTIL.items():
            kb = self._opt(g, f"pcie_throughput.{direction}", nv.nvmlDeviceGetPcieThroughput, h, counter)
            if kb is not None:
                out[direction] = float(kb) * 1024.0
        if not out:
            raise _Unsupported
        return {"pcie_throughput_bytes_per_second": out}

    def _read_ecc_mode(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetEccMode: ecc.mode.current."""
        current, _pending = self._nv.nvmlDeviceGetEccMode(h)
        return {"ecc_mode_enabled": bool(current)}

    def _read_ecc_errors(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetTotalEccErrors: ecc.errors.{corrected,uncorrected}.{volatile,aggregate}.total."""
        nv = self._nv
        counts = {}
        for key, (error_type, counter_type) in _ECC_COUNTERS.items():
            n = self._opt(g, f"ecc.{key}", nv.nvmlDeviceGetTotalEccErrors, h, error_type, counter_type)
            if n is not None:
                counts[key] = int(n)
        if not counts:
            raise _Unsupported
        return {"ecc_errors_total": counts}

    def _read_remapped_rows(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetRemappedRows: remapped_rows.correctable/.uncorrectable/.pending/.failure."""
        correctable, uncorrectable, pending, failure = self._nv.nvmlDeviceGetRemappedRows(h)
        return {
            "remapped_rows": {"correctable": int(correctable), "uncorrectable": int(uncorrectable)},
            "row_remap_pending": bool(pending),
            "row_remap_failure": bool(failure),
        }

    def _read_retired_pages(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetRetiredPages per cause and ...PendingStatus (pre-Ampere; NOT_SUPPORTED on Hopper)."""
        nv = self._nv
        pages = {}
        for name, cause in _RETIREMENT_CAUSES.items():
            addresses = self._opt(g, f"retired.{name}", nv.nvmlDeviceGetRetiredPages, h, cause)
            if addresses is not None:
                pages[name] = len(addresses)
        out: dict[str, Any] = {"retired_pages": pages} if pages else {}
        pending = self._opt(g, "retired.pending", nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
        if pending is not None:
            out["retired_pages_pending"] = bool(pending)
        if not out:
            raise _Unsupported
        return out

    def _read_persistence_mode(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetPersistenceMode: persistence_mode."""
        return {"persistence_mode_enabled": bool(self._nv.nvmlDeviceGetPersistenceMode(h))}

    def _read_mig_mode(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetMigMode: mig.mode.current."""
        current, _pending = self._nv.nvmlDeviceGetMigMode(h)
        return {"mig_mode_enabled": bool(current)}

    def _read_compute_mode(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetComputeMode: compute_mode default|exclusive_process|prohibited."""
        mode = int(self._nv.nvmlDeviceGetComputeMode(h))
        return {"compute_mode": _COMPUTE_MODES.get(mode, f"mode_{mode}")}

    def _read_fabric(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetGpuFabricInfo: NVSwitch fabric state and status (nvidia-smi -q Fabric).

        GPUs outside an NVSwitch fabric say NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: omitted.
        On an NVSwitch system CUDA cannot start until the state is completed with success
        (nvidia-fabricmanager, or the NVLink switch's fabric manager, registers the GPU).
        """
        info = _GpuFabricInfoV1()  # not the binding's struct: its layout differs between nvidia-ml-py versions
        self._nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
        state = int(info.state)
        if state not in _FABRIC_STATES:
            raise _Unsupported
        return {"fabric_state": _FABRIC_STATES[state], "fabric_status_ok": int(info.status) == NVML_SUCCESS}

    def _read_nvlink_errors(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvidia-smi nvlink -e per link: Replay / Recovery / CRC Errors -> ``replay``, ``recovery``, ``crc``.

        One nvmlDeviceGetFieldValues call for every link and type (NVML_FI_DEV_NVLINK_ERROR_DL_*,
        scopeId = link); a type whose field this driver does not support is read with
        nvmlDeviceGetNvLinkErrorCounter(DL_REPLAY / DL_RECOVERY / DL_CRC_FLIT) instead. Both agree
        with nvidia-smi on H200 (driver 580). DL_CRC_DATA / DL_ECC_DATA are left out (see
        NVLINK_ERROR_COUNTERS).
        """
        count = self._nvlink_count(g)
        if count == 0:
            raise _Unsupported
        nv = self._nv
        links: dict[str, dict[str, int]] = {str(link): {} for link in range(count)}
        by_field = [name for name in NVLINK_ERROR_FIELDS if f"nvlink_field.{name}" not in g.unsupported]
        if by_field:
            ids = [
                (int(getattr(nv, f"NVML_FI_DEV_NVLINK_ERROR_DL_{name.upper()}", NVLINK_ERROR_FIELDS[name])), link)
                for name in by_field
                for link in range(count)
            ]
            try:
                got = self._opt(g, "nvlink_field.call", nv.nvmlDeviceGetFieldValues, h, ids)
            except (TypeError, AttributeError):  # a binding without (fieldId, scopeId) pairs
                got = None
            values = list(got) if got is not None else []
            if got is None:
                g.unsupported.update(f"nvlink_field.{name}" for name in by_field)
            for i, name in enumerate(by_field if got is not None else ()):
                mine = values[i * count : (i + 1) * count]
                codes = [int(v.nvmlReturn) for v in mine]
                if all(code in UNSUPPORTED_CODES for code in codes):
                    g.unsupported.add(f"nvlink_field.{name}")  # this driver: the error counter API
                    continue
                for link, (code, value) in enumerate(zip(codes, mine, strict=True)):
                    if code == NVML_SUCCESS:
                        links[str(link)][name] = int(_field_value(value))
                    elif code in NVML_GONE_CODES:
                        raise _nvml_error(nv, code)
                    # else: this link's counter is not available now (a link down): omitted
        for name, counter in NVLINK_ERROR_COUNTERS.items():
            if f"nvlink_field.{name}" not in g.unsupported:
                continue
            for link in range(count):
                n = self._opt(g, f"nvlink_error.{name}", nv.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
                if n is not None:
                    links[str(link)][name] = int(n)
        links = {link: counters for link, counters in links.items() if counters}
        if not links:
            raise _Unsupported
        return {"nvlink_errors_total": links}

    # ---- STATIC readers ---------------------------------------------------
    def _read_identity(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """name, pci.bus_id (00000000:BB:DD.F), serial, vbios_version, compute_cap, minor number."""
        nv = self._nv
        out: dict[str, Any] = {"name": _text(nv.nvmlDeviceGetName(h))}
        pci = self._opt(g, "identity.pci", nv.nvmlDeviceGetPciInfo, h)
        if pci is not None:
            g.pci_bus_id = _text(pci.busId)
            out["pci_bus_id"] = g.pci_bus_id
        serial = self._opt(g, "identity.serial", nv.nvmlDeviceGetSerial, h)
        if serial:
            out["serial"] = _text(serial)
        vbios = self._opt(g, "identity.vbios", nv.nvmlDeviceGetVbiosVersion, h)
        if vbios:
            out["vbios_version"] = _text(vbios)
        cc = self._opt(g, "identity.cc", nv.nvmlDeviceGetCudaComputeCapability, h)
        if cc is not None:
            out["compute_capability"] = f"{int(cc[0])}.{int(cc[1])}"
        minor = self._opt(g, "identity.minor", nv.nvmlDeviceGetMinorNumber, h)
        if minor is not None:
            out["minor_number"] = int(minor)
        return out

    def _read_thresholds(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetTemperatureThreshold: slowdown, shutdown, GPU max, memory max, °C."""
        nv = self._nv
        out = {}
        for name, threshold in _THRESHOLDS.items():
            celsius = self._opt(g, f"threshold.{name}", nv.nvmlDeviceGetTemperatureThreshold, h, threshold)
            if celsius:  # 0 = not reported
                out[name] = float(celsius)
        if not out:
            raise _Unsupported
        return out

    def _read_max_clocks(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetMaxClockInfo: clocks.max.sm / .mem / .gr, MHz -> Hz."""
        nv = self._nv
        clocks = {}
        for domain, clock_type in _CLOCK_DOMAINS.items():
            mhz = self._opt(g, f"max_clock.{domain}", nv.nvmlDeviceGetMaxClockInfo, h, clock_type)
            if mhz:
                clocks[domain] = float(mhz) * 1e6
        if not clocks:
            raise _Unsupported
        return {"clocks_max_hertz": clocks}

    def _read_pcie_max(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetMaxPcieLinkGeneration / Width: pcie.link.gen.max, pcie.link.width.max."""
        nv = self._nv
        out = {}
        gen = self._opt(g, "pcie.gen_max", nv.nvmlDeviceGetMaxPcieLinkGeneration, h)
        if gen is not None:
            out["pcie_link_generation_max"] = int(gen)
        width = self._opt(g, "pcie.width_max", nv.nvmlDeviceGetMaxPcieLinkWidth, h)
        if width is not None:
            out["pcie_link_width_max"] = int(width)
        if not out:
            raise _Unsupported
        return out

    def _bus_id(self, handle: Any) -> str | None:
        """nvmlDeviceGetPciInfo(handle).busId, or None when it fails."""
        try:
            return _text(self._nv.nvmlDeviceGetPciInfo(handle).busId)
        except Exception as exc:
            log.debug("nvmlDeviceGetPciInfo failed: %s", exc)
            return None

    def _peers(self, g: _Gpu) -> list[_Gpu]:
        with self._lock:
            return [p for i, p in sorted(self._gpus.items()) if i != g.index and p.handle is not None]

    def _p2p_ok(self, h: Any, peer_handle: Any, capability: int) -> bool | None:
        """nvmlDeviceGetP2PStatus for one capability index; None when the call fails.

        Each index is probed on its own: DESIGN.md saw the read index raise an argument
        error with one binding (its NVML_P2P_CAPS_INDEX_READ constant is a tuple), so the
        plain integer is passed and any failure only omits that one capability.
        """
        try:
            return int(self._nv.nvmlDeviceGetP2PStatus(h, peer_handle, capability)) == _P2P_STATUS_OK
        except Exception as exc:
            log.debug("nvmlDeviceGetP2PStatus(capability %d) failed: %s", capability, exc)
            return None

    def _read_p2p(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetP2PStatus per peer and capability read|write|nvlink|atomics (topo -p2p)."""
        peers = self._peers(g)
        if not peers:
            return {}
        statuses = []
        for peer in peers:
            for name, capability in P2P_CAPABILITIES.items():
                ok = self._p2p_ok(h, peer.handle, capability)
                if ok is not None:
                    statuses.append(P2pStatus(peer_index=peer.index, capability=name, ok=ok))
        return {"p2p_status": tuple(statuses)} if statuses else {}

    def _read_topology(self, g: _Gpu, h: Any) -> dict[str, Any]:
        """nvmlDeviceGetTopologyCommonAncestor per peer (nvidia-smi topo -m), "nvlink" when linked.

        A peer counts as reached through NVLink when one of this GPU's links ends at the
        peer's PCI bus id (nvmlDeviceGetNvLinkRemotePciInfo: direct links) or when NVML
        reports P2P over NVLink to it (NVSwitch systems, where links end at switches).
        """
        nv = self._nv
        peers = self._peers(g)
        if not peers:
            return {}
        remote_bus_ids = set()
        for link in range(self._nvlink_count(g)):
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link):
                    remote_bus_ids.add(_norm_bus_id(_text(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)))
            except Exception as exc:
                if _code(exc) in LOST_CODES:
                    raise
                log.debug("GPU %d link %d: remote PCI info failed: %s", g.index, link, exc)
        levels = {}
        for peer in peers:
            peer_bus_id = peer.pci_bus_id
            if peer_bus_id is None:
                peer_bus_id = self._bus_id(peer.handle)
            if peer_bus_id is not None and _norm_bus_id(peer_bus_id) in remote_bus_ids:
                levels[str(peer.index)] = "nvlink"
                continue
            if self._p2p_ok(h, peer.handle, P2P_CAPABILITIES["nvlink"]):
                levels[str(peer.index)] = "nvlink"
                continue
            try:
                level = int(nv.nvmlDeviceGetTopologyCommonAncestor(h, peer.handle))
            except Exception as exc:
                if _code(exc) in LOST_CODES:
                    raise
                log.debug("GPU %d peer %d: topology failed: %s", g.index, peer.index, exc)
                continue
            levels[str(peer.index)] = TOPOLOGY_LEVELS.get(level, f"level_{level}")
        return {"topology_level": levels} if levels else {}

    # ---- internals: events ------------------------------------------------
    def _reset_event_state(self) -> None:
        self._event_set = None
        self._event_handles = {}
        self._event_registered = {}
        self._event_excluded = {}
        self._event_unsupported = set()
        self._events_lost = []

    def _refresh_event_set(self) -> None:
        """Create the event set, or rebuild it when a GPU left out while lost answers again."""
        with self._lock:
            gpus = {i: (g.handle, g.generation, g.confirmed) for i, g in self._gpus.items()}
        if self._event_set is not None:
            returned = [
                i
                for i, gen in self._event_excluded.items()
                if gpus.get(i, (None, 0, False))[0] is not None and gpus[i][2] and gpus[i][1] != gen
            ]
            if not returned:
                return
            log.info("GPU(s) %s answer again: registering them for NVML events", returned)
            _quiet(self._nv.nvmlEventSetFree, self._event_set)
            self._event_set = None
        nv = self._nv
        self._event_set = nv.nvmlEventSetCreate()
        self._event_handles = {}
        self._event_registered = {}
        self._event_excluded = {}
        wanted = EVENT_XID | sum(_EVENT_EXTRA)
        for index, (handle, generation, _confirmed) in sorted(gpus.items()):
            if index in self._event_unsupported:
                continue
            if handle is None:
                self._event_excluded[index] = generation
                continue
            try:
                supported = int(nv.nvmlDeviceGetSupportedEventTypes(handle))
                if not supported & EVENT_XID:
                    log.info("GPU %d does not support XID events; the kernel log is the only XID source", index)
                    self._event_unsupported.add(index)
                    continue
                nv.nvmlDeviceRegisterEvents(handle, wanted & supported, self._event_set)
            except Exception as exc:
                if _code(exc) in LOST_CODES:
                    self._event_excluded[index] = generation
                    log.warning("GPU %d lost; not registered for NVML events: %s", index, exc)
                else:
                    self._event_unsupported.add(index)
                    log.warning("GPU %d cannot be registered for NVML events: %s", index, exc)
                continue
            self._event_handles[_handle_key(handle)] = index
            self._event_registered[index] = generation
            g = self._gpus.get(index)
            if g is not None and g.pci_bus_id is None:
                g.pci_bus_id = self._bus_id(handle)

    def _on_wait_error(self, exc: Exception, timeout_seconds: float) -> list[XidEvent]:
        code = _code(exc)
        if code == NVML_ERROR_TIMEOUT:
            self._event_last_error = None
            return []
        if code in LOST_CODES:
            lost = self._find_lost_registered()
            _quiet(self._nv.nvmlEventSetFree, self._event_set)
            self._event_set = None  # rebuilt on the next call without the lost GPUs
            if lost:
                self._events_lost.extend((i, str(exc)) for i in lost[1:])
                raise GpuLostError(lost[0], str(exc)) from exc
            log.warning("NVML event wait: %s, but every GPU still answers; event set rebuilt", exc)
            return []
        message = f"NVML event wait failed: {exc}"
        if message != self._event_last_error:
            log.warning("%s", message)
            self._event_last_error = message
        self._stop.wait(timeout_seconds)
        return []

    def _find_lost_registered(self) -> list[int]:
        """Registered GPUs that no longer answer (a temperature read returns a lost code)."""
        lost = []
        with self._lock:
            gpus = {i: g for i, g in self._gpus.items() if i in self._event_registered}
        for index, g in sorted(gpus.items()):
            handle = g.handle
            if handle is None:
                lost.append(index)
                continue
            try:
                self._nv.nvmlDeviceGetTemperature(handle, _TEMPERATURE_GPU)
            except Exception as probe_exc:
                if _code(probe_exc) in LOST_CODES:
                    lost.append(index)
                    self._mark_lost(g, str(probe_exc), polling_thread=False)
        return lost

    def _to_xid_event(self, data: Any, now: float) -> XidEvent | None:
        index = self._event_handles.get(_handle_key(data.device))
        if index is None:
            index = _try(lambda: int(self._nv.nvmlDeviceGetIndex(data.device)))
        event_type = int(data.eventType)
        g = self._gpus.get(index) if index is not None else None
        if not event_type & EVENT_XID:
            what = _EVENT_EXTRA.get(event_type, f"event type 0x{event_type:x}")
            log.warning("GPU %s: NVML event: %s (data %d)", index, what, int(data.eventData))
            return None
        xid = int(data.eventData)
        return XidEvent(
            xid=xid,
            timestamp_seconds=now,
            source="nvml",
            gpu_index=index,
            uuid=g.uuid if g is not None else None,
            pci_bus_id=g.pci_bus_id if g is not None else None,
            message=f"NVML XID critical error event: Xid {xid}",
        )


# ---- helpers ---------------------------------------------------------------
def _code(exc: BaseException) -> int | None:
    """The NVML return code of an NVMLError (any binding or fake), else None."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _missing_in_binding(exc: BaseException, nv: Any) -> bool:
    """An AttributeError for a function this pynvml (an older nvidia-ml-py) does not have."""
    return isinstance(exc, AttributeError) and getattr(exc, "obj", None) is nv and nv is not None


def _nvml_error(nv: Any, code: int) -> Exception:
    error_class = getattr(nv, "NVMLError", None)
    if error_class is not None:
        try:
            err = error_class(code)
            if isinstance(err, Exception):
                return err
        except Exception:
            pass
    err = RuntimeError(f"NVML error {code}")
    err.value = code  # type: ignore[attr-defined]
    return err


def _init_message(exc: BaseException) -> str:
    code = _code(exc)
    reasons = {
        NVML_ERROR_LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 not found (is the NVIDIA driver installed?)",
        NVML_ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
        NVML_ERROR_NO_PERMISSION: "no permission to open the NVIDIA devices (/dev/nvidia*)",
        NVML_ERROR_LIB_RM_VERSION_MISMATCH: "libnvidia-ml and the kernel driver differ (driver upgraded without reboot?)",
    }
    reason = reasons.get(code) if code is not None else None
    return f"{reason} [nvmlInit: {exc}]" if reason else f"nvmlInit failed: {exc}"


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").strip("\x00").strip()
    return str(value).strip()


def _norm_bus_id(bus_id: str) -> str:
    """00000000:18:00.0 and 0000:18:00.0 (any case) -> 00000000:18:00.0."""
    bus_id = bus_id.strip().upper()
    domain, sep, rest = bus_id.partition(":")
    if not sep:
        return bus_id
    try:
        return f"{int(domain, 16):08X}:{rest}"
    except ValueError:
        return bus_id


def _cuda_version(value: int) -> str:
    """13000 -> "13.0", 12040 -> "12.4"."""
    return f"{value // 1000}.{value % 1000 // 10}"


def _field_value(value: Any) -> float:
    """The number in a c_nvmlFieldValue_t, by its valueType (NVML_VALUE_TYPE_*)."""
    return float(getattr(value.value, _FIELD_VALUE_ATTRIBUTES.get(int(value.valueType), "uiVal")))


def _function(nv: Any, *names: str) -> Callable[..., Any]:
    """The first of ``names`` the binding has (newer and older spellings)."""
    for name in names:
        fn = getattr(nv, name, None)
        if fn is not None:
            return fn  # type: ignore[no-any-return]
    raise _Unsupported


def _handle_key(handle: Any) -> Any:
    """A hashable identity for an NVML handle (the C pointer value of a ctypes handle)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except Exception:
        return handle if _hashable(handle) else id(handle)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:
        log.debug("NVML call failed: %s", exc)
        return None


def _quiet(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception as exc:
        log.debug("%s failed: %s", getattr(fn, "__name__", fn), exc)
