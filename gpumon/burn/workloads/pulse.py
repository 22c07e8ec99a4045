"""The ``pulse`` load (``--long``): full load stepped on and off, as DCGM's pulse test does.

``CYCLES`` times: GEMMs at full rate for ``ON_SECONDS``, then idle for ``OFF_SECONDS``. Power
swings from idle to the limit at every step; a GPU whose supply or clocks do not keep up shows
as on-phases slower than its others (the first GEMMs after a step stall), and one that computes
wrong on a step as an output that differs from the first on-phase's (the same inputs every time).
The watcher samples power, clocks and clock events during the steps (``telemetry`` gives the
power swing and any slowdown seen while pulsing).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from gpumon.burn.workloads.context import SEED, Context, checksum, flip_bit, model_name

CYCLES = {True: 10, False: 4}
"""By ``ctx.cuda``: on/off cycles."""
ON_SECONDS = {True: 2.0, False: 0.3}
OFF_SECONDS = {True: 1.5, False: 0.2}
SIZE = {True: 8192, False: 256}


def pulse(ctx: Context) -> dict[str, Any]:
    """Per on-phase: TFLOP/s, the first GEMM's seconds after the step, whether the output stayed the same."""
    torch = ctx.torch
    n = SIZE[ctx.cuda]
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    gen = torch.Generator(device="cpu").manual_seed(SEED + 2)
    a = torch.randn(n, n, generator=gen).to(dtype).to(ctx.device)
    b = torch.randn(n, n, generator=gen).to(dtype).to(ctx.device)
    c = torch.empty_like(a)
    ctx.held += [a, b, c]
    torch.matmul(a, b, out=c)  # warm-up: kernels chosen before the first step
    ctx.sync()
    first_sum: int | None = None
    phases: list[dict[str, Any]] = []
    for cycle in range(CYCLES[ctx.cuda]):
        ctx.hb.progress("pulse", force=True)
        phases.append(_on_phase(ctx, (a, b, c), cycle))
        if first_sum is None:
            first_sum = phases[0]["checksum"]
        ctx.hb.progress("pulse")
        time.sleep(OFF_SECONDS[ctx.cuda])  # idle: power falls back
    rates = [p["tflops"] for p in phases]
    return {
        "model": model_name(ctx),
        "cycles": len(phases),
        "on_seconds": ON_SECONDS[ctx.cuda],
        "off_seconds": OFF_SECONDS[ctx.cuda],
        "tflops_phases": [round(r, 3) for r in rates],
        "tflops_median": statistics.median(rates),
        "first_gemm_seconds": [p["first_gemm_seconds"] for p in phases],
        "gemm_seconds_median": statistics.median(p["gemm_seconds"] for p in phases),
        "changed_phases": [i for i, p in enumerate(phases) if p["checksum"] != first_sum and i > 0],
    }


def _on_phase(ctx: Context, abc: tuple[Any, Any, Any], cycle: int) -> dict[str, Any]:
    """One on-phase; on CPU its GEMMs are timed by the worker thread's CPU time (``workloads.tails``)."""
    torch = ctx.torch
    a, b, c = abc
    clock = time.perf_counter if ctx.cuda else time.thread_time
    wall = time.perf_counter()
    start = clock()
    torch.matmul(a, b, out=c)
    ctx.sync()
    first = clock() - start
    done = 1
    while time.perf_counter() - wall < ON_SECONDS[ctx.cuda]:
        for _ in range(8):
            torch.matmul(a, b, out=c)
        ctx.sync()
        done += 8
        ctx.hb.progress("pulse")
    elapsed = clock() - start
    if ctx.spec.injection.has("corrupt", ctx.spec.gpu) and cycle >= 1:
        flip_bit(ctx, c, 104729 * cycle)
    n = a.shape[0]
    return {
        "tflops": 2.0 * n * n * n * done / elapsed / 1e12,
        "first_gemm_seconds": first,
        "gemm_seconds": (elapsed - first) / max(1, done - 1),
        "checksum": checksum(ctx, c),
    }
