"""Silent zeros in profiling: a busy GPU whose GPM counters read 0, or stop changing, is a finding
(NVIDIA/dcgm-exporter#662: profiling metrics at 0 while the GPU was 99 % busy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpumon.health.config import HealthConfig
from gpumon.health.profiling_stuck import WINDOW_SECONDS, StuckProfiling
from gpumon.health.service import HealthService
from gpumon.model.findings import WARNING
from gpumon.model.snapshot import GpuSnapshot, HostSnapshot, Snapshot
from gpumon.model.xid_catalog import XidCatalog

T0 = 1_800_000_000.0


def gpu(index: int, utilization: float | None, sm: float | None, **gpm: float) -> GpuSnapshot:
    values: dict[str, Any] = {"sm_occupancy_ratio": 0.0, "tensor_active_ratio": 0.0, "dram_active_ratio": 0.0}
    values.update(gpm)
    return GpuSnapshot(
        index=index, uuid=f"GPU-{index}", up=True, utilization_ratio=utilization, sm_active_ratio=sm, **values
    )


def snap(at: float, *gpus: GpuSnapshot) -> Snapshot:
    return Snapshot(timestamp_seconds=at, monotonic_seconds=at - T0, nvml_up=True, host=HostSnapshot(), gpus=gpus)


def play(detector: StuckProfiling, seconds: float, step: float, make: Any) -> float:
    t = T0
    while t <= T0 + seconds:
        detector.observe(snap(t, *make(t)))
        t += step
    return t - step


def moving(t: float) -> float:
    return round(0.5 + 0.4 * ((t - T0) % 90) / 90, 3)


def test_gpm_at_zero_while_busy_for_the_window_is_a_finding_naming_the_gpu() -> None:
    detector = StuckProfiling()
    end = play(
        detector,
        WINDOW_SECONDS + 30,
        10,
        lambda t: [
            gpu(0, 0.99, 0.0),  # busy, counters at 0: stuck
            gpu(1, 0.99, moving(t), tensor_active_ratio=moving(t) / 2, dram_active_ratio=0.3),  # busy, counters live
            gpu(2, 0.02, 0.0),  # idle: 0 is right
        ],
    )
    found = detector.findings(end)
    assert [(f.gpu, f.severity, f.kind, f.action) for f in found] == [(0, WARNING, "profiling_stuck", "none")]
    assert "stuck at 0" in found[0].summary


def test_counters_that_stop_changing_while_busy_are_a_finding() -> None:
    detector = StuckProfiling()
    end = play(detector, WINDOW_SECONDS + 30, 10, lambda t: [gpu(0, 0.97, 0.42, tensor_active_ratio=0.31)])
    assert [f.summary.split(" while")[0] for f in detector.findings(end)] == ["profiling counters not changing"]


def test_no_finding_before_a_full_window_nor_when_the_gpu_was_idle_once_nor_without_gpm() -> None:
    short = StuckProfiling()
    end = play(short, WINDOW_SECONDS / 2, 10, lambda t: [gpu(0, 0.99, 0.0)])
    assert short.findings(end) == []
    rested = StuckProfiling()
    end = play(rested, WINDOW_SECONDS + 30, 10, lambda t: [gpu(0, 0.99 if t - T0 != 120 else 0.1, 0.0)])
    assert rested.findings(end) == []
    no_gpm = StuckProfiling()
    end = play(no_gpm, WINDOW_SECONDS + 30, 10, lambda t: [gpu(0, 0.99, None)])
    assert no_gpm.findings(end) == []


def test_the_verdict_shows_it(tmp_path: Path) -> None:
    clock = [T0]
    service = HealthService(
        tmp_path, XidCatalog.load(), HealthConfig(sysfs_root=tmp_path / "sys"), clock=lambda: clock[0]
    )
    t = T0
    while t <= T0 + WINDOW_SECONDS + 30:
        clock[0] = t
        service.on_snapshot(snap(t, gpu(0, 0.99, 0.0)))
        t += 10
    report = service.report()
    assert report.status == WARNING
    assert [f.kind for f in report.findings if f.gpu == 0] == ["profiling_stuck"]
