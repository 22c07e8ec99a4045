"""The ``allreduce`` load: a size sweep over all ranks, every result checked; pairwise runs to find a slow link."""

from __future__ import annotations

from typing import Any

from gpumon.burn.workloads.allreduce_timing import per_iteration, time_allreduce
from gpumon.burn.workloads.context import GIB, MIB, TORCH_DTYPES, Context, flip_bit

SMALL_SIZES = (MIB, 4 * MIB, 16 * MIB, 64 * MIB)
"""Latency-bound sizes swept first on CUDA (a CUDA graph times them): reported, never judged against a floor."""

BANDWIDTH_SIZES: dict[tuple[bool, bool], tuple[int, ...]] = {
    (True, False): (256 * MIB, GIB, 4 * GIB),
    (True, True): (256 * MIB, GIB),
    (False, False): (MIB, 4 * MIB),
    (False, True): (MIB,),
}
"""(cuda, quick) -> the bandwidth-bound sizes: the largest that fits is judged against the floor."""


def sweep_sizes(cuda: bool, quick: bool, affordable_bytes: int) -> tuple[list[int], list[int]]:
    """(every size to run, ascending; the bandwidth sizes among them) for ``affordable_bytes`` per buffer.

    The bandwidth sizes are the sweep gpumon always ran (CUDA: 256 MiB / 1 GiB / 4 GiB, quick
    without 4 GiB; CPU: 1 MiB, 4 MiB unless quick), cut to what fits: the largest of them is
    judged against the floor and the first is the size of the pairwise runs. On CUDA the
    SMALL_SIZES below the first bandwidth size come before them.
    """
    sizes = BANDWIDTH_SIZES[(cuda, quick)]
    bandwidth = [s for s in sizes if s <= affordable_bytes] or [min(sizes[0], max(MIB, affordable_bytes))]
    small = [s for s in SMALL_SIZES if s < bandwidth[0]] if cuda else []
    return small + bandwidth, bandwidth


def allreduce(ctx: Context) -> dict[str, Any]:
    """All-reduce size sweep over all ranks; busbw = algbw·2(n−1)/n; every result checked exactly.

    When the whole group is below the floor, every pair of ranks is measured to find the
    GPU or link responsible.
    """
    spec = ctx.spec
    if ctx.dist is None:
        return {"skipped": "one rank: nothing to all-reduce"}
    torch, dist = ctx.torch, ctx.dist
    n = spec.world_size
    # (i % 4 + 1)·(rank + 1) summed over ranks stays an exact integer in bf16 up to n = 10
    dtype_name = "bf16" if ctx.cuda and 4 * n * (n + 1) // 2 <= 256 else "fp32"
    dtype = getattr(torch, TORCH_DTYPES[dtype_name])
    affordable = _agree_min(ctx, int(ctx.free_bytes() * 0.4))
    sizes, bandwidth_sizes = sweep_sizes(ctx.cuda, spec.quick, affordable)
    results = []
    for size in sizes:
        results.append(_allreduce_size(ctx, None, n, size, dtype, dtype_name, check=True))
        ctx.hb.progress("allreduce", {"gbps": results[-1]["busbw_bytes_per_second"] / 1e9})
    out: dict[str, Any] = {"dtype": dtype_name, "world_size": n, "sizes": results}
    group_busbw = results[-1]["busbw_bytes_per_second"]
    floor = spec.allreduce_floor_bytes_per_second
    slow = torch.tensor([1 if floor is not None and group_busbw < floor else 0], dtype=torch.int64, device=ctx.device)
    ctx.hb.collective("allreduce", "all_reduce(flag)")
    dist.all_reduce(slow, op=dist.ReduceOp.MAX)
    if int(slow.item()) and n >= 3:
        out["pairwise"] = _pairwise(ctx, bandwidth_sizes[0], dtype, dtype_name)
    return out


