"""The ``allreduce`` load: a size sweep over all ranks, every result checked; pairwise runs to find a slow link."""

from __future__ import annotations

import time
from typing import Any

from gpumon.burn.workloads.context import GIB, MIB, TORCH_DTYPES, Context, flip_bit


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
    if ctx.cuda:
        sizes = [256 * MIB, GIB] if spec.quick else [256 * MIB, GIB, 4 * GIB]
    else:
        sizes = [MIB] if spec.quick else [MIB, 4 * MIB]
    affordable = _agree_min(ctx, int(ctx.free_bytes() * 0.4))
    sizes = [s for s in sizes if s <= affordable] or [min(sizes[0], max(MIB, affordable))]
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
        out["pairwise"] = _pairwise(ctx, sizes[0], dtype, dtype_name)
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
    ctx.sync()
    t = time.perf_counter()
    dist.all_reduce(buf, group=group)
    ctx.sync()
    estimate = torch.tensor([time.perf_counter() - t], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(estimate, op=dist.ReduceOp.MAX, group=group)  # every rank runs the same count
    target = 1.0 if ctx.cuda and not ctx.spec.quick else 0.4
    iters = max(5, min(200, int(target / max(float(estimate.item()), 1e-6))))
    slow = ctx.spec.injection.has("slow", ctx.spec.gpu)
    ctx.hb.collective("allreduce", f"all_reduce {size // MIB} MiB x{iters}")
    ctx.sync()
    start = time.perf_counter()
    for _ in range(iters):
        if slow:  # a tenth of the rate: pairs with this GPU must stand out even on a noisy CPU
            time.sleep(9 * float(estimate.item()))
        dist.all_reduce(buf, group=group)
    ctx.sync()
    seconds = (time.perf_counter() - start) / iters
    algbw = size / seconds
    out: dict[str, Any] = {
        "bytes": size,
        "iterations": iters,
        "seconds_per_op": seconds,
        "algbw_bytes_per_second": algbw,
        "busbw_bytes_per_second": algbw * 2 * (n - 1) / n,
    }
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
