#!/usr/bin/env python3
"""What single NVML calls cost the calling thread's CPU, against their wall time, on a real GPU host.

    python3 benchmarks/bench_nvml_cpu.py [--gpu 0] [--repeat 100] [--load] [--readers]

Times each call ``--repeat`` times (median wall µs and median CPU µs of this thread, user +
system, so time the driver spends on the CPU counts): the per-process calls of gpumon's fast
tier and the costliest slow-tier counters, among them the violation counters both ways (the eight
``nvmlDeviceGetViolationStatus`` calls, the reference, and the one field-values call gpumon makes). With ``--load`` it times everything again while a
torch matmul process (a child of its own) keeps the GPU busy, since some calls cost more with a
process on the GPU. The reference is the wall time of the same call: CPU ≈ wall means the driver
spins on the CPU for the whole call. With ``--readers`` it times every reader group of gpumon's
NVML backend instead (``NvmlBackend.read_group``, all tiers) and gives what each costs one GPU per
second at the default intervals (CPU per read / the tier's interval): where a daemon's CPU goes on
this host. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_nvml_calls import reader_names, timed_us

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpumon.backends.nvml.clocks import PERF_POLICIES, PERF_POLICY_FIELDS

VIOLATION_CALLS = "nvmlDeviceGetViolationStatus, all 8 policies"
"""The reference for the violation counters: what gpumon asked before it read them as fields."""
VIOLATION_FIELDS = "nvmlDeviceGetFieldValues(PERF_POLICY 74-81)"

LOAD = """
import sys, time, torch
torch.cuda.set_device(int(sys.argv[1]))
a = torch.randn(4096, 4096, device="cuda")
end = time.time() + float(sys.argv[2])
while time.time() < end:
    a @ a
    torch.cuda.synchronize()
