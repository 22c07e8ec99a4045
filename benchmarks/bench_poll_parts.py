"""Where a poll's CPU goes, in process, part by part; optionally against another checkout.

    python benchmarks/bench_poll_parts.py [--gpus 8] [--rounds 400] [--scrape-every 1] [--pairs 3]
        [--reference CHECKOUT] [--quick]

A ``Daemon`` on ``FakeBackend.plausible(N)`` (built, its port bound, never started) is polled with a
simulated second between polls, and its collector's body (one plain scrape) is made after every
``--scrape-every``-th poll (1: a daemon scraped once a second; 15: as Prometheus at its default). Printed: the thread CPU of the whole poll (the reference the
parts add up to) and of its parts: the backend's reads (the simulation: a real host pays NVML calls
there), the poller's merge, each store listener (the collector's rendering ahead, and within it the
per-GPU families, the slow and static rows and the per-snapshot sources), and the scrape's body.
Every part is hot here (the same code each round); a daemon pays more per part, as its caches have
gone cold in the second between polls (bench_daemon_cpu.py measures that whole).

With ``--reference CHECKOUT`` (a ``git archive REV | tar -x -C DIR`` tree) the same runs in a
subprocess for that tree and for this one, alternately, ``--pairs`` times, and each part's median
is shown with the ratio this / reference.
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


def measure(gpus: int, rounds: int, scrape_every: int = 1) -> dict[str, float]:
    """µs of thread CPU per poll for the whole poll, each part, and the scrape's body (per poll:
    a scrape's cost over ``scrape_every`` polls)."""
    from gpumon.backends.fake import FakeBackend
    from gpumon.config.file import Config
    from gpumon.daemon import Daemon

    clock, wall = [1000.0], [1.8e9]
    spent: dict[str, float] = {}

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.thread_time() - start

        return run

    with tempfile.TemporaryDirectory() as state:
        config = Config(listen="127.0.0.1:0", state_dir=Path(state), backend="fake", fake_gpus=gpus)
        backend = FakeBackend.plausible(gpus)
        daemon = Daemon(config, backend, monotonic=lambda: clock[0], wall_clock=lambda: wall[0])
        try:
            backend.read = timed("backend reads (simulation)", backend.read)  # type: ignore[method-assign]
            poller, families = daemon.poller, daemon.collector._gpu
            poller._merge = timed("poller merge", poller._merge)  # type: ignore[method-assign]
            families.of = timed("prepare: per-GPU families", families.of)  # type: ignore[method-assign]
            families.prepare_slower = timed("prepare: slow and static rows", families.prepare_slower)  # type: ignore[method-assign]
            extras = daemon.collector._extras
            extras.warm_per_snapshot = timed("prepare: per-snapshot sources", extras.warm_per_snapshot)  # type: ignore[method-assign]
            health = daemon.health  # the scrape's health series ask for its report (an alert tick does every 5 s)
            health.current_report = timed("health report (current_report)", health.current_report)  # type: ignore[method-assign]
            store = daemon.store
            store._listeners = tuple(
                (timed(f"listener {getattr(fn, '__qualname__', repr(fn))}", fn), failures)
                for fn, failures in store._listeners
            )
            whole: dict[str, float] = {"poll (reference)": 0.0, "scrape body": 0.0}
            for n in range(20 + rounds):
                if n == 20:
                    spent.clear()
                    whole = dict.fromkeys(whole, 0.0)
                start = time.thread_time()
                poller.poll()
                middle = time.thread_time()
                if n % scrape_every == 0:
                    daemon.collector.body()
                whole["poll (reference)"] += middle - start
                whole["scrape body"] += time.thread_time() - middle
                clock[0] += 1.0
                wall[0] += 1.0
        finally:
            daemon.server.stop()  # never started: closes its listener
    return {name: seconds * 1e6 / rounds for name, seconds in {**whole, **spent}.items()}


def in_subprocess(tree: Path, gpus: int, rounds: int, scrape_every: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    args = [sys.executable, str(Path(__file__).resolve()), "--json", "--gpus", str(gpus), "--rounds", str(rounds)]
    args += ["--scrape-every", str(scrape_every)]
    done = subprocess.run(args, env=env, cwd=tree, capture_output=True, text=True, timeout=600, check=True)
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--scrape-every", type=int, default=1, help="polls between scrapes (default 1)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--reference", type=Path, help="another checkout's tree, measured alternately")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="20 rounds, one pair (checks the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.pairs = 20, 1
    if args.json:
        print(json.dumps(measure(args.gpus, args.rounds, args.scrape_every)))
        return
    print(
        f"## one poll of {args.gpus} simulated GPUs and a scrape every {args.scrape_every} poll(s), in process, "
        f"µs of thread CPU per poll ({args.rounds} rounds)"
    )
    if args.reference is None:
        for name, micros in measure(args.gpus, args.rounds, args.scrape_every).items():
            print(f"{name:<60}{micros:>10.0f}")
        return
    mine: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for _ in range(args.pairs):
        theirs.append(in_subprocess(args.reference.resolve(), args.gpus, args.rounds, args.scrape_every))
        mine.append(in_subprocess(HERE, args.gpus, args.rounds, args.scrape_every))
    print(f"{'part':<60}{'reference':>10}{'this':>10}{'ratio':>8}")
    names = list(mine[0]) + [name for name in theirs[0] if name not in mine[0]]  # parts one tree has alone too
    for name in names:
        ref = statistics.median(r.get(name, 0.0) for r in theirs)
        this = statistics.median(m.get(name, 0.0) for m in mine)
        ratio = f"{this / ref:8.2f}" if ref else f"{'-':>8}"
        print(f"{name:<60}{ref:>10.0f}{this:>10.0f}{ratio}")


if __name__ == "__main__":
    main()
