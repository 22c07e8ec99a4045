#!/usr/bin/env python3
"""gpumon burn against bare torch loops, measured in the same run on real GPUs.

Prints one table with ratios:
  * matmul TFLOP/s: gpumon burn (median of rounds) vs a bare torch.matmul loop, same dtype and shape,
    run before and after gpumon (goal >= 95 %)
  * sustained power under gpumon's matmul vs the power limit (goal >= 90 %)
  * all-reduce busbw: gpumon vs a bare torch.distributed all_reduce loop (nccl-tests formula
    busbw = algbw·2(n−1)/n) at 256 MiB / 1 GiB / 4 GiB (goal >= 97 %)
  * wall time of ``gpumon burn --quick --gpus all`` (goal <= 60 s for 2 GPUs)

Bare loops run in child processes so this process never holds a CUDA context (gpumon would
see it as another compute process). Usage: python3 benchmarks/bench_burn.py [--seconds 15]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from burn_runs import run_burn, run_child
from spawn_ranks import join_nccl, spawn_ranks

MIB = 1 << 20
SIZES = (256 * MIB, 1024 * MIB, 4096 * MIB)


# ------------------------------------------------------------------ bare references (child processes)
def bare_matmul(seconds: float, n: int, gpu: int) -> dict[str, Any]:
    import statistics

    import torch

    torch.cuda.set_device(gpu)
    a = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    b = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(3):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    per_round = max(1, int(0.5 / ((time.perf_counter() - t) / 3)))
    rates = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        for _ in range(per_round):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
        rates.append(2.0 * n**3 * per_round / (time.perf_counter() - t) / 1e12)
    return {"tflops_median": statistics.median(rates), "tflops_max": max(rates)}


def _bare_allreduce_rank(rank: int, world: int, port: int, out: str) -> None:
    torch, dist = join_nccl(rank, world, port)
    res = []
    for size in SIZES:
        buf = torch.zeros(size // 2, dtype=torch.bfloat16, device="cuda")
        for _ in range(5):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        iters = 20
        t = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        torch.cuda.synchronize()
        sec = (time.perf_counter() - t) / iters
        res.append({"bytes": size, "busbw_bytes_per_second": size / sec * 2 * (world - 1) / world})
        del buf
        torch.cuda.empty_cache()
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def bare_allreduce(world: int) -> list[dict[str, Any]]:
    return spawn_ranks(_bare_allreduce_rank, world)


# ------------------------------------------------------------------ driver
def _gpu_count() -> int:
    return int(run_child(__file__, "count"))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=15.0, help="matmul seconds per measurement")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        kind = a.child[0]
        if kind == "count":
            import torch

            print(torch.cuda.device_count())
        elif kind == "matmul":
            print(json.dumps(bare_matmul(float(a.child[1]), int(a.child[2]), 0)))
        elif kind == "allreduce":
            print(json.dumps(bare_allreduce(int(a.child[1]))))
        return 0

    rows: list[tuple[str, str, str, str, str]] = []
    n_gpus = _gpu_count()
    print(f"{n_gpus} GPU(s); matmul bf16 8192^3 for {a.seconds:.0f} s per run", flush=True)

    bare1 = run_child(__file__, "matmul", str(a.seconds), "8192")
    rep, _wall, code = run_burn(["--gpus", "all", "--tests", "matmul", "--dtype", "bf16", "--duration", str(a.seconds)])
    bare2 = run_child(__file__, "matmul", str(a.seconds), "8192")
    g0 = rep["gpus"][0]
    bare = (bare1["tflops_median"] + bare2["tflops_median"]) / 2
    ours = g0["matmul"]["tflops"]
    rows.append(
        (
            "matmul bf16 8192³ TFLOP/s (GPU 0)",
            f"{ours:.1f}",
            f"{bare:.1f} (bare {bare1['tflops_median']:.1f}"
            f"/{bare2['tflops_median']:.1f}, burst {max(bare1['tflops_max'], bare2['tflops_max']):.0f})",
            f"{ours / bare * 100:.1f} %",
            ">= 95 %",
        )
    )
    for g in rep["gpus"]:
        tel = g.get("telemetry") or {}
        if tel.get("power_sustained_watts") and tel.get("power_limit_watts"):
            rows.append(
                (
                    f"sustained power GPU {g['gpu']} W",
                    f"{tel['power_sustained_watts']:.0f}",
                    f"{tel['power_limit_watts']:.0f} (limit)",
                    f"{tel['power_sustained_ratio'] * 100:.1f} %",
                    ">= 90 %",
                )
            )
    if code != 0:
        rows.append(("matmul run verdict", rep["verdict"], "", "", "pass"))

    if n_gpus >= 2:
        bare_ar = run_child(__file__, "allreduce", str(n_gpus))
        rep_ar, _w, _c = run_burn(["--gpus", "all", "--tests", "allreduce"])
        ours_sizes = {s["bytes"]: s["busbw_bytes_per_second"] for s in rep_ar["gpus"][0]["allreduce"]["sizes"]}
        for ref in bare_ar:
            mine = ours_sizes.get(ref["bytes"])
            rows.append(
                (
                    f"all-reduce busbw {ref['bytes'] // MIB} MiB GB/s ({n_gpus} GPUs)",
                    f"{mine / 1e9:.1f}" if mine else "not run",
                    f"{ref['busbw_bytes_per_second'] / 1e9:.1f}",
                    f"{mine / ref['busbw_bytes_per_second'] * 100:.1f} %" if mine else "—",
                    ">= 97 %",
                )
            )

    rep_q, wall, code = run_burn(["--quick", "--gpus", "all"])
    rows.append(
        (
            f"gpumon burn --quick --gpus all ({n_gpus} GPUs) wall s",
            f"{wall:.1f}",
            "60",
            f"{wall / 60 * 100:.0f} %",
            f"<= 60 s, verdict {rep_q['verdict']}",
        )
    )

    widths = [max(len(r[i]) for r in [*rows, ("what", "gpumon", "reference", "ratio", "goal")]) for i in range(5)]
    header = ("what", "gpumon", "reference", "ratio", "goal")
    for r in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
