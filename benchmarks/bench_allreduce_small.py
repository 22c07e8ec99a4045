#!/usr/bin/env python3
"""Small-message all-reduce: gpumon burn's busbw at 1 / 4 / 16 / 64 / 256 MiB against a reference, in one run.

Per size it prints gpumon's busbw (``gpumon burn --tests allreduce``, and the same sizes from a
``--quick`` run of every test, whose wall time is printed too), the reference and the ratio
(goal >= 90 %). The reference is nccl-tests' ``all_reduce_perf`` (in-place busbw, bf16, one
process driving every GPU) when it is found (``--nccl-tests PATH``, ``$NCCL_TESTS_DIR`` or
``PATH``); otherwise ``nccl_ref/allreduce_ref.cu``, a bare NCCL loop without torch timed the way
all_reduce_perf times it (one process drives every GPU, eager launches, wall time to the last
stream's sync), built here with nvcc against the NCCL that torch loads; only where neither can
run, a plain CUDA-graph torch loop. The table says which. Beside it: the bare NCCL loop with one
process per GPU and as CUDA graphs, and plain torch graph (replayed on its capture stream, and
on torch's default stream) and eager loops, so what torch, the process layout, the stream and
launch overhead each cost is visible. busbw = size/time · 2(n−1)/n (nccl-tests).

Bare loops run in child processes so this process never holds a CUDA context (gpumon would see
it as another compute process). Every process keeps NVLink multicast off, as gpumon burn does.
Usage (repository root, GPU host): python3 benchmarks/bench_allreduce_small.py [--nccl-tests PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from burn_runs import bench_env, run_burn, run_child
from spawn_ranks import join_nccl, spawn_ranks

MIB = 1 << 20
SIZES = (MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)
GRAPH_OPS = 50
GOAL = 0.90


# ------------------------------------------------------------------ bare torch loops (child processes)
def _bare_rank(rank: int, world: int, port: int, out: str) -> None:
    torch, dist = join_nccl(rank, world, port)

    def agree_max(value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device="cuda")
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    res = []
    for size in SIZES:
        buf = torch.zeros(size // 2, dtype=torch.bfloat16, device="cuda")
        for _ in range(20):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        # eager: what a plain torch loop measures (launch overhead included)
        t = time.perf_counter()
        for _ in range(10):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        iters = max(20, int(0.5 / agree_max((time.perf_counter() - t) / 10)))
        iters = int(agree_max(iters))
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        eager = (time.perf_counter() - t) / iters
        # CUDA graph of GRAPH_OPS all-reduces, replays timed with CUDA events
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            for _ in range(GRAPH_OPS):
                dist.all_reduce(buf)

        graphed = _replayed(torch, graph, stream, agree_max)
        on_default = _replayed(torch, graph, torch.cuda.default_stream(), agree_max)
        factor = 2 * (world - 1) / world
        res.append(
            {
                "bytes": size,
                "eager_busbw_bytes_per_second": size / eager * factor,
                "graph_busbw_bytes_per_second": size / graphed * factor,
                "graph_default_stream_busbw_bytes_per_second": size / on_default * factor,
            }
        )
        del graph, buf
        torch.cuda.empty_cache()
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def _replayed(torch: Any, graph: Any, on: Any, agree_max: Callable[[float], float]) -> float:
    """Seconds per all-reduce, the graph replayed (and timed) on stream ``on``."""
    with torch.cuda.stream(on):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        replays = max(5, int(0.5 / agree_max(start.elapsed_time(end) / 1e3)))
        graph.replay()
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end) / 1e3 / (replays * GRAPH_OPS))


def bare_loops(world: int) -> list[dict[str, Any]]:
    return spawn_ranks(_bare_rank, world)


# ------------------------------------------------------------------ nccl-tests
def find_nccl_tests(given: str | None) -> str | None:
    for candidate in (given, os.environ.get("NCCL_TESTS_DIR")):
        if candidate:
            path = Path(candidate)
            path = path / "all_reduce_perf" if path.is_dir() else path
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return shutil.which("all_reduce_perf")


def nccl_tests(binary: str, world: int) -> tuple[dict[int, float], str]:
    """{bytes: in-place busbw bytes/s} from one all_reduce_perf run over ``world`` GPUs, and its command line."""
    base = [binary, "-b", "1M", "-e", "256M", "-f", "4", "-g", str(world), "-w", "20", "-n", "200"]
    for extra in (["-d", "bfloat16"], []):  # bf16 as gpumon; builds without it fall back to float
        cmd = base + extra
        proc = subprocess.run(cmd, capture_output=True, text=True, env=bench_env(), timeout=600)
        rows = _parse_nccl_tests(proc.stdout)
        if proc.returncode == 0 and rows:
            return rows, " ".join(cmd)
    raise SystemExit(f"all_reduce_perf failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")


def _parse_nccl_tests(text: str) -> dict[int, float]:
    """Rows: size count type redop root | time algbw busbw #wrong (out-of-place) | same (in-place); GB/s."""
    out: dict[int, float] = {}
    for line in text.splitlines():
        cols = line.split()
        if len(cols) >= 13 and cols[0].isdigit():
            out[int(cols[0])] = float(cols[11]) * 1e9
    return out


