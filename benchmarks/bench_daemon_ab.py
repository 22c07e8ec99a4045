"""Two gpumon daemons from two checkouts, started together on simulated GPUs (or this host's): CPU and RSS of each.

    python benchmarks/bench_daemon_ab.py REFERENCE_CHECKOUT [OTHER_CHECKOUT] [--gpus 8] [--seconds 250]
        [--scrape-interval 1] [--backend nvml] [--quick]

REFERENCE_CHECKOUT is a tree of gpumon (``git worktree add /tmp/before a76c2bb``, or ``git archive
REV | tar -x -C DIR``); OTHER_CHECKOUT defaults to this one. Each tree runs its own ``gpumon run
--backend fake --fake-gpus N`` (default intervals, its own state dir, its own modules through
PYTHONPATH); both start together and are scraped every ``--scrape-interval`` seconds (default 1),
in turn, for ``--seconds``; ``--backend nvml``: both read this host's GPUs through NVML (``--gpus`` is
then ignored). Printed: each daemon's share of one core over that time (the sum of its
threads' schedstat run time; and user + system in clock ticks, which counts threads that ended
within the window too), its threads' shares largest first, its RSS, and the ratio of the
other to the reference.

Why together: the fake backend's simulated load follows wall time (a period of about 251 s), and a
shared box's speed drifts over minutes and days; two daemons measured one after the other see
different loads and a different box (docs/benchmarks.md, "Daemon CPU per GPU count").
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_proc import daemon, process_cpu_seconds, thread_cpu_seconds

HERE = Path(__file__).resolve().parent.parent


def _ticks(pid: int) -> float:
    """User + system seconds of the process (10 ms ticks), threads that have ended included: the
    schedstat sum above leaves out a thread that ended within the window (one started per call)."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("reference", type=Path, help="the checkout measured first in each round (before)")
    parser.add_argument("other", type=Path, nargs="?", default=HERE, help="the other checkout (default: this one)")
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs (--backend fake)")
    parser.add_argument("--backend", default="fake", choices=("fake", "nvml"), help="nvml: this host's GPUs")
    parser.add_argument("--seconds", type=float, default=250.0)
    parser.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes (default 1)")
    parser.add_argument("--quick", action="store_true", help="2 GPUs for 3 s (checks the script runs)")
    args = parser.parse_args()
    gpus, seconds = (2, 3.0) if args.quick else (args.gpus, args.seconds)
    trees = [args.reference.resolve(), args.other.resolve()]
    with contextlib.ExitStack() as stack:  # both started, one right after the other, before either is measured
        procs, ports = zip(*(stack.enter_context(daemon(gpus, backend=args.backend, tree=tree)) for tree in trees), strict=True)
        time.sleep(3.0)  # past start-up: the first static and slow reads
        conns = [http.client.HTTPConnection("127.0.0.1", port, timeout=30) for port in ports]
        before = [process_cpu_seconds(proc.pid) for proc in procs]
        ticks_before = [_ticks(proc.pid) for proc in procs]
        threads_before = [thread_cpu_seconds(proc.pid) for proc in procs]
        began = time.monotonic()
        rounds = 0
        while time.monotonic() - began < seconds:
            for conn in conns:  # one plain scrape each, keep-alive, as Prometheus does
                conn.request("GET", "/metrics")
                conn.getresponse().read()
            rounds += 1
            time.sleep(max(0.0, min(began + seconds, began + rounds * args.scrape_interval) - time.monotonic()))
        elapsed = time.monotonic() - began
        shares = [100.0 * (process_cpu_seconds(proc.pid) - b) / elapsed for proc, b in zip(procs, before, strict=True)]
        ticked = [100.0 * (_ticks(proc.pid) - b) / elapsed for proc, b in zip(procs, ticks_before, strict=True)]
        per_thread = [
            sorted(
                (100.0 * (cpu - old.get(tid, 0.0)) / elapsed for tid, cpu in thread_cpu_seconds(proc.pid).items()),
                reverse=True,
            )
            for proc, old in zip(procs, threads_before, strict=True)
        ]
        rss = [psutil.Process(proc.pid).memory_info().rss / 2**20 for proc in procs]
    what = f"{gpus} simulated GPUs" if args.backend == "fake" else "this host's GPUs (NVML)"
    print(
        f"## two daemons started together, {what}, a scrape every {args.scrape_interval:g} s each, "
        f"{elapsed:.0f} s"
    )
    print(f"{'checkout':<50}{'% of a core':>12}{'(ticks)':>9}{'RSS MiB':>9}  threads, % of a core each, largest first")
    rows = zip(("reference", "other"), trees, shares, ticked, rss, per_thread, strict=True)
    for label, tree, share, tick, mib, threads in rows:
        each = " ".join(f"{t:.3f}" for t in threads)
        print(f"{f'{label}: {tree}':<50}{share:>12.3f}{tick:>9.3f}{mib:>9.1f}  {each}")
    print(
        f"ratio other / reference: CPU {ratio(shares[1], shares[0])} (ticks {ratio(ticked[1], ticked[0])}), "
        f"RSS {ratio(rss[1], rss[0])}"
    )
    return 0


def ratio(other: float, reference: float) -> str:
    """other / reference to two places, or "n/a" where the reference measured nothing (a short window
    can hold no 10 ms clock tick of a light daemon)."""
    return f"{other / reference:.2f}" if reference > 0 else "n/a"


if __name__ == "__main__":
    sys.exit(main())
