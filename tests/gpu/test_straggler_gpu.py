"""A real imbalance on two real GPUs: a training-like job and a process stealing GPU 1's time.

The job: two ranks (one per GPU), each multiplying bf16 matrices and all-reducing the result over
NCCL every step, so both GPUs advance at the pace of the slower one. The competitor: a second
process multiplying matrices on GPU 1 only. A ``gpumon run --backend nvml`` daemon with a 20 s
straggler window watches; the test reads /api/health once a second.

Which signal separates the GPUs: with the competitor, GPU 1 time-slices between two processes,
and GPU 0 waits for it in the all-reduce. Both stay ~100 % "utilized" (NCCL's kernels spin while
they wait), GPU 0's power and SM activity drop (it waits), GPU 1's do not, and the clocks stay
about the same. So utilization, power and GPM activity would not name GPU 1 (power and activity
would name GPU 0, the healthy one). What does: the busiest process's share of SM time
(nvmlDeviceGetProcessUtilization) — about 1.0 for rank 0 on GPU 0 and about 0.5 for rank 1 on GPU 1 —
the ``compute_share`` signal; the second process on GPU 1 is the evidence.

Phases (about 2.5 minutes): 40 s of the job alone (no finding allowed), then the competitor on GPU 1
until the finding names GPU 1 (at most 60 s), then the competitor gone until the finding clears (at
most 45 s). Printed: time to detection, time to clear and the false-alarm count.

A host's GPU can really be slow: one of a lent 4 x H100 host's reached 87 °C under this job with
software thermal slowdown active (its peers 53-59 °C) and gpumon named it. A finding about another
GPU is a false alarm unless it names a hardware slowdown (thermal, hardware, power brake) that
nvidia-smi, asked every second of the test, showed active on that GPU; those are printed, not failed.

Run on a host with two GPUs and a CUDA build of torch:
    pytest -m gpu -s tests/gpu/test_straggler_gpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpumon.health.stragglers import REASONS
from tests.gpu.conftest import smi
from tests.gpu.nvidia_smi_clocks import active_slowdowns
from tests.helpers import DaemonProcess, free_port

pytestmark = pytest.mark.gpu

WINDOW_SECONDS = 20
CHILD_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

JOB = r"""
import os, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def rank_main(rank, stop_file, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    grad = torch.zeros(64 * 1024 * 1024, device="cuda", dtype=torch.bfloat16)
    print(f"rank {rank} ready", flush=True)
    while not os.path.exists(stop_file):
        for _ in range(8):
            c = a @ b
        grad[:1024].copy_(c.flatten()[:1024])
        dist.all_reduce(grad)
        torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(rank_main, args=(sys.argv[1], int(sys.argv[2])), nprocs=2, join=True)
"""

COMPETITOR = r"""
import os, sys
import torch
torch.cuda.set_device(1)
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
print("competitor ready", flush=True)
while not os.path.exists(sys.argv[1]):
    for _ in range(50):
        c = a @ b
    torch.cuda.synchronize()
"""


def _need_two_gpus() -> None:
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA GPUs")


def _start(script: Path, *args: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, **CHILD_ENV}
    return subprocess.Popen(
        [sys.executable, str(script), *args], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


def _stop(proc: subprocess.Popen[bytes], stop_file: Path) -> None:
    stop_file.touch()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture()
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    _need_two_gpus()
    config = tmp_path / "gpumon.yaml"
    config.write_text(
        json.dumps(
            {
                "interval_seconds": 1,
                "slow_interval_seconds": 2,
                "health": {"stragglers": {"window_seconds": WINDOW_SECONDS}},
            }
        )
    )
    d = DaemonProcess(["--backend", "nvml", "--config", str(config)], tmp_path, env={"GPUMON_KERNEL_LOG": "false"})
    d.wait_ready(timeout=60)
    yield d
    d.stop()


def _stragglers(daemon: DaemonProcess) -> list[dict[str, Any]]:
    findings = daemon.get("/api/health").json()["findings"]
    return [f for f in findings if f["kind"] == "straggler"]


class SlowdownWitness:
    """The hardware slowdowns nvidia-smi showed active on each GPU during the test (asked by ``look``)."""

    def __init__(self) -> None:
        self.seen: dict[int, set[str]] = {}

    def look(self) -> None:
        out = smi("--query-gpu=index,clocks_event_reasons.active", "--format=csv,noheader")
        for gpu, reasons in active_slowdowns(out).items():
            self.seen.setdefault(gpu, set()).update(reasons)

    def confirms(self, finding: dict[str, Any]) -> bool:
        """Whether ``finding`` names a hardware slowdown nvidia-smi showed on its GPU."""
        seen = self.seen.get(finding["gpu"], set())
        return any(REASONS[reason] in finding["reason"] for reason in seen)  # the words a finding uses


def test_a_process_stealing_gpu_1s_time_makes_gpu_1_the_straggler_and_only_then(
    daemon: DaemonProcess, tmp_path: Path
) -> None:
    job_script, competitor_script = tmp_path / "job.py", tmp_path / "competitor.py"
    job_script.write_text(JOB)
    competitor_script.write_text(COMPETITOR)
    job_stop, competitor_stop = tmp_path / "job.stop", tmp_path / "competitor.stop"
    job = _start(job_script, str(job_stop), str(free_port()), log=tmp_path / "job.log")
    competitor: subprocess.Popen[bytes] | None = None
    false_alarms: list[str] = []
    witness = SlowdownWitness()
    confirmed: list[str] = []

    def others(found: list[dict[str, Any]]) -> None:
        """Sort the findings about GPUs other than 1 into confirmed slowdowns and false alarms."""
        witness.look()
        for f in found:
            if f["gpu"] != 1:
                (confirmed if witness.confirms(f) else false_alarms).append(f["reason"])

    try:
        deadline = time.monotonic() + 90
        while "rank 1 ready" not in (tmp_path / "job.log").read_text(errors="replace"):
            assert job.poll() is None and time.monotonic() < deadline, (tmp_path / "job.log").read_text()
            time.sleep(1)

        # 1. the job alone, longer than the window: never a straggler
        healthy_end = time.monotonic() + 2 * WINDOW_SECONDS
        while time.monotonic() < healthy_end:
            found = _stragglers(daemon)
            others(found)
            false_alarms += [f["reason"] for f in found if f["gpu"] == 1]
            time.sleep(1)

        # 2. a competitor on GPU 1: the finding names GPU 1 within its window (and a bit)
        competitor = _start(competitor_script, str(competitor_stop), log=tmp_path / "competitor.log")
        started = time.monotonic()
        detected: dict[str, Any] | None = None
        while detected is None and time.monotonic() - started < 3 * WINDOW_SECONDS:
            found = _stragglers(daemon)
            others(found)
            detected = next((f for f in found if f["gpu"] == 1), None)
            time.sleep(1)
        time_to_detection = time.monotonic() - started

        # 3. the competitor gone: GPU 1's finding clears
        _stop(competitor, competitor_stop)
        competitor = None
        gone = time.monotonic()
        while time.monotonic() - gone < 2 * WINDOW_SECONDS + 5:
            found = _stragglers(daemon)
            others(found)
            if not any(f["gpu"] == 1 for f in found):
                break
            time.sleep(1)
        time_to_clear = time.monotonic() - gone
        cleared = not any(f["gpu"] == 1 for f in _stragglers(daemon))
    finally:
        if competitor is not None:
            _stop(competitor, competitor_stop)
        _stop(job, job_stop)

    print(
        f"\nstraggler window {WINDOW_SECONDS} s: detected GPU 1 after {time_to_detection:.1f} s "
        f"({detected['reason'] if detected else 'never'}); cleared {time_to_clear:.1f} s after the competitor "
        f"stopped; false alarms: {len(false_alarms)} {sorted(set(false_alarms))}; other GPUs' hardware slowdowns "
        f"nvidia-smi confirmed: {len(confirmed)} {sorted(set(confirmed))[:3]}"
    )
    print("deviation series:", [m for m in daemon.metrics().splitlines() if m.startswith("gpumon_straggler_")])
    assert detected is not None, f"GPU 1 never named a straggler; log:\n{daemon.log()[-3000:]}"
    assert false_alarms == []
    assert cleared, "the straggler finding stayed after the competitor stopped"