# ------------------------------------------------------------------ bare NCCL loop (nccl_ref/allreduce_ref.cu)
def _nccl_dirs() -> tuple[str, str] | None:
    """(include dir, lib dir) of the NCCL torch loads (the nvidia-nccl wheel), else the system's."""
    proc = subprocess.run(
        [sys.executable, "-c", "import nvidia.nccl as n; print(list(n.__path__)[0])"], capture_output=True, text=True
    )
    root = Path(proc.stdout.strip()) if proc.returncode == 0 else None
    if root and (root / "include" / "nccl.h").is_file():
        return str(root / "include"), str(root / "lib")
    if Path("/usr/include/nccl.h").is_file():
        return "/usr/include", ""
    return None


def build_nccl_ref(workdir: str) -> tuple[str | None, str]:
    """The built reference binary (or None) and how it was built, or why not."""
    nvcc = shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.access(p, os.X_OK)), None)
    dirs = _nccl_dirs()
    if not nvcc or not dirs:
        return None, f"not built: {'nvcc' if not nvcc else 'nccl.h'} not found"
    include, lib = dirs
    binary = str(Path(workdir) / "allreduce_ref")
    source = str(Path(__file__).parent / "nccl_ref" / "allreduce_ref.cu")
    link = [f"-L{lib}", "-l:libnccl.so.2", f"-Xlinker=-rpath={lib}"] if lib else ["-lnccl"]
    cmd = [nvcc, "-O2", "-o", binary, source, f"-I{include}", *link]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return None, f"not built: {proc.stderr[-800:]}"
    return binary, " ".join(cmd)


def nccl_ref(binary: str, mode: str, world: int) -> dict[int, dict[str, Any]]:
    """{bytes: row} from the bare NCCL loop in ``mode`` ('threads' or 'procs')."""
    proc = subprocess.run(
        [binary, mode, str(world), *(str(s) for s in SIZES)],
        capture_output=True,
        text=True,
        env=bench_env(),
        timeout=600,
    )
    if proc.returncode != 0:
        raise SystemExit(f"allreduce_ref {mode} failed ({proc.returncode}): {proc.stderr[-1500:]}")
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {r["bytes"]: r for r in rows}


