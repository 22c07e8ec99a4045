"""Whole runs on CPU (gloo, simulated GPUs): verdicts, exit codes, reports, watchdog, fault injection.

Each injected fault must be caught and attributed to the right GPU or rank, and to no other.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from gpumon.util.state.files import health_dir
from tests.burn.conftest import CPU
from tests.helpers import wait_for


def test_healthy_run_passes_writes_reports_and_removes_the_marker(burn, tmp_path):
    r = burn([*CPU, "--gpus", "0,1"])
    assert r.code == 0, r.out + r.err
    assert "burn: PASS — 2 GPU(s)" in r.out
    assert "GPU 1 rank 1 matmul: rate " in r.out  # plain progress lines when stdout is not a terminal
    rep = r.report
    assert rep["verdict"] == "pass" and rep["exit_code"] == 0 and rep["faults"] == []
    assert [g["gpu"] for g in rep["gpus"]] == [0, 1]
    for g in rep["gpus"]:
        assert g["tests"] == {
            "sw": True,
            "fingerprint": True,
            "pcie": True,
            "matmul": True,
            "memory": True,
            "p2p": None,
            "allreduce": True,
            "telemetry": True,
        }
        assert g["matmul"]["dtype"] == "fp32" and g["matmul"]["tflops"] > 0
        assert g["memory"]["bandwidth_bytes_per_second"] > 0
        assert g["allreduce"]["busbw_bytes_per_second"] > 0
    assert rep["thresholds"]["straggler_fraction"] == 0.75  # CPU: simulated GPUs share a loaded host
    assert any(c["test"] == "p2p" and c["passed"] is None and "device cpu" in c["detail"] for c in rep["checks"])
    state = health_dir(tmp_path / "state", "fake").parent / "burn"  # a simulated run's, apart from the node's
    assert json.loads((state / "last.json").read_text())["finished_at"] == rep["finished_at"]
    assert not (state / "running.json").exists()


def test_corrupted_results_and_an_allocation_failure_are_each_attributed_to_their_own_gpu(burn):
    """One run, two faults on two GPUs: each is named for its GPU and no other. (Which figures fail
    which check is tested on synthetic figures in tests/burn/test_judge_rules.py.)"""
    r = burn(
        [*CPU, "--gpus", "0,1", "--tests", "matmul,memory,allreduce"], env={"GPUMON_BURN_INJECT": "corrupt:1,oom:0"}
    )
    assert r.code == 1
    faults = r.report["faults"]
    gpu0 = [f for f in faults if f.startswith("GPU 0 ")]
    gpu1 = [f for f in faults if f.startswith("GPU 1 ")]
    assert sorted(faults) == sorted(gpu0 + gpu1), faults
    (oom,) = gpu0  # the first large allocation (matmul's) fails; GPU 0's other tests pass
    assert oom.startswith("GPU 0 (rank 0): out of memory (injected out of memory allocating"), oom
    assert any("silent data corruption" in f for f in gpu1)
    assert any("read back wrong" in f for f in gpu1)
    assert any("all-reduce result wrong on rank 1" in f for f in gpu1)
    assert r.report["gpus"][0]["tests"] == {"matmul": False, "memory": True, "allreduce": True, "telemetry": True}


def test_an_injected_slow_gpu_runs_at_a_tenth_of_its_rate_and_the_others_at_full_speed():
    """``slow:G`` adds nine times the busy time on GPU G only, so with two GPUs it stays far below the
    straggler limit (a third of the other's rate) on a noisy CPU run (at a quarter, CI once saw it pass).
    That the judge names such a GPU is tested on synthetic figures in tests/burn/test_judge_rules.py; the
    whole path (injection, timed rounds, judge) runs end to end in the pairwise all-reduce test below."""
    from types import SimpleNamespace

    from gpumon.burn.workloads import context, inject

    injection, problems = inject.parse("slow:1")
    assert problems == []

    def took(gpu: int, busy_seconds: float) -> float:
        start = time.monotonic()
        context.slow_down(SimpleNamespace(spec=SimpleNamespace(injection=injection, gpu=gpu)), busy_seconds)
        return time.monotonic() - start

    assert took(1, 0.05) >= 9 * 0.05
    assert took(0, 100.0) < 5, "a GPU without the injection does not wait"


def test_a_slow_group_is_localised_by_pairwise_all_reduce(burn, tmp_path):
    scenario = tmp_path / "four.yaml"
    scenario.write_text("count: 4\n")
    r = burn(
        [*CPU, "--backend", f"fake:{scenario}", "--gpus", "all", "--tests", "allreduce", "--quick"],
        env={"GPUMON_BURN_INJECT": "slow:2", "GPUMON_BURN_FLOORS": "allreduce_busbw_gbps=1000"},
    )
    assert r.code == 1
    faults = r.report["faults"]
    assert any(f.startswith("all-reduce over 4 ranks: busbw") for f in faults), faults
    assert "GPU 2: allreduce: every link of this GPU is slow while most other links are fine" in faults, faults
    pairs = [c for c in r.report["checks"] if c["check"] == "pair_busbw"]
    assert len(pairs) == 6


def test_ctrl_c_stops_workers_and_removes_the_marker(tmp_path):
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpumon.burn",
            "--device",
            "cpu",
            "--gpus",
            "0,1",
            "--duration",
            "60",
            "--state-dir",
            str(state),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    marker = health_dir(state, "fake").parent / "burn" / "running.json"  # a simulated run's, apart from the node's
    try:
        wait_for(marker.exists, 60, what="the running marker")
        data = json.loads(marker.read_text())
        assert set(data) == {"pid", "gpus", "uuids", "started_at"}
        assert data["pid"] == proc.pid and data["gpus"] == [0, 1] and len(data["uuids"]) == 2
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "interrupted" in err and "Traceback" not in err
    assert not marker.exists()


def test_a_hung_rank_is_ended_by_the_watchdog_and_named_and_a_healthy_gpu_keeps_its_matmul_rounds(burn):
    """The end-to-end hang run. Which rank the watchdog names (the computing one, not those waiting
    for it in a collective) is tested on synthetic views in tests/burn/test_judge_rules.py."""
    start = time.monotonic()
    r = burn(
        ["--device", "cpu", "--gpus", "0,1", "--tests", "matmul", "--duration", "30", "--heartbeat-timeout", "3"],
        env={"GPUMON_BURN_INJECT": "hang:1"},
        timeout=90,
    )
    assert r.code == 1
    assert r.report["faults"][0].startswith("rank 1 (GPU 1) hung in matmul: no progress for")
    assert time.monotonic() - start < 60, "ended by the 3 s watchdog, not by the 30 s duration"
    healthy = r.report["gpus"][0]
    assert healthy["matmul"]["partial"] is True and healthy["matmul"]["tflops"] > 0
    assert healthy["tests"]["matmul"] is None  # shown, not judged
    row = next(line for line in r.out.splitlines() if line.strip().startswith("│ 0"))
    assert "—" not in row.split("│")[4], row  # the verdict table shows GPU 0's TFLOP/s


def test_an_allocation_failure_in_the_memory_test_is_out_of_memory_on_that_gpu_only():
    """The memory test in process (the whole run's path through the worker and the judge is the
    corrupt-and-oom run above, where the injected failure hits matmul's allocation first)."""
    from types import SimpleNamespace

    import torch

    from gpumon.burn.orchestration.protocol import WorkerSpec
    from gpumon.burn.workloads import inject
    from gpumon.burn.workloads.context import Context, classify_error
    from gpumon.burn.workloads.memory import memory

    injection, _ = inject.parse("oom:0")

    def context(gpu: int) -> Context:
        spec = WorkerSpec(
            rank=gpu, world_size=2, gpu=gpu, node_gpus=(0, 1), expected_uuid=None, device="cpu", dtype="auto",
            tests=("memory",), duration_seconds=0.0, quick=True, store_host="", store_port=0, store_prefix="",
            injection=injection, allreduce_floor_bytes_per_second=None, link_fraction=0.5,
        )  # fmt: skip
        hb = SimpleNamespace(progress=lambda *args, **kwargs: None)
        return Context(spec=spec, hb=hb, device=torch.device("cpu"), dist=None, torch=torch)

    failing = context(0)
    with pytest.raises(MemoryError) as raised:
        memory(failing)
    assert classify_error(raised.value, failing) == (
        "oom",
        "GPU 0 (rank 0): out of memory (injected out of memory allocating (1048576,) torch.int32)",
    )
    assert memory(context(1))["mismatched_words"] == 0


def test_an_injected_slow_gpu_is_the_memory_straggler_on_cpu(burn):
    """On CPU the memory figure is the fastest batch in the worker's own time (a loaded host slows a batch
    now and then); a GPU slowed ten times is slow in every batch, so it is still named."""
    r = burn([*CPU, "--gpus", "0,1", "--tests", "memory"], env={"GPUMON_BURN_INJECT": "slow:1"})
    assert r.code == 1, r.out + r.err
    assert [f for f in r.report["faults"] if "memory" in f and f.startswith("GPU 1 ")], r.report["faults"]
    assert not [f for f in r.report["faults"] if f.startswith("GPU 0 ")], r.report["faults"]
