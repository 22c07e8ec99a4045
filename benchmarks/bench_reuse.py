"""What the work the daemon reuses saves: the same step timed when nothing changed and when
everything did, in process, on the fake backend, with an injected clock.

    python3 benchmarks/bench_reuse.py [--gpus 64] [--rounds 200]
    python3 benchmarks/bench_reuse.py --quick      # few GPUs and rounds (checks the script runs)

Printed, median µs per step, each pair with its ratio:

1. the first scrape after a poll (``GpumonCollector.render``) when no GPU's values changed, against
   one where every GPU's temperature, power and utilisation changed (their samples are made again);
2. a scrape of a snapshot already scraped, against a fresh collector made and scraped (several scrapers
   of one snapshot share its text; the head, HELP lines and templates are made once, not per scrape);

A health report's reuse (drift worked out again only when what it reads changed) is not timed here:
the stragglers engine is most of a report's cost (profile ``HealthService.report``).

A ratio near 1 in a pair means that reuse stopped working. Nothing is asserted (tests/test_daemon_cpu.py
checks that what is served stays a fresh render's); the table is the result.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.exposition.collector import GpumonCollector
from gpumon.model.poll_intervals import PollIntervals


def median_us(step: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def render_after_poll(gpus: int, changing: bool, rounds: int) -> float:
    """Median µs of the first scrape after a poll (the poll itself not timed); every GPU's temperature,
    power and utilisation move each poll when ``changing``."""
    clock = [1000.0]
    ticks = range(rounds + 2)
    base: dict[str, object] = {"temperature_celsius": 40.0, "power_watts": 500.0, "utilization_ratio": 0.5}
    if changing:
        base = {
            "temperature_celsius": [40.0 + t % 20 for t in ticks],
            "power_watts": [500.0 + t for t in ticks],
            "utilization_ratio": [(t % 100) / 100 for t in ticks],
        }
    backend = FakeBackend.from_mapping({"count": gpus, "base": base})
    store = SnapshotStore()
    poller = Poller(backend, store, monotonic=lambda: clock[0], wall_clock=lambda: clock[0], host_figures=dict)
    collector = GpumonCollector(store, PollIntervals(), monotonic=lambda: clock[0])
    times = []
    for _ in range(rounds + 1):
        clock[0] += 1
        poller.poll()
        start = time.perf_counter()
        collector.render()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]) * 1e6


def scrape(gpus: int, fresh: bool) -> Callable[[], object]:
    """A scrape of one snapshot: by the collector that scraped it already, or by a fresh one."""
    store = SnapshotStore()
    Poller(FakeBackend.plausible(gpus), store, host_figures=dict).poll()
    warm = GpumonCollector(store, PollIntervals())
    warm.render()
    if fresh:
        return lambda: GpumonCollector(store, PollIntervals()).render()
    return warm.render


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="4 GPUs, 10 rounds")
    args = parser.parse_args()
    gpus, rounds = (4, 10) if args.quick else (args.gpus, args.rounds)
    print(f"{gpus} GPU(s), median of {rounds} rounds, µs per step")
    pairs = [
        (
            "scrape after a poll",
            "no GPU changed",
            render_after_poll(gpus, False, rounds),
            "every GPU changed",
            render_after_poll(gpus, True, rounds),
        ),
        (
            "scrape",
            "snapshot scraped before",
            median_us(scrape(gpus, fresh=False), rounds),
            "fresh collector",
            median_us(scrape(gpus, fresh=True), rounds),
        ),
    ]
    print(f"{'step':<20} {'reused':<25} {'µs':>10}   {'made again':<20} {'µs':>10}   ratio")
    for step, reused, reused_us, made, made_us in pairs:
        print(f"{step:<20} {reused:<25} {reused_us:>10.1f}   {made:<20} {made_us:>10.1f}   {made_us / reused_us:.1f}x")


if __name__ == "__main__":
    main()