def _agree_min(ctx: Context, value: int) -> int:
    t = ctx.torch.tensor([value], dtype=ctx.torch.int64, device=ctx.device)
    ctx.hb.collective("allreduce", "all_reduce(min)")
    ctx.dist.all_reduce(t, op=ctx.dist.ReduceOp.MIN)
    return int(t.item())


def _allreduce_size(
    ctx: Context, group: Any, n: int, size: int, dtype: Any, dtype_name: str, check: bool
) -> dict[str, Any]:
    torch, dist = ctx.torch, ctx.dist
    elem = torch.tensor([], dtype=dtype).element_size()
    numel = size // elem
    buf = ctx.alloc((numel,), dtype)
    ctx.held.append(buf)
    buf.zero_()  # zeros stay zeros however often they are summed
    ctx.hb.collective("allreduce", f"all_reduce {size // MIB} MiB warm-up")
    for _ in range(3):
        dist.all_reduce(buf, group=group)
    target = 1.0 if ctx.cuda and not ctx.spec.quick else 0.4
    timing = time_allreduce(ctx, group, buf, size, target)
    algbw = size / timing.seconds_per_op
    out: dict[str, Any] = {
        "bytes": size,
        "iterations": timing.iterations,
        "seconds_per_op": timing.seconds_per_op,
        "algbw_bytes_per_second": algbw,
        "busbw_bytes_per_second": algbw * 2 * (n - 1) / n,
        "timing": timing.method,
    }
    if timing.fallback_reason is not None:
        out["timing_fallback"] = timing.fallback_reason
    if check:  # the sweep, not the pairwise runs: every iteration of a short eager loop timed on its own
        out["tails"] = per_iteration(ctx, group, buf, size)
    if check:
        out["mismatched_elements"] = _check_allreduce(ctx, group, n, buf, dtype)
    del buf
    ctx.held.clear()
    return out


def _check_allreduce(ctx: Context, group: Any, n: int, buf: Any, dtype: Any) -> int:
    """Element i of rank r holds (i % 4 + 1)(r' + 1), r' the rank in the group; the sum is exact."""
    torch, dist = ctx.torch, ctx.dist
    me = dist.get_rank(group) if group is not None else ctx.spec.rank
    tile = torch.arange(1, 5, dtype=dtype, device=ctx.device)
    view = buf.view(-1, 4)
    view.copy_((tile * (me + 1)).expand_as(view))
    ctx.hb.collective("allreduce", "all_reduce check")
    dist.all_reduce(buf, group=group)
    ctx.sync()
    if ctx.spec.injection.has("corrupt", ctx.spec.gpu):
        flip_bit(ctx, buf, 31337)
    expected = tile * (n * (n + 1) // 2)
    bad = 0
    step = (64 * MIB) // (4 * buf.element_size())
    for start in range(0, view.shape[0], step):
        bad += int((view[start : start + step] != expected).sum().item())
    ctx.hb.progress("allreduce")
    return bad


def _pairwise(ctx: Context, size: int, dtype: Any, dtype_name: str) -> list[dict[str, Any]]:
    """Every pair of ranks, in n−1 rounds of disjoint pairs (circle method); one size, no checks."""
    dist = ctx.dist
    n = ctx.spec.world_size
    groups = {}
    for a in range(n):
        for b in range(a + 1, n):
            groups[(a, b)] = dist.new_group([a, b])
    out = []
    for pairs in _rounds(n):
        mine = next(((a, b) for a, b in pairs if ctx.spec.rank in (a, b)), None)
        if mine is not None:
            res = _allreduce_size(ctx, groups[mine], 2, size, dtype, dtype_name, check=False)
            if ctx.spec.rank == mine[0]:
                out.append({"ranks": list(mine), **res})
        ctx.hb.collective("allreduce", "barrier (pairwise)")
        ctx.barrier()
    return out


def _rounds(n: int) -> list[list[tuple[int, int]]]:
    """Round-robin schedule: n−1 rounds (n even) in which every rank meets every other once."""
    players: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = players[i], players[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(pairs)
        players = [players[0], players[-1], *players[1:-1]]
    return rounds
