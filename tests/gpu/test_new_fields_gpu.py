"""The fields added with the one-declaration redesign, against nvidia-smi on a real GPU host.

Run with ``python3 -m pytest -m gpu tests/gpu/test_new_fields_gpu.py -s -v``: every compared
value is printed. Row-remapper histogram, GPU recovery action, encoder/decoder utilization,
the graphics engine's activity (GPM) and the NVLink bandwidth DCGM serves, each with its DCGM twin.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

import pytest

from gpumon.backends.nvml import NvmlBackend
from gpumon.poller import Poller
from gpumon.snapshot import GpuSnapshot, Tier
from gpumon.store import SnapshotStore
from tests.gpu.conftest import smi
from tests.helpers import dcgm_values

pytestmark = pytest.mark.gpu

RECOVERY_WORDS = {
    "None": "none",
    "Reset": "gpu_reset",
    "GPU Reset": "gpu_reset",
    "Node Reboot": "node_reboot",
    "Reboot": "node_reboot",
    "Drain P2P": "drain_p2p",
    "Drain and Reset": "drain_and_reset",
}


def query(index: int, *fields: str) -> list[str]:
    line = smi("-i", str(index), f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits").strip()
    return [v.strip() for v in line.split(",")]


def polled(backend: NvmlBackend) -> tuple[GpuSnapshot, ...]:
    return Poller(backend, SnapshotStore()).poll().gpus


def test_row_remapper_histogram_matches_nvidia_smi(backend: NvmlBackend) -> None:
    levels = ("max", "high", "partial", "low", "none")
    for gpu in polled(backend):
        smi_values = query(gpu.index, *(f"remapped_rows.histogram.{level}" for level in levels))
        print(f"\nGPU {gpu.index}: nvidia-smi {dict(zip(levels, smi_values, strict=True))} gpumon {gpu.row_remap_bank_availability}")
        if smi_values[0] in ("[N/A]", "N/A"):
            assert gpu.row_remap_bank_availability is None
            continue
        assert gpu.row_remap_bank_availability == {level: int(v) for level, v in zip(levels, smi_values, strict=True)}
        twins = dcgm_values(gpu)
        assert twins["DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_MAX"] == float(smi_values[0])


def test_recovery_action_matches_nvidia_smi(backend: NvmlBackend) -> None:
    for gpu in polled(backend):
        (smi_value,) = query(gpu.index, "gpu_recovery_action")
        print(f"\nGPU {gpu.index}: nvidia-smi gpu_recovery_action {smi_value!r} gpumon {gpu.recovery_action!r}")
        if smi_value in ("[N/A]", "N/A"):
            assert gpu.recovery_action is None
            continue
        assert gpu.recovery_action == RECOVERY_WORDS.get(smi_value, smi_value.lower().replace(" ", "_"))
        if smi_value == "None":
            assert dcgm_values(gpu)["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"] == 0.0


def test_encoder_and_decoder_utilization_match_nvidia_smi(backend: NvmlBackend) -> None:
    for gpu in polled(backend):
        enc, dec = query(gpu.index, "utilization.encoder", "utilization.decoder")
        print(f"\nGPU {gpu.index}: nvidia-smi enc {enc} dec {dec}; gpumon {gpu.encoder_utilization_ratio} {gpu.decoder_utilization_ratio}")
        assert gpu.encoder_utilization_ratio == pytest.approx(float(enc) / 100, abs=0.02)
        assert gpu.decoder_utilization_ratio == pytest.approx(float(dec) / 100, abs=0.02)
        twins = dcgm_values(gpu)
        assert twins["DCGM_FI_DEV_ENC_UTIL"] == pytest.approx(float(enc), abs=2)
        assert twins["DCGM_FI_DEV_DEC_UTIL"] == pytest.approx(float(dec), abs=2)


TRAFFIC = r"""
import os, time, torch, torch.distributed as dist
rank = int(os.environ["RANK"]); torch.cuda.set_device(rank)
dist.init_process_group("nccl")
x = torch.ones(64 * 2**20, device="cuda")
end = time.time() + 20
while time.time() < end:
    dist.all_reduce(x)
    torch.cuda.synchronize()  # else the loop queues thousands of all-reduces that outlast it
torch.cuda.synchronize(); dist.destroy_process_group()
"""


def test_dcgm_nvlink_bandwidth_rises_under_all_reduce_traffic(backend: NvmlBackend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    if backend.device_count() < 2 or importlib.util.find_spec("torch") is None:
        pytest.skip("needs 2 GPUs and torch for NVLink traffic")
    if backend.gpm_supported(0) is False:
        pytest.skip("GPU 0 has no GPM")
    script = tmp_path / "traffic.py"
    script.write_text(TRAFFIC)
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", str(script)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[float] = []
    try:
        backend.read(0, Tier.SLOW)
        for _ in range(9):  # GPM averages between two reads: read every 2 s while the all-reduce runs
            time.sleep(2)
            busy = GpuSnapshot.assemble(0, "u", backend.read(0, Tier.SLOW))
            seen.append(dcgm_values(busy).get("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", -1.0))
    finally:
        out, _ = proc.communicate(timeout=120)
    print(f"\nGPU 0 DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL every 2 s under all-reduce (MB/s): {seen}")
    assert proc.returncode == 0, out[-2000:]
    mb = max(seen)
    assert mb is not None and mb > 1000  # GB/s of NVLink traffic, in MB/s


GR_LOAD = r"""
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + 8
while time.time() < end:
    a @ a
torch.cuda.synchronize()
"""


def test_graphics_engine_activity_rises_under_a_matmul(backend: NvmlBackend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs torch for a load")
    if backend.gpm_supported(0) is False:
        pytest.skip("GPU 0 has no GPM")
    backend.read(0, Tier.SLOW)
    idle = backend.read(0, Tier.SLOW).get("graphics_active_ratio")
    script = tmp_path / "load.py"
    script.write_text(GR_LOAD)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
    proc = subprocess.Popen([sys.executable, str(script)], env=env)
    try:
        time.sleep(4)
        backend.read(0, Tier.SLOW)
        time.sleep(2)
        busy = backend.read(0, Tier.SLOW).get("graphics_active_ratio")
    finally:
        proc.wait(timeout=60)
    print(f"\nGPU 0: graphics engine active idle {idle} busy {busy}")
    assert idle is not None and busy is not None
    assert busy > 0.5 and busy > idle
