"""Per-iteration times of a load: p50, p99 and the slowest iterations with when they happened.

A GPU that stalls 1 % of the time has a fine mean and a bad p99: the matmul test times every GEMM
(CUDA events between back-to-back GEMMs on the GPU, ``perf_counter`` around each on the CPU) and
the all-reduce test every iteration of a short eager loop per size. On ``--device cpu`` a GEMM's
time is the worker thread's CPU time (``time.thread_time``): a simulated GPU's own time, without the
host's preemptions (on a busy 2-core host they made 1 % of wall-clock times 50x the median). The
``stall:G`` injection makes one op in ``STALL_EVERY`` spin for ``STALL_FACTOR`` op times more on GPU G
(a spin kernel on the GPU: 2 % of its GEMMs, a mean 6 % slower, within the model's floor, a p99 about
5x; a busy loop on the CPU, 10 op times, where timings are noisier and there is no floor).
"""

from __future__ import annotations

import time
from typing import Any

SLOWEST_KEPT = 5
STALL_EVERY = 50
STALL_FACTOR = {True: 4, False: 10}
"""By ``ctx.cuda``."""
GPU_CYCLES_PER_SECOND = 2.0e9
"""The spin of ``torch.cuda._sleep`` counts GPU clock cycles: about 2 GHz on a Hopper GPU under load."""


def percentile(sorted_values: list[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by the nearest-rank method (nccl-tests' and most tools' choice)."""
    if not sorted_values:
        return 0.0
    rank = max(1, -(-len(sorted_values) * q // 100))  # ceil(n * q / 100)
    return sorted_values[int(min(rank, len(sorted_values))) - 1]


def summarise(seconds: list[float], at_seconds: list[float]) -> dict[str, Any]:
    """{iterations, p50/p99/max in ms, slowest: [{ms, at_seconds (since the test started), iteration}]}."""
    ordered = sorted(seconds)
    slowest = sorted(range(len(seconds)), key=lambda i: seconds[i], reverse=True)[:SLOWEST_KEPT]
    return {
        "iterations": len(seconds),
        "p50_ms": percentile(ordered, 50) * 1e3,
        "p99_ms": percentile(ordered, 99) * 1e3,
        "max_ms": (ordered[-1] if ordered else 0.0) * 1e3,
        "mean_ms": (sum(seconds) / len(seconds) if seconds else 0.0) * 1e3,
        "slowest": [
            {"ms": round(seconds[i] * 1e3, 4), "at_seconds": round(at_seconds[i], 3), "iteration": i} for i in slowest
        ],
    }


def stall(ctx: Any, iteration: int, per_op_seconds: float) -> None:
    """``stall:G``: one op in STALL_EVERY waits STALL_FACTOR op times more, on the GPU itself (a spin kernel)."""
    if not ctx.spec.injection.has("stall", ctx.spec.gpu) or iteration % STALL_EVERY != STALL_EVERY // 2:
        return
    if ctx.cuda:
        ctx.torch.cuda._sleep(int(STALL_FACTOR[True] * per_op_seconds * GPU_CYCLES_PER_SECOND))
        return
    until = time.thread_time() + STALL_FACTOR[False] * per_op_seconds
    while time.thread_time() < until:  # busy: the thread's CPU time is what a CPU op is timed by
        pass
