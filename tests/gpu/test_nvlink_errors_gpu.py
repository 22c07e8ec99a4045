"""On a GPU host with NVLink: gpumon's NVLink error counters are what ``nvidia-smi nvlink -e`` shows.

Run: ``python3 -m pytest -m gpu tests/gpu/test_nvlink_errors_gpu.py -v -s``. Each test reads
nvidia-smi, then gpumon's NVML backend, then nvidia-smi again, and requires, for every GPU, link
and type (replay, recovery, crc), ``nvidia-smi before <= gpumon <= nvidia-smi after`` (a counter
may tick between the reads; it may never be ahead of nvidia-smi or behind it). It prints the
comparison per GPU, and for information the DL_CRC_DATA / DL_ECC_DATA counters gpumon leaves out.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gpumon.backends.nvml import NvmlBackend
from gpumon.model.snapshot import Tier
from tests.gpu.conftest import smi
from tests.gpu.nvidia_smi_nvlink import SMI_TYPES, parse_nvlink_errors

pytestmark = pytest.mark.gpu

TYPES = tuple(SMI_TYPES.values())
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _left_out_counters(gpu: int) -> dict[str, int]:
    """nvmlDeviceGetNvLinkErrorCounter DL_CRC_DATA / DL_ECC_DATA summed over links (printed, not judged)."""
    import pynvml

    h = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    out = {}
    for name, counter in (("dl_crc_data", 3), ("dl_ecc_data", 4)):
        total = 0
        for link in range(18):
            with contextlib.suppress(pynvml.NVMLError):
                total += int(pynvml.nvmlDeviceGetNvLinkErrorCounter(h, link, counter))
        out[name] = total
    return out


def _compare(backend: NvmlBackend, when: str) -> None:
    before = parse_nvlink_errors(smi("nvlink", "-e"))
    ours = {g: dict(backend.read(g, Tier.SLOW)).get("nvlink_errors_total") or {} for g in range(backend.device_count())}
    after = parse_nvlink_errors(smi("nvlink", "-e"))
    with_links = [g for g, links in before.items() if links]
    if not with_links:
        pytest.skip("nvidia-smi nvlink -e shows no NVLink on this host")
    problems = []
    for g in with_links:
        print(f"\n[{when}] GPU {g}: link: type nvidia-smi-before / gpumon / nvidia-smi-after")
        links = before[g]
        if set(ours[g]) != set(links):
            problems.append(
                f"GPU {g}: gpumon has links {sorted(ours[g], key=int)}, nvidia-smi {sorted(links, key=int)}"
            )
        for link in sorted(links, key=int):
            mine = ours[g].get(link, {})
            row = []
            for kind in TYPES:
                lo, hi, got = links[link].get(kind), after[g].get(link, {}).get(kind), mine.get(kind)
                row.append(f"{kind} {lo}/{got}/{hi}")
                if lo is None:
                    if got is not None:
                        problems.append(f"GPU {g} link {link} {kind}: gpumon {got}, nvidia-smi shows none")
                    continue
                if got is None or not lo <= got <= (hi if hi is not None else lo):
                    problems.append(f"GPU {g} link {link} {kind}: gpumon {got}, nvidia-smi {lo} then {hi}")
            extra = sorted(set(mine) - set(TYPES))
            if extra:
                problems.append(f"GPU {g} link {link}: gpumon exports types nvidia-smi does not show: {extra}")
            print(f"  link {link}: " + ", ".join(row))
        print(f"  left out (not errors to nvidia-smi), summed over links: {_left_out_counters(g)}")
    assert problems == [], "\n".join(problems)


ALLREDUCE = textwrap.dedent(
    """
    import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp

    def work(rank, port):
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                device_id=torch.device("cuda", rank))
        buf = torch.ones(128 << 20, dtype=torch.bfloat16, device="cuda")  # 256 MiB
        for _ in range(100):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(work, args=(int(sys.argv[1]),), nprocs=2)
        print("all-reduce done: 100 x 256 MiB over 2 GPUs")
    """
)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_every_link_matches_nvidia_smi_at_idle(backend: NvmlBackend) -> None:
    _compare(backend, "idle")


def test_every_link_matches_nvidia_smi_after_an_all_reduce(backend: NvmlBackend, tmp_path: Path) -> None:
    torch: Any = pytest.importorskip("torch", reason="torch with CUDA is needed for the all-reduce")
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs for an all-reduce, found {torch.cuda.device_count()}")
    _compare(backend, "before the all-reduce")
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    env = {**os.environ, **NO_MULTICAST, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    done = subprocess.run(
        [sys.executable, str(script), str(_free_port())], capture_output=True, text=True, timeout=300, env=env
    )
    print(done.stdout, done.stderr[-2000:])
    assert done.returncode == 0, done.stderr[-2000:]
    _compare(backend, "after the all-reduce")
