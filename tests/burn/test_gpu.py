"""On real GPUs (run on the GPU host: pytest -m gpu tests/burn -v -s): a healthy run passes, each fault is named."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.gpu

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _gpu_count() -> int:
    torch = pytest.importorskip("torch", reason="torch with CUDA is needed on the GPU host")
    return int(torch.cuda.device_count())


@pytest.fixture
def two_gpus() -> None:
    if _gpu_count() < 2:
        pytest.skip(f"needs 2 GPUs, found {_gpu_count()}")


def _show(r) -> None:
    print(r.out[-6000:])
    print(r.err[-2000:])


def test_quick_healthy_run_passes_on_all_gpus(burn):
    assert _gpu_count() >= 1, "no CUDA GPU visible to torch"
    start = time.monotonic()
    r = burn(["--quick", "--gpus", "all"], env=NO_MULTICAST, timeout=180)
    wall = time.monotonic() - start
    _show(r)
    print(f"quick wall time {wall:.1f} s")
    assert r.code == 0, r.report["faults"] if r.report else r.err
    for g in r.report["gpus"]:
        assert g["matmul"]["dtype"] == "bf16"
        assert g["tests"]["matmul"] and g["tests"]["memory"]


def test_quick_healthy_burn_on_two_gpus_has_no_warning(burn, two_gpus):
    """A healthy --quick burn on two GPUs: exit 0, and no check carries a warning (NVLink counters included)."""
    r = burn(["--quick", "--gpus", "0,1"], env=NO_MULTICAST, timeout=180)
    _show(r)
    assert r.report is not None, r.err
    warnings = [c for c in r.report["checks"] if "(warning)" in str(c["detail"])]
    for c in warnings:
        print(f"WARNING GPU {c['gpu']} {c['test']}/{c['check']}: {c['detail']}")
    for g in r.report["gpus"]:
        print(f"GPU {g['gpu']} NVLink counters grown: {g['telemetry'].get('nvlink_errors_grown')}")
    assert r.code == 0, r.report["faults"]
    assert warnings == [], "a healthy burn must not warn"


def test_small_all_reduce_sizes_are_timed_with_a_cuda_graph_and_checked(burn, two_gpus):
    """1-64 MiB come first in the sweep, timed with a CUDA graph, every result exact; the floor stays at the top."""
    r = burn(["--gpus", "0,1", "--quick", "--tests", "allreduce"], env=NO_MULTICAST, timeout=180)
    _show(r)
    assert r.code == 0, r.report["faults"] if r.report else r.err
    sizes = r.report["gpus"][0]["allreduce"]["sizes"]
    for s in sizes:
        print(f"{s['bytes'] >> 20:>5} MiB {s['timing']:>10}: busbw {s['busbw_bytes_per_second'] / 1e9:.1f} GB/s")
    assert [s["bytes"] >> 20 for s in sizes][:4] == [1, 4, 16, 64]
    assert [s["timing"] for s in sizes[:4]] == ["cuda_graph"] * 4
    assert not [c for c in r.report["checks"] if c["check"] == "timing"], "no size fell back to the eager loop"


def test_corruption_is_caught_on_gpu_1(burn, two_gpus):
    r = burn(
        ["--gpus", "0,1", "--quick", "--duration", "5", "--tests", "matmul,memory,p2p,allreduce"],
        env={**NO_MULTICAST, "GPUMON_BURN_INJECT": "corrupt:1"},
        timeout=180,
    )
    _show(r)
    assert r.code == 1
    faults = r.report["faults"]
    assert any("silent data corruption" in f for f in faults)
    assert all("GPU 1" in f for f in faults), faults


def test_slow_gpu_1_is_the_straggler(burn, two_gpus):
    r = burn(
        ["--gpus", "0,1", "--duration", "8", "--tests", "matmul"],
        env={**NO_MULTICAST, "GPUMON_BURN_INJECT": "slow:1"},
        timeout=180,
    )
    _show(r)
    assert r.code == 1
    assert any(f.startswith("GPU 1 ") and "below the median" in f for f in r.report["faults"]), r.report["faults"]
    assert not any(f.startswith("GPU 0 ") for f in r.report["faults"])


def test_hung_rank_1_is_ended_and_named(burn, two_gpus):
    start = time.monotonic()
    r = burn(
        ["--gpus", "0,1", "--quick", "--heartbeat-timeout", "5"],
        env={**NO_MULTICAST, "GPUMON_BURN_INJECT": "hang:1"},
        timeout=180,
    )
    _show(r)
    assert r.code == 1
    assert r.report["faults"][0].startswith("rank 1 (GPU 1) hung in matmul")
    assert time.monotonic() - start < 90


def test_allocation_failure_on_gpu_0_is_reported(burn):
    r = burn(
        ["--gpus", "0", "--quick", "--tests", "memory"],
        env={**NO_MULTICAST, "GPUMON_BURN_INJECT": "oom:0"},
        timeout=180,
    )
    _show(r)
    assert r.code == 1
    assert r.report["faults"][0].startswith("GPU 0 (rank 0): out of memory")
