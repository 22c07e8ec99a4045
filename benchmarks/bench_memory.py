#!/usr/bin/env python3
"""Where a running daemon's resident memory is, against a bare pynvml process on the same host.

    python3 benchmarks/bench_memory.py [--backend nvml|fake] [--fake-gpus 8] [--seconds 30] [--libraries 12]

Starts ``gpumon run`` (default intervals, scraped once a second for ``--seconds``) and, as the
reference, a bare process of the same Python that imports pynvml, initialises NVML and reads every
GPU's memory and utilization once (with ``--backend fake``: a bare interpreter). Then reads both
processes' mappings (``/proc/PID/smaps``, through psutil) and prints resident memory (RSS) and
proportional memory (PSS: a shared page split between the processes that map it) by what the
mapping holds: anonymous memory (Python objects, malloc arenas, thread stacks), the interpreter,
libnvidia-ml, extension modules, other shared libraries, device mappings; then, with
``--libraries N``, the N file mappings of the daemon with the most RSS beside the reference's.
Linux only; nothing is asserted.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psutil
from daemon_proc import bytecode_note, daemon, get

BARE_NVML = """
import sys, pynvml
pynvml.nvmlInit()
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    pynvml.nvmlDeviceGetMemoryInfo(h)
    pynvml.nvmlDeviceGetUtilizationRates(h)
print("ready", flush=True)
sys.stdin.read()
"""
BARE_PYTHON = 'import sys\nprint("ready", flush=True)\nsys.stdin.read()\n'

CATEGORIES = (
    "anonymous (Python objects, malloc, thread stacks)",
    "python interpreter (executable, libpython)",
    "libnvidia-ml (NVML)",
    "extension modules (.so in site-packages, lib-dynload)",
    "other shared libraries",
    "device mappings (/dev/nvidia*)",
    "other files",
)


def category(path: str) -> str:
    """The CATEGORIES entry a mapping's path falls in."""
    name = Path(path).name
    if not path or (path.startswith("[") and path != "[vdso]"):
        return CATEGORIES[0]
    if "libnvidia-ml" in name:
        return CATEGORIES[2]
    if path.startswith("/dev/nvidia"):
        return CATEGORIES[5]
    if name.startswith(("python", "libpython")):
        return CATEGORIES[1]
    if ".so" in name and ("site-packages" in path or "dist-packages" in path or "lib-dynload" in path):
        return CATEGORIES[3]
    if ".so" in name:
        return CATEGORIES[4]
    return CATEGORIES[6]


def mappings(pid: int) -> list[Any]:
    """Process ``pid``'s mappings grouped by path (``/proc/PID/smaps`` through psutil), read once."""
    return list(psutil.Process(pid).memory_maps(grouped=True))


def by_category(maps: list[Any]) -> dict[str, tuple[float, float]]:
    """(RSS MiB, PSS MiB) of ``maps`` per category, and a total."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for mapping in maps:
        for key in (category(mapping.path), "total"):
            totals[key][0] += mapping.rss / 2**20
            totals[key][1] += mapping.pss / 2**20
    return {key: (rss, pss) for key, (rss, pss) in totals.items()}


def by_file(maps: list[Any]) -> dict[str, float]:
    """RSS MiB of ``maps`` per mapped file (anonymous mappings left out)."""
    return {Path(m.path).name: m.rss / 2**20 for m in maps if m.path and not m.path.startswith("[")}


def bare_process(backend: str) -> subprocess.Popen[str]:
    """The reference process, started and ready (it waits on its stdin)."""
    code = BARE_NVML if backend == "nvml" else BARE_PYTHON
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        raise SystemExit(f"the bare {backend} process did not start")
    return proc


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="nvml", choices=("nvml", "fake"))
    parser.add_argument("--fake-gpus", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--libraries", type=int, default=0, help="list the N files mapped with the most RSS")
    args = parser.parse_args()

    bare = bare_process(args.backend)
    try:
        with daemon(args.fake_gpus, backend=args.backend) as (proc, port):
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                get(port, "/metrics")
                time.sleep(1)
            our_maps = mappings(proc.pid)
            threads = psutil.Process(proc.pid).num_threads()
        reference_maps = mappings(bare.pid)
    finally:
        bare.kill()
        bare.wait()
    ours, reference = by_category(our_maps), by_category(reference_maps)
    our_files, reference_files = by_file(our_maps), by_file(reference_maps)
    label = "bare pynvml process" if args.backend == "nvml" else "bare python"
    gpus = "" if args.backend == "nvml" else f" {args.fake_gpus} simulated GPUs,"
    print(
        f"# gpumon run --backend {args.backend},{gpus} scraped once a second for {args.seconds:.0f} s; {threads} threads"
    )
    note = bytecode_note()
    if note:
        print(note)
    print(f"# python {sys.version.split()[0]}; MiB; reference: a {label} on the same host, read at the same time")
    print(f"{'what the mapping holds':<56}{'gpumon RSS':>11}{'PSS':>8}{'ref RSS':>9}{'PSS':>8}")
    for key in (*CATEGORIES, "total"):
        rss, pss = ours.get(key, (0.0, 0.0))
        ref_rss, ref_pss = reference.get(key, (0.0, 0.0))
        print(f"{key:<56}{rss:>11.1f}{pss:>8.1f}{ref_rss:>9.1f}{ref_pss:>8.1f}")
    total, ref_total = ours["total"][0], reference["total"][0]
    print(f"gpumon over the reference: {total - ref_total:+.1f} MiB RSS ({total / ref_total:.2f}x)")
    if args.libraries:
        print(f"{'file mapped (largest RSS in gpumon)':<56}{'gpumon RSS':>11}{'ref RSS':>17}")
        for name, rss in sorted(our_files.items(), key=lambda item: -item[1])[: args.libraries]:
            ref = reference_files.get(name)
            print(f"{name:<56}{rss:>11.2f}{'-' if ref is None else f'{ref:.2f}':>17}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
