"""The ``p2p`` load: copy bandwidth and data integrity from this GPU to every other GPU of its node."""

from __future__ import annotations

import time
from typing import Any

from gpumon.burn.workloads.context import MIB, SEED, Context, checksum, flip_bit, slow_down


def p2p(ctx: Context) -> dict[str, Any]:
    """Copy bandwidth from this GPU to every other GPU of its node, one source GPU at a time."""
    spec = ctx.spec
    if not ctx.cuda:
        return {"skipped": "device cpu: one memory, no GPU-to-GPU links to measure"}
    peers = [g for g in spec.node_gpus if g != spec.gpu]
    if not peers:
        return {"skipped": "one GPU on this node: no pairs"}
    torch = ctx.torch
    nbytes = (128 if spec.quick else 256) * MIB
    pairs: list[dict[str, Any]] = []
    for src_rank in range(spec.world_size):
        if src_rank == spec.rank:
            src = ctx.alloc((nbytes // 2,), torch.int16)
            src.copy_(
                torch.randint(
                    -32768, 32767, (nbytes // 2,), dtype=torch.int16, generator=torch.Generator().manual_seed(SEED)
                )
            )
            want = checksum(ctx, src)
            for peer in peers:
                dst_dev = torch.device("cuda", peer)
                dst = torch.zeros(nbytes // 2, dtype=torch.int16, device=dst_dev)
                for _ in range(2):
                    dst.copy_(src, non_blocking=True)
                ctx.sync(ctx.device, dst_dev)
                iters = 0
                start = time.perf_counter()
                while time.perf_counter() - start < (0.2 if spec.quick else 0.5):
                    t = time.perf_counter()
                    for _ in range(5):
                        dst.copy_(src, non_blocking=True)
                    ctx.sync(ctx.device, dst_dev)
                    slow_down(ctx, time.perf_counter() - t)
                    iters += 5
                    ctx.hb.progress("p2p")
                elapsed = time.perf_counter() - start
                if spec.injection.has("corrupt", spec.gpu):
                    flip_bit(ctx, dst, 4242)
                got = checksum(ctx, dst)
                bw = nbytes * iters / elapsed
                pairs.append(
                    {
                        "src_gpu": spec.gpu,
                        "dst_gpu": peer,
                        "bytes": nbytes,
                        "bytes_per_second": bw,
                        "checksum_ok": got == want,
                    }
                )
                ctx.hb.progress("p2p", {"gbps": bw / 1e9})
                del dst
            del src
            torch.cuda.empty_cache()
        if ctx.dist is not None:
            ctx.hb.collective("p2p", "barrier")
            ctx.barrier()
    return {"pairs": pairs}
