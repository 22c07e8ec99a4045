"""The ``fingerprint`` load: the same seeded work on every GPU of the fleet, one digest per dtype.

Each GPU multiplies fixed matrices (generated on the CPU from one seed, so identical everywhere)
in every dtype the burn uses, and writes then reads back a fixed memory pattern; each output's bits
are reduced to a 64-bit digest (``context.checksum``). GPUs of one model running the same
software must agree bit for bit: cuBLAS gives the same bits at every run on GPUs of the same
architecture and SM count for one cuBLAS version. The agent compares digests across every GPU of
every node (``verdict.judge_fingerprint``); a GPU that computes the same wrong answer every time
(which the matmul test's repeated GEMMs cannot see: they agree with each other) stands out from the
fleet's majority even on a node with one GPU. Takes well under a second on a GPU.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from gpumon.burn.workloads.context import MIB, SEED, TORCH_DTYPES, Context, checksum, flip_bit, model_name

CUDA_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp64")
CPU_DTYPES = ("bf16", "fp32", "fp64")
"""tf32 and fp16 on a CPU are fp32 (or slow emulation): not worth a digest there."""
CUDA_SIZE = 2048
CPU_SIZE = 128
PATTERN_BYTES = {True: 256 * MIB, False: 4 * MIB}
"""Bytes of the memory pattern, by ``ctx.cuda``."""
SDC_WORD = 4099
"""The word the ``sdc:G`` injection flips, the same one every time: a consistent wrong answer."""


def fingerprint(ctx: Context) -> dict[str, Any]:
    """Digests (16 hex digits) of seeded GEMMs in each dtype and of a memory pattern read back."""
    torch = ctx.torch
    n = CUDA_SIZE if ctx.cuda else CPU_SIZE
    gen = torch.Generator(device="cpu").manual_seed(SEED + 1)
    a64 = torch.randn(n, n, generator=gen, dtype=torch.float64)
    b64 = torch.randn(n, n, generator=gen, dtype=torch.float64)
    digests: dict[str, str] = {}
    tf32_before = torch.backends.cuda.matmul.allow_tf32 if ctx.cuda else False
    try:
        for name in CUDA_DTYPES if ctx.cuda else CPU_DTYPES:
            ctx.hb.progress("fingerprint")
            digests[name] = _gemm_digest(ctx, a64, b64, name)
    finally:
        if ctx.cuda:
            torch.backends.cuda.matmul.allow_tf32 = tf32_before
    digests["memory"] = _memory_digest(ctx)
    return {"model": model_name(ctx), "software": software(ctx), "n": n, "digests": digests}


def _gemm_digest(ctx: Context, a64: Any, b64: Any, name: str) -> str:
    torch = ctx.torch
    dtype = getattr(torch, TORCH_DTYPES[name])
    if ctx.cuda:
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
    a = a64.to(dtype).to(ctx.device)
    b = b64.to(dtype).to(ctx.device)
    c = torch.matmul(a, b)
    _inject(ctx, c)
    return _hex(checksum(ctx, c))


def _memory_digest(ctx: Context) -> str:
    """A pattern computed from each word's index (no randomness), written to memory and read back."""
    torch = ctx.torch
    words = PATTERN_BYTES[ctx.cuda] // 8
    buf = ctx.alloc((words,), torch.int64)
    torch.arange(words, dtype=torch.int64, device=ctx.device, out=buf)
    buf.mul_(0x5851F42D4C957F2D).bitwise_xor_(SEED)  # int64 arithmetic wraps: every bit pattern occurs
    ctx.sync()
    _inject(ctx, buf)
    digest = _hex(checksum(ctx, buf))
    del buf
    return digest


def _inject(ctx: Context, t: Any) -> None:
    """``sdc:G``: the same bit of the same word wrong every time."""
    if ctx.spec.injection.has("sdc", ctx.spec.gpu):
        flip_bit(ctx, t, SDC_WORD)


def _hex(value: int) -> str:
    return f"{value & 0xFFFFFFFFFFFFFFFF:016x}"


def software(ctx: Context) -> str:
    """What decides the GEMM kernels besides the model: torch, its CUDA and cuBLAS, the SM count (CPU: its ISA)."""
    torch = ctx.torch
    parts = [f"torch {torch.__version__}"]
    if ctx.cuda:
        parts.append(f"CUDA {torch.version.cuda}")
        for dist_name in ("nvidia-cublas-cu12", "nvidia-cublas-cu13", "nvidia-cublas"):
            try:
                parts.append(f"cuBLAS {importlib.metadata.version(dist_name)}")
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        props = torch.cuda.get_device_properties(ctx.spec.gpu)
        parts.append(f"{props.multi_processor_count} SMs")
    else:
        parts.append(f"CPU {torch.backends.cpu.get_cpu_capability()}")
    return ", ".join(parts)
