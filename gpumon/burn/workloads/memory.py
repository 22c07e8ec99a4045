"""The ``memory`` load: fill most free memory with patterns, verify every word, measure copy bandwidth."""

from __future__ import annotations

import time
from typing import Any

from gpumon.burn.workloads.context import GIB, MIB, Context, InjectedOom, flip_bit, model_name, slow_down

PATTERNS = (0x00000000, 0xFFFFFFFF, 0xAAAAAAAA, 0x55555555, "index")


def memory(ctx: Context) -> dict[str, Any]:
    """Fill most of the free memory with patterns, verify every word, measure copy bandwidth."""
    free_before = ctx.free_bytes()
    if ctx.cuda:
        fraction = 0.5 if ctx.spec.quick else 0.9
        chunk_bytes = GIB
        target = int(free_before * fraction) - 512 * MIB
    else:
        chunk_bytes = 4 * MIB
        target = (16 if ctx.spec.quick else 32) * MIB
    chunks, oom_stopped = _allocate_chunks(ctx, chunk_bytes, target)
    ctx.held += chunks
    scratch = chunks.pop()  # holds the index pattern for verification
    ctx.torch.arange(chunk_bytes // 4, dtype=ctx.torch.int32, out=scratch)
    mismatched, first_bad = _check_patterns(ctx, chunks, scratch)
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


def _allocate_chunks(ctx: Context, chunk_bytes: int, target_bytes: int) -> tuple[list[Any], bool]:
    """int32 chunks up to ``target_bytes`` (at least two chunks); returns them and whether an OOM stopped it early.

    An OOM before the first chunk, or an injected one, is raised.
    """
    chunks: list[Any] = []
    oom_stopped = False
    while (len(chunks) + 1) * chunk_bytes <= max(target_bytes, 2 * chunk_bytes):
        try:
            chunks.append(ctx.alloc((chunk_bytes // 4,), ctx.torch.int32))
        except Exception as exc:
            if not chunks or isinstance(exc, InjectedOom):
                raise
            oom_stopped = True  # fragmentation: test what we got
            break
        ctx.hb.progress("memory")
    return chunks, oom_stopped


def _check_patterns(ctx: Context, chunks: list[Any], scratch: Any) -> tuple[int, dict[str, Any] | None]:
    """Every pattern written to every chunk and read back; returns the words that differed and the first place."""
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
            flip_bit(ctx, chunks[-1], 12345)
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
    return mismatched, first_bad


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
    spent = 0.0
    """Seconds the copies took: wall time on a GPU; on CPU the worker's own CPU time (one torch thread) and
    what slow:G slept, so that simulated GPUs sharing a loaded host's cores are not stragglers when preempted."""
    fastest = 0.0
    """CPU: the fastest batch's rate, as pcie takes it: simulated GPUs share the host's caches and memory
    bandwidth with whatever else runs there, which slows a batch now and then even in the worker's own
    time (CI measured one of two 7.7 times slower over a whole run); slow:G slows every batch."""
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t, own = time.perf_counter(), time.thread_time()
        for _ in range(10):
            dst.copy_(src)
        ctx.sync()
        busy, own = time.perf_counter() - t, time.thread_time() - own
        slow_down(ctx, busy)
        batch = time.perf_counter() - t - (0.0 if ctx.cuda else busy - own)
        spent += batch
        fastest = max(fastest, 2.0 * nbytes * 10 / max(batch, 1e-9))
        done += 10
        ctx.hb.progress("memory")
    return 2.0 * nbytes * done / max(spent, 1e-9) if ctx.cuda else fastest