# ------------------------------------------------------------------ gpumon
def _sizes(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {s["bytes"]: s for s in (report["gpus"][0].get("allreduce") or {}).get("sizes", [])}


def _gbps(row: dict[str, Any] | None, timing: str) -> str:
    return f"{row[f'{timing}_busbw_bytes_per_second'] / 1e9:.1f}" if row else "—"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nccl-tests", help="all_reduce_perf binary or the nccl-tests build directory")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        if a.child[0] == "count":
            import torch

            print(torch.cuda.device_count())
        else:
            print(json.dumps(bare_loops(int(a.child[1]))))
        return 0

    world = int(run_child(__file__, "count"))
    if world < 2:
        raise SystemExit(f"needs 2 or more GPUs, torch sees {world}")
    binary = find_nccl_tests(a.nccl_tests)
    ref_rows: dict[int, float] = {}
    if binary:
        ref_rows, cmd = nccl_tests(binary, world)
        ref_name = f"nccl-tests ({cmd})"
    workdir = tempfile.mkdtemp(prefix="allreduce-ref-")
    ref_binary, ref_build = build_nccl_ref(workdir)
    print(f"bare NCCL loop: {ref_build}")
    threads = nccl_ref(ref_binary, "threads", world) if ref_binary else {}
    procs = nccl_ref(ref_binary, "procs", world) if ref_binary else {}
    bare = {r["bytes"]: r for r in run_child(__file__, "loops", str(world))}
    if not binary and threads:
        ref_rows = {b: r["eager_busbw_bytes_per_second"] for b, r in threads.items()}
        version = next(iter(threads.values()))["nccl_version"]
        ref_name = f"bare NCCL loop timed as all_reduce_perf -g {world} times it (NCCL {version}; nccl-tests not found)"
    elif not binary:
        ref_rows = {b: r["graph_busbw_bytes_per_second"] for b, r in bare.items()}
        ref_name = "plain CUDA-graph torch loop (nccl-tests' all_reduce_perf not found, bare NCCL loop not built)"
    full, _, _ = run_burn(["--gpus", "all", "--tests", "allreduce"])
    quick, quick_wall, _ = run_burn(["--quick", "--gpus", "all"])
    ours, ours_quick = _sizes(full), _sizes(quick)

    print(f"{world} GPUs, NVLink multicast off; busbw GB/s; reference: {ref_name}")
    header = (
        "size",
        "gpumon",
        "timing",
        "gpumon --quick",
        "reference",
        "ratio",
        "NCCL 1 proc graph",
        "NCCL proc/GPU eager",
        "NCCL proc/GPU graph",
        "torch graph",
        "torch graph, default stream",
        "torch eager",
        "goal",
    )
    rows = [header]
    worst = None
    for size in SIZES:
        mine, mine_q, ref = ours.get(size), ours_quick.get(size), ref_rows.get(size)
        ratio = mine["busbw_bytes_per_second"] / ref if mine and ref else None
        if ratio is not None:
            worst = ratio if worst is None else min(worst, ratio)
        rows.append(
            (
                f"{size // MIB} MiB",
                f"{mine['busbw_bytes_per_second'] / 1e9:.1f}" if mine else "not run",
                str(mine.get("timing", "?")) if mine else "",
                f"{mine_q['busbw_bytes_per_second'] / 1e9:.1f}" if mine_q else "not run",
                f"{ref / 1e9:.1f}" if ref else "—",
                f"{ratio * 100:.1f} %" if ratio is not None else "—",
                _gbps(threads.get(size), "graph"),
                _gbps(procs.get(size), "eager"),
                _gbps(procs.get(size), "graph"),
                _gbps(bare.get(size), "graph"),
                _gbps(bare.get(size), "graph_default_stream"),
                f"{bare[size]['eager_busbw_bytes_per_second'] / 1e9:.1f}" if size in bare else "—",
                f">= {GOAL * 100:.0f} %",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in [rows[0], tuple("-" * w for w in widths), *rows[1:]]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    print(f"gpumon burn --quick --gpus all: {quick_wall:.1f} s wall (goal <= 60 s), verdict {quick['verdict']}")
    print(f"gpumon burn --tests allreduce: verdict {full['verdict']}")
    fallbacks = [c["detail"] for r in (full, quick) for c in r["checks"] if c["check"] == "timing"]
    for line in fallbacks:
        print(f"fallback: {line}")
    if worst is not None:
        print(f"lowest ratio {worst * 100:.1f} % (goal >= {GOAL * 100:.0f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
