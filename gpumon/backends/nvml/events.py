"""XID critical-error events through one NVML event set (the event thread's side of the backend)."""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpumon.backends.base import GpuLostError
from gpumon.backends.nvml.codes import LOST_CODES, NVML_ERROR_TIMEOUT, code_of
from gpumon.backends.nvml.reader import GpuState
from gpumon.backends.nvml.thermal import TEMPERATURE_GPU
from gpumon.backends.nvml.topology import bus_id
from gpumon.model.xid import XidEvent

log = logging.getLogger(__name__)

EVENT_XID = 0x8  # nvmlEventTypeXidCriticalError
EVENT_EXTRA = {  # other types registered where supported; logged, not returned
    0x2: "double-bit ECC error",  # nvmlEventTypeDoubleBitEccError
    0x800: "DRAM retirement failure",  # nvmlEventTypeDramRetirementFailure
}
MAX_EVENTS_PER_WAIT = 64


class EventWatcher:
    """The NVML event set over every GPU, used from the event thread only (under ``self.lock``).

    ``gpus`` gives the backend's GPU states (read under the backend's ``state_lock``);
    ``mark_lost`` tells the backend a registered GPU stopped answering.
    """

    def __init__(
        self,
        nv: Any,
        gpus: Callable[[], dict[int, GpuState]],
        state_lock: threading.Lock,
        mark_lost: Callable[[GpuState, str], None],
        stop: threading.Event,
    ) -> None:
        self._nv = nv
        self._gpus = gpus
        self._state_lock = state_lock
        self._mark_lost = mark_lost
        self._stop = stop
        self.lock = threading.Lock()
        self._event_set: Any | None = None
        self._handles: dict[Any, int] = {}
        self.registered: dict[int, int] = {}
        """index -> generation registered in the current event set."""
        self._excluded: dict[int, int] = {}
        """index -> generation that could not be registered because the GPU was lost."""
        self._unsupported: set[int] = set()
        self._lost: list[tuple[int, str]] = []
        self._last_error: str | None = None

    def close(self, free: bool) -> None:
        """Forget the event set (freeing it when ``free``: NVML still initialised). Call under ``lock``."""
        if free and self._event_set is not None:
            quiet(self._nv.nvmlEventSetFree, self._event_set)
        self._event_set = None
        self._handles = {}
        self.registered = {}
        self._excluded = {}
        self._unsupported = set()
        self._lost = []

    def wait(self, timeout_seconds: float) -> list[XidEvent]:
        """One wait of up to ``timeout_seconds`` (see NvmlBackend.wait_events). Call under ``lock``."""
        if self._lost:
            index, reason = self._lost.pop(0)
            raise GpuLostError(index, reason)
        self._refresh()
        if self._event_set is None or not self.registered:
            self._stop.wait(timeout_seconds)
            return []
        try:
            first = self._nv.nvmlEventSetWait_v2(self._event_set, int(timeout_seconds * 1000))
        except Exception as exc:
            return self._on_wait_error(exc, timeout_seconds)
        received = [first]
        while len(received) < MAX_EVENTS_PER_WAIT:  # drain a burst without waiting
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

    def _refresh(self) -> None:
        """Create the event set, or rebuild it when a GPU left out while lost answers again."""
        with self._state_lock:
            gpus = {i: (g.handle, g.generation, g.confirmed) for i, g in self._gpus().items()}
        if self._event_set is not None:
            returned = [
                i
                for i, gen in self._excluded.items()
                if gpus.get(i, (None, 0, False))[0] is not None and gpus[i][2] and gpus[i][1] != gen
            ]
            if not returned:
                return
            log.info("GPU(s) %s answer again: registering them for NVML events", returned)
            quiet(self._nv.nvmlEventSetFree, self._event_set)
            self._event_set = None
        nv = self._nv
        self._event_set = nv.nvmlEventSetCreate()
        self._handles = {}
        self.registered = {}
        self._excluded = {}
        wanted = EVENT_XID | sum(EVENT_EXTRA)
        for index, (handle, generation, _confirmed) in sorted(gpus.items()):
            if index in self._unsupported:
                continue
            if handle is None:
                self._excluded[index] = generation
                continue
            try:
                supported = int(nv.nvmlDeviceGetSupportedEventTypes(handle))
                if not supported & EVENT_XID:
                    log.info("GPU %d does not support XID events; the kernel log is the only XID source", index)
                    self._unsupported.add(index)
                    continue
                nv.nvmlDeviceRegisterEvents(handle, wanted & supported, self._event_set)
            except Exception as exc:
                if code_of(exc) in LOST_CODES:
                    self._excluded[index] = generation
                    log.warning("GPU %d lost; not registered for NVML events: %s", index, exc)
                else:
                    self._unsupported.add(index)
                    log.warning("GPU %d cannot be registered for NVML events: %s", index, exc)
                continue
            self._handles[handle_key(handle)] = index
            self.registered[index] = generation
            g = self._gpus().get(index)
            if g is not None and g.pci_bus_id is None:
                g.pci_bus_id = bus_id(nv, handle)

    def _on_wait_error(self, exc: Exception, timeout_seconds: float) -> list[XidEvent]:
        code = code_of(exc)
        if code == NVML_ERROR_TIMEOUT:
            self._last_error = None
            return []
        if code in LOST_CODES:
            lost = self._find_lost_registered()
            quiet(self._nv.nvmlEventSetFree, self._event_set)
            self._event_set = None  # rebuilt on the next call without the lost GPUs
            if lost:
                self._lost.extend((i, str(exc)) for i in lost[1:])
                raise GpuLostError(lost[0], str(exc)) from exc
            log.warning("NVML event wait: %s, but every GPU still answers; event set rebuilt", exc)
            return []
        message = f"NVML event wait failed: {exc}"
        if message != self._last_error:
            log.warning("%s", message)
            self._last_error = message
        self._stop.wait(timeout_seconds)
        return []

    def _find_lost_registered(self) -> list[int]:
        """Registered GPUs that no longer answer (a temperature read returns a lost code)."""
        lost = []
        with self._state_lock:
            gpus = {i: g for i, g in self._gpus().items() if i in self.registered}
        for index, g in sorted(gpus.items()):
            handle = g.handle
            if handle is None:
                lost.append(index)
                continue
            try:
                self._nv.nvmlDeviceGetTemperature(handle, TEMPERATURE_GPU)
            except Exception as probe_exc:
                if code_of(probe_exc) in LOST_CODES:
                    lost.append(index)
                    self._mark_lost(g, str(probe_exc))
        return lost

    def _to_xid_event(self, data: Any, now: float) -> XidEvent | None:
        index = self._handles.get(handle_key(data.device))
        if index is None:
            index = try_call(lambda: int(self._nv.nvmlDeviceGetIndex(data.device)))
        event_type = int(data.eventType)
        g = self._gpus().get(index) if index is not None else None
        if not event_type & EVENT_XID:
            what = EVENT_EXTRA.get(event_type, f"event type 0x{event_type:x}")
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


def handle_key(handle: Any) -> Any:
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


def try_call(fn: Callable[[], Any]) -> Any:
    """``fn()``, or None (logged at debug) when it raises."""
    try:
        return fn()
    except Exception as exc:
        log.debug("NVML call failed: %s", exc)
        return None


def quiet(fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)``, its failure logged at debug only."""
    try:
        fn(*args)
    except Exception as exc:
        log.debug("%s failed: %s", getattr(fn, "__name__", fn), exc)
