"""Stragglers on shared hosts: GPUs are grouped by what runs together (the Slurm job, pod or
container, else the process that launched the job's processes), the busy GPUs of a group are
compared, and an idle or differently loaded GPU never hides or fakes a straggler.

Each shape runs on simulated GPUs, one snapshot a second, with a 60 s window: a cause starts at
second 30 and stops at second 150, and the test gives the time to detection, the time to clear
and the false findings (any other GPU named at any second)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpumon.health.stragglers import StragglerConfig, StragglerDetector
from gpumon.model.snapshot import GpuSnapshot, ProcessSnapshot
from tests.signals.helpers import GHZ, gpu, snap

WINDOW = 60.0
START, STOP, END = 30, 150, 240
GIB = 1 << 30


def rank(pid: int, launcher: int | None, share: float = 0.98, memory: int = 20 * GIB) -> ProcessSnapshot:
    """A process of a job; ``launcher``: the process that started it (None: not attributed)."""
    return ProcessSnapshot(pid=pid, used_memory_bytes=memory, sm_utilization_ratio=share, launcher_pid=launcher)


def idle(index: int) -> GpuSnapshot:
    return gpu(index, utilization_ratio=0.0, clocks_hertz={"sm": 0.345 * GHZ}, power_watts=70.0, processes=())


@dataclass(frozen=True)
class Timeline:
    named: dict[int, list[int]]
    """Per second, the GPUs a finding names."""

    def detected_after(self, index: int) -> int | None:
        """Seconds from the cause's start to the first finding naming ``index``."""
        return next((t - START for t in range(START, END) if index in self.named[t]), None)

    def cleared_after(self, index: int) -> int | None:
        """Seconds from the cause's end until ``index`` is no longer named (and stays so)."""
        return next(
            (t - STOP for t in range(STOP, END) if all(index not in self.named[u] for u in range(t, END))), None
        )

    def named_ever(self) -> set[int]:
        return {i for gpus in self.named.values() for i in gpus}


def play(make: Callable[[int, bool], list[GpuSnapshot]]) -> Timeline:
    """``make(t, cause)``: the GPUs at second t, with the cause on or off."""
    detector = StragglerDetector(StragglerConfig(window_seconds=WINDOW))
    named = {}
    for t in range(END):
        detector.observe(snap(1000.0 + t, *make(t, START <= t < STOP)), burning=False)
        named[t] = [f.gpu for f in detector.findings(1000.0 + t) if f.gpu is not None]
    return Timeline(named)


def assert_found_and_cleared(timeline: Timeline, index: int) -> None:
    detected, cleared = timeline.detected_after(index), timeline.cleared_after(index)
    assert detected is not None and detected <= WINDOW, timeline.named
    assert cleared is not None and cleared <= 0.5 * WINDOW, timeline.named
    assert all(index not in timeline.named[t] for t in range(START)), "named before the cause"
    assert timeline.named_ever() == {index}, "another GPU named"


# ---- a job on some of the GPUs, another tenant's process on one of them ----------------------------


def subset_with_competitor(launchers: bool) -> Callable[[int, bool], list[GpuSnapshot]]:
    """A job on GPUs 0 and 1 of 4 (ranks 101 and 102, launched by 100); from second 30 a process
    of another tenant (started from a shell: its own launcher) takes half of GPU 1's time; GPUs 2
    and 3 idle."""

    def make(t: int, cause: bool) -> list[GpuSnapshot]:
        job = 100 if launchers else None
        gpu1 = (rank(102, job, 0.5 if cause else 0.98),)
        if cause:
            gpu1 += (rank(300, 300 if launchers else None, 0.48, memory=40 * GIB),)
        return [
            gpu(0, processes=(rank(101, job),), sm_active_ratio=0.55 if cause else 0.95),
            gpu(1, processes=gpu1, sm_active_ratio=0.95),
            idle(2),
            idle(3),
        ]

    return make


def test_a_job_on_two_of_four_gpus_names_the_gpu_another_tenant_shares() -> None:
    assert_found_and_cleared(play(subset_with_competitor(launchers=True)), 1)


