"""The health side of a poll, part by part: the engines fed every snapshot and the health report, hot and cold.

    python benchmarks/bench_health_parts.py [--gpus 8] [--rounds 600] [--reference CHECKOUT] [--pairs 2] [--caught-up]
        [--quick]

A ``Daemon`` on ``FakeBackend.plausible(N)`` (built, never started) is polled with a simulated second between
polls; its simulated GPUs follow the simulated clock, so two checkouts see the very same snapshots. Every 5th
poll the alert tick's finding rules ask for the health findings (``AlertService._read_findings``: the whole
report, ``current_report``, before round 7; since, the findings of the kinds the rules name). Printed, per part,
the median µs of thread CPU a call: *hot* (back-to-back, as bench_poll_parts.py measures) and *cold*: with
64 MiB written just before the call, so the CPU caches hold none of the part's code or data, as in a daemon
whose poll comes after an idle second (there each part costs several times its hot figure). In the cold
pass each part is timed in a run of its own (the eviction before one part would count in a part around it).
Parts: ``HealthService.on_snapshot`` and, within it, each engine's ``observe`` and the burn marker's read;
the tick's findings and, within them, the report (before round 7) and its parts. ``--caught-up``: the engines
observe the snapshots taken before each tick's ask, untimed, so the tick's row is the report's side alone.

With ``--reference CHECKOUT`` (a ``git archive REV | tar -x -C DIR`` tree) the same runs in a subprocess for that
tree and for this one, alternately, ``--pairs`` times, and each part's median is shown with the ratio this /
reference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
_EVICT = bytearray(64 << 20)


def _evict() -> None:
    """Write a byte in every 64-byte line of 64 MiB: the caches then hold none of what comes next."""
    _EVICT[::64] = bytes(len(_EVICT) // 64)


def _parts(daemon: Any) -> dict[str, tuple[Any, str]]:
    """Each part: (the object, the name of its method). The report's parts are module functions of the service."""
    import gpumon.health.service as service

    health = daemon.health
    parts: dict[str, tuple[Any, str]] = {"health engines (on_snapshot)": (health, "_on_snapshot")}
    for name in ("stragglers", "trends", "profiling", "stuck_processes"):
        parts[f"… observe {name}"] = (getattr(health.detectors, name), "observe")
    parts["… observe xid lifecycle"] = (health.lifecycle, "observe")
    parts["… burn marker read"] = (health._burn, "read")
    parts["alert tick's findings (_read_findings)"] = (daemon.alerts, "_read_findings")
    parts["health report (current_report)"] = (health, "current_report")
    parts["… detectors' findings"] = (health.detectors, "findings")
    parts["… xid lifecycle findings"] = (health.lifecycle, "findings")
    parts["… snapshot findings"] = (service, "snapshot_findings")
    parts["… drift and peers"] = (health._drift_check, "drift")
    parts["… verdict"] = (service, "verdict")
    return parts


def _run(
    gpus: int, rounds: int, timed: Callable[[list[str]], list[str]], cold: bool, caught_up: bool = False
) -> dict[str, float]:
    """Median µs a call of the parts ``timed`` picks (from every part's name), evicting the caches first if ``cold``."""
    from gpumon.backends.fake import FakeBackend
    from gpumon.config.file import Config
    from gpumon.daemon import Daemon

    clock, wall = [1000.0], [1.8e9]
    spent: dict[str, list[float]] = {}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            if cold:
                _evict()
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent.setdefault(name, []).append(time.thread_time() - start)

        return run

    with tempfile.TemporaryDirectory() as state:
        config = Config(listen="127.0.0.1:0", state_dir=Path(state), backend="fake", fake_gpus=gpus)
        backend = FakeBackend.plausible(gpus, clock=lambda: wall[0])
        daemon = Daemon(config, backend, monotonic=lambda: clock[0], wall_clock=lambda: wall[0])
        try:
            parts = _parts(daemon)
            for name in timed(list(parts)):
                owner, method = parts[name]
                object.__setattr__(owner, method, wrap(name, getattr(owner, method)))  # Detectors is frozen
            for n in range(60 + rounds):
                if n == 60:
                    spent.clear()
                daemon.poller.poll()
                if n % 5 == 0:
                    if caught_up:  # the engines observe the snapshots taken first, untimed
                        daemon.health.detectors.catch_up()
                    daemon.alerts._read_findings()  # as the alert tick asks every 5 s
                clock[0] += 1.0
                wall[0] += 1.0
        finally:
            daemon.server.stop()  # never started: closes its listener
    return {name: statistics.median(spent[name]) * 1e6 for name in parts if name in spent}  # in the parts' order


def measure(gpus: int, rounds: int, caught_up: bool = False) -> dict[str, float]:
    hot = _run(gpus, rounds, lambda names: names, cold=False, caught_up=caught_up)
    out = {f"hot: {name}": micros for name, micros in hot.items()}
    for name in hot:
        pick: Callable[[list[str]], list[str]] = lambda _names, n=name: [n]  # type: ignore[misc]  # noqa: E731
        out[f"cold: {name}"] = _run(gpus, rounds, pick, cold=True, caught_up=caught_up)[name]
    return out


def in_subprocess(tree: Path, gpus: int, rounds: int, caught_up: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    args = [sys.executable, str(Path(__file__).resolve()), "--json", "--gpus", str(gpus), "--rounds", str(rounds)]
    args += ["--caught-up"] if caught_up else []
    done = subprocess.run(args, env=env, cwd=tree, capture_output=True, text=True, timeout=900, check=True)
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--reference", type=Path, help="another checkout's tree, measured alternately")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--caught-up", action="store_true", help="the engines observe the snapshots before each tick's ask (untimed)"
    )
    parser.add_argument("--quick", action="store_true", help="2 GPUs, 20 rounds, one pair (checks the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.gpus, args.rounds, args.pairs = 2, 20, 1
    if args.json:
        print(json.dumps(measure(args.gpus, args.rounds, args.caught_up)))
        return
    print(
        f"## the health side of a poll, {args.gpus} simulated GPUs, median µs of thread CPU a call ({args.rounds} polls)"
    )
    if args.reference is None:
        for name, micros in measure(args.gpus, args.rounds, args.caught_up).items():
            print(f"{name:<50}{micros:>10.0f}")
        return
    mine: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for _ in range(args.pairs):
        theirs.append(in_subprocess(args.reference.resolve(), args.gpus, args.rounds, args.caught_up))
        mine.append(in_subprocess(HERE, args.gpus, args.rounds, args.caught_up))
    print(f"{'part':<50}{'reference':>10}{'this':>10}{'ratio':>8}")
    names = list(mine[0]) + [name for name in theirs[0] if name not in mine[0]]  # a part one tree no longer calls: 0
    for name in names:
        ref = statistics.median(r.get(name, 0.0) for r in theirs)
        this = statistics.median(m.get(name, 0.0) for m in mine)
        ratio = f"{this / ref:8.2f}" if ref else f"{'-':>8}"
        print(f"{name:<50}{ref:>10.0f}{this:>10.0f}{ratio}")


if __name__ == "__main__":
    main()
