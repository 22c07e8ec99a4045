"""The daemon's CPU, memory and threads against the number of (simulated) GPUs.

For each GPU count (default 8, 64, 256) a ``gpumon run --backend fake --fake-gpus N`` runs with
the default intervals and is scraped once a second (plain text, keep-alive; ``--scrape-every 15``
scrapes as Prometheus usually does) for ``--seconds`` (default 60). Printed per count: % of one core, CPU per GPU, RSS, threads. The reference
measured in the same run is the cost of the scrapes alone: the same daemon's CPU is split into
what the scrapes' render takes (timed in process over the same families) and the rest.
The simulation's own cost is timed apart: ``FakeBackend.read`` of every GPU in process (fast tier
every second, slow every 10 s, static every 300 s, as the default intervals read them); "less
sim" is the daemon's share without it (a real host pays NVML calls there instead: 142 µs a fast
poll of 2 H200s).
With ``--profile`` the daemon runs under benchmarks/sampling_profiler.py (which costs about
1 % of a core itself) and its busiest functions are printed.

    python benchmarks/bench_daemon_cpu.py [--gpus 8,64,256] [--seconds 60] [--scrape-every 1] [--profile] [--quick]
"""

from __future__ import annotations

import argparse
import http.client
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_proc import daemon, process_cpu_seconds


def measure(gpus: int, seconds: float, profile_to: Path | None, scrape_every: float = 1.0) -> tuple[float, float, int]:
    """(share of one core, max RSS bytes, threads) of a daemon scraped every ``scrape_every`` seconds."""
    prefix = [str(Path(__file__).resolve().parent / "sampling_profiler.py"), str(profile_to)] if profile_to else None
    with daemon(gpus, prefix=prefix) as (proc, port):
        ps = psutil.Process(proc.pid)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        time.sleep(3)  # past start-up (static tier, first slow read, imports)
        cpu0, t0 = process_cpu_seconds(proc.pid), time.monotonic()
        rss, threads = 0, 0
        next_at = t0
        while (now := time.monotonic()) - t0 < seconds:
            if now < next_at:
                time.sleep(next_at - now)
            next_at += scrape_every
            conn.request("GET", "/metrics")
            conn.getresponse().read()
            rss = max(rss, ps.memory_info().rss)
            threads = max(threads, ps.num_threads())
        cpu1, elapsed = process_cpu_seconds(proc.pid), time.monotonic() - t0
        conn.close()
    share = (cpu1 - cpu0) / elapsed
    return share, rss, threads


def simulation_share(gpus: int, rounds: int = 50) -> float:
    """Share of one core the fake backend's own reads take at the default intervals (in process)."""
    from gpumon.backends.fake import FakeBackend
    from gpumon.model.snapshot import Tier

    backend = FakeBackend.plausible(gpus)
    backend.init()
    per_tier = {}
    for tier in (Tier.FAST, Tier.SLOW, Tier.STATIC):
        t0 = time.thread_time()
        for _ in range(rounds):
            for i in range(gpus):
                backend.read(i, tier)
            time.sleep(0.002)  # values move with the clock, as between polls
        per_tier[tier] = (time.thread_time() - t0) / rounds
    return per_tier[Tier.FAST] / 1.0 + per_tier[Tier.SLOW] / 10.0 + per_tier[Tier.STATIC] / 300.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", default="8,64,256", help="comma-separated GPU counts")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--scrape-every", type=float, default=1.0, help="seconds between scrapes (Prometheus: often 15)"
    )
    parser.add_argument("--profile", action="store_true", help="run each daemon under the sampling profiler")
    parser.add_argument("--top", type=int, default=15, help="profile lines shown per GPU count")
    parser.add_argument("--quick", action="store_true", help="8 GPUs for 1 s (checks the script runs)")
    args = parser.parse_args()
    counts = [int(c) for c in args.gpus.split(",")]
    if args.quick:
        counts, args.seconds = [8], 1.0
    rows = []
    profiles = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            out = Path(tmp) / f"profile-{n}.txt" if args.profile else None
            rows.append((n, *measure(n, args.seconds, out, args.scrape_every), simulation_share(n)))
            if out is not None and out.exists():
                profiles[n] = out.read_text()
    every = "a second" if args.scrape_every == 1 else f"every {args.scrape_every:g} s"
    print(f"## gpumon run --backend fake, default intervals, one /metrics scrape {every}, {args.seconds:g} s")
    print(
        f"{'GPUs':>6}{'% core':>9}{'% core/GPU':>12}{'sim %':>8}{'less sim':>10}{'/GPU':>8}{'RSS MiB':>9}{'threads':>9}"
    )
    for n, share, rss, threads, sim in rows:
        less = share - sim
        print(
            f"{n:>6}{share * 100:>9.2f}{share * 100 / n:>12.4f}{sim * 100:>8.2f}{less * 100:>10.2f}"
            f"{less * 100 / n:>8.4f}{rss / 2**20:>9.1f}{threads:>9}"
        )
    base_n, base_share = rows[0][0], rows[0][1]
    for n, share, *_ in rows[1:]:
        print(f"growth {base_n} -> {n} GPUs: {share / base_share:.2f}x CPU for {n / base_n:g}x GPUs")
    print(
        "goal for 8 GPUs, scraped once a second: <= 0.5 % of a core, RSS <= 60 MB (simulated GPUs add the simulation)"
    )
    for n, text in profiles.items():
        print(f"## sampling profile, {n} GPUs")
        lines = text.splitlines()
        head = lines[:1]
        own = lines[lines.index("## self") + 1 : lines.index("## self") + 1 + args.top]
        total_at = lines.index("## total")
        total = lines[total_at + 1 : total_at + 1 + args.top]
        print("\n".join([*head, "self:", *own, "total (on the stack):", *total]))


if __name__ == "__main__":
    main()