"""


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float] | str:
    """(median wall µs, median thread CPU µs), or the error of the first call (unsupported here)."""
    try:
        fn()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return timed_us(fn, repeat)


def calls(nv: Any, h: Any) -> list[tuple[str, Callable[[], Any]]]:
    last_seen = [0]

    def process_utilization() -> None:
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(h, last_seen[0])
        except nv.NVMLError_NotFound:  # no sample since the last call
            return
        last_seen[0] = max([last_seen[0], *(int(s.timeStamp) for s in samples)])

    def every_policy() -> None:
        for policy in PERF_POLICIES.values():
            with contextlib.suppress(nv.NVMLError):  # a policy this GPU lacks: its field is left out too
                nv.nvmlDeviceGetViolationStatus(h, policy)

    return [
        ("nvmlDeviceGetComputeRunningProcesses", lambda: nv.nvmlDeviceGetComputeRunningProcesses(h)),
        ("nvmlDeviceGetProcessUtilization(last seen)", process_utilization),
        ("nvmlDeviceGetMemoryInfo", lambda: nv.nvmlDeviceGetMemoryInfo(h)),
        ("nvmlDeviceGetUtilizationRates", lambda: nv.nvmlDeviceGetUtilizationRates(h)),
        ("nvmlDeviceGetTotalEnergyConsumption", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h)),
        ("nvmlDeviceGetViolationStatus(POWER)", lambda: nv.nvmlDeviceGetViolationStatus(h, 0)),
        (VIOLATION_CALLS, every_policy),
        (VIOLATION_FIELDS, lambda: nv.nvmlDeviceGetFieldValues(h, list(PERF_POLICY_FIELDS.values()))),
        ("  the thermal field (75) alone", lambda: nv.nvmlDeviceGetFieldValues(h, [PERF_POLICY_FIELDS["thermal"]])),
        ("  the power field (74) alone", lambda: nv.nvmlDeviceGetFieldValues(h, [PERF_POLICY_FIELDS["power"]])),
        ("nvmlDeviceGetFieldValues(TOTAL_ENERGY 83)", lambda: nv.nvmlDeviceGetFieldValues(h, [83])),
        ("nvmlDeviceGetPcieReplayCounter", lambda: nv.nvmlDeviceGetPcieReplayCounter(h)),
    ]


def table(nv: Any, h: Any, repeat: int, label: str) -> None:
    print(f"## {label}")
    print(f"{'call':46} {'wall µs':>10} {'CPU µs':>10} {'CPU/wall':>9}")
    cpu_of: dict[str, float] = {}
    for name, fn in calls(nv, h):
        got = timed(fn, repeat)
        if isinstance(got, str):
            print(f"{name:46} {got}")
        else:
            wall, cpu = got
            cpu_of[name] = cpu
            print(f"{name:46} {wall:10.1f} {cpu:10.1f} {cpu / wall if wall else 0:9.2f}")
    if cpu_of.get(VIOLATION_CALLS) and VIOLATION_FIELDS in cpu_of:
        ratio = cpu_of[VIOLATION_FIELDS] / cpu_of[VIOLATION_CALLS]
        print(f"violation counters: gpumon's one field-values call / the eight per-policy calls, CPU: {ratio:.2f}")


def readers_table(gpu: int, repeat: int) -> None:
    """Every reader group of the NVML backend on GPU ``gpu``: wall and CPU per read (each read asking
    NVML), and its CPU share of one core per GPU at the default intervals (a reader that asks NVML
    less often than its tier is read, at that interval)."""
    from gpumon.backends.nvml import NvmlBackend
    from gpumon.model.fields.nvlink import NVLINK_ERRORS_SECONDS
    from gpumon.model.poll_intervals import PollIntervals
    from gpumon.model.snapshot import Tier

    intervals = PollIntervals()
    every = {"nvlink_errors": NVLINK_ERRORS_SECONDS}  # the daemon asks NVML for these less often than their tier
    backend = NvmlBackend.from_system()  # (not the daemon's: every read asks NVML)
    backend.init()
    try:
        for tier in (Tier.STATIC, Tier.SLOW, Tier.FAST):  # a first read of each tier (support probes)
            backend.read(gpu, tier)
        print(f"## gpumon's reader groups on GPU {gpu} (read_group, median of {repeat})")
        print(f"{'reader':24} {'tier':7} {'wall µs':>10} {'CPU µs':>10} {'CPU/wall':>9} {'% core/GPU':>11}")
        total = 0.0
        for tier in (Tier.FAST, Tier.SLOW, Tier.STATIC):
            for name in reader_names(tier):
                wall, cpu = timed_us(lambda name=name: backend.read_group(gpu, name), repeat, warmup=1)
                share = cpu / 1e6 / max(intervals.of(tier), every.get(name, 0.0)) * 100
                total += share
                print(
                    f"{name:24} {tier.value:7} {wall:10.1f} {cpu:10.1f} {cpu / wall if wall else 0:9.2f} {share:11.4f}"
                )
        print(
            f"all readers: {total:.3f} % of a core per GPU at the default intervals "
            f"({intervals.fast_seconds:g} / {intervals.slow_seconds:g} / {intervals.static_seconds:g} s)"
        )
    finally:
        backend.shutdown()


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--repeat", type=int, default=100)
    p.add_argument("--load", action="store_true", help="also time the calls with a matmul process on the GPU")
    p.add_argument("--readers", action="store_true", help="time gpumon's reader groups instead")
    a = p.parse_args()
    if a.readers:
        readers_table(a.gpu, a.repeat)
        return 0
    import pynvml as nv

    nv.nvmlInit()
    try:
        h = nv.nvmlDeviceGetHandleByIndex(a.gpu)
        print(f"# GPU {a.gpu}: {nv.nvmlDeviceGetName(h)}, driver {nv.nvmlSystemGetDriverVersion()}")
        table(nv, h, a.repeat, "idle")
        if a.load:
            load = subprocess.Popen([sys.executable, "-c", LOAD, str(a.gpu), "120"])
            try:
                time.sleep(8)  # CUDA context up and the matmul running
                table(nv, h, a.repeat, "a matmul process on the GPU")
            finally:
                load.kill()
                load.wait()
    finally:
        nv.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
