#!/usr/bin/env python3
"""gpumon's daemon CPU against the floor: a bare pynvml loop that makes the same NVML calls at the same cadence.

    python3 benchmarks/bench_daemon_floor.py [--seconds 60] [--scrape-interval 15] [--warmup 5]
    python3 benchmarks/bench_daemon_floor.py --backend fake --fake-gpus 8   # simulated GPUs: the script runs
    python3 benchmarks/bench_daemon_floor.py --quick                        # fake, 2 GPUs, 3 s (tests)

Measured in one run on this host, one after the other over windows of ``--seconds``:

1. ``gpumon run`` with default settings in a subprocess, scraped every ``--scrape-interval``
   seconds as Prometheus 2.42 asks (OpenMetrics, gzip): its CPU over the window (the schedstat run
   time of its live threads; and user + system in clock ticks, coarse, but counting the threads that
   ended within the window, which the first leaves out), which starts ``--warmup`` seconds after it is ready; its RSS,
   the scrapes' latency, and the series per GPU of a plain-text scrape.
2. The floor, in this process: a thread that replays the pynvml calls gpumon's NVML backend makes
   (recorded through a proxy of the module after the first reads, as bench_nvml_calls.py does;
   answers and errors dropped), each GPU's reader groups when the daemon makes them: the fast
   tier every poll, the slow and static tiers as the poller plans them (at most
   ceil(GPUs x fast / interval) GPUs a poll), and a reader with ``ReaderSpec.every_seconds`` at
   most that often. Its schedule starts where the daemon's did (its first poll, from
   gpumon_last_poll_timestamp_seconds{tier="static"}), so both windows hold the same reads.
   Its CPU: the thread's user + system time.

Printed: % of one core of each, per GPU, the ratio daemon / floor (goal <= 1.5 with a scrape every 15 s,
<= 2.0 with one every second), the floor by
reader group (where NVML's cost goes on this host), the series per GPU (budget <= 60 on an 8-GPU
NVLink host), RSS and scrape latency of each daemon measured. Nothing is asserted. It imports what the
daemon imports (psutil, pynvml, gpumon's own modules) and nothing else; ``--backend fake`` also
uses tests/fake_pynvml.py for the floor.
"""

from __future__ import annotations

import argparse
import http.client
import math
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_nvml_calls import Call, recorded_groups, replay
from daemon_proc import VARIANTS, daemon, get, pct, process_cpu_seconds

from gpumon.backends.base import NvmlUnavailableError
from gpumon.backends.nvml import NvmlBackend
from gpumon.backends.nvml.reader import ReaderSpec
from gpumon.backends.nvml.registry import collect_readers
from gpumon.config.file import Config
from gpumon.model.snapshot import Tier

ORDER = (Tier.STATIC, Tier.SLOW, Tier.FAST)
"""The order the poller reads a GPU's tiers in."""


class FloorPlan:
    """Which reader groups of which GPU a poll at second ``t`` makes, as gpumon run makes them:
    the poller's plan of tiers (gpumon.collect.poll_plan.plan_tiers) and the backend's spacing of readers."""

    def __init__(self, count: int, readers: dict[Tier, tuple[ReaderSpec, ...]], intervals: dict[Tier, float]) -> None:
        self.count = count
        self.readers = readers
        self.intervals = intervals
        self.tier_read: list[dict[Tier, float]] = [{} for _ in range(count)]
        self.reader_ran: list[dict[str, float]] = [{} for _ in range(count)]

    def poll(self, t: float) -> list[tuple[int, str]]:
        """(GPU, reader group) of the poll at ``t``, in the daemon's order."""
        plan: list[list[Tier]] = [[] for _ in range(self.count)]
        for tier in (Tier.STATIC, Tier.SLOW):
            interval = self.intervals[tier]
            budget = max(1, math.ceil(self.count * self.intervals[Tier.FAST] / interval))
            waiting = []
            for i in range(self.count):
                last = self.tier_read[i].get(tier)
                if last is None:
                    plan[i].append(tier)
                elif t - last >= interval - 1e-3:
                    waiting.append((last, i))
            for _last, i in sorted(waiting)[:budget]:
                plan[i].append(tier)
        out = []
        for i, tiers in enumerate(plan):
            tiers.append(Tier.FAST)
            for tier in ORDER:
                if tier not in tiers:
                    continue
                self.tier_read[i][tier] = t
                for spec in self.readers[tier]:
                    ran = self.reader_ran[i].get(spec.name)
                    if spec.every_seconds and ran is not None and t - ran < spec.every_seconds:
                        continue  # the daemon's backend gives the fields of its last run
                    self.reader_ran[i][spec.name] = t
                    out.append((i, spec.name))
        return out


