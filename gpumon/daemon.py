"""The one place that builds and wires gpumon's parts, runs them and shuts them down.

Order of construction: backend -> store -> poller -> exporter (collector, server)
-> scheduler (the only caller of the backend's read) -> event thread. Shutdown goes
in reverse. SIGTERM/SIGINT stop within 2 s even while an NVML call hangs (the
polling and event threads are daemon threads); SIGHUP reloads the configuration and
keeps the old one when the new one is invalid.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from types import FrameType

from apscheduler.executors.debug import DebugExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from gpumon.backends.base import GpuBackend
from gpumon.config import Config, ConfigError
from gpumon.exporter.collector import GpumonCollector, SelfStats
from gpumon.exporter.server import MetricsServer, json_response
from gpumon.poller import Poller, PollIntervals
from gpumon.snapshot import to_jsonable
from gpumon.store import SnapshotStore

log = logging.getLogger("gpumon")


def intervals_of(config: Config) -> PollIntervals:
    return PollIntervals(
        fast_seconds=config.interval_seconds,
        slow_seconds=config.slow_interval_seconds,
        static_seconds=config.static_interval_seconds,
    )


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    logging.getLogger("apscheduler").setLevel(logging.WARNING if level != "debug" else logging.INFO)


class Daemon:
    """gpumon run: everything wired, started, stopped."""

    def __init__(
        self,
        config: Config,
        backend: GpuBackend,
        reload_config: Callable[[], Config] | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._reload_config = reload_config
        self._mono = monotonic
        self._stop = threading.Event()
        self._reload = threading.Event()
        self.backend = backend
        self.store = SnapshotStore()
        self.poller = Poller(backend, self.store, intervals_of(config), monotonic=monotonic)
        self.collector = GpumonCollector(
            self.store,
            intervals_of(config),
            monotonic=monotonic,
            self_stats=lambda: SelfStats(poll_skipped_total=self.poller.skipped_polls_total),
            processes=config.exporter.processes,
        )
        self.server = MetricsServer(
            config.listen_address(),
            self.collector.render,
            self.store,
            stale_after_seconds=config.stale_after,
            monotonic=monotonic,
        )
        self.server.add_route("/api/snapshot", self._snapshot_route)
        self.scheduler = BackgroundScheduler(
            executors={"default": DebugExecutor()},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            daemon=True,
        )

    # ------------------------------------------------------------------
    def start(self) -> None:
        self.server.start()
        self.scheduler.add_job(
            self.poller.poll,
            "interval",
            seconds=self.config.interval_seconds,
            id="poll",
            next_run_time=_now(),
        )
        self.scheduler.start()
        log.info(
            "gpumon listening on %s:%d (backend %s, every %gs)",
            self.config.listen_address()[0],
            self.server.port,
            self.config.backend,
            self.config.interval_seconds,
        )

    def stop(self) -> None:
        log.info("gpumon stopping")
        stuck = self.poller.poll_running
        if stuck:
            # BackgroundScheduler.shutdown joins its thread, which is inside the hung call:
            # leave it (a daemon thread) and do not touch NVML from here.
            log.warning("a poll is stuck inside the backend; exiting without waiting for it")
        else:
            self.scheduler.shutdown(wait=False)
        self.server.stop()
        if not stuck:
            try:
                self.backend.shutdown()
            except Exception:
                log.debug("backend shutdown failed", exc_info=True)

    def request_stop(self) -> None:
        self._stop.set()

    def request_reload(self) -> None:
        self._reload.set()
        self._stop.set()

    def run_forever(self) -> int:
        """Serve until SIGTERM/SIGINT; reload on SIGHUP. Returns the exit code."""
        self._install_signals()
        self.start()
        try:
            while True:
                self._stop.wait(1.0)
                if self._reload.is_set():
                    self._reload.clear()
                    self._stop.clear()
                    self.reload()
                    continue
                if self._stop.is_set():
                    break
        finally:
            self.stop()
        return 0

    def reload(self) -> None:
        """Re-read the configuration; apply what can change live, keep the old one on errors."""
        if self._reload_config is None:
            return
        try:
            new = self._reload_config()
        except ConfigError as exc:
            log.error("reload rejected, keeping the running configuration:\n  %s", "\n  ".join(exc.problems))
            return
        old = self.config
        for key in ("listen", "backend", "fake_gpus", "state_dir"):
            if getattr(new, key) != getattr(old, key):
                log.warning("%s changed in the configuration; it takes effect after a restart", key)
        new = dataclasses.replace(
            new, listen=old.listen, backend=old.backend, fake_gpus=old.fake_gpus, state_dir=old.state_dir
        )
        configure_logging(new.log_level)
        if new.interval_seconds != old.interval_seconds:
            self.scheduler.reschedule_job("poll", trigger="interval", seconds=new.interval_seconds)
        self.poller.set_intervals(intervals_of(new))
        self.collector.set_options(intervals_of(new), processes=new.exporter.processes)
        self.server.set_stale_after(new.stale_after)
        self.config = new
        log.info("configuration reloaded from %s", new.source or "defaults")

    # ------------------------------------------------------------------
    def _snapshot_route(self) -> tuple[int, str, bytes]:
        snapshot = self.store.latest()
        if snapshot is None:
            return json_response({"error": "no snapshot yet"}, 503)
        data = to_jsonable(snapshot)
        data["age_seconds"] = self._mono() - snapshot.monotonic_seconds
        return json_response(data)

    def _install_signals(self) -> None:
        def on_term(signum: int, frame: FrameType | None) -> None:
            self.request_stop()

        def on_hup(signum: int, frame: FrameType | None) -> None:
            self.request_reload()

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
        signal.signal(signal.SIGHUP, on_hup)


def _now():  # type: ignore[no-untyped-def]
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def hostname() -> str:
    return socket.gethostname()
