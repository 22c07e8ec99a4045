"""How one all-reduce size is timed: an eager loop, or a CUDA graph of back-to-back all-reduces.

A small all-reduce (1–64 MiB) over NVLink takes 13–250 µs, the same order as launching it from
Python, so an eager ``dist.all_reduce`` loop measures launch overhead (up to 2× below
nccl-tests at 1 MiB on 2×H200). Below ``GRAPH_BELOW_BYTES`` a CUDA (NCCL) run captures
``GRAPH_OPS`` all-reduces in one CUDA graph on a side stream, replays it on that same stream
and times the replays with CUDA events recorded there, as nccl-tests times its loop
(``all_reduce_perf -G``). The side stream matters: the same graph replayed on torch's default
(legacy) stream ran at 45 GB/s busbw at 1 MiB on 2×H200, on a side stream at 77
(docs/benchmarks.md, "Small-message all-reduce"). Capture that fails on any rank makes every
rank time that size eagerly, with the reason kept in the result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from gpumon.burn.workloads.context import MIB, Context
from gpumon.burn.workloads.tails import summarise

GRAPH_BELOW_BYTES = 256 * MIB
"""Sizes below this are timed with a CUDA graph on CUDA; larger ones are bandwidth-bound and timed eagerly."""
GRAPH_OPS = 50
"""All-reduces captured back to back in one graph (1 MiB on 2×H200: about 1 ms per replay)."""
MAX_EAGER_ITERATIONS = 200
MAX_GRAPH_REPLAYS = 1000


@dataclass(frozen=True)
class Timing:
    """One size's timing: seconds per all-reduce and how it was measured."""

    seconds_per_op: float
    iterations: int
    """All-reduces in the timed loop (graph: replays × GRAPH_OPS)."""
    method: str
    """``cuda_graph`` | ``eager``"""
    fallback_reason: str | None = None
    """Why a size meant for a CUDA graph was timed eagerly (None when it was not meant for one)."""


def wants_graph(ctx: Context, size_bytes: int) -> bool:
    """Whether this size is timed with a CUDA graph: CUDA (NCCL) runs, sizes below GRAPH_BELOW_BYTES."""
    return ctx.cuda and size_bytes < GRAPH_BELOW_BYTES


def time_allreduce(ctx: Context, group: Any, buf: Any, size_bytes: int, target_seconds: float) -> Timing:
    """Time ``dist.all_reduce(buf)`` over ``group`` for about ``target_seconds``; NCCL already warm.

    Every rank of ``group`` calls this with the same size and ends with the same method.
    """
    if not wants_graph(ctx, size_bytes):
        return time_eager(ctx, group, buf, size_bytes, target_seconds)
    graph, reason = _capture(ctx, group, buf)
    if _any_rank(ctx, group, graph is None) or graph is None:
        reason = reason or "CUDA graph capture failed on another rank"
        del graph
        timing = time_eager(ctx, group, buf, size_bytes, target_seconds)
        return dataclasses.replace(timing, fallback_reason=reason)
    try:
        return _time_graph(ctx, group, graph, size_bytes, target_seconds)
    finally:
        del graph


def time_eager(ctx: Context, group: Any, buf: Any, size_bytes: int, target_seconds: float) -> Timing:
    """One timed op gives the count (agreed across ranks), then a plain loop of ``dist.all_reduce``."""
    dist = ctx.dist
    ctx.sync()
    t = time.perf_counter()
    dist.all_reduce(buf, group=group)
    ctx.sync()
    estimate = _agree_max(ctx, group, time.perf_counter() - t)  # every rank runs the same count
    iters = max(5, min(MAX_EAGER_ITERATIONS, int(target_seconds / max(estimate, 1e-6))))
    slow = ctx.spec.injection.has("slow", ctx.spec.gpu)
    ctx.hb.collective("allreduce", f"all_reduce {size_bytes // MIB} MiB x{iters}")
    ctx.sync()
    start = time.perf_counter()
    for _ in range(iters):
        if slow:  # a tenth of the rate: pairs with this GPU must stand out even on a noisy CPU
            time.sleep(9 * estimate)
        dist.all_reduce(buf, group=group)
    ctx.sync()
    return Timing((time.perf_counter() - start) / iters, iters, "eager")


TAIL_ITERATIONS = {True: 100, False: 20}
"""All-reduces timed one by one per size, by whether the size is below GRAPH_BELOW_BYTES (the same on every rank)."""


