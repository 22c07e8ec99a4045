"""What every load test shares: the worker's torch handles (``Context``), errors, dtypes, bit checks.

Each test returns JSON-ready figures; judging (peers, floors) happens in the agent, in
``gpumon.burn.verdict``, where every GPU's results are side by side. torch is never imported
here: the worker hands its module in ``Context.torch``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gpumon.burn.orchestration.protocol import WorkerSpec

MIB = 1 << 20
GIB = 1 << 30

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "tf32": "float32", "fp32": "float32", "fp64": "float64"}
REFERENCE_SIZE = 256
"""Side of the small product checked against a float64 CPU reference."""
SEED = 20240601


@dataclass
class Context:
    """A worker's torch handles and the fault injection state."""

    spec: WorkerSpec
    hb: Any
    device: Any
    dist: Any
    torch: Any
    oom_injected: bool = False
    held: list[Any] = field(default_factory=list)
    cpu_group: Any = None
    """A gloo process group for barriers, so waiting ranks keep their GPUs idle."""

    @property
    def cuda(self) -> bool:
        return bool(self.device.type == "cuda")

    def sync(self, *devices: Any) -> None:
        if self.cuda:
            for d in devices or (self.device,):
                self.torch.cuda.synchronize(d)

    def barrier(self) -> None:
        if self.dist is None:
            return
        if self.cpu_group is not None:
            self.dist.barrier(group=self.cpu_group)
        elif self.cuda:
            self.dist.barrier(device_ids=[self.spec.gpu])
        else:
            self.dist.barrier()

    def alloc(self, shape: tuple[int, ...], dtype: Any, device: Any = None) -> Any:
        """A large allocation; the ``oom:G`` injection makes the first one fail."""
        if self.spec.injection.has("oom", self.spec.gpu) and not self.oom_injected:
            self.oom_injected = True
            raise InjectedOom(shape, dtype)
        return self.torch.empty(shape, dtype=dtype, device=device if device is not None else self.device)

    def free_bytes(self) -> int:
        if self.cuda:
            free, _total = self.torch.cuda.mem_get_info(self.spec.gpu)
            return int(free)
        return 4 * GIB


class InjectedOom(MemoryError):
    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        super().__init__(f"injected out of memory allocating {shape} {dtype}")


def model_name(ctx: Context) -> str:
    if ctx.cuda:
        return str(ctx.torch.cuda.get_device_name(ctx.spec.gpu))
    return "cpu"


def release(ctx: Context) -> None:
    ctx.held.clear()
    if ctx.cuda:
        ctx.torch.cuda.empty_cache()


def classify_error(exc: BaseException, ctx: Context) -> tuple[str, str]:
    """(kind, one-line message) for an exception raised by a test."""
    where = f"GPU {ctx.spec.gpu} (rank {ctx.spec.rank})"
    oom_types: tuple[type[BaseException], ...] = (MemoryError,)
    if ctx.cuda:
        oom_types += (ctx.torch.cuda.OutOfMemoryError,)
    if isinstance(exc, oom_types):
        free = ctx.free_bytes() if ctx.cuda else None
        extra = f", {free / GIB:.1f} GiB free now" if free is not None else ""
        return "oom", f"{where}: out of memory ({str(exc).splitlines()[0][:200]}{extra})"
    text = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
    if "NCCL" in text and ("init" in text.lower() or "unhandled system error" in text):
        return "cannot_run", f"{where}: NCCL would not initialise: {text}"
    return "error", f"{where}: {type(exc).__name__}: {text}"


def resolve_dtype(requested: str, ctx: Context) -> str:
    """``auto``: bf16 on compute capability >= 8.0, fp16 before; fp32 on CPU."""
    if requested != "auto":
        return requested
    if not ctx.cuda:
        return "fp32"
    major, _minor = ctx.torch.cuda.get_device_capability(ctx.spec.gpu)
    return "bf16" if major >= 8 else "fp16"


_FINGERPRINT_MULTIPLIER = 0x9E3779B97F4A7C15 - (1 << 64)
"""An odd 64-bit constant (2^64 / golden ratio) as a signed int64."""
_FINGERPRINT_CHUNK_WORDS = 1 << 22
"""Words weighed at a time: 32 MiB per int64 temporary on the GPU."""


def checksum(ctx: Context, t: Any) -> int:
    """Bit-exact fingerprint of a tensor, computed where it lives: sum of w_i · m_i mod 2^64.

    w_i is the i-th 16-bit word of the tensor's bits (unsigned), m_i = (2i + 1) · K mod 2^64 with K
    odd: every weight is odd and no two positions below 2^48 words share a weight modulo 2^49. A
    flipped bit changes the sum by ±2^b · m_i with b < 16, which is never 0 mod 2^64, and two flipped
    bits can only cancel if 2^a · m_i = 2^b · m_j mod 2^64, which those weights rule out: any one or
    two flipped bits change the fingerprint (a plain sum of words lets a 0→1 and a 1→0 flip cancel).
    """
    torch = ctx.torch
    words = t.contiguous().view(-1).view(torch.int16)
    total = torch.zeros((), dtype=torch.int64, device=words.device)
    for start in range(0, words.numel(), _FINGERPRINT_CHUNK_WORDS):
        w = words[start : start + _FINGERPRINT_CHUNK_WORDS].to(torch.int64) & 0xFFFF
        position = torch.arange(start, start + w.numel(), dtype=torch.int64, device=w.device)
        total += (w * ((2 * position + 1) * _FINGERPRINT_MULTIPLIER)).sum()  # int64 arithmetic wraps mod 2^64
    return int(total.item())


def flip_bit(ctx: Context, t: Any, position: int) -> None:
    words = t.view(-1).view(ctx.torch.int16)
    i = position % words.numel()
    words[i : i + 1].bitwise_xor_(1)


def slow_down(ctx: Context, busy_seconds: float) -> None:
    """``slow:G``: sleep nine times the busy time, so the GPU runs at a tenth of its rate. A
    quarter was too close to the straggler limit with two GPUs (flagged below a third of the
    other's rate), where a noisy CPU run could hide it."""
    if ctx.spec.injection.has("slow", ctx.spec.gpu):
        time.sleep(9 * busy_seconds)
