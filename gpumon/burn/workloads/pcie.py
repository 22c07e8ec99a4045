"""The ``pcie`` load: pinned host-to-device, device-to-host and both at once, per GPU alone and all together.

Each GPU of a node takes its turn alone (its own link: a GPU on a downtrained link, Gen4 in a
Gen5 slot or x8, shows here), then all copy at once (a PCIe switch or host bridge shared by
several GPUs shows only then). Pinned host memory, one buffer per direction, timed with the wall
clock around synchronised batches of copies (as nvbandwidth's and the CUDA samples' bandwidth
tests do). On ``--device cpu`` the same steps copy between two CPU buffers, so the orchestration
and the verdict run in CI; the figures are memory copies then, timed by the worker thread's CPU
time (as the GEMM tails are: a busy host's preemptions halved them at random), judged only
against peers.
"""

from __future__ import annotations

import time
from typing import Any

from gpumon.burn.workloads.context import MIB, Context, model_name

BUFFER_BYTES = {(True, False): 256 * MIB, (True, True): 128 * MIB, (False, False): 16 * MIB, (False, True): 8 * MIB}
"""(cuda, quick) -> bytes copied per transfer."""
SECONDS_PER_DIRECTION = {False: 0.3, True: 0.06}
"""By ``quick``: how long each direction is timed, alone and together."""
BATCH_COPIES = 4
SLOW_PCIE_FACTOR = 4
"""``slow-pcie:G``: its copies take this many times as long (a link at a quarter: x4 instead of x16)."""


def pcie(ctx: Context) -> dict[str, Any]:
    """Host-link bandwidth of this GPU alone (one GPU of the node at a time) and with all at once (bytes/s)."""
    spec = ctx.spec
    nbytes = BUFFER_BYTES[(ctx.cuda, spec.quick)]
    host, device = _buffers(ctx, nbytes)
    streams = (ctx.torch.cuda.Stream(ctx.device), ctx.torch.cuda.Stream(ctx.device)) if ctx.cuda else (None, None)
    alone: dict[str, float] = {}
    for turn_gpu in spec.node_gpus:  # every rank of every node walks the same turns (same GPU count per node)
        if turn_gpu == spec.gpu:
            alone = _directions(ctx, host, device, streams)
        ctx.hb.collective("pcie", f"barrier (GPU {turn_gpu}'s turn alone)")
        ctx.barrier()
    together = _directions(ctx, host, device, streams)
    ctx.hb.collective("pcie", "barrier (together)")
    ctx.barrier()
    return {"model": model_name(ctx), "bytes": nbytes, "pinned": ctx.cuda, "alone": alone, "together": together}


def _buffers(ctx: Context, nbytes: int) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """(host source, host destination), (device source, device destination): int8, the host ones pinned."""
    torch = ctx.torch
    pin = ctx.cuda
    host = (torch.ones(nbytes, dtype=torch.int8, pin_memory=pin), torch.empty(nbytes, dtype=torch.int8, pin_memory=pin))
    device = (ctx.alloc((nbytes,), torch.int8), ctx.alloc((nbytes,), torch.int8))
    device[0].fill_(1)
    ctx.held += [*host, *device]
    return host, device


def _directions(
    ctx: Context, host: tuple[Any, Any], device: tuple[Any, Any], streams: tuple[Any, Any]
) -> dict[str, float]:
    """Bytes/s host-to-device, device-to-host, and both at once (bytes moved in both directions together)."""
    h2d = _timed(ctx, [(device[1], host[0], streams[0])])
    d2h = _timed(ctx, [(host[1], device[0], streams[1])])
    both = _timed(ctx, [(device[1], host[0], streams[0]), (host[1], device[0], streams[1])])
    return {"h2d_bytes_per_second": h2d, "d2h_bytes_per_second": d2h, "bidirectional_bytes_per_second": both}


def _timed(ctx: Context, copies: list[tuple[Any, Any, Any]]) -> float:
    """Batches of the given copies (each on its stream, all at once) for SECONDS_PER_DIRECTION; bytes/s."""
    nbytes = BATCH_COPIES * sum(int(src.numel()) for _dst, src, _s in copies)
    _batch(ctx, copies)  # warm-up
    clock = time.perf_counter if ctx.cuda else time.thread_time  # CPU: the worker's own time (workloads.tails)
    seconds = SECONDS_PER_DIRECTION[ctx.spec.quick]
    done = 0
    fastest = 0.0
    """CPU: the fastest batch's rate. Simulated GPUs share the host's caches and memory with whatever else
    runs there, which slows a batch now and then even in the worker's own time; the injection slows all."""
    start = clock()
    while clock() - start < seconds:
        t = clock()
        _batch(ctx, copies)
        if ctx.spec.injection.has("slow-pcie", ctx.spec.gpu):
            _wait(ctx, clock, (SLOW_PCIE_FACTOR - 1) * (clock() - t))
        fastest = max(fastest, nbytes / max(clock() - t, 1e-9))
        done += 1
        ctx.hb.progress("pcie")
    return nbytes * done / (clock() - start) if ctx.cuda else fastest


def _wait(ctx: Context, clock: Any, seconds: float) -> None:
    """The ``slow-pcie`` delay: a sleep on a GPU (the copy engines idle), a busy loop on CPU (counted there)."""
    if ctx.cuda:
        time.sleep(seconds)
        return
    until = clock() + seconds
    while clock() < until:
        pass


def _batch(ctx: Context, copies: list[tuple[Any, Any, Any]]) -> None:
    """BATCH_COPIES copies of each, on its own stream, then wait for all."""
    torch = ctx.torch
    for _ in range(BATCH_COPIES):
        for dst, src, stream in copies:
            if stream is None:
                dst.copy_(src)
            else:
                with torch.cuda.stream(stream):
                    dst.copy_(src, non_blocking=True)
    for _dst, _src, stream in copies:
        if stream is not None:
            stream.synchronize()
