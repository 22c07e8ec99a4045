"""The ``p2p`` load: copy bandwidth and data integrity from this GPU to every other GPU of its node.

The copies go in rounds: in round k (1 .. n-1) the GPU at position i of the node's GPU list copies to
the GPU at position (i + k) mod n, so after n-1 rounds every ordered pair has been measured once.
Where every pair of the node's GPUs is joined by NVLink (``spec.p2p_concurrent``) all GPUs copy at
once in a round, each sending to one peer and receiving from another: each NVLink direction carries
one copy, as when pairs run one at a time, and 8 GPUs take 7 rounds instead of 56 turns. Over PCIe a
round's copies could share a switch's uplink and read slower than the link is, so there the GPUs take
their turn one at a time within each round.
"""

from __future__ import annotations

import time
from typing import Any

from gpumon.burn.workloads.context import MIB, SEED, Context, checksum, flip_bit, slow_down


def p2p(ctx: Context) -> dict[str, Any]:
    """Copy bandwidth and integrity from this GPU to every other GPU of its node, in n-1 rounds."""
    spec = ctx.spec
    if not ctx.cuda:
        return {"skipped": "device cpu: one memory, no GPU-to-GPU links to measure"}
    node = list(spec.node_gpus)
    if len(node) < 2:
        return {"skipped": "one GPU on this node: no pairs"}
    torch = ctx.torch
    nbytes = (128 if spec.quick else 256) * MIB
    me = node.index(spec.gpu)
    src = ctx.alloc((nbytes // 2,), torch.int16)
    generator = torch.Generator(device=ctx.device).manual_seed(SEED)
    src.copy_(torch.randint(-32768, 32767, (nbytes // 2,), dtype=torch.int16, generator=generator, device=ctx.device))
    want = checksum(ctx, src)
    pairs: list[dict[str, Any]] = []
    turns = 1 if spec.p2p_concurrent else len(node)
    for k in range(1, len(node)):
        peer = node[(me + k) % len(node)]
        for turn in range(turns):
            if turns == 1 or turn == me:
                pairs.append(_copy_to(ctx, src, want, peer, nbytes))
            if ctx.dist is not None:
                ctx.hb.collective("p2p", "barrier")
                ctx.barrier()
    del src
    torch.cuda.empty_cache()
    return {"pairs": pairs}


def _copy_to(ctx: Context, src: Any, want: int, peer: int, nbytes: int) -> dict[str, Any]:
    """Copy ``src`` to GPU ``peer`` for a fixed time: bytes per second, and whether the bits arrived."""
    torch = ctx.torch
    spec = ctx.spec
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
    ctx.hb.progress("p2p", {"gbps": bw / 1e9})
    del dst
    return {"src_gpu": spec.gpu, "dst_gpu": peer, "bytes": nbytes, "bytes_per_second": bw, "checksum_ok": got == want}
