"""The error policy of a read (the package docstring words it): a reader's exception sorted, liveness, counts.

A reader that raised is either absent on that GPU (remembered, never asked again), proof that
the GPU is lost or that NVML is gone (raised), or that reader's error: logged (a warning the
first time per GPU and reader) and counted per tier (``take``) and per GPU and reader
(``by_reader``). A FAST read whose liveness readers all failed counts towards the GPU's loss.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from gpumon.backends.base import GpuLostError, NvmlUnavailableError
from gpumon.backends.nvml.codes import (
    LOST_CODES,
    NVML_GONE_CODES,
    UNSUPPORTED_CODES,
    Unsupported,
    code_of,
    missing_in_binding,
)
from gpumon.backends.nvml.reader import GpuState
from gpumon.model.snapshot import Tier

log = logging.getLogger(__name__)
"""The logger name these log lines have always carried (they lived in core.py)."""

LIVENESS_READERS = frozenset({"memory", "utilization"})
"""FAST readers whose calls (nvmlDeviceGetMemoryInfo, nvmlDeviceGetUtilizationRates) every GPU answers."""
LIVENESS_FAILURES_LOST = 3
"""FAST reads in a row in which every liveness reader failed that make a GPU lost."""


class ErrorPolicy:
    """Sorts the failures of one backend's readers and counts its readers' errors.

    ``lock``: the backend's lock, which guards the counts; ``mark_lost``: drops a GPU's handle
    (called from the polling thread) before GpuLostError is raised for it."""

    def __init__(self, pynvml: Any, lock: threading.Lock, mark_lost: Callable[[GpuState, str], None]) -> None:
        self._nv = pynvml
        self._lock = lock
        self._mark_lost = mark_lost
        self._by_tier: Counter[str] = Counter()
        self.by_reader: Counter[tuple[int, str]] = Counter()
        """Reader errors since init by (GPU index, reader name), cumulative; read under the lock."""

    def reset(self) -> None:
        """Forget every count (a new init); called under the lock."""
        self._by_tier = Counter()
        self.by_reader = Counter()

    def take(self) -> dict[str, int]:
        """Reader errors since the last call, counted by tier; then reset."""
        if not self._by_tier:  # the usual case, every poll: no lock, no new Counter
            return {}
        with self._lock:
            errors, self._by_tier = self._by_tier, Counter()
        return dict(errors)

    def count_liveness(self, g: GpuState, answered: int, failed: int, error: str) -> None:
        """After a FAST read's liveness readers, some of which failed or are unsupported: when none
        answered and one failed, LIVENESS_FAILURES_LOST such reads in a row (or one, while the GPU is
        not yet confirmed after a loss) make the GPU lost; when one answered, the count starts again."""
        if failed and not answered:
            self._liveness_failed(g, error)
        elif answered and g.liveness_failures:
            g.liveness_failures = 0

    def _liveness_failed(self, g: GpuState, error: str) -> None:
        """Count a FAST read whose liveness reads all failed; raise GpuLostError at the limit."""
        g.liveness_failures += 1
        if g.liveness_failures >= LIVENESS_FAILURES_LOST or not g.confirmed:
            reason = f"{error} ({g.liveness_failures} read(s) in a row without an answer to its liveness reads)"
            self._mark_lost(g, reason)
            raise GpuLostError(g.index, reason)

    def reader_failed(self, g: GpuState, tier: Tier, name: str, exc: Exception) -> None:
        """Sort a reader's exception: unsupported (remember), lost / NVML gone (raise), else count it."""
        if isinstance(exc, Unsupported):
            self._unsupported(g, name)
            log.debug("GPU %d: %s not supported; not asked again", g.index, name)
            return
        code = code_of(exc)
        if code in LOST_CODES:
            self._mark_lost(g, str(exc))
            raise GpuLostError(g.index, str(exc)) from exc
        if code in NVML_GONE_CODES:
            raise NvmlUnavailableError(f"NVML went away: {exc}") from exc
        if code in UNSUPPORTED_CODES:
            self._unsupported(g, name)
            log.debug("GPU %d: %s not supported (%s); not asked again", g.index, name, exc)
            return
        if missing_in_binding(exc, self._nv):
            self._unsupported(g, name)
            log.info("GPU %d: %s omitted: this nvidia-ml-py has no %s", g.index, name, getattr(exc, "name", "?"))
            return
        self.record_error(g, tier, name, exc)

    @staticmethod
    def _unsupported(g: GpuState, name: str) -> None:
        """Remember that ``g`` lacks reader ``name``; its tier's plan is rebuilt without it."""
        g.unsupported.add(name)
        g.plans = {}

    def record_error(self, g: GpuState, tier: Tier, name: str, exc: Exception) -> None:
        """Keep a reader's error for take(); warn the first time per GPU and reader."""
        message = f"GPU {g.index} {name}: {type(exc).__name__}: {exc}"
        if name not in g.warned:
            g.warned.add(name)
            log.warning("%s (fields omitted; logged once, counted each time)", message)
        else:
            log.debug("%s", message)
        with self._lock:
            self._by_tier[tier.value] += 1
            self.by_reader[(g.index, name)] += 1
