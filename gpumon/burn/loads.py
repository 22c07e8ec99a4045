"""The load tests a worker runs on its GPU: matmul, memory, p2p, allreduce (torch, in the worker only).

Each test returns JSON-ready figures; judging (peers, floors) happens in the agent, in
``gpumon.burn.judge``, where every GPU's results are side by side.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpumon.burn.protocol import WorkerSpec

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


def _checksum(ctx: Context, t: Any) -> int:
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


def _flip_bit(ctx: Context, t: Any, position: int) -> None:
    words = t.view(-1).view(ctx.torch.int16)
    i = position % words.numel()
    words[i : i + 1].bitwise_xor_(1)


def _slow_down(ctx: Context, busy_seconds: float) -> None:
    """``slow:G``: sleep three times the busy time, so the GPU runs at a quarter of its rate."""
    if ctx.spec.injection.has("slow", ctx.spec.gpu):
        time.sleep(3 * busy_seconds)


# ---------------------------------------------------------------- matmul
def matmul(ctx: Context) -> dict[str, Any]:
    """GEMMs at the best dtype for the whole duration; bit-exact and float64-reference checks."""
    torch = ctx.torch
    dtype_name = resolve_dtype(ctx.spec.dtype, ctx)
    dtype = getattr(torch, TORCH_DTYPES[dtype_name])
    if ctx.cuda:
        torch.backends.cuda.matmul.allow_tf32 = dtype_name == "tf32"
        torch.backends.cudnn.allow_tf32 = dtype_name == "tf32"
    n = 8192 if ctx.cuda else 256
    elem = torch.tensor([], dtype=dtype).element_size()
    while ctx.cuda and n > 1024 and 4 * n * n * elem > 0.5 * ctx.free_bytes():
        n //= 2
    gen = torch.Generator().manual_seed(SEED)
    a = ctx.alloc((n, n), dtype)
    b = ctx.alloc((n, n), dtype)
    c = ctx.alloc((n, n), dtype)
    ctx.held += [a, b, c]
    a.copy_(torch.randn(n, n, generator=gen).to(dtype))
    b.copy_(torch.randn(n, n, generator=gen).to(dtype))
    tolerance = {"bf16": 2e-2, "fp16": 4e-3, "tf32": 4e-3, "fp32": 1e-5, "fp64": 1e-12}[dtype_name]
    reference_before = _reference_check(ctx, a, b, tolerance)

    flop = 2.0 * n * n * n
    for _ in range(3):  # warm-up, and a first estimate of one GEMM's time
        torch.matmul(a, b, out=c)
    ctx.sync()
    t0 = time.perf_counter()
    for _ in range(3):
        torch.matmul(a, b, out=c)
    ctx.sync()
    per_gemm = max((time.perf_counter() - t0) / 3, 1e-6)
    round_seconds = 0.5 if ctx.cuda else 0.2
    per_round = max(1, int(round_seconds / per_gemm))

    rates: list[float] = []
    first: Any = None
    """Round 0's output, kept: every later round is compared with it bit for bit."""
    first_checksum = 0
    mismatch_rounds: list[int] = []
    end = time.monotonic() + ctx.spec.duration_seconds
    rnd = 0
    while time.monotonic() < end or rnd < 2:
        ctx.hb.progress("matmul")
        start = time.perf_counter()
        for _ in range(per_round):
            torch.matmul(a, b, out=c)
        ctx.sync()
        busy = time.perf_counter() - start
        _slow_down(ctx, busy)
        elapsed = time.perf_counter() - start
        if ctx.spec.injection.has("corrupt", ctx.spec.gpu) and rnd >= 1:
            _flip_bit(ctx, c, 7919 * rnd)
        if first is None:
            first = c.clone()
            ctx.held.append(first)
            first_checksum = _checksum(ctx, c)
        elif not torch.equal(c.view(torch.int16), first.view(torch.int16)):  # the bits, not the values (-0.0, NaN)
            mismatch_rounds.append(rnd)
        rates.append(flop * per_round / elapsed / 1e12)
        ctx.hb.progress("matmul", {"tflops": rates[-1]})
        rnd += 1
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
        "reference": {
            "size": min(REFERENCE_SIZE, n),
            "tolerance": tolerance,
            "max_rel_error": max(reference_before, reference_after),
            "passed": max(reference_before, reference_after) <= tolerance,
        },
    }