def run_floor(
    plan: FloorPlan, calls: dict[int, dict[str, list[Call]]], first: int, seconds: int, fast: float
) -> tuple[float, dict[str, float], int]:
    """Replay the polls ``first`` .. ``first + seconds - 1`` (one every ``fast`` seconds of wall time;
    the polls before ``first`` only advance the plan): (CPU seconds of this thread, CPU seconds by
    reader group, NVML calls made)."""
    for t in range(first):
        plan.poll(t * fast)
    by_reader: dict[str, float] = {}
    made = 0
    start_wall, start_cpu = time.monotonic(), time.thread_time()
    for n in range(seconds):
        delay = start_wall + n * fast - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        for i, name in plan.poll((first + n) * fast):
            group = calls[i][name]
            c0 = time.thread_time()
            replay(group)
            by_reader[name] = by_reader.get(name, 0.0) + time.thread_time() - c0
            made += len(group)
    return time.thread_time() - start_cpu, by_reader, made


def nvml_module(backend: str, fake_gpus: int) -> Any:
    if backend == "fake":
        from tests.fake_pynvml import FakeGpu, FakeNvml

        return FakeNvml([FakeGpu(index=i) for i in range(fake_gpus)])
    import pynvml

    return pynvml


def measure_daemon(args: argparse.Namespace, tree: Path | None = None) -> dict[str, Any]:
    """The daemon's CPU over the window, and where its first poll was (seconds before the window);
    ``tree``: another gpumon checkout to run (default this one)."""
    result: dict[str, Any] = {}
    with daemon(args.fake_gpus, backend=args.backend, tree=tree) as (proc, port):
        ps = psutil.Process(proc.pid)
        time.sleep(args.warmup)
        text = get(port, "/metrics")[1].decode()
        first_poll = _value(text, 'gpumon_last_poll_timestamp_seconds{tier="static"}')
        gpus = int(_value(text, "gpumon_gpus") or 0)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        latencies, rss = [], []
        cpu0, wall0, now0 = process_cpu_seconds(ps.pid), time.monotonic(), time.time()
        ticks0 = ps.cpu_times()
        next_scrape = wall0
        while time.monotonic() - wall0 < args.seconds:
            if time.monotonic() >= next_scrape:
                t0 = time.perf_counter()
                get(port, "/metrics", VARIANTS["openmetrics+gzip"], conn)
                latencies.append(time.perf_counter() - t0)
                next_scrape += args.scrape_interval
            rss.append(ps.memory_info().rss)
            time.sleep(min(0.5, max(0.0, next_scrape - time.monotonic())))
        cpu1, wall1, ticks1 = process_cpu_seconds(ps.pid), time.monotonic(), ps.cpu_times()
        conn.close()
        scraped = get(port, "/metrics")[1].decode()
        series = [line for line in scraped.splitlines() if line and not line.startswith("#")]
        result.update(
            cpu_seconds=cpu1 - cpu0,
            # user + system in clock ticks: coarse, but it counts threads that ended within the window,
            # which the schedstat sum of the live threads leaves out (a thread started per call)
            tick_seconds=(ticks1.user + ticks1.system) - (ticks0.user + ticks0.system),
            wall_seconds=wall1 - wall0,
            first=max(0, round(now0 - first_poll)) if first_poll else args.warmup,
            gpus=gpus,
            series=len(series),
            rss=max(rss),
            latencies=latencies,
        )
    return result


def footprint(d: dict[str, Any], count: int) -> str:
    """Series (per GPU), the scrapes' latency and the largest RSS of one measured daemon."""
    gpus = d["gpus"] or count
    lat = d["latencies"]
    scrapes = (
        f"scrapes (OpenMetrics, gzip) {len(lat)}, p50 {statistics.median(lat) * 1e3:.2f} ms, "
        f"p99 {pct(lat, 0.99) * 1e3:.2f} ms; "
        if lat
        else ""
    )
    ticks = 100 * d["tick_seconds"] / d["wall_seconds"]
    return (
        f"series {d['series']} ({d['series'] / gpus:.1f} per GPU); {scrapes}RSS max {d['rss'] / 2**20:.1f} MiB; "
        f"user+system ticks {ticks:.3f} % of one core (threads that ended in the window included)"
    )


