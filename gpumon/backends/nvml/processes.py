"""Compute processes on a GPU: pid, memory used, SM share.

The pids and their memory are read every fast poll (nvmlDeviceGetComputeRunningProcesses: 10–30 µs
on an H200). The SM share (nvmlDeviceGetProcessUtilization) costs 1.7–2.7 ms of CPU a call on an
H200, the driver spinning, so it is read at most every PROCESS_UTILIZATION_SECONDS, and at once
when a pid appears that the last read did not see; between reads each pid keeps its share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumon.backends.nvml.codes import (
    LOST_CODES,
    NVML_ERROR_NOT_FOUND,
    NVML_GONE_CODES,
    NVML_SUCCESS,
    UNSUPPORTED_CODES,
    code_of,
)
from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec
from gpumon.model.snapshot import ProcessSnapshot, Tier

VALUE_NOT_AVAILABLE = 2**64 - 1
PROCESS_UTILIZATION_SECONDS = 5.0
"""Shortest time between two nvmlDeviceGetProcessUtilization calls on one GPU, unless a new pid appears."""
_FATAL_CODES = LOST_CODES | NVML_GONE_CODES


def read_processes(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetComputeRunningProcesses (pid, used_memory bytes) plus per-process SM share.

    The SM share comes from nvmlDeviceGetProcessUtilization (samples newer than the last
    seen timestamp; NOT_FOUND = no new samples), read as the module docstring says; its error
    is counted as the reader ``process_utilization`` and leaves the share out. Name, user and
    cgroup are added elsewhere.
    """
    procs = ctx.nv.nvmlDeviceGetComputeRunningProcesses(h)
    if not procs:
        out["processes"] = ()
        return
    sm_share = _shares_now(ctx, g, h, frozenset(int(p.pid) for p in procs))
    snapshots = []
    for p in procs:
        pid = int(p.pid)
        used = p.usedGpuMemory
        used_bytes = None if used is None or int(used) >= VALUE_NOT_AVAILABLE else int(used)
        snapshots.append(ProcessSnapshot(pid=pid, used_memory_bytes=used_bytes, sm_utilization_ratio=sm_share.get(pid)))
    out["processes"] = tuple(snapshots)


def _shares_now(ctx: Context, g: GpuState, h: Any, pids: frozenset[int]) -> Mapping[int, float]:
    """The SM share per pid: from a new nvmlDeviceGetProcessUtilization call when one is due, else the last."""
    now = ctx.clock()
    due = (
        g.process_util_read_at is None
        or now - g.process_util_read_at >= PROCESS_UTILIZATION_SECONDS
        or not pids <= g.process_util_pids
    )
    if not due:
        return g.process_shares
    g.process_util_read_at, g.process_util_pids, g.process_shares = now, pids, {}
    try:
        g.process_shares = _process_sm_share(ctx, g, h)
    except Exception as exc:
        if code_of(exc) in _FATAL_CODES:
            raise
        ctx.record_error(g, Tier.FAST, "process_utilization", exc)
    return g.process_shares


def _process_sm_share(ctx: Context, g: GpuState, h: Any) -> dict[int, float]:
    if "process_utilization" in g.unsupported:
        return {}
    try:
        samples = ctx.nv.nvmlDeviceGetProcessUtilization(h, g.process_util_timestamp)
    except Exception as exc:
        code = code_of(exc)
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


READERS = (ReaderSpec("processes", Tier.FAST, read_processes),)
