"""Where a running daemon's CPU goes, thread by thread: ``Daemon`` in this process on simulated GPUs.

    python benchmarks/bench_daemon_threads.py [--gpus 8] [--seconds 60] [--scrape-interval 15] [--warmup 5] [--parts]

Runs gpumon's ``Daemon`` (default settings, ``FakeBackend.plausible(N)``, a scratch state directory, a
free port) started as ``gpumon run`` starts it, scrapes ``/metrics`` as Prometheus 2.42 does every
``--scrape-interval`` seconds from a thread of its own (left out of the figures), and prints each of
the daemon's threads, by name, with its share of one core over ``--seconds`` (schedstat run time;
a thread that ended within the window is left out). For another checkout, put its tree first on
PYTHONPATH (``PYTHONPATH=/tmp/before:. python benchmarks/bench_daemon_threads.py``).

``--parts`` also times the parts of a poll as the running daemon pays them (caches gone cold in the
second between polls, unlike bench_poll_parts.py's back-to-back polls): the backend's reads, the
poller's merge, each store listener, APScheduler's wake, the alert tick (and the health findings it
asks for), the health report, the health series' asks (built or reused), the health engines'
catch-up, the spool's writes and a scrape's body (made on a worker thread, or kept bytes on the event
loop), as calls in the window and µs of thread CPU a call (mean and median). The wrappers add about a
µs a call.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import http.client
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from daemon_proc import VARIANTS, free_port, thread_cpu_seconds

from gpumon.backends.factory import make_backend
from gpumon.backends.fake import FakeBackend
from gpumon.config.file import Config
from gpumon.daemon import Daemon
from gpumon.health.health_series import HealthCollector


class Parts:
    """Thread CPU seconds of each call of wrapped functions, counted while ``open``."""

    def __init__(self) -> None:
        self.open = False
        self.spent: dict[str, list[float]] = {}
        """Each part's calls' thread CPU seconds."""
        self._gc_start = 0.0

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.open:
                    self.spent.setdefault(name, []).append(time.thread_time() - start)

        return run

    def instrument(self, daemon: Daemon) -> None:
        """Wrap the parts of a poll and the other threads' work."""
        backend, poller = daemon.backend, daemon.poller
        backend.read = self.timed("poll: backend reads, a read", backend.read)  # type: ignore[method-assign]
        poller._merge = self.timed("poll: merge, a GPU", poller._merge)
        daemon.poll_job._poll = self.timed("poll, whole (listeners included)", daemon.poll_job._poll)
        daemon.store._listeners = tuple(
            (self.timed(f"poll: listener {getattr(fn, '__qualname__', repr(fn))}", fn), what)
            for fn, what in daemon.store._listeners
        )
        scheduler = daemon.poll_job.scheduler
        scheduler._process_jobs = self.timed("APScheduler: _process_jobs", scheduler._process_jobs)  # type: ignore[method-assign]
        alerts = daemon.alerts
        alerts.tick = self.timed("alert tick", alerts.tick)  # type: ignore[method-assign]
        health = daemon.health  # its report: the alert tick's finding rules and each scrape's health series
        health.current_report = self.timed("health report (current_report)", health.current_report)  # type: ignore[method-assign]
        collector = daemon.collector  # a scrape's body: on a worker thread (body) or the event loop (ready_body)
        collector.body = self.timed("scrape: GpumonCollector.body (worker)", collector.body)  # type: ignore[method-assign]
        collector.ready_body = self.timed("scrape: GpumonCollector.ready_body (loop)", collector.ready_body)  # type: ignore[method-assign]
        detectors = health.detectors  # the engines observe the snapshots taken when next asked (frozen: set past it)
        object.__setattr__(
            detectors,
            "catch_up",
            self.timed("health engines catch up (observe the snapshots taken)", detectors.catch_up),
        )
        alerts._read_findings = self.timed("alert tick: its health findings", alerts._read_findings)  # type: ignore[method-assign]
        if hasattr(health, "findings_of"):  # the tick's finding kinds only (round 7 on; before, it took the report)
            health.findings_of = self.timed("health findings of the tick's kinds (findings_of)", health.findings_of)
        self._health_series(health)
        writer = alerts._spool_writer
        writer.write = self.timed("alert spool write", writer.write)  # type: ignore[method-assign]
        gc.callbacks.append(self._on_gc)

    def _health_series(self, health: Any) -> None:
        """Each ask of the health series (``HealthCollector.families``, on its budget thread: the poll's
        render-ahead and the scrapes), by whether it built the report or handed out the kept one."""
        built = [0]
        report = health.report

        def counted(*args: Any, **kwargs: Any) -> Any:
            built[0] += 1
            return report(*args, **kwargs)

        health.report = counted
        families = HealthCollector.families

        def ask(collector: HealthCollector) -> list[Any]:
            before, start = built[0], time.thread_time()
            out = list(families(collector))
            if self.open:
                how = "built the report" if built[0] != before else "reused the kept report"
                self.spent.setdefault(f"health series: an ask that {how}", []).append(time.thread_time() - start)
            return out

        HealthCollector.families = ask  # type: ignore[assignment,method-assign]  # this process only

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        """Time the cyclic garbage collector's passes, by generation, on whichever thread ran them."""
        if phase == "start":
            self._gc_start = time.thread_time()
        elif self.open:
            self.spent.setdefault(f"gc: generation {info['generation']}", []).append(
                time.thread_time() - self._gc_start
            )

    def report(self, elapsed: float) -> None:
        """Each part: calls, mean and median µs a call (the median: steadier where a GC pass or a neighbour's
        burst lands in a few of a rare part's calls), share of one core."""
        print(f"{'part':<60}{'calls':>7}{'µs a call':>11}{'median':>8}{'% of one core':>15}")
        for name, calls in sorted(self.spent.items()):
            seconds = sum(calls)
            mean, median = seconds / len(calls) * 1e6, statistics.median(calls) * 1e6
            print(f"{name[:59]:<60}{len(calls):>7}{mean:>11.0f}{median:>8.0f}{100 * seconds / elapsed:>15.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="fake", choices=("fake", "nvml"), help="nvml: this host's GPUs")
    parser.add_argument("--gpus", type=int, default=8, help="simulated GPUs (--backend fake)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--scrape-interval", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--parts", action="store_true", help="time the parts of a poll and of the other threads")
    parser.add_argument("--quick", action="store_true", help="2 GPUs, 2 s (checks the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.gpus, args.seconds, args.scrape_interval, args.warmup = 2, 2.0, 1.0, 1.0
    port = free_port()
    parts = Parts()
    with tempfile.TemporaryDirectory() as state:
        config = Config(listen=f"127.0.0.1:{port}", state_dir=Path(state), backend=args.backend, fake_gpus=args.gpus)
        backend = FakeBackend.plausible(args.gpus) if args.backend == "fake" else make_backend("nvml", daemon=True)
        daemon = Daemon(config, backend)
        daemon._install_signals = lambda: None  # type: ignore[method-assign]  # not the main thread here
        if args.parts:
            parts.instrument(daemon)
        runner = threading.Thread(target=daemon.run_forever, name="main (run_forever)", daemon=True)
        runner.start()
        stop = threading.Event()
        scraper_ids: set[int] = set()

        def scrape() -> None:
            scraper_ids.add(threading.get_native_id())
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            while not stop.is_set():
                with contextlib.suppress(OSError, http.client.HTTPException):
                    conn.request("GET", "/metrics", headers=VARIANTS["openmetrics+gzip"])
                    conn.getresponse().read()
                stop.wait(args.scrape_interval)

        time.sleep(args.warmup)
        pid = os.getpid()
        before = thread_cpu_seconds(pid)
        began = time.monotonic()
        parts.open = True
        threading.Thread(target=scrape, name="scraper", daemon=True).start()
        time.sleep(args.seconds)
        parts.open = False
        after = thread_cpu_seconds(pid)
        elapsed = time.monotonic() - began
        names = {t.native_id: t.name for t in threading.enumerate()}
        stop.set()
        daemon.request_stop()
        runner.join(5)
    me = threading.get_native_id()
    rows = sorted(
        (
            (100.0 * (cpu - before.get(tid, 0.0)) / elapsed, names.get(tid, f"thread {tid}"))
            for tid, cpu in after.items()
            if tid not in scraper_ids and tid != me
        ),
        reverse=True,
    )
    what = f"{args.gpus} simulated GPUs" if args.backend == "fake" else "this host's GPUs (NVML)"
    print(
        f"## gpumon Daemon in process, {what}, a scrape every {args.scrape_interval:g} s, "
        f"{elapsed:.0f} s; % of one core"
    )
    for share, name in rows:
        print(f"{name:<40}{share:>8.3f}")
    print(f"{'every thread of the daemon':<40}{sum(s for s, _ in rows):>8.3f}")
    if args.parts:
        parts.report(elapsed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
