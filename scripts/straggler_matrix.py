"""The straggler detector against real GPUs in the shapes users run: a table of shapes with time to
detection, time to clear and false findings. Needs 3 or more CUDA GPUs and torch with CUDA.

    python3 scripts/straggler_matrix.py [--window 20] [--shapes subset,side-by-side,all-copy]

One ``gpumon run --backend nvml`` daemon watches every shape (a straggler window of --window s); the
script reads its /api/health once a second. Each shape starts its jobs (matmul steps with an NCCL
all-reduce each step, one process per GPU, started by one launcher process as torchrun or
mp.spawn would), runs them alone for twice the window (any straggler then is a false finding), then
starts another tenant's process on one GPU until a finding names that GPU (or three windows pass),
stops it, and waits until the finding clears. A finding that names any other GPU is false.

Shapes (on n GPUs):
  subset        one job on GPUs 0..n-2, the last GPU idle; a matmul tenant on GPU 1
  side-by-side  job A on GPUs 0,1 and job B on 2..n-1 (B's steps smaller, so the jobs run at
                different paces); a matmul tenant on GPU n-1; A and B must never be compared
  all-copy      one job on every GPU; a tenant on GPU n-1 that copies memory instead of multiplying
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

JOB = r"""
import os, sys, time
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def rank_main(rank, gpus, size, stop_file, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    gpu = gpus[rank]
    torch.cuda.set_device(gpu)
    dist.init_process_group("nccl", rank=rank, world_size=len(gpus), device_id=torch.device("cuda", gpu))
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    grad = torch.zeros(64 * 1024 * 1024, device="cuda", dtype=torch.bfloat16)
    print(f"rank {rank} ready", flush=True)
    while not os.path.exists(stop_file):
        for _ in range(8):
            c = a @ b
        grad[:1024].copy_(c.flatten()[:1024])
        dist.all_reduce(grad)
        torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    gpus = [int(g) for g in sys.argv[1].split(",")]
    mp.spawn(rank_main, args=(gpus, int(sys.argv[2]), sys.argv[3], int(sys.argv[4])), nprocs=len(gpus), join=True)
"""

TENANT = r"""
import os, sys
import torch
gpu, kind, stop_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.cuda.set_device(gpu)
if kind == "matmul":
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    step = lambda: a @ b
else:
    src = torch.empty(1024 * 1024 * 1024, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    step = lambda: dst.copy_(src)
print("tenant ready", flush=True)
while not os.path.exists(stop_file):
    for _ in range(50):
        step()
    torch.cuda.synchronize()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stragglers(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(url + "/api/health", timeout=5) as r:
        findings = json.load(r)["findings"]
    return [f for f in findings if f["kind"] == "straggler"]


class Run:
    def __init__(self, tmp: Path, window: int) -> None:
        self.tmp = tmp
        self.window = window
        self.env = {**os.environ, **NO_MULTICAST}
        (tmp / "job.py").write_text(JOB)
        (tmp / "tenant.py").write_text(TENANT)

    def start(self, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
        log, stop = self.tmp / f"{name}.log", self.tmp / f"{name}.stop"
        stop.unlink(missing_ok=True)
        script = self.tmp / ("tenant.py" if name.startswith("tenant") else "job.py")
        proc = subprocess.Popen(
            [sys.executable, str(script), *args, str(stop)]
            if name.startswith("tenant")
            else [sys.executable, str(script), *args[:2], str(stop), args[2]],
            env=self.env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        return proc, log, stop

    @staticmethod
    def wait_text(proc: subprocess.Popen[bytes], log: Path, text: str, count: int) -> None:
        deadline = time.monotonic() + 120
        while log.read_text(errors="replace").count(text) < count:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{log.name} did not start:\n{log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.5)

    @staticmethod
    def stop(proc: subprocess.Popen[bytes], stop: Path) -> None:
        stop.touch()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def shape(self, url: str, jobs: list[tuple[list[int], int]], tenant_gpu: int, tenant_kind: str) -> dict[str, Any]:
        started = [
            self.start(f"job{i}", ",".join(map(str, gpus)), str(size), str(free_port()))
            for i, (gpus, size) in enumerate(jobs)
        ]
        false: list[str] = []
        detection = clear = None
        try:
            for (proc, log, _stop), (gpus, _size) in zip(started, jobs, strict=True):
                self.wait_text(proc, log, "ready", len(gpus))
            end = time.monotonic() + 2 * self.window
            while time.monotonic() < end:
                false += [f"alone: GPU {f['gpu']}" for f in stragglers(url)]
                time.sleep(1)
            tenant, tlog, tstop = self.start("tenant", str(tenant_gpu), tenant_kind)
            try:
                self.wait_text(tenant, tlog, "ready", 1)
                t0 = time.monotonic()
                while time.monotonic() - t0 < 3 * self.window:
                    found = stragglers(url)
                    false += [f"tenant: GPU {f['gpu']}" for f in found if f["gpu"] != tenant_gpu]
                    if any(f["gpu"] == tenant_gpu for f in found):
                        detection = time.monotonic() - t0
                        break
                    time.sleep(1)
            finally:
                self.stop(tenant, tstop)
            t1 = time.monotonic()
            while time.monotonic() - t1 < 3 * self.window:
                found = stragglers(url)
                false += [f"after: GPU {f['gpu']}" for f in found if f["gpu"] != tenant_gpu]
                if not found:
                    clear = time.monotonic() - t1
                    break
                time.sleep(1)
        finally:
            for proc, _log, stop in started:
                self.stop(proc, stop)
        return {"detected_s": detection, "cleared_s": clear, "false": sorted(set(false))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--shapes", default="subset,side-by-side,all-copy")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    import torch

    n = torch.cuda.device_count()
    if n < 3:
        print(f"needs 3 or more GPUs, found {n}")
        return 2
    last = n - 1
    shapes = {
        "subset": ([(list(range(n - 1)), 8192)], 1, "matmul"),
        "side-by-side": ([([0, 1], 8192), (list(range(2, n)), 6144)], last, "matmul"),
        "all-copy": ([(list(range(n)), 8192)], last, "copy"),
    }
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        config = tmp / "gpumon.yaml"
        config.write_text(
            json.dumps(
                {
                    "interval_seconds": 1,
                    "slow_interval_seconds": 2,
                    "health": {"stragglers": {"window_seconds": args.window}},
                }
            )
        )
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "GPUMON_KERNEL_LOG": "false", "PYTHONUNBUFFERED": "1"}
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpumon",
                "run",
                "--backend",
                "nvml",
                "--config",
                str(config),
                "--listen",
                f"127.0.0.1:{port}",
                "--state-dir",
                str(tmp / "state"),
            ],
            env=env,
            stdout=(tmp / "daemon.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        results: dict[str, Any] = {}
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if daemon.poll() is not None or time.monotonic() > deadline:
                    print((tmp / "daemon.log").read_text(errors="replace")[-3000:])
                    return 1
                time.sleep(0.5)
            run = Run(tmp, args.window)
            for name in args.shapes.split(","):
                jobs, tenant_gpu, kind = shapes[name]
                results[name] = {
                    "gpus": n,
                    "jobs": [g for g, _ in jobs],
                    "tenant_gpu": tenant_gpu,
                    "tenant": kind,
                    **run.shape(url, jobs, tenant_gpu, kind),
                }
                r = results[name]
                print(
                    f"{name:13} jobs {r['jobs']} tenant {kind} on GPU {tenant_gpu}: detected "
                    f"{r['detected_s'] if r['detected_s'] is None else round(r['detected_s'], 1)} s, cleared "
                    f"{r['cleared_s'] if r['cleared_s'] is None else round(r['cleared_s'], 1)} s, "
                    f"false findings {r['false'] or 'none'}",
                    flush=True,
                )
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    ok = all(r["detected_s"] is not None and r["cleared_s"] is not None and not r["false"] for r in results.values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
