"""Compute processes on the GPU (fast tier)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpumon.model.fields.spec import Metric, Sample, Tier, declare


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
    launcher_pid: int | None = None
    """The process that launched this one as part of one job (/proc/PID/stat): its parent, or the
    process itself when its parent is a session leader (a login shell, tmux, a systemd service) or
    init. The ranks of a torchrun or multiprocessing job share it; jobs started one by one from a
    shell do not. None when /proc does not say (the stragglers then group the GPU with the host)."""
    state: str | None = None
    """The process's state letter this poll, field 3 of /proc/PID/stat (``R`` running, ``S`` sleeping, ``D``
    uninterruptible sleep, ``Z`` zombie...); None when /proc does not say."""

    @property
    def job_claim(self) -> tuple[str, str] | None:
        """The job the system places this process in, the outermost claim first: ``("slurm_job", id)``,
        ``("pod", uid)`` or ``("container", id)``; None when none does. Energy per owner and the
        straggler groups both start from it, so a process is one job's to both."""
        if self.slurm_job_id:
            return ("slurm_job", self.slurm_job_id)
        if self.pod_uid:
            return ("pod", self.pod_uid)
        if self.container_id:
            return ("container", self.container_id)
        return None


def _count(processes: tuple[ProcessSnapshot, ...]) -> Iterable[Sample]:
    return [((), float(len(processes)))]


def _memory(processes: tuple[ProcessSnapshot, ...]) -> Iterable[Sample]:
    known = [p.used_memory_bytes for p in processes if p.used_memory_bytes is not None]
    return [((), float(sum(known)))]


@dataclass(frozen=True)
class ProcessFields:
    processes: tuple[ProcessSnapshot, ...] | None = declare(
        Tier.FAST,
        "Compute processes (nvidia-smi --query-compute-apps)",
        nvml="nvmlDeviceGetComputeRunningProcesses (usedGpuMemory None / 2⁶⁴−1 → None);"
        " nvmlDeviceGetProcessUtilization(last timestamp) for smUtil, at most every 5 s and at once for a new pid"
        " (1.7–2.7 ms of CPU a call on an H200; the share is kept between calls)",
        conversion="bytes; % / 100",
        smi="`--query-compute-apps=pid,used_memory`; `pmon`",
        metric=(
            Metric(
                "gpumon_processes",
                "gauge",
                "Compute processes on the GPU (nvidia-smi --query-compute-apps).",
                samples=_count,
            ),
            Metric(
                "gpumon_process_memory_bytes",
                "gauge",
                "GPU memory held by compute processes, bytes (sum of nvidia-smi used_memory).",
                samples=_memory,
            ),
        ),
        fake=(),
    )
