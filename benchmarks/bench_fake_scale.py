"""Poll and scrape cost with many simulated GPUs (default 256), on any machine.

Goal (issue 2): one poll <= 50 ms and one scrape <= 50 ms with 256 GPUs on a 2-core box.
The reference measured in the same run is the fake backend's own read cost (the floor
the poller cannot go below), so the printed ratio is gpumon's overhead on top of it.

    python benchmarks/bench_fake_scale.py [--gpus 256] [--rounds 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

from gpumon.backends.fake import FakeBackend
from gpumon.exporter.collector import GpumonCollector
from gpumon.poller import Poller, PollIntervals
from gpumon.snapshot import Tier
from gpumon.store import SnapshotStore


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()

    backend = FakeBackend.from_mapping({"count": args.gpus})
    store = SnapshotStore()
    poller = Poller(backend, store, PollIntervals())
    poller.poll()  # first poll reads every tier
    polls, reads, scrapes = [], [], []
    collector = GpumonCollector(store, PollIntervals(), processes=True)
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for i in range(args.gpus):
            backend.read(i, Tier.FAST)
        reads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        poller.poll()
        polls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        body = collector.render()
        scrapes.append(time.perf_counter() - t0)
    print(f"{args.gpus} simulated GPUs, {args.rounds} rounds, {len(body) / 1024:.0f} KiB per scrape")
    print(f"{'what':<34}{'p50 ms':>9}{'p99 ms':>9}")
    for name, values in (
        ("backend fast reads (reference)", reads),
        ("gpumon poll (fast tier)", polls),
        ("gpumon /metrics render", scrapes),
    ):
        print(f"{name:<34}{statistics.median(values) * 1e3:>9.2f}{pct(values, 0.99) * 1e3:>9.2f}")
    print(f"poll / bare reads ratio: {statistics.median(polls) / statistics.median(reads):.2f}")
    print(
        f"goal poll <= 50 ms: {'met' if statistics.median(polls) <= 0.05 else 'MISSED'}; "
        f"scrape <= 50 ms: {'met' if statistics.median(scrapes) <= 0.05 else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
