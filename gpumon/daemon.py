"""The one place that builds and wires gpumon's parts, runs them and shuts them down.

Order of construction: XID catalog and tracker -> store -> poller -> alert service ->
exporter (collector with the alerts, burn-results and DCGM collectors; HTTP server with
the web config) -> scheduler (the only caller of the backend's read) -> XID event thread
and kernel-log follower -> systemd notifications. Shutdown goes in reverse. SIGTERM/SIGINT stop within 2 s even while an NVML call hangs (the
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
from datetime import datetime, timezone
from types import FrameType

from apscheduler.executors.debug import DebugExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from gpumon.alerts import config as alerts_config
from gpumon.alerts.service import AlertService
from gpumon.backends.base import GpuBackend
from gpumon.burn.results_collector import BurnResultsCollector
from gpumon.config import Config, ConfigError
from gpumon.events.catalog import XidCatalog
from gpumon.events.kernel_follow import KernelLogFollower
from gpumon.events.model import XidEvent
from gpumon.events.tracker import XidTracker
from gpumon.events.xid_thread import XidEventThread
from gpumon.exporter.collector import GpumonCollector, SelfStats
from gpumon.exporter.dcgm import DcgmCompatCollector
from gpumon.exporter.read_errors import ReadErrorsCollector
from gpumon.exporter.server import MetricsServer, json_response
from gpumon.exporter.webconfig import WebConfigWatcher
from gpumon.findings.service import HealthService
from gpumon.poller import Poller, PollIntervals
from gpumon.processes import ProcessEnricher
from gpumon.snapshot import to_jsonable
from gpumon.store import SnapshotStore
from gpumon.systemd_notify import SystemdNotifier

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
        wall_clock: Callable[[], float] = time.time,
        notifier: SystemdNotifier | None = None,
    ) -> None:
        """Build every part; raises OSError when the port cannot be bound and
        gpumon.exporter.webconfig.WebConfigError for an unusable web config."""
        self.config = config
        self._reload_config = reload_config
        self._mono = monotonic
        self._stop = threading.Event()
        self._reload = threading.Event()
        self.notifier = notifier or SystemdNotifier()
        self.backend = backend
        self.catalog = XidCatalog.load(config.xid_catalog)
        self.tracker = XidTracker(live_since_seconds=wall_clock())
        self.store = SnapshotStore()
        self.store.subscribe(self.tracker.set_gpus_from_snapshot)
        self.poller = Poller(
            backend,
            self.store,
            intervals_of(config),
            monotonic=monotonic,
            wall_clock=wall_clock,
            enrich_processes=ProcessEnricher().enrich,
            xid_counts=self.tracker.for_gpu,
        )
        alerting = config.alerting if config.alerting is not None else default_alerting()
        self.alerts = AlertService(
            alerting,
            config.state_dir,
            alerting.host or hostname(),
            clock=wall_clock,
            xid_action=lambda code: self.catalog.lookup(code).action,
        )
        self.store.subscribe(self.alerts.on_snapshot)
        self.tracker.subscribe(self.alerts.on_xid)
        self.health = HealthService(
            config.state_dir,
            self.catalog,
            config.health,
            clock=wall_clock,
            monotonic=monotonic,
            simulated=backend.name == "fake",
        )
        self.store.subscribe(self.health.on_snapshot)
        self.tracker.subscribe(self.health.on_xid)
        self.collector = GpumonCollector(
            self.store,
            intervals_of(config),
            monotonic=monotonic,
            self_stats=lambda: SelfStats(poll_skipped_total=self.poller.skipped_polls_total),
            processes=config.exporter.processes,
        )
        self.collector.add("alerts", self.alerts.collector())
        self.collector.add("burn", BurnResultsCollector(config.state_dir))
        read_errors = getattr(backend, "read_errors", None)
        if callable(read_errors):  # per GPU and reader: a field's error, not a lost GPU
            self.collector.add("read_errors", ReadErrorsCollector(read_errors))
        self.collector.add("health", self.health.collector())
        if "dcgm" in config.exporter.compat:
            self.collector.add("dcgm", DcgmCompatCollector(self.store, hostname(), self.catalog))
        self.web = WebConfigWatcher(config.web_config_file) if config.web_config_file else None
        web = self.web
        self.server = MetricsServer(
            config.listen_address(),
            self.collector.render,
            self.store,
            stale_after_seconds=config.stale_after,
            monotonic=monotonic,
            web_config=web,
            collect=self.collector.collect,
        )
        self.server.add_route("/api/snapshot", self._snapshot_route)
        self.server.add_route("/api/health", lambda: json_response(self.health.report().to_json()))
        for path, route in self.alerts.routes().items():
            self.server.add_route(path, route)
        self.scheduler = BackgroundScheduler(
            executors={"default": DebugExecutor()},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
            daemon=True,
        )
        self.events = XidEventThread(backend, self.tracker.record, ready=lambda: self.poller.nvml_up)
        self.kernel_log: KernelLogFollower | None = None

    # ------------------------------------------------------------------
    def start(self) -> None:
        self.alerts.start()
        self.server.start()
        self.scheduler.add_job(
            self.poller.poll,
            "interval",
            seconds=self.config.interval_seconds,
            id="poll",
            next_run_time=_now(),
        )
        self.scheduler.start()
        self.events.start()
        if self.config.kernel_log and self.backend.name != "fake":  # the host's log is not the simulated GPUs'
            self._start_kernel_log()
        log.info(
            "gpumon listening on %s:%d (backend %s, every %gs)",
            self.config.listen_address()[0],
            self.server.port,
            self.config.backend,
            self.config.interval_seconds,
        )

    def stop(self) -> None:
        log.info("gpumon stopping")
        self.notifier.stopping()
        self.events.request_stop()  # its NVML wait ends within 0.5 s, while the rest stops
        if self.kernel_log is not None:
            self.kernel_log.request_stop()  # its read ends within 0.25 s
        deadline = self._mono() + 0.5  # a normal poll ends within milliseconds; a hung one never does
        while self.poller.poll_running and self._mono() < deadline:
            time.sleep(0.01)
        stuck = self.poller.poll_running
        if stuck:
            # BackgroundScheduler.shutdown joins its thread, which is inside the hung call:
            # leave it (a daemon thread) and do not touch NVML from here.
            log.warning("a poll is stuck inside the backend; exiting without waiting for it")
        else:
            self.scheduler.shutdown(wait=False)
        self.server.stop()
        self.events.stop(timeout=0.5)
        if self.kernel_log is not None:
            self.kernel_log.stop(timeout=0.5)
        self.alerts.stop(timeout=0.5)
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
        ping = self.notifier.watchdog_ping_period_seconds() or 1.0
        ready_sent = False
        try:
            while True:
                self._stop.wait(min(1.0, ping))
                # The watchdog proves the main loop lives; a GPU hung in NVML is reported
                # through metrics and /ready, since restarting gpumon would not free it.
                self.notifier.watchdog()
                if not ready_sent and self.store.latest() is not None:
                    self.notifier.ready(self._status())
                    ready_sent = True
                if self._reload.is_set():
                    self._reload.clear()
                    self._stop.clear()
                    self.notifier.reloading("reloading configuration")
                    self.reload()
                    self.notifier.ready(self._status())
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
        for key in ("listen", "backend", "fake_gpus", "state_dir", "web_config_file", "kernel_log"):
            if getattr(new, key) != getattr(old, key):
                log.warning("%s changed in the configuration; it takes effect after a restart", key)
        if new.exporter.compat != old.exporter.compat:
            log.warning("exporter.compat changed in the configuration; it takes effect after a restart")
        if new.health != old.health:
            log.warning("health changed in the configuration; it takes effect after a restart")
        new = dataclasses.replace(
            new,
            listen=old.listen,
            backend=old.backend,
            fake_gpus=old.fake_gpus,
            state_dir=old.state_dir,
            web_config_file=old.web_config_file,
            kernel_log=old.kernel_log,
            exporter=dataclasses.replace(new.exporter, compat=old.exporter.compat),
            health=old.health,
        )
        configure_logging(new.log_level)
        if new.interval_seconds != old.interval_seconds:
            self.scheduler.reschedule_job("poll", trigger="interval", seconds=new.interval_seconds)
        self.poller.set_intervals(intervals_of(new))
        self.collector.set_options(intervals_of(new), processes=new.exporter.processes)
        self.server.set_stale_after(new.stale_after)
        if self.web is not None:
            self.web.reload()
        if new.alerting is not None:
            self.alerts.reload(new.alerting)
        if new.xid_catalog != old.xid_catalog:
            self.catalog = XidCatalog.load(new.xid_catalog)
        self.config = new
        log.info("configuration reloaded from %s", new.source or "defaults")

    # ------------------------------------------------------------------
    def _start_kernel_log(self) -> None:
        """Follow the kernel log for XIDs: those since boot (so a restarted daemon still knows), then
        every new one for as long as the daemon runs (the only XID source while NVML events are not)."""

        def backfill(events: list[XidEvent]) -> None:
            counted = self.tracker.record_all(events)
            if counted:
                log.warning("%d XID(s) found in the kernel log since boot", counted)

        self.kernel_log = KernelLogFollower(backfill, self.tracker.record, logger=log)
        self.kernel_log.start()

    def _status(self) -> str:
        snapshot = self.store.latest()
        if snapshot is None:
            return "starting"
        if not snapshot.nvml_up:
            return f"NVML unavailable: {snapshot.nvml_error}"
        lost = sum(1 for g in snapshot.gpus if not g.up)
        return f"{len(snapshot.gpus)} GPU(s), {lost} lost, serving on port {self.server.port}"

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


def _now() -> datetime:
    return datetime.now(timezone.utc)


def default_alerting() -> alerts_config.AlertingConfig:
    """The alerting section as it is with nothing configured (the built-in pack, no receivers)."""
    parsed, problems = alerts_config.parse(None)
    if parsed is None:
        raise ConfigError(problems)
    return parsed


def hostname() -> str:
    return socket.gethostname()