def test_without_process_attribution_the_busy_gpus_of_the_host_are_compared() -> None:
    assert_found_and_cleared(play(subset_with_competitor(launchers=False)), 1)


# ---- a job on all GPUs, one at lower clocks (simulated only: no card setting changes) -----------------


def test_a_job_on_all_gpus_names_the_one_at_lower_clocks() -> None:
    def make(t: int, cause: bool) -> list[GpuSnapshot]:
        gpus = [gpu(i, processes=(rank(101 + i, 100),)) for i in range(4)]
        if cause:
            gpus[3] = gpu(3, processes=(rank(104, 100),), clocks_hertz={"sm": 1.98 * GHZ * 0.85})
        return gpus

    assert_found_and_cleared(play(make), 3)


def test_a_job_next_to_an_idle_gpu_names_its_slow_gpu_and_nothing_else() -> None:
    def make(t: int, cause: bool) -> list[GpuSnapshot]:
        slow = {"clocks_hertz": {"sm": 1.98 * GHZ * 0.85}} if cause else {}
        return [
            gpu(0, processes=(rank(101, 100),)),
            gpu(1, processes=(rank(102, 100),)),
            gpu(2, processes=(rank(103, 100),), **slow),
            idle(3),
        ]

    assert_found_and_cleared(play(make), 2)


def test_an_idle_gpu_beside_a_healthy_job_is_never_named_nor_names_anyone() -> None:
    def make(t: int, cause: bool) -> list[GpuSnapshot]:
        return [gpu(0, processes=(rank(101, 100),)), gpu(1, processes=(rank(102, 100),)), idle(2), idle(3)]

    assert play(make).named_ever() == set()


# ---- two independent jobs side by side ----------------------------------------------------------------


def two_jobs(t: int, cause: bool) -> list[GpuSnapshot]:
    """Job A (launched by 100) on GPUs 0 and 1 at full clocks; job B (launched by 200) on GPUs 2 and 3,
    a lighter load at 20 % lower clocks and a smaller share; from second 30 GPU 3 of job B runs 15 %
    slower than GPU 2."""
    b_clock = 1.98 * GHZ * 0.8
    return [
        gpu(0, processes=(rank(101, 100),)),
        gpu(1, processes=(rank(102, 100),)),
        gpu(2, processes=(rank(201, 200, 0.7),), clocks_hertz={"sm": b_clock}, power_watts=420.0),
        gpu(3, processes=(rank(202, 200, 0.7),), clocks_hertz={"sm": b_clock * (0.85 if cause else 1.0)}),
    ]


def test_two_jobs_side_by_side_are_never_compared() -> None:
    def both_healthy(t: int, cause: bool) -> list[GpuSnapshot]:
        return two_jobs(t, False)

    assert play(both_healthy).named_ever() == set()


def test_a_slow_gpu_of_one_of_two_jobs_is_named_against_its_own_job() -> None:
    assert_found_and_cleared(play(two_jobs), 3)


def test_single_gpu_jobs_started_one_by_one_are_not_each_others_peers() -> None:
    """Four single-GPU jobs from one shell (each its own launcher), unequal loads: nothing to compare."""

    def make(t: int, cause: bool) -> list[GpuSnapshot]:
        return [
            gpu(i, processes=(rank(400 + i, 400 + i, 0.6 + 0.1 * i),), clocks_hertz={"sm": (1.4 + 0.15 * i) * GHZ})
            for i in range(4)
        ]

    assert play(make).named_ever() == set()


def test_a_slurm_job_on_two_gpus_beside_idle_ones_is_compared() -> None:
    def make(t: int, cause: bool) -> list[GpuSnapshot]:
        def job(pid: int, **values: object) -> GpuSnapshot:
            process = ProcessSnapshot(pid=pid, used_memory_bytes=GIB, sm_utilization_ratio=0.98, slurm_job_id="77")
            return gpu(pid - 500, processes=(process,), **values)

        slow = {"clocks_hertz": {"sm": 1.98 * GHZ * 0.85}} if cause else {}
        return [job(500), job(501, **slow), idle(2), idle(3)]

    assert_found_and_cleared(play(make), 1)