def per_iteration(ctx: Context, group: Any, buf: Any, size_bytes: int) -> dict[str, Any]:
    """p50/p99 and the slowest of a loop of eager all-reduces, each timed alone (as ``all_reduce_perf -I``
    reports per-iteration times): the wall clock from the launch to the end of a synchronise, so launch
    and synchronise overhead (some µs) are in these times and small sizes read slower than the
    CUDA-graph figure."""
    dist = ctx.dist
    iters = TAIL_ITERATIONS[size_bytes < GRAPH_BELOW_BYTES]
    ctx.hb.collective("allreduce", f"all_reduce {size_bytes // MIB} MiB x{iters} one by one")
    seconds: list[float] = []
    at: list[float] = []
    ctx.sync()
    start_at = time.perf_counter()
    for _ in range(iters):
        t = time.perf_counter()
        dist.all_reduce(buf, group=group)
        ctx.sync()
        seconds.append(time.perf_counter() - t)
        at.append(t - start_at)
    return summarise(seconds, at)


def _capture(ctx: Context, group: Any, buf: Any) -> tuple[Any, str | None]:
    """(graph, side stream): GRAPH_OPS all-reduces of ``buf`` captured on that stream; (None, reason) on failure."""
    torch, dist = ctx.torch, ctx.dist
    ctx.hb.collective("allreduce", f"capture {GRAPH_OPS} x all_reduce")
    try:
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(ctx.device)
        stream.wait_stream(torch.cuda.current_stream(ctx.device))
        # thread_local: torch's NCCL watchdog thread may query events of earlier work meanwhile
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            for _ in range(GRAPH_OPS):
                dist.all_reduce(buf, group=group)
        ctx.sync()
        return (graph, stream), None
    except Exception as exc:
        text = str(exc).splitlines()[0][:200] if str(exc) else ""
        with contextlib.suppress(Exception):  # a failed capture may leave an error to clear
            ctx.sync()
        return None, f"CUDA graph capture failed: {type(exc).__name__}: {text}".rstrip(": ")


def _time_graph(ctx: Context, group: Any, captured: Any, size_bytes: int, target_seconds: float) -> Timing:
    """Replays on the capture's side stream, timed with CUDA events there; one replay first lines the ranks up."""
    graph, stream = captured
    with ctx.torch.cuda.stream(stream):  # never torch's default (legacy) stream: 1.7x slower at 1 MiB
        return _replay(ctx, group, graph, size_bytes, target_seconds)


def _replay(ctx: Context, group: Any, graph: Any, size_bytes: int, target_seconds: float) -> Timing:
    torch = ctx.torch
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    ctx.hb.collective("allreduce", f"all_reduce {size_bytes // MIB} MiB graph warm-up")
    graph.replay()
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    estimate = _agree_max(ctx, group, start.elapsed_time(end) / 1e3)  # seconds per replay, the slowest rank's
    replays = max(3, min(MAX_GRAPH_REPLAYS, int(target_seconds / max(estimate, 1e-6))))
    slow = ctx.spec.injection.has("slow", ctx.spec.gpu)
    ctx.hb.collective("allreduce", f"all_reduce {size_bytes // MIB} MiB graph x{replays * GRAPH_OPS}")
    graph.replay()
    start.record()
    for _ in range(replays):
        if slow:  # the GPU idles while the CPU sleeps: the events see it
            time.sleep(9 * estimate)
        graph.replay()
    end.record()
    end.synchronize()
    ops = replays * GRAPH_OPS
    return Timing(start.elapsed_time(end) / 1e3 / ops, ops, "cuda_graph")


def _agree_max(ctx: Context, group: Any, seconds: float) -> float:
    t = ctx.torch.tensor([seconds], dtype=ctx.torch.float64, device=ctx.device)
    ctx.dist.all_reduce(t, op=ctx.dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _any_rank(ctx: Context, group: Any, flag: bool) -> bool:
    """Whether ``flag`` is set on any rank of ``group`` (every rank learns the same answer)."""
    t = ctx.torch.tensor([1 if flag else 0], dtype=ctx.torch.int64, device=ctx.device)
    ctx.hb.collective("allreduce", "all_reduce(capture flag)")
    ctx.dist.all_reduce(t, op=ctx.dist.ReduceOp.MAX, group=group)
    return bool(int(t.item()))