def _value(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def measure_floor(args: argparse.Namespace, first: int) -> dict[str, Any]:
    nv = nvml_module(args.backend, args.fake_gpus)
    probe = NvmlBackend(nv)
    try:
        probe.init()
    except NvmlUnavailableError as exc:
        raise SystemExit(f"cannot measure the floor: {exc}") from exc
    count, host = probe.device_count(), probe.host()
    name = probe.read(0, Tier.STATIC).get("name") if count else None
    probe.shutdown()
    config = Config()
    intervals = {
        Tier.FAST: config.interval_seconds,
        Tier.SLOW: config.slow_interval_seconds,
        Tier.STATIC: config.static_interval_seconds,
    }
    with recorded_groups(nv, count) as calls:
        plan = FloorPlan(count, collect_readers(), intervals)
        done: dict[str, Any] = {}

        def work() -> None:
            done["cpu"], done["by_reader"], done["calls"] = run_floor(
                plan, calls, first, int(args.seconds), intervals[Tier.FAST]
            )

        thread = threading.Thread(target=work, name="floor")
        t0 = time.monotonic()
        thread.start()
        thread.join()
        done["wall"] = time.monotonic() - t0
    done.update(count=count, host=host, name=name)
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="nvml", choices=("nvml", "fake"))
    parser.add_argument("--fake-gpus", type=int, default=2, help="GPUs of --backend fake (default 2)")
    parser.add_argument("--seconds", type=float, default=60, help="each window, seconds (default 60)")
    parser.add_argument("--scrape-interval", type=float, default=15, help="seconds between scrapes (default 15)")
    parser.add_argument("--warmup", type=float, default=5, help="seconds from ready to the window (default 5)")
    parser.add_argument("--quick", action="store_true", help="--backend fake, 2 GPUs, 3 s windows (checks it runs)")
    parser.add_argument(
        "--before", type=Path, help="another gpumon checkout (e.g. `git worktree add /tmp/old REV`): its daemon too"
    )
    args = parser.parse_args()
    if args.quick:
        args.backend, args.fake_gpus, args.seconds, args.scrape_interval, args.warmup = "fake", 2, 3, 1, 1

    before = measure_daemon(args, args.before) if args.before else None
    d = measure_daemon(args)
    f = measure_floor(args, d["first"])
    count = f["count"] or 1
    daemon_pct = 100 * d["cpu_seconds"] / d["wall_seconds"]
    floor_pct = 100 * f["cpu"] / args.seconds
    host = f["host"]
    print(
        f"# {f['count']} GPU(s) {f['name'] or ''}, driver {host.driver_version}, backend {args.backend}, "
        f"python {sys.version.split()[0]}"
    )
    print(
        f"# windows of {args.seconds:g} s, default settings, a scrape every {args.scrape_interval:g} s; "
        f"the daemon's window starts {d['first']} s after its first poll, the floor's schedule too"
    )
    print(f"{'what':<52}{'% of one core':>14}{'% per GPU':>11}")
    print(f"{'floor: bare pynvml, same calls, same cadence':<52}{floor_pct:>14.3f}{floor_pct / count:>11.3f}")
    if before is not None:
        before_pct = 100 * before["cpu_seconds"] / before["wall_seconds"]
        label = f"gpumon run of {args.before} (before)"
        print(f"{label[:51]:<52}{before_pct:>14.3f}{before_pct / count:>11.3f}")
        print(f"ratio before / floor: {before_pct / floor_pct if floor_pct > 0 else float('inf'):.2f}")
        print(f"before: {footprint(before, count)}")
    print(f"{'gpumon run (every thread, scrapes included)':<52}{daemon_pct:>14.3f}{daemon_pct / count:>11.3f}")
    ratio = daemon_pct / floor_pct if floor_pct > 0 else float("inf")
    print(f"ratio gpumon run / floor: {ratio:.2f} (goal <= {1.5 if args.scrape_interval >= 15 else 2.0})")
    print(f"floor NVML calls in the window: {f['calls']} ({f['calls'] / args.seconds:.0f} a second)")
    print("floor by reader group (CPU in the window; what NVML costs on this host):")
    for name, cpu in sorted(f["by_reader"].items(), key=lambda kv: -kv[1]):
        print(f"  {name:<22}{cpu * 1e3:>10.2f} ms  {100 * cpu / args.seconds / count:>8.4f} % per GPU")
    print(f"gpumon run: {footprint(d, count)} (series budget <= 60 per GPU on an 8-GPU NVLink host)")
    print("target at 8 GPUs: <= 0.5 % of one core (<= 0.0625 % per GPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
