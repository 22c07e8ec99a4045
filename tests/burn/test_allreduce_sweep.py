"""The all-reduce sweep: small sizes on CUDA, floors only at the largest size, CUDA graph fallback (on CPU)."""

from __future__ import annotations

import contextlib
import datetime
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from gpumon.burn.orchestration.protocol import WorkerSpec
from gpumon.burn.verdict.judge import judge
from gpumon.burn.verdict.thresholds import Thresholds
from gpumon.burn.workloads import allreduce_timing
from gpumon.burn.workloads.allreduce import _allreduce_size, sweep_sizes
from gpumon.burn.workloads.context import Context
from gpumon.burn.workloads.inject import Injection

MIB = 1 << 20
GIB = 1 << 30
SMALL = [MIB, 4 * MIB, 16 * MIB, 64 * MIB]


def test_cuda_sweeps_one_to_sixty_four_mib_before_the_bandwidth_sizes():
    assert sweep_sizes(True, False, 100 * GIB) == ([*SMALL, 256 * MIB, GIB, 4 * GIB], [256 * MIB, GIB, 4 * GIB])
    assert sweep_sizes(True, True, 100 * GIB) == ([*SMALL, 256 * MIB, GIB], [256 * MIB, GIB])


def test_the_bandwidth_sizes_are_cut_to_free_memory_as_before_and_small_sizes_stay_below_them():
    assert sweep_sizes(True, False, 2 * GIB) == ([*SMALL, 256 * MIB, GIB], [256 * MIB, GIB])
    # too little for 256 MiB: one bandwidth size of what fits, the small sizes below it
    assert sweep_sizes(True, False, 40 * MIB) == ([MIB, 4 * MIB, 16 * MIB, 40 * MIB], [40 * MIB])


def test_cpu_runs_keep_their_sizes_and_no_small_sweep():
    assert sweep_sizes(False, False, 4 * GIB) == ([MIB, 4 * MIB], [MIB, 4 * MIB])
    assert sweep_sizes(False, True, 4 * GIB) == ([MIB], [MIB])


def test_only_cuda_sizes_below_256_mib_are_meant_for_a_cuda_graph():
    cuda = SimpleNamespace(cuda=True)
    assert allreduce_timing.wants_graph(cuda, 64 * MIB)  # type: ignore[arg-type]
    assert not allreduce_timing.wants_graph(cuda, 256 * MIB)  # type: ignore[arg-type]
    assert not allreduce_timing.wants_graph(SimpleNamespace(cuda=False), MIB)  # type: ignore[arg-type]


def _size(size: int, busbw: float, **extra: Any) -> dict[str, Any]:
    return {
        "bytes": size,
        "iterations": 100,
        "seconds_per_op": 1e-5,
        "algbw_bytes_per_second": busbw,
        "busbw_bytes_per_second": busbw,
        "mismatched_elements": 0,
        "timing": "cuda_graph" if size < 256 * MIB else "eager",
        **extra,
    }


def _node(sizes: list[dict[str, Any]]) -> dict[str, Any]:
    ranks = [
        {
            "rank": g,
            "gpu": g,
            "node": 0,
            "model": "NVIDIA H200",
            "results": {"allreduce": {"dtype": "bf16", "world_size": 2, "sizes": sizes}},
            "errors": [],
            "last_test": "allreduce",
        }
        for g in (0, 1)
    ]
    return {
        "node": 0,
        "hostname": "h",
        "ranks": ranks,
        "gpus_info": {str(g): {"uuid": f"GPU-{g}", "name": "NVIDIA H200"} for g in (0, 1)},
        "topology": {"0": {"1": "nvlink"}, "1": {"0": "nvlink"}},
        "abort": None,
    }


def test_small_sizes_far_below_the_floor_do_not_fail_a_healthy_pair():
    # 2xH200 figures: nccl-tests 57.7 GB/s at 1 MiB, the H200 floor (240) holds at the largest size only
    sizes = [_size(MIB, 55e9), _size(4 * MIB, 115e9), _size(16 * MIB, 205e9), _size(64 * MIB, 260e9)]
    sizes += [_size(256 * MIB, 300e9), _size(GIB, 330e9)]
    j = judge([_node(sizes)], Thresholds(), ("allreduce",))
    (busbw,) = [c for c in j.checks if c["check"] == "busbw"]
    assert busbw["passed"] is True and busbw["threshold"] == 240e9 and busbw["value"] == 330e9
    assert "1 MiB 55.0" in busbw["detail"] and "1024 MiB 330.0" in busbw["detail"]
    assert not j.faults
    summary = j.gpus[(0, 0)]["allreduce"]
    assert [s["bytes"] for s in summary["sizes"]] == [s["bytes"] for s in sizes]
    assert [s["timing"] for s in summary["sizes"]][:4] == ["cuda_graph"] * 4


