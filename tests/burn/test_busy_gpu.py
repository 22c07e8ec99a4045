"""A GPU used by another process: the burn names the process as ``gpumon once`` does (pid and name)."""

from __future__ import annotations

import subprocess

from gpumon.backends.nvml import NvmlBackend
from gpumon.burn.orchestration.runner import read_gpu
from gpumon.burn.workloads.sw import check_gpu
from tests.fake_pynvml import MIB, h200_pair


def test_the_busy_message_names_the_other_process_from_proc():
    other = subprocess.Popen(["sleep", "30"])
    try:
        fake = h200_pair()
        fake.gpus[1].processes = [(other.pid, 2000 * MIB)]
        backend = NvmlBackend(fake)
        backend.init()
        busy = [c for c in check_gpu(1, read_gpu(backend, 1)) if c.severity == "busy"]
    finally:
        other.kill()
        other.wait()
    assert len(busy) == 1
    assert busy[0].detail == f"1 other compute process(es) on the GPU: {other.pid} (sleep)"
