"""benchmarks/bench_daemon_floor.py: the daemon's CPU against a bare pynvml loop making the same
calls at the same cadence runs here on simulated GPUs, and its floor follows the daemon's schedule."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

from gpumon.backends.nvml.registry import collect_readers
from gpumon.model.snapshot import Tier

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))


def test_the_floor_makes_each_reader_group_as_often_as_the_daemon_does() -> None:
    from bench_daemon_floor import FloorPlan

    plan = FloorPlan(8, collect_readers(), {Tier.FAST: 1.0, Tier.SLOW: 10.0, Tier.STATIC: 300.0})
    runs = Counter(name for t in range(600) for _gpu, name in plan.poll(float(t)))
    per_gpu = {name: n / 8 for name, n in runs.items()}
    assert per_gpu["utilization"] == 600  # fast: every poll
    assert 59 <= per_gpu["ecc_errors"] <= 60  # slow: every 10 s
    assert 19 <= per_gpu["pcie_replays"] <= 20 and 19 <= per_gpu["fabric"] <= 20  # every 30 s
    assert 9 <= per_gpu["energy"] <= 10  # every 60 s
    assert 19 <= per_gpu["gpm"] <= 20 and 19 <= per_gpu["violations"] <= 20  # every 30 s
    assert per_gpu["nvlink_errors"] == 2  # every 300 s
    assert per_gpu["p2p"] == 1 and per_gpu["topology"] == 1  # hourly
    assert per_gpu["max_clocks"] == 2  # the static tier: every 300 s


def test_the_benchmark_prints_the_daemon_against_the_floor_on_simulated_gpus() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_daemon_floor.py"), "--quick"], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    for line in ("floor: bare pynvml, same calls, same cadence", "gpumon run", "ratio gpumon run / floor: "):
        assert line in done.stdout, done.stdout
    footprint = next(line for line in done.stdout.splitlines() if line.startswith("gpumon run: series "))
    assert "per GPU" in footprint and "RSS max" in footprint, footprint
