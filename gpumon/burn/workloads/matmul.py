"""The ``matmul`` load: GEMMs at the best dtype for the whole duration, checked bit for bit and against float64."""

from __future__ import annotations

import statistics
import time
from typing import Any

from gpumon.burn.workloads.context import (
    REFERENCE_SIZE,
    SEED,
    TORCH_DTYPES,
    Context,
    checksum,
    flip_bit,
    model_name,
    resolve_dtype,
    slow_down,
)
from gpumon.burn.workloads.fingerprint import SDC_WORD
from gpumon.burn.workloads.tails import stall, summarise


def matmul(ctx: Context) -> dict[str, Any]:
    """GEMMs at the best dtype for the whole duration; bit-exact and float64-reference checks."""
    torch = ctx.torch
    dtype_name = resolve_dtype(ctx.spec.dtype, ctx)
    dtype = getattr(torch, TORCH_DTYPES[dtype_name])
    if ctx.cuda:
        torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
        torch.backends.cudnn.allow_tf32 = dtype_name == "tf32"
    n = _matrix_size(ctx, dtype)
    a, b, c = _operands(ctx, n, dtype)
    tolerance = {"bf16": 2e-2, "fp16": 4e-3, "tf32": 4e-3, "fp32": 1e-5, "fp64": 1e-12}[dtype_name]
    reference_before = _reference_check(ctx, a, b, tolerance)
    per_round, per_gemm = _gemms_per_round(ctx, a, b, c)
    timed = _timed_rounds(ctx, (a, b, c), per_round, per_gemm, flop_per_gemm=2.0 * n * n * n)
    rates, first_checksum, mismatch_rounds, tails = timed
    reference_after = _reference_check(ctx, a, b, tolerance)
    return {
        "model": model_name(ctx),
        "dtype": dtype_name,
        "n": n,
        "gemms_per_round": per_round,
        "rounds": len(rates),
        "tflops_median": statistics.median(rates),
        "tflops_max": max(rates),
        "tflops_rounds": [round(r, 3) for r in rates],
        "checksum_first": str(first_checksum),
        "checksum_mismatch_rounds": mismatch_rounds,
        "tails": tails,
        "reference": {
            "size": min(REFERENCE_SIZE, n),
            "tolerance": tolerance,
            "max_rel_error": max(reference_before, reference_after),
            "passed": max(reference_before, reference_after) <= tolerance,
        },
    }


def _matrix_size(ctx: Context, dtype: Any) -> int:
    """The side n of the square matrices: 8192 on a GPU, halved until the three fit half its free memory; 256 on CPU."""
    n = 8192 if ctx.cuda else 256
    elem = ctx.torch.tensor([], dtype=dtype).element_size()
    while ctx.cuda and n > 1024 and 4 * n * n * elem > 0.5 * ctx.free_bytes():
        n //= 2
    return n


def _operands(ctx: Context, n: int, dtype: Any) -> tuple[Any, Any, Any]:
    """A and B filled from the fixed seed (the same on every GPU), and C for the product; all held to the end."""
    torch = ctx.torch
    gen = torch.Generator(device=ctx.device).manual_seed(SEED)  # on the GPU: 2 x 8192^2 on the CPU took ~2 s
    a = ctx.alloc((n, n), dtype)
    b = ctx.alloc((n, n), dtype)
    c = ctx.alloc((n, n), dtype)
    ctx.held += [a, b, c]
    a.copy_(torch.randn(n, n, generator=gen, device=ctx.device).to(dtype))
    b.copy_(torch.randn(n, n, generator=gen, device=ctx.device).to(dtype))
    return a, b, c


def _gemms_per_round(ctx: Context, a: Any, b: Any, c: Any) -> tuple[int, float]:
    """(GEMMs to fill one round: 0.5 s on a GPU, 0.2 s on CPU; seconds per GEMM), after a warm-up and a timing."""
    torch = ctx.torch
    for _ in range(3):  # warm-up, and a first estimate of one GEMM's time
        torch.matmul(a, b, out=c)
    ctx.sync()
    t0 = time.perf_counter()
    for _ in range(3):
        torch.matmul(a, b, out=c)
    ctx.sync()
    per_gemm = max((time.perf_counter() - t0) / 3, 1e-6)
    round_seconds = 0.5 if ctx.cuda else 0.2
    return max(1, int(round_seconds / per_gemm)), per_gemm


