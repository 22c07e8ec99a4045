"""What the burn benchmarks share: the environment every process runs in, a child of the benchmark
script, and ``gpumon burn`` run as a user runs it.

Every process keeps NVLink multicast off, as gpumon burn does (KINDS.md of the GPU hosts), and no
fault injection leaks in from the caller's environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def bench_env() -> dict[str, str]:
    """This process's environment with NVLink multicast off, GPUs in PCI order and no injection."""
    env = dict(os.environ)
    env.update(NO_MULTICAST)
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    env.pop("GPUMON_BURN_INJECT", None)
    return env


def run_child(script: str, kind: str, *args: str) -> Any:
    """``script --child KIND ARGS`` in a process of its own (no CUDA context here); the JSON of its last line."""
    proc = subprocess.run(
        [sys.executable, script, "--child", kind, *args], capture_output=True, text=True, env=bench_env(), timeout=600
    )
    if proc.returncode != 0:
        raise SystemExit(f"bare {kind} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_burn(args: list[str]) -> tuple[dict[str, Any], float, int]:
    """``gpumon burn ARGS --json``: (its report, wall seconds, exit code)."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "r.json"
        t = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "gpumon.burn", *args, "--json", str(path), "--state-dir", d],
            capture_output=True,
            text=True,
            env=bench_env(),
            timeout=600,
        )
        wall = time.monotonic() - t
        if not path.exists():
            raise SystemExit(f"gpumon burn {' '.join(args)} wrote no report: {proc.stderr[-2000:]}")
        return json.loads(path.read_text()), wall, proc.returncode
