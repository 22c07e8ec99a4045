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
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.model.snapshot import GpuSnapshot, Tier
from tests.gpu.conftest import smi
from tests.helpers import dcgm_values, free_port

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
        print(
            f"\nGPU {gpu.index}: nvidia-smi {dict(zip(levels, smi_values, strict=True))} gpumon {gpu.row_remap_bank_availability}"
        )
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
        print(
            f"\nGPU {gpu.index}: nvidia-smi enc {enc} dec {dec}; gpumon {gpu.encoder_utilization_ratio} {gpu.decoder_utilization_ratio}"
        )
        assert gpu.encoder_utilization_ratio == pytest.approx(float(enc) / 100, abs=0.02)
        assert gpu.decoder_utilization_ratio == pytest.approx(float(dec) / 100, abs=0.02)
        twins = dcgm_values(gpu)
        assert twins["DCGM_FI_DEV_ENC_UTIL"] == pytest.approx(float(enc), abs=2)
        assert twins["DCGM_FI_DEV_DEC_UTIL"] == pytest.approx(float(dec), abs=2)


TRAFFIC = r"""
import datetime, os, sys, time, torch, torch.distributed as dist
rank, port = int(sys.argv[1]), sys.argv[2]
torch.cuda.set_device(rank)
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", rank))
x = torch.ones(64 * 2**20, device="cuda")
print(f"rank {rank} joined", flush=True)
end, stop = time.time() + 20, torch.zeros(1, device="cuda")
while stop.item() == 0:  # both ranks run the same number of all-reduces, or one waits forever
    for _ in range(20):
        dist.all_reduce(x)
    stop.fill_(float(time.time() > end))
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # .item() syncs, so no backlog outlasts the loop
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
"""


def test_dcgm_nvlink_bandwidth_rises_under_all_reduce_traffic(backend: NvmlBackend, tmp_path) -> None:  # type: ignore[no-untyped-def]
    if backend.device_count() < 2 or importlib.util.find_spec("torch") is None:
        pytest.skip("needs 2 GPUs and torch for NVLink traffic")
    if backend.gpm_supported(0) is False:
        pytest.skip("GPU 0 has no GPM")
    script = tmp_path / "traffic.py"
    script.write_text(TRAFFIC)
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    port = str(free_port())
    logs = [tmp_path / f"rank{rank}.log" for rank in (0, 1)]
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), port], env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
        )
        for rank, log in enumerate(logs)
    ]
    seen: list[float] = []
    try:
        backend.read(0, Tier.SLOW)
        for _ in range(9):  # GPM averages between two reads: read every 2 s while the all-reduce runs
            time.sleep(2)
            busy = GpuSnapshot.assemble(0, "u", backend.read(0, Tier.SLOW))
            seen.append(dcgm_values(busy).get("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", -1.0))
        codes = [rank.wait(timeout=90) for rank in ranks]
    finally:
        for rank in ranks:  # never leave a rank running into the next test
            if rank.poll() is None:
                rank.kill()
                rank.wait()
    out = "\n".join(log.read_text(errors="replace")[-1500:] for log in logs)
    print(f"\nGPU 0 DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL every 2 s under all-reduce (MB/s): {seen}\n{out}")
    assert codes == [0, 0], out
    assert max(seen) > 1000  # GB/s of NVLink traffic, in MB/s


GR_LOAD = r"""
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
a @ a
torch.cuda.synchronize()
print("busy", flush=True)
end = time.time() + 6
while time.time() < end:
    a @ a
torch.cuda.synchronize()
"""
"""A matmul load that says "busy" once its first product is done (torch's import and CUDA's start
take seconds, more on a machine just started), then keeps the GPU busy for 6 s."""


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
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "busy\n", "the load did not start"
        time.sleep(1)
        backend.read(0, Tier.SLOW)  # GPM: the window is from this read to the next
        time.sleep(2)
        busy = backend.read(0, Tier.SLOW).get("graphics_active_ratio")
    finally:
        proc.wait(timeout=60)
    print(f"\nGPU 0: graphics engine active idle {idle} busy {busy}")
    assert idle is not None and busy is not None
    assert busy > 0.5 and busy > idle
