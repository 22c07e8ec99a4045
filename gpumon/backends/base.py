"""The backend protocol and the errors a backend may raise.

A backend reads one tier of fields for one GPU and returns them as a plain dict of
``GpuSnapshot`` field names to values in base units. A field the GPU does not support
is simply absent from the dict (the backend remembers that and does not ask again).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gpumon.model.snapshot import HostSnapshot, Tier
from gpumon.model.xid import XidEvent


class BackendError(Exception):
    """Base class of backend errors."""


class NvmlUnavailableError(BackendError):
    """NVML (libnvidia-ml.so) or the driver is missing or failed to initialise."""


class ScenarioError(ValueError):
    """A fake backend's scenario is not valid; ``problems`` lists every reason, one line each.
    Here, not in gpumon.backends.scenario, so that a command can catch it without importing the
    fake backend (a real host's daemon never loads it)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class GpuLostError(BackendError):
    """The GPU no longer answers: NVML says so (GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND, fallen off the
    bus) or its liveness reads keep failing. One field answering UNKNOWN is that field's error, not this."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"GPU {index} lost: {reason}")
        self.index = index
        self.reason = reason


class GpuBackend(Protocol):
    """What the poller needs from a source of GPU readings.

    ``init`` is called once (and again after ``NvmlUnavailableError``, with backoff);
    every other call happens on the polling thread only, after a successful ``init``.
    """

    name: str
    simulated: bool
    """Whether the GPUs are made up (the fake backend's scenarios), not this host's: none of the host's own
    evidence is theirs (its kernel log's XIDs, its /sys PCIe devices, the UUIDs CUDA gives), their XIDs
    come from ``wait_events`` alone, and the daemon marks them ``gpumon_simulated``. What a command asks
    instead of the backend's name."""
    per_reader_errors: bool
    """Whether one reader group of a read can fail alone (NVML: yes; the fake: a scripted read fails
    whole). The daemon exports ``read_errors()`` as ``gpumon_read_errors_total`` only when it can."""

    def init(self) -> None:
        """Load NVML / the scenario; raise NvmlUnavailableError when it cannot."""

    def shutdown(self) -> None:
        """Release NVML. Safe to call when init failed."""

    def device_count(self) -> int:
        """Number of GPUs seen at init."""

    def uuid(self, index: int) -> str:
        """The GPU's UUID (GPU-xxxxxxxx-...). May raise GpuLostError."""

    def host(self) -> HostSnapshot:
        """Driver and CUDA driver versions (psutil figures are added by the poller)."""

    def read(self, index: int, tier: Tier) -> Mapping[str, Any]:
        """Fields of ``tier`` for GPU ``index``; unsupported fields are absent.

        Raises GpuLostError when the GPU is gone, NvmlUnavailableError when the driver
        itself went away (the poller re-initialises); any other exception is a bug or a
        transient NVML error that the poller logs, counts and survives.
        """

    def wait_events(self, timeout_seconds: float) -> list[XidEvent]:
        """Block up to ``timeout_seconds`` for XID (and other critical) events on any GPU.

        Called from the event thread only (NVML allows that one extra caller). Returns
        the events seen, possibly none. Raises GpuLostError for a GPU lost inside the
        wait (the caller reports it and keeps waiting for the other GPUs).
        """

    def take_errors(self) -> dict[str, int]:
        """Errors survived inside reads since the last call, by tier value ("fast", "slow", "static"); then reset.

        One reader group failing leaves its fields out of the read without failing it; the
        poller adds these counts to its per-tier poll errors once per poll. {} when none.
        """

    def read_errors(self) -> dict[tuple[int, str, str], int]:
        """Those errors since init by (GPU index, UUID, reader name), cumulative (never reset).

        Exported as ``gpumon_read_errors_total{gpu, uuid, reader}``.
        """
