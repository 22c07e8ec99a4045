"""The NVML backend core: lifecycle, read dispatch, GPUs lost and found again.

The readers live in one module per subsystem (their ``READERS`` tuples are collected by
``registry``); the XID event set lives in ``events``; the error policy (see the package
docstring), liveness and error counting in ``error_policy``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpumon.backends.base import GpuLostError, NvmlUnavailableError
from gpumon.backends.gpm import GpmSampler
from gpumon.backends.nvml import thermal
from gpumon.backends.nvml.codes import NVML_GONE_CODES, code_of, init_message
from gpumon.backends.nvml.error_policy import LIVENESS_READERS, ErrorPolicy
from gpumon.backends.nvml.events import EventWatcher, quiet, try_call
from gpumon.backends.nvml.reader import Context, GpuState, Reader, cuda_version, spaced, text
from gpumon.backends.nvml.registry import collect_readers
from gpumon.model.snapshot import HostSnapshot, Tier
from gpumon.model.xid import XidEvent

log = logging.getLogger(__name__)

SHUTDOWN_WAIT_SECONDS = 0.2
"""How long ``shutdown`` waits for an NVML event wait in progress to end before it leaves NVML as it is."""

Plan = tuple[tuple[tuple[str, Reader], ...], tuple[tuple[str, Reader], ...]]


class NvmlBackend:
    """GpuBackend over NVML. See the package docstring for the error policy.

    ``read`` and the other calls run on the polling thread; ``wait_events`` runs on the
    event thread. NVML itself is thread-safe; the shared state here is guarded by a lock.
    """

    name = "nvml"
    simulated = False
    per_reader_errors = True

    def __init__(
        self,
        pynvml: Any,
        *,
        import_error: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        spaced: bool = False,
    ) -> None:
        """``spaced``: run the costly readers at most every ``ReaderSpec.every_seconds`` (the daemon's
        backend; one-shot readers such as ``gpumon burn`` want every field fresh on every read)."""
        self._nv = pynvml
        self._clock = clock
        self._spaced = spaced
        self._import_error = import_error
        self._lock = threading.Lock()
        self._inited = False
        self._gpus: dict[int, GpuState] = {}
        self._policy = ErrorPolicy(pynvml, self._lock, self._mark_lost)
        self._stop = threading.Event()
        self._readers = collect_readers()
        self._ctx = self._context(GpmSampler(pynvml))
        self._shutdown_pending = False
        """A shutdown was asked under an event wait: NVML is not shut down yet (``init`` finishes it)."""
        self._events = EventWatcher(pynvml, lambda: self._gpus, self._lock, self._mark_lost_from_events, self._stop)

    @classmethod
    def from_system(cls, *, spaced: bool = False, wrap: Callable[[Any], Any] | None = None) -> NvmlBackend:
        """The backend over the installed nvidia-ml-py. A missing module fails at ``init()``.
        ``wrap``: what the backend gets instead of the module, made from it (``gpumon record``'s recorder)."""
        try:
            import pynvml
        except ImportError as exc:
            return cls(None, import_error=str(exc), spaced=spaced)
        return cls(pynvml if wrap is None else wrap(pynvml), spaced=spaced)

    def _context(self, gpm: GpmSampler) -> Context:
        field = getattr(self._nv, "NVML_FI_DEV_MEMORY_TEMP", thermal.FI_DEV_MEMORY_TEMP)
        return Context(
            self._nv,
            gpm,
            self._peers,
            self._policy.record_error,
            int(field),
            self._clock,
            self._spaced,
            getattr(self._nv, "nvmlMemory_v2", None),
        )

    @property
    def _gpm(self) -> GpmSampler:
        return self._ctx.gpm

    @property
    def _event_registered(self) -> dict[int, int]:
        """index -> generation of the GPUs in the current event set (tests/gpu look at it)."""
        return self._events.registered

    # ---- lifecycle --------------------------------------------------------
    def init(self) -> None:
        """nvmlInit once, then find the GPUs. Raises NvmlUnavailableError with a one-line reason."""
        if self._shutdown_pending:
            self.shutdown()  # the one asked under an event wait, if that wait has ended meanwhile
            if self._shutdown_pending:
                raise NvmlUnavailableError("NVML is shut down once an NVML event wait in progress ends (5 s at most)")
        with self._lock:
            if self._inited:
                return
            nv = self._nv
            if nv is None:
                raise NvmlUnavailableError(f"cannot import pynvml (nvidia-ml-py): {self._import_error}")
            try:
                nv.nvmlInit()
            except Exception as exc:
                raise NvmlUnavailableError(init_message(exc)) from None
            try:
                count = int(nv.nvmlDeviceGetCount())
            except Exception as exc:
                quiet(nv.nvmlShutdown)
                raise NvmlUnavailableError(f"nvmlDeviceGetCount failed: {exc}") from None
            gpus: dict[int, GpuState] = {}
            for index in range(count):
                try:
                    handle = nv.nvmlDeviceGetHandleByIndex(index)
                    uuid = text(nv.nvmlDeviceGetUUID(handle))
                    gpus[index] = GpuState(index=index, handle=handle, uuid=uuid)
                except Exception as exc:
                    if code_of(exc) in NVML_GONE_CODES:
                        quiet(nv.nvmlShutdown)
                        raise NvmlUnavailableError(init_message(exc)) from None
                    log.warning("GPU %d does not answer at start: %s", index, exc)
                    gpus[index] = GpuState(index=index, handle=None, uuid=None, confirmed=False, lost_reason=str(exc))
            self._gpus = gpus
            self._policy.reset()
            self._ctx = self._context(GpmSampler(nv))
            self._stop.clear()
            self._inited = True
        log.info("NVML initialised: %d GPU(s)", count)

    def shutdown(self) -> None:
        """Free the event set and GPM samples, then nvmlShutdown. Safe when init failed.

        Never under an event wait in progress (the event thread's, up to 5 s): then it returns at once
        and the event thread shuts NVML down as that wait ends (``init`` fails as NVML unavailable until
        then); a daemon's stop never waits for the wait and leaves the rest to the process's exit."""
        self._stop.set()
        if not self._events.lock.acquire(timeout=SHUTDOWN_WAIT_SECONDS):
            self._shutdown_pending = True
            log.debug("an NVML event wait is in progress: NVML is shut down after it, not under it")
            return
        try:
            self._shut_down()
        finally:
            self._events.lock.release()

    def _shut_down(self) -> None:
        """The shutdown itself; call under the event lock (so never under a wait)."""
        self._shutdown_pending = False
        self._events.close(free=self._inited)
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
            g.uuid = text(self._nv.nvmlDeviceGetUUID(g.handle))
        except Exception as exc:
            raise GpuLostError(index, str(exc)) from exc
        return g.uuid

    def host(self) -> HostSnapshot:
        """Driver version (driver_version), CUDA driver version ("13.0") and NVML version."""
        nv = self._nv
        driver = try_call(lambda: text(nv.nvmlSystemGetDriverVersion()))
        nvml_version = try_call(lambda: text(nv.nvmlSystemGetNVMLVersion()))
        cuda = try_call(lambda: cuda_version(int(nv.nvmlSystemGetCudaDriverVersion_v2())))
        return HostSnapshot(driver_version=driver, cuda_driver_version=cuda, nvml_version=nvml_version)

    def read(self, index: int, tier: Tier) -> Mapping[str, Any]:
        """Fields of ``tier`` for GPU ``index`` in base units; unsupported fields absent.

        Each reader writes its fields into the one dict returned (see ``reader``). Raises
        GpuLostError (GPU gone), NvmlUnavailableError (NVML gone). Other NVML errors leave
        a partial result (the failed reader's fields left out) and an entry for ``take_errors()``.
        """
        g = self._gpus.get(index)  # the usual case without the lock: a GPU that has its handle
        if g is None or g.handle is None or not self._inited:
            g = self._gpu_for_read(index)
        plan = g.plans.get(tier)
        if plan is None:
            plan = self._plan(g, tier)
        liveness, others = plan
        out: dict[str, Any] = {}
        ctx = self._ctx
        h = g.handle  # one handle for the whole read: if the GPU is lost meanwhile, NVML says so
        failed = skipped = 0
        error = ""
        for name, reader in liveness:  # FAST reads only: every GPU answers these (counted below)
            try:
                reader(ctx, g, h, out)
            except Exception as exc:
                self._policy.reader_failed(g, tier, name, exc)
                if name in g.unsupported:  # an unsupported reader proves nothing either way
                    skipped += 1
                else:
                    failed += 1
                    error = error or f"{name}: {exc}"
        if failed or skipped:
            self._policy.count_liveness(g, len(liveness) - failed - skipped, failed, error)
        elif g.liveness_failures and liveness:
            g.liveness_failures = 0
        for name, reader in others:  # _run, written out: this runs every second for every GPU
            try:
                reader(ctx, g, h, out)
            except Exception as exc:
                self._policy.reader_failed(g, tier, name, exc)
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
        return self._policy.take()

    def read_errors(self) -> dict[tuple[int, str, str], int]:
        """Reader errors since init by (GPU index, UUID, reader name), cumulative (never reset).

        Exported as ``gpumon_read_errors_total{gpu, uuid, reader}``: which fields of which GPU
        failed (UNKNOWN, TIMEOUT, ...) and how often, without marking the GPU lost.
        """
        with self._lock:
            counts = dict(self._policy.by_reader)
            uuids = {i: g.uuid or "" for i, g in self._gpus.items()}
        return {(index, uuids.get(index, ""), name): n for (index, name), n in counts.items()}

    def gpm_supported(self, index: int) -> bool | None:
        """Whether GPU ``index`` offers NVML GPM profiling metrics; None until a read probed it."""
        return self._gpm.supported(index)

    def read_group(self, index: int, name: str) -> dict[str, Any]:
        """Run one reader group alone (for benchmarks and debugging): the fields it writes, in a dict
        of their own; same rules as ``read``."""
        g = self._gpu_for_read(index)
        for tier, specs in self._readers.items():
            for spec in specs:
                if spec.name == name:
                    out: dict[str, Any] = {}
                    if name not in g.unsupported:
                        self._run(g, tier, ((name, spec.read),), out)
                    return out
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
        if not self._events.lock.acquire(timeout=timeout_seconds):
            return []
        try:
            if not self._inited or self._stop.is_set():
                self._stop.wait(timeout_seconds)
                return []
            return self._events.wait(timeout_seconds)
        finally:
            if self._shutdown_pending:  # asked under this very wait: done now that it has ended
                self._shut_down()
            self._events.lock.release()

    # ---- internals: GPUs and readers ---------------------------------------
    def _gpu(self, index: int) -> GpuState:
        with self._lock:
            if not self._inited:
                raise NvmlUnavailableError("the NVML backend is not initialised")
            g = self._gpus.get(index)
        if g is None:
            raise IndexError(f"no GPU with index {index} (NVML sees {len(self._gpus)})")
        return g

    def _gpu_for_read(self, index: int) -> GpuState:
        """The GPU's state, re-acquiring the handle of a GPU that was lost."""
        g = self._gpu(index)
        if g.handle is not None:
            return g
        nv = self._nv
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            uuid = text(nv.nvmlDeviceGetUUID(handle))
        except Exception as exc:
            if code_of(exc) in NVML_GONE_CODES:
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

    def _peers(self, g: GpuState) -> list[GpuState]:
        with self._lock:
            return [p for i, p in sorted(self._gpus.items()) if i != g.index and p.handle is not None]

    def _mark_lost(self, g: GpuState, reason: str, *, polling_thread: bool = True) -> None:
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

    def _mark_lost_from_events(self, g: GpuState, reason: str) -> None:
        self._mark_lost(g, reason, polling_thread=False)

    def _plan(self, g: GpuState, tier: Tier) -> Plan:
        """The readers of ``tier`` still asked on ``g``: (liveness readers, the others), each (name, reader).

        Kept in ``g.plans`` until a reader turns out unsupported. Only FAST reads check liveness;
        their liveness readers run first.
        """
        readers = [
            (spec.name, spaced(spec) if self._spaced and spec.every_seconds else spec.read)
            for spec in self._readers.get(tier, ())
            if spec.name not in g.unsupported
        ]
        live = tuple(r for r in readers if r[0] in LIVENESS_READERS) if tier is Tier.FAST else ()
        plan = (live, tuple(r for r in readers if r not in live))
        g.plans[tier] = plan
        return plan

    def _run(self, g: GpuState, tier: Tier, readers: Iterable[tuple[str, Reader]], out: dict[str, Any]) -> None:
        """Run ``readers`` on ``g``, each writing its fields into ``out``; each failure is sorted by
        _reader_failed (a reader that raised wrote nothing)."""
        ctx = self._ctx
        h = g.handle  # one handle for the whole read: if the GPU is lost meanwhile, NVML says so
        for name, reader in readers:
            try:
                reader(ctx, g, h, out)
            except Exception as exc:
                self._policy.reader_failed(g, tier, name, exc)
