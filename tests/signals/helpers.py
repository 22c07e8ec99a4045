"""Snapshots for the early-signal tests: busy GPUs by default, one poll a second."""

from __future__ import annotations

from typing import Any

from gpumon.model.snapshot import GpuSnapshot, ProcessSnapshot, Snapshot

GHZ = 1e9


def gpu(index: int, **values: Any) -> GpuSnapshot:
    base: dict[str, Any] = {
        "name": "NVIDIA H200",
        "utilization_ratio": 0.97,
        "clocks_hertz": {"sm": 1.98 * GHZ},
        "power_watts": 640.0,
        "power_limit_watts": 700.0,
        "clock_events_active": {},
    }
    base.update(values)
    return GpuSnapshot(index=index, uuid=f"GPU-{index}", **base)


def proc(pid: int, share: float | None, memory: int = 1 << 30, job: str | None = None) -> ProcessSnapshot:
    return ProcessSnapshot(pid=pid, used_memory_bytes=memory, sm_utilization_ratio=share, slurm_job_id=job)


def snap(t: float, *gpus: GpuSnapshot) -> Snapshot:
    return Snapshot(timestamp_seconds=t, monotonic_seconds=t, nvml_up=True, gpus=tuple(gpus))
