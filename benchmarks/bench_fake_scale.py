"""Poll and scrape cost with many simulated GPUs (default 256), on any machine.

Goal: one poll <= 50 ms and an HTTP scrape p99 <= 50 ms with 256 GPUs on a 2-core box.

Part 1, in process: ``Poller.poll()`` against the fake backend's bare fast reads (the floor
the poller cannot go below), the collector's render, and the body a gzip scrape gets (what the
daemon serves): the first scrape of a new snapshot, and a later scrape of the same snapshot.
Part 2, as Prometheus sees it: a real ``gpumon run --backend fake --fake-gpus N`` subprocess
(default intervals, so the poller and the health engines run meanwhile) scraped over HTTP
with keep-alive, plain, gzipped, and with Prometheus 2.42's OpenMetrics Accept header;
interleaved, round by round; the daemon's CPU over those scrapes is printed too. The reference measured in the same run is prometheus_client's
own ``generate_latest`` over a registry holding the same gpumon families.

    python benchmarks/bench_fake_scale.py [--gpus 256] [--rounds 30] [--scrapes 40] [--compat dcgm] [--quick]

``--compat dcgm`` adds dcgm-exporter's families (in process: the DCGM collector as an extra
collector; over HTTP: ``gpumon run --compat dcgm``).
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_proc import VARIANTS, daemon, pct, process_cpu_seconds
from prometheus_client import CollectorRegistry, generate_latest

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.exposition.collector import GpumonCollector
from gpumon.exposition.dcgm import DcgmCompatCollector
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import Tier


def in_process(gpus: int, rounds: int, compat: list[str]) -> float:
    """Prints poll and render figures; returns the median generate_latest time (the reference)."""
    backend = FakeBackend.from_mapping({"count": gpus})
    store = SnapshotStore()
    poller = Poller(backend, store, PollIntervals())
    poller.poll()  # first poll reads every tier
    collector = GpumonCollector(store, PollIntervals(), processes=True)
    if "dcgm" in compat:
        collector.add("dcgm", DcgmCompatCollector(store, "bench-host"))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)  # type: ignore[arg-type]
    collector.render()  # the first render builds every tier's families (once per daemon start): not timed
    polls, reads, renders, firsts, laters, reference = [], [], [], [], [], []
    body = b""
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in range(gpus):
            backend.read(i, Tier.FAST)
        reads.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        poller.poll()
        polls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        body = collector.render()
        renders.append(time.perf_counter() - t0)
        poller.poll()  # a new snapshot for the body
        t0 = time.perf_counter()
        collector.body(gzip=True)
        firsts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        collector.body(gzip=True)
        laters.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        generate_latest(registry)
        reference.append(time.perf_counter() - t0)
    ref = statistics.median(reference)
    with_compat = f", --compat {','.join(compat)}" if compat else ""
    print(f"## in process: {gpus} simulated GPUs{with_compat}, {rounds} rounds, {len(body) / 1024:.0f} KiB per scrape")
    print(f"{'what':<46}{'p50 ms':>9}{'p99 ms':>9}{'/ ref':>8}")
    for name, values in (
        ("backend fast reads", reads),
        ("gpumon poll (fast tier)", polls),
        ("gpumon collector render", renders),
        ("body, first gzip scrape of a snapshot", firsts),
        ("body, later gzip scrape of it", laters),
        ("prometheus_client generate_latest (reference)", reference),
    ):
        p50 = statistics.median(values)
        print(f"{name:<46}{p50 * 1e3:>9.2f}{pct(values, 0.99) * 1e3:>9.2f}{p50 / ref:>8.2f}")
    print(f"poll / bare reads ratio: {statistics.median(polls) / statistics.median(reads):.2f}")
    return ref


def over_http(gpus: int, scrapes: int, pause: float, ref: float, compat: list[str]) -> None:
    args = ["--compat", ",".join(compat)] if compat else []
    with daemon(gpus, args=args) as (proc, port):
        cpu_start, wall_start = process_cpu_seconds(proc.pid), time.monotonic()
        conns = {name: http.client.HTTPConnection("127.0.0.1", port, timeout=30) for name in VARIANTS}
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        sizes: dict[str, int] = {}
        names = list(VARIANTS)
        for n in range(scrapes + 2):
            for k in range(len(names)):
                name = names[(n + k) % len(names)]
                t0 = time.perf_counter()
                conns[name].request("GET", "/metrics", headers=VARIANTS[name])
                response = conns[name].getresponse()
                body = response.read()
                elapsed = time.perf_counter() - t0
                if response.status != 200:
                    raise SystemExit(f"/metrics answered {response.status}")
                if n >= 2:  # the first two rounds warm up
                    times[name].append(elapsed)
                sizes[name] = len(body)
                time.sleep(pause)
        cpu_end, wall = process_cpu_seconds(proc.pid), time.monotonic() - wall_start
    cpu = (cpu_end - cpu_start) / wall
    print(f"## over HTTP: gpumon run --backend fake --fake-gpus {gpus} {' '.join(args)}, {scrapes} scrapes per variant")
    print(f"{'variant':<20}{'KiB':>8}{'p50 ms':>9}{'p99 ms':>9}{'p50/ref':>9}{'p99/ref':>9}")
    worst = 0.0
    for name in names:
        p50, p99 = statistics.median(times[name]), pct(times[name], 0.99)
        worst = max(worst, p99)
        print(
            f"{name:<20}{sizes[name] / 1024:>8.0f}{p50 * 1e3:>9.2f}{p99 * 1e3:>9.2f}{p50 / ref:>9.2f}{p99 / ref:>9.2f}"
        )
    print(f"reference (generate_latest, same families, in process): {ref * 1e3:.2f} ms")
    print(f"daemon CPU while scraped: {cpu * 100:.1f} % of a core over {wall:.0f} s")
    print(f"goal HTTP scrape p99 <= 50 ms: {'met' if worst <= 0.05 else 'MISSED'} (worst p99 {worst * 1e3:.1f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--scrapes", type=int, default=40)
    parser.add_argument("--pause", type=float, default=0.2, help="seconds between scrapes")
    parser.add_argument(
        "--compat", action="append", default=[], choices=["dcgm"], help="also serve these compat families"
    )
    parser.add_argument("--quick", action="store_true", help="8 GPUs, a few rounds (checks the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.gpus, args.rounds, args.scrapes, args.pause = 8, 3, 3, 0.0
    ref = in_process(args.gpus, args.rounds, args.compat)
    over_http(args.gpus, args.scrapes, args.pause, ref, args.compat)


if __name__ == "__main__":
    main()