def test_a_size_timed_eagerly_after_a_failed_capture_is_reported_with_the_reason_not_failed():
    reason = "CUDA graph capture failed: RuntimeError: operation not permitted when stream is capturing"
    mine = [_size(MIB, 14e9, timing="eager", timing_fallback=reason), _size(GIB, 330e9)]
    other = [_size(MIB, 14e9, timing="eager", timing_fallback="CUDA graph capture failed on another rank")]
    node = _node(mine)
    node["ranks"][1]["results"]["allreduce"]["sizes"] = [*other, _size(GIB, 330e9)]
    j = judge([node], Thresholds(), ("allreduce",))
    (row,) = [c for c in j.checks if c["check"] == "timing"]
    assert row["passed"] is None and row["group"] == [[0, 0], [0, 1]]
    assert row["detail"].startswith("1 MiB timed with an eager loop, not a CUDA graph (" + reason)
    assert not j.faults and j.gpus[(0, 0)]["tests"]["allreduce"] is True


class _PretendCuda(Context):
    """A CPU context that claims CUDA, so the graph path is tried (and fails: this torch has no CUDA graphs)."""

    @property
    def cuda(self) -> bool:
        return True

    def sync(self, *devices: Any) -> None:
        return None


@pytest.fixture
def gloo_world_of_one() -> Any:
    dist.init_process_group(
        "gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=datetime.timedelta(seconds=30)
    )
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_a_failed_capture_falls_back_to_the_eager_loop_with_its_reason_and_still_checks_the_sum(gloo_world_of_one):
    spec = WorkerSpec(
        rank=0,
        world_size=1,
        gpu=0,
        node_gpus=(0,),
        expected_uuid=None,
        device="cpu",
        dtype="fp32",
        tests=("allreduce",),
        duration_seconds=1.0,
        quick=True,
        store_host="127.0.0.1",
        store_port=0,
        store_prefix="t",
        injection=Injection(),
        allreduce_floor_bytes_per_second=None,
        link_fraction=0.5,
    )
    hb = SimpleNamespace(progress=lambda *a, **k: None, collective=lambda *a, **k: None)
    ctx = _PretendCuda(spec=spec, hb=hb, device=torch.device("cpu"), dist=gloo_world_of_one, torch=torch)
    out = _allreduce_size(ctx, None, 1, MIB, torch.float32, "fp32", check=True)
    assert out["timing"] == "eager"
    assert out["timing_fallback"].startswith("CUDA graph capture failed: RuntimeError")
    assert out["iterations"] >= 5 and out["busbw_bytes_per_second"] == 0.0  # one rank: 2(n-1)/n = 0
    assert out["mismatched_elements"] == 0


class _Streams:
    """torch.cuda's stream and event calls, recording on which stream each replay and event happens."""

    def __init__(self) -> None:
        self.current = "default"
        self.log: list[str] = []

    @contextlib.contextmanager
    def stream(self, stream: str) -> Any:
        before, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = before

    def event(self, enable_timing: bool = False) -> Any:
        streams = self

        class _Event:
            def record(self) -> None:
                streams.log.append(f"event on {streams.current}")

            def synchronize(self) -> None:
                return None

            def elapsed_time(self, other: Any) -> float:
                return 1.0  # ms

        return _Event()


def test_the_graph_is_replayed_and_timed_on_the_stream_it_was_captured_on_never_torchs_default():
    # on 2xH200 a 1 MiB all-reduce graph replayed on torch's default (legacy) stream ran at 45 GB/s busbw,
    # on a side stream at 77: the replays and their events must be on the capture's stream
    streams = _Streams()
    fake_torch = SimpleNamespace(
        cuda=SimpleNamespace(stream=streams.stream, Event=streams.event),
        tensor=lambda values, **kw: SimpleNamespace(item=lambda: values[0]),
        float64=None,
    )
    fake_dist = SimpleNamespace(all_reduce=lambda *a, **k: None, ReduceOp=SimpleNamespace(MAX="max"))
    graph = SimpleNamespace(replay=lambda: streams.log.append(f"replay on {streams.current}"))
    ctx = SimpleNamespace(
        torch=fake_torch,
        dist=fake_dist,
        device="cuda:0",
        spec=SimpleNamespace(injection=Injection(), gpu=0),
        hb=SimpleNamespace(collective=lambda *a, **k: None),
    )
    timing = allreduce_timing._time_graph(ctx, None, (graph, "capture-stream"), MIB, 0.01)  # type: ignore[arg-type]
    assert timing.method == "cuda_graph" and timing.iterations >= 3 * allreduce_timing.GRAPH_OPS
    assert streams.log and all(entry.endswith("on capture-stream") for entry in streams.log), streams.log