def _timed_rounds(
    ctx: Context, abc: tuple[Any, Any, Any], per_round: int, per_gemm: float, flop_per_gemm: float
) -> tuple[list[float], int, list[int], dict[str, Any]]:
    """Rounds of GEMMs for the duration (at least two), each GEMM timed; returns TFLOP/s per round, round 0's
    checksum, the rounds whose output differed from round 0's bit for bit, and the per-GEMM tails."""
    torch = ctx.torch
    c = abc[2]
    rates: list[float] = []
    first: Any = None
    """Round 0's output, kept: every later round is compared with it bit for bit."""
    first_checksum = 0
    mismatch_rounds: list[int] = []
    gemm_seconds: list[float] = []
    gemm_at: list[float] = []
    test_start = time.perf_counter()
    end = time.monotonic() + ctx.spec.duration_seconds
    rnd = 0
    while time.monotonic() < end or rnd < 2:
        ctx.hb.progress("matmul")
        start = time.perf_counter()
        times = _timed_gemms(ctx, abc, per_round, per_gemm, len(gemm_seconds))
        busy = time.perf_counter() - start
        slow_down(ctx, busy)
        elapsed = time.perf_counter() - start
        if not ctx.cuda:  # the worker's own CPU time and what slow:G slept, never the host's preemptions
            elapsed = sum(times) + elapsed - busy
        gemm_at += [start - test_start + sum(times[: i + 1]) for i in range(len(times))]
        gemm_seconds += times
        if ctx.spec.injection.has("corrupt", ctx.spec.gpu) and rnd >= 1:
            flip_bit(ctx, c, 7919 * rnd)
        if ctx.spec.injection.has("sdc", ctx.spec.gpu):  # the same wrong bit every round: rounds agree
            flip_bit(ctx, c, SDC_WORD)
        if first is None:
            first = c.clone()
            ctx.held.append(first)
            first_checksum = checksum(ctx, c)
        elif not torch.equal(c.view(torch.int16), first.view(torch.int16)):  # the bits, not the values (-0.0, NaN)
            mismatch_rounds.append(rnd)
        rates.append(flop_per_gemm * per_round / elapsed / 1e12)
        ctx.hb.progress("matmul", {"tflops": rates[-1]})
        rnd += 1
    return rates, first_checksum, mismatch_rounds, summarise(gemm_seconds, gemm_at)


def _timed_gemms(ctx: Context, abc: tuple[Any, Any, Any], count: int, per_gemm: float, done: int) -> list[float]:
    """``count`` back-to-back GEMMs, each one's seconds: CUDA events between them (no gap on the GPU), or the
    CPU's clock; ``done`` GEMMs came before (the ``stall:G`` injection picks by the running count)."""
    torch = ctx.torch
    a, b, c = abc
    if not ctx.cuda:
        out = []
        for i in range(count):
            t = time.thread_time()  # the worker's own time, not the host's preemptions (workloads.tails)
            stall(ctx, done + i, per_gemm)
            torch.matmul(a, b, out=c)
            out.append(time.thread_time() - t)
        return out
    events = [torch.cuda.Event(enable_timing=True) for _ in range(count + 1)]
    events[0].record()
    for i in range(count):
        stall(ctx, done + i, per_gemm)
        torch.matmul(a, b, out=c)
        events[i + 1].record()
    events[-1].synchronize()
    return [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(count)]


def _reference_check(ctx: Context, a: Any, b: Any, tolerance: float) -> float:
    """max|C - C_ref| / max|C_ref| for a small corner of a·b against float64 on the CPU."""
    torch = ctx.torch
    r = min(REFERENCE_SIZE, a.shape[0])
    a_s, b_s = a[:r, :r].contiguous(), b[:r, :r].contiguous()
    got = torch.matmul(a_s, b_s).double().cpu()
    ref = a_s.double().cpu() @ b_s.double().cpu()
    scale = float(ref.abs().max()) or 1.0
    return float((got - ref).abs().max()) / scale
