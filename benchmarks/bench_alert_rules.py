"""The alert rules' cost per poll (``AlertService.on_snapshot``), in process, hot; optionally against another tree.

    python benchmarks/bench_alert_rules.py [--gpus 8] [--firing 8] [--rounds 1000] [--pairs 3]
        [--reference CHECKOUT] [--quick]

Snapshots of ``FakeBackend.plausible(N)`` are taken by the real poller (a simulated second apart), then
handed to an ``AlertService`` with the default rules (the built-in pack, no receiver), as the daemon's
poll thread does, its clock a second on per snapshot. Two cases: the simulation as it is (its alerts
go pending and back), and the same snapshots with ``--firing`` GPUs' memory 95 % used and moving a
little every poll, so that GpuMemoryHigh fires on each after its 5 minutes (what a host running
frameworks that preallocate, e.g. JAX, shows for days). Printed: µs of thread CPU per call, the
median of ``--pairs`` runs, each measured after 400 polls of warm-up.

With ``--reference CHECKOUT`` (a ``git archive REV gpumon | tar -x -C DIR`` tree) each run is a
subprocess, that tree's and this one's alternately, and the ratio this / reference is shown.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
WARMUP = 400


def snapshots(gpus: int, count: int, firing: int) -> list[Any]:
    """``count`` snapshots of the simulation, the first ``firing`` GPUs' memory 95 % used and moving."""
    from gpumon.backends.fake import FakeBackend
    from gpumon.collect.poller import Poller
    from gpumon.collect.store import SnapshotStore
    from gpumon.config.daemon_settings import intervals_of
    from gpumon.config.file import Config

    clock = [1000.0]
    store = SnapshotStore()
    taken: list[Any] = []
    store.subscribe(taken.append)
    intervals = intervals_of(Config(backend="fake", fake_gpus=gpus))
    poller = Poller(
        FakeBackend.plausible(gpus), store, intervals, monotonic=lambda: clock[0], wall_clock=lambda: clock[0]
    )
    for _ in range(count):
        poller.poll()
        clock[0] += 1.0
    out = []
    for n, snapshot in enumerate(taken):
        moved = [
            dataclasses.replace(g, memory_used_bytes=int(0.95 * g.memory_total_bytes) + 4096 * n) if i < firing else g
            for i, g in enumerate(snapshot.gpus)
        ]
        out.append(dataclasses.replace(snapshot, gpus=tuple(moved)))
    return out


def measure(gpus: int, firing: int, rounds: int) -> dict[str, float]:
    """µs of thread CPU per ``on_snapshot`` call: the simulation, and with ``firing`` alerts firing; and
    how many alerts fired by the end of each."""
    from gpumon.alerts.service import AlertService
    from gpumon.config.daemon_settings import default_alerting

    results: dict[str, float] = {}
    clock = [1000.0]
    for name, count in (("simulation", 0), (f"{firing} GPUs firing GpuMemoryHigh", firing)):
        sequence = snapshots(gpus, WARMUP + rounds, count)
        clock[0] = 1000.0
        with tempfile.TemporaryDirectory() as state:
            service = AlertService(default_alerting(), Path(state), "node1", clock=lambda: clock[0])
            spent = 0.0
            for n, snapshot in enumerate(sequence):
                clock[0] += 1.0
                start = time.thread_time()
                service.on_snapshot(snapshot)
                if n >= WARMUP:
                    spent += time.thread_time() - start
            firing_now = sum(a["state"] == "firing" for a in service.active_alerts())
        results[name] = spent * 1e6 / rounds
        results[f"{name}: alerts firing at the end"] = firing_now
    return results


def in_subprocess(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(Path(__file__).resolve()), "--json", "--gpus", str(args.gpus)]
    command += ["--firing", str(args.firing), "--rounds", str(args.rounds)]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--firing", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--reference", type=Path, help="another checkout's tree, measured alternately")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="50 rounds, one pair (checks the script runs)")
    args = parser.parse_args()
    args.firing = min(args.firing, args.gpus)
    if args.quick:
        args.rounds, args.pairs = 50, 1
    if args.json:
        print(json.dumps(measure(args.gpus, args.firing, args.rounds)))
        return
    print(f"## AlertService.on_snapshot on {args.gpus} simulated GPUs, µs of thread CPU per call, hot")
    if args.reference is None:
        for name, value in measure(args.gpus, args.firing, args.rounds).items():
            print(f"{name:<60}{value:>10.1f}")
        return
    mine: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for _ in range(args.pairs):
        theirs.append(in_subprocess(args.reference.resolve(), args))
        mine.append(in_subprocess(HERE, args))
    print(f"{'case':<60}{'reference':>10}{'this':>10}{'ratio':>8}")
    for name in mine[0]:
        ref = statistics.median(r[name] for r in theirs)
        this = statistics.median(m[name] for m in mine)
        ratio = f"{this / ref:>8.2f}" if not name.endswith("at the end") else ""
        print(f"{name:<60}{ref:>10.1f}{this:>10.1f}{ratio}")


if __name__ == "__main__":
    main()
