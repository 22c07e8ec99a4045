"""A poll that does not return, as the daemon's verdict sees it: the GPU whose read hangs is CRITICAL, a
reading grown old for another reason cannot be judged (UNKNOWN), never OK.

The daemon's poll reads every GPU in turn on one thread; a read that never returns (a GPU fallen off the
bus, a driver that does not answer) keeps that thread inside the backend, and the latest snapshot grows
old. DCGM and NVSentinel treat an unresponsive device or library as a failure; so does gpumon: once the
poll has been inside the backend for longer than the hang bound (the daemon's ``stale_after_seconds``,
5 × ``interval_seconds`` by default, the age at which ``/ready`` fails too), the GPU it was reading is
CRITICAL (``nvml_hang``, reboot the node), or the node when it was inside no GPU's read (NVML's
initialisation, the host's figures).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpumon.model.findings import CRITICAL, UNKNOWN, Finding
from gpumon.model.snapshot import Snapshot


@dataclass(frozen=True)
class PollProgress:
    """Where the daemon's poll is now (gpumon.collect.poller.Poller.progress)."""

    running_since_seconds: float | None
    """When the poll in progress started (monotonic seconds); None between polls."""
    gpu_index: int | None
    """The GPU whose read the poll is inside; None outside every GPU's read."""


IDLE = PollProgress(None, None)


def hang_findings(
    snapshot: Snapshot | None, progress: PollProgress, now_monotonic: float, hang_after_seconds: float
) -> list[Finding]:
    """``nvml_hang`` (CRITICAL) when the poll in progress has been inside the backend for more than
    ``hang_after_seconds``; ``stale_reading`` (UNKNOWN) when no poll runs and the latest snapshot is older
    than that (the poll job stopped); else nothing (a poll in progress is at most one interval behind)."""
    since = progress.running_since_seconds
    if since is not None:  # a poll runs: judged by how long it has been inside the backend
        if now_monotonic - since > hang_after_seconds:
            return [_hung(snapshot, progress.gpu_index, now_monotonic - since, hang_after_seconds)]
        return []
    if snapshot is None:
        return []  # no reading yet: gpumon.health.gpu_state says so (no_data)
    age = now_monotonic - snapshot.monotonic_seconds
    if age <= hang_after_seconds:
        return []
    return [
        Finding(
            kind="stale_reading",
            severity=UNKNOWN,
            action="none",
            summary=f"the latest GPU reading is {age:.0f} s old (more than {hang_after_seconds:g} s) and no poll "
            "is running: gpumon cannot judge the GPUs now",
            evidence={"age_seconds": round(age, 1), "limit_seconds": hang_after_seconds},
        )
    ]


def _hung(snapshot: Snapshot | None, gpu: int | None, seconds: float, limit_seconds: float) -> Finding:
    evidence: dict[str, object] = {"hung_seconds": round(seconds, 1), "limit_seconds": limit_seconds}
    if gpu is None:
        return Finding(
            kind="nvml_hang",
            severity=CRITICAL,
            action="reboot_node",
            summary=f"the NVIDIA driver has not answered gpumon's poll for more than {limit_seconds:g} s",
            evidence=evidence,
        )
    uuid = next((g.uuid for g in snapshot.gpus if g.index == gpu), None) if snapshot is not None else None
    return Finding(
        kind="nvml_hang",
        severity=CRITICAL,
        action="reboot_node",
        summary=f"does not answer: a read has not returned for more than {limit_seconds:g} s (nvml_hang)",
        gpu=gpu,
        uuid=uuid,
        evidence=evidence,
    )


@dataclass(frozen=True)
class PollWatch:
    """The daemon's poll as the health service watches it (built by gpumon.daemon)."""

    progress: Callable[[], PollProgress]
    hang_after_seconds: Callable[[], float]
    """The hang bound now, in seconds (the daemon's ``stale_after_seconds``, which SIGHUP may change)."""
    monotonic: Callable[[], float]

    def findings(self, snapshot: Snapshot | None) -> list[Finding]:
        return hang_findings(snapshot, self.progress(), self.monotonic(), self.hang_after_seconds())