def _reference_check(ctx: Context, a: Any, b: Any, tolerance: float) -> float:
    """max|C - C_ref| / max|C_ref| for a small corner of a·b against float64 on the CPU."""
    torch = ctx.torch
    r = min(REFERENCE_SIZE, a.shape[0])
    a_s, b_s = a[:r, :r].contiguous(), b[:r, :r].contiguous()
    got = torch.matmul(a_s, b_s).double().cpu()
    ref = a_s.double().cpu() @ b_s.double().cpu()
    scale = float(ref.abs().max()) or 1.0
    return float((got - ref).abs().max()) / scale


# ---------------------------------------------------------------- memory
PATTERNS = (0x00000000, 0xFFFFFFFF, 0xAAAAAAAA, 0x55555555, "index")


def memory(ctx: Context) -> dict[str, Any]:
    """Fill most of the free memory with patterns, verify every word, measure copy bandwidth."""
    torch = ctx.torch
    free_before = ctx.free_bytes()
    if ctx.cuda:
        fraction = 0.5 if ctx.spec.quick else 0.9
        chunk_bytes = GIB
        target = int(free_before * fraction) - 512 * MIB
    else:
        chunk_bytes = 4 * MIB
        target = (16 if ctx.spec.quick else 32) * MIB
    words = chunk_bytes // 4
    chunks: list[Any] = []
    oom_stopped = False
    while (len(chunks) + 1) * chunk_bytes <= max(target, 2 * chunk_bytes):
        try:
            chunks.append(ctx.alloc((words,), torch.int32))
        except Exception as exc:
            if not chunks or isinstance(exc, InjectedOom):
                raise
            oom_stopped = True  # fragmentation: test what we got
            break
        ctx.hb.progress("memory")
    ctx.held += chunks
    scratch = chunks.pop()  # holds the index pattern for verification
    torch.arange(words, dtype=torch.int32, out=scratch)
    mismatched = 0
    first_bad: dict[str, Any] | None = None
    corrupt = ctx.spec.injection.has("corrupt", ctx.spec.gpu)
    for pattern in PATTERNS:
        for chunk in chunks:
            if pattern == "index":
                chunk.copy_(scratch)
            else:
                chunk.fill_(_as_int32(int(pattern)))
            ctx.hb.progress("memory")
        if corrupt and pattern == PATTERNS[2]:
            _flip_bit(ctx, chunks[-1], 12345)
        for i, chunk in enumerate(chunks):
            expected = scratch if pattern == "index" else _as_int32(int(pattern))
            bad = int((chunk != expected).sum().item())
            if bad:
                mismatched += bad
                if first_bad is None:
                    first_bad = {
                        "pattern": str(pattern) if pattern == "index" else f"0x{int(pattern):08X}",
                        "chunk": i,
                        "words": bad,
                    }
            ctx.hb.progress("memory")
    tested = len(chunks) * chunk_bytes
    bandwidth = _copy_bandwidth(ctx, chunks[0], chunks[1] if len(chunks) > 1 else scratch)
    return {
        "model": model_name(ctx),
        "free_bytes_before": free_before,
        "bytes_tested": tested,
        "chunk_bytes": chunk_bytes,
        "patterns": [p if isinstance(p, str) else f"0x{p:08X}" for p in PATTERNS],
        "mismatched_words": mismatched,
        "first_mismatch": first_bad,
        "allocation_stopped_by_oom": oom_stopped,
        "bandwidth_bytes_per_second": bandwidth,
    }


def _as_int32(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value


def _copy_bandwidth(ctx: Context, src: Any, dst: Any) -> float:
    """Device copy bandwidth, read + write bytes per second (nvbandwidth / DESIGN §3 convention)."""
    for _ in range(2):
        dst.copy_(src)
    ctx.sync()
    nbytes = int(src.numel() * src.element_size())
    seconds = 1.0 if ctx.cuda and not ctx.spec.quick else 0.3
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        for _ in range(10):
            dst.copy_(src)
        ctx.sync()
        _slow_down(ctx, time.perf_counter() - t)
        done += 10
        ctx.hb.progress("memory")
    return 2.0 * nbytes * done / (time.perf_counter() - start)


# ---------------------------------------------------------------- p2p
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
            want = _checksum(ctx, src)
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
                    _slow_down(ctx, time.perf_counter() - t)
                    iters += 5
                    ctx.hb.progress("p2p")
                elapsed = time.perf_counter() - start
                if spec.injection.has("corrupt", spec.gpu):
                    _flip_bit(ctx, dst, 4242)
                got = _checksum(ctx, dst)
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


# ---------------------------------------------------------------- allreduce
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
        _flip_bit(ctx, buf, 31337)
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


TESTS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "matmul": matmul,
    "memory": memory,
    "p2p": p2p,
    "allreduce": allreduce,
}
