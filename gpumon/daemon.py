"""The one place that builds and wires gpumon's parts, runs them and shuts them down.

Order of construction: XID catalog and tracker -> store -> poller -> alert service ->
exporter (collector with the alerts, burn-results and DCGM collectors; HTTP server with
the web config) -> poll job (APScheduler; the only caller of the backend's read) -> XID
event thread and kernel-log follower -> systemd notifications. Shutdown goes in reverse.

Signals only set flags and ring a wake-up fd (``gpumon.wakeup``: no lock in a handler, so a SIGHUP
storm neither deadlocks nor kills the daemon); the main thread acts on them and pings the systemd watchdog. It
never waits on a poll, so SIGTERM/SIGINT stop within 2 s in every state, even while an
NVML call hangs (the poll and event threads are daemon threads). SIGHUP reloads the
configuration: all of it is read and checked first, then applied; a reload that fails for
any reason keeps the running configuration, is logged in one line and shows in
``gpumon_config_last_reload_successful``.
"""

from __future__ import annotations

import logging
import signal
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpumon import process_memory
from gpumon.alerts.service import AlertService
from gpumon.backends.base import GpuBackend
from gpumon.backends.factory import simulated_spec
from gpumon.collect.poller import Poller
from gpumon.collect.processes import ProcessEnricher
from gpumon.collect.scheduling import PollJob
from gpumon.collect.store import SnapshotStore
from gpumon.config.daemon_settings import default_alerting, intervals_of
from gpumon.config.file import Config
from gpumon.daemon_reload import ConfigReload
from gpumon.daemon_sources import add_sources, host_figures_reader
from gpumon.early_hangup import received_early
from gpumon.events.kernel_follow import KernelLogFollower
from gpumon.events.tracker import XidTracker
from gpumon.events.xid_thread import XidEventThread
from gpumon.exposition.collector import GpumonCollector
from gpumon.exposition.own_families import SelfStats
from gpumon.health.poll_watch import PollProgress, PollWatch
from gpumon.health.service import HealthService
from gpumon.http.messages import json_response
from gpumon.http.server import MetricsServer
from gpumon.http.snapshot_api import snapshot_response
from gpumon.model.xid import XidEvent
from gpumon.model.xid_catalog import XidCatalog
from gpumon.systemd_notify import SystemdNotifier
from gpumon.util.state.files import close_to_others, health_dir
from gpumon.util.state.lock import DaemonLock
from gpumon.wakeup import SignalFlags, Wakeup

if TYPE_CHECKING:
    from gpumon.http.webconfig_watcher import WebConfigWatcher

log = logging.getLogger("gpumon")


DEAF_CHECK_SECONDS = 10.0
"""How often the main thread asks whether the exporter still answers when no systemd watchdog is
set (with one, at every ping: half of WatchdogSec)."""


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
        settle_memory: Callable[[], None] = process_memory.settle,
    ) -> None:
        """Build every part; raises OSError when the port cannot be bound,
        gpumon.http.webconfig.WebConfigError for an unusable web config and
        gpumon.util.state.lock.StateDirBusy when another daemon runs on the same state directory.
        ``settle_memory`` runs once, in run_forever after the first poll (a test passes its own)."""
        self.config = config
        # one daemon per state directory (raises StateDirBusy): two would share, and fight over, one
        # alert spool and one health state; released by stop(), or by the kernel when the process ends
        self._state_lock = DaemonLock.take(config.state_dir, log)
        for line in close_to_others([config.state_dir, health_dir(config.state_dir)]):
            log.warning("state directory: %s", line)
        try:
            self._build(config, backend, reload_config, monotonic, wall_clock, notifier, settle_memory)
        except BaseException:
            self._state_lock.release()
            raise

    def _build(
        self,
        config: Config,
        backend: GpuBackend,
        reload_config: Callable[[], Config] | None,
        monotonic: Callable[[], float],
        wall_clock: Callable[[], float],
        notifier: SystemdNotifier | None,
        settle_memory: Callable[[], None],
    ) -> None:
        """Every part, in the order of the module's docstring (each step subscribes in that order)."""
        self._settle_memory = settle_memory
        self._mono = monotonic
        self._wall = wall_clock
        self._wake = Wakeup()
        self._signals = SignalFlags()
        """stop: set by SIGTERM/SIGINT and never cleared (a stop cannot be lost to a reload); reload: by SIGHUP."""
        self._reloads = ConfigReload(self, reload_config, wall_clock)
        self._deaf = False
        """True while the exporter cannot answer (the watchdog is not fed)."""
        self.notifier = notifier or SystemdNotifier()
        self.backend = backend
        self._build_acquisition(config, backend, monotonic, wall_clock)
        self._build_alerts_and_health(config, monotonic, wall_clock)
        self._build_exposition(config, backend, monotonic)
        self._build_server(config, monotonic)
        self.poll_job = PollJob(self.poller.poll, config.interval_seconds, monotonic=monotonic)
        self.events = XidEventThread(backend, self.tracker.record, ready=lambda: self.poller.nvml_up)
        self.store.subscribe(lambda snapshot: self.events.nvml_up() if snapshot.nvml_up else None)
        self.kernel_log: KernelLogFollower | None = None

    def _build_acquisition(
        self, config: Config, backend: GpuBackend, monotonic: Callable[[], float], wall_clock: Callable[[], float]
    ) -> None:
        """The XID catalog and tracker, the snapshot store and the poller that fills it."""
        self.catalog = XidCatalog.load(config.xid_catalog)
        self.tracker = XidTracker(live_since_seconds=wall_clock())
        self.store = SnapshotStore()
        self.store.subscribe(self.tracker.set_gpus_from_snapshot)
        self.host_figures = host_figures_reader(config.exporter.sources.host_figures)  # None: turned off
        self.poller = Poller(
            backend,
            self.store,
            intervals_of(config),
            monotonic=monotonic,
            wall_clock=wall_clock,
            enrich_processes=ProcessEnricher().enrich,
            xid_counts=self.tracker.for_gpu,
            host_figures=dict if self.host_figures is None else self.host_figures,  # dict: none
        )

    def _build_alerts_and_health(
        self, config: Config, monotonic: Callable[[], float], wall_clock: Callable[[], float]
    ) -> None:
        """The alert service and the health service, each fed snapshots and XIDs."""
        alerting = config.alerting if config.alerting is not None else default_alerting()
        self.alerts = AlertService(
            alerting,
            config.state_dir,
            alerting.host or socket.gethostname(),
            clock=wall_clock,
            monotonic=monotonic,  # alerts age on it: a step of the wall clock fires or holds back none
            xid_action=lambda code: self.catalog.lookup(code).action,
            findings=lambda kinds: self.health.findings_of(kinds),  # the finding rules (tick thread, every 5 s)
        )
        self.store.subscribe(self.alerts.on_snapshot)
        self.tracker.subscribe(self.alerts.on_xid)
        self.health = HealthService(
            config.state_dir,
            self.catalog,
            config.health,
            clock=wall_clock,
            monotonic=monotonic,
            # simulated GPUs keep their state apart from the node's, one folder per scenario
            simulated=simulated_spec(config.backend) or False,
            # a read that does not return within stale_after_seconds is its GPU's fault (as /ready fails then)
            poll_watch=PollWatch(
                lambda: PollProgress(*self.poller.progress()), lambda: self.config.stale_after, monotonic
            ),
            lock_wait_seconds=0.0,  # a gpumon health run holding the state's lock never stalls a poll or scrape
        )
        self.store.subscribe(self.health.on_snapshot)
        # with its GPU known, also when the kernel log is read before the first poll maps the bus ids
        self.tracker.subscribe(self.health.on_xid, attributed=True)
        self.tracker.subscribe_paired(self.health.on_xid_paired)

    def _build_exposition(self, config: Config, backend: GpuBackend, monotonic: Callable[[], float]) -> None:
        """The collector of /metrics with every extra source; the DCGM-compatible one with --compat."""
        self.collector = GpumonCollector(
            self.store,
            intervals_of(config),
            monotonic=monotonic,
            self_stats=self._self_stats,
            processes=config.exporter.processes,
            detail=frozenset(config.exporter.detail),
        )
        self.store.subscribe(self.collector.prepare)
        self.dcgm = add_sources(
            self.collector,
            config,
            backend,
            self.store,
            self.catalog,
            alerts=self.alerts.collector(),
            health=self.health.collector(),
            host_figures=self.host_figures,
            burn_root=self.health.burn_root,  # a simulated backend's own
        )

    def _build_server(self, config: Config, monotonic: Callable[[], float]) -> None:
        """The HTTP server (with the web config where one is given) and its routes besides /metrics."""
        self.web: WebConfigWatcher | None = None
        if config.web_config_file:  # its modules (TLS, basic auth) are loaded only where one is given
            from gpumon.http.webconfig_watcher import WebConfigWatcher

            self.web = WebConfigWatcher(config.web_config_file, reread_in_background=True)
        web = self.web
        self.server = MetricsServer(
            config.listen_address(),
            self.collector,
            self.store,
            stale_after_seconds=config.stale_after,
            monotonic=monotonic,
            web_config=web,
        )
        self.server.add_route("/api/snapshot", self._snapshot_route)
        self.server.add_route("/api/health", lambda: json_response(self.health.report().to_json()))
        for path, route in self.alerts.routes().items():
            self.server.add_route(path, route)

    # ------------------------------------------------------------------
    def start(self) -> None:
        self.alerts.start()
        self.server.start()
        self.poll_job.start()
        self.events.start()
        if self.config.kernel_log and not self.backend.simulated:  # the host's log is not the simulated GPUs'
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
        self.events.request_stop()  # it ends after its event wait; nothing waits for that (a simulated one ends now)
        if self.kernel_log is not None:
            self.kernel_log.request_stop()  # its read ends within 0.25 s
        self.poll_job.shutdown()  # no new poll; returns at once (the scheduler's thread runs none)
        deadline = self._mono() + 0.5  # a normal poll ends within milliseconds; a hung one never does
        while self.poll_job.running and self._mono() < deadline:
            time.sleep(0.01)
        stuck = self.poll_job.running
        if stuck:
            # leave the poll's daemon thread inside the hung call and do not touch NVML from here
            log.warning("a poll is stuck inside the backend; exiting without waiting for it")
        self.server.stop()
        # not waited for long: backend.shutdown() below leaves NVML to the process's exit while an NVML
        # event wait is in progress (its set is never freed under it), and ends a simulated one at once
        self.events.stop(timeout=0.1)
        if self.kernel_log is not None:
            self.kernel_log.stop(timeout=0.5)
        self.alerts.stop(timeout=0.5)
        self._state_lock.release()
        self._wake.close()
        if not stuck:
            try:
                self.backend.shutdown()
            except Exception:
                log.debug("backend shutdown failed", exc_info=True)

    def request_stop(self) -> None:
        self._signals.stop = True
        self._wake.ring()

    def request_reload(self) -> None:
        self._signals.reload = True
        self._wake.ring()

    def run_forever(self) -> int:
        """Serve until SIGTERM/SIGINT; reload on SIGHUP. Returns the exit code."""
        self._install_signals()
        ready_sent = False
        self.store.subscribe(lambda snapshot: None if ready_sent else self._wake.ring())
        self.start()
        # Woken by a signal, by the first snapshot (READY=1) and when systemd's watchdog wants its
        # ping; without a watchdog only every DEAF_CHECK_SECONDS, to log an exporter gone deaf.
        period = self.notifier.watchdog_ping_period_seconds() or DEAF_CHECK_SECONDS
        try:
            while not self._signals.stop:
                self._wake.wait(period)
                # The watchdog proves the main loop lives and the exporter answers; a GPU hung in
                # NVML is reported through metrics and /ready, since restarting gpumon would not free it.
                self._feed_watchdog()
                if self._signals.stop:
                    break
                if not ready_sent and self.store.latest() is not None:
                    self.notifier.ready(self._status())
                    ready_sent = True
                    # What start-up built (modules, config, backend, the first tier caches) lives
                    # as long as the process: out of the collector's reach, its full collections
                    # stop rescanning it (a 25 ms pause every few scrapes at 256 GPUs, 1.6 ms after);
                    # what start-up freed goes back to the kernel (docs/benchmarks.md, memory).
                    self._settle_memory()
                if self._signals.reload:
                    self._signals.reload = False  # a SIGHUP during the reload reloads once more
                    if ready_sent:
                        self.notifier.reloading("reloading configuration")
                    ok = self.reload()
                    if ready_sent:
                        self.notifier.ready(self._status() + ("" if ok else "; reload rejected, see the log"))
        finally:
            self.stop()
        return 0

    def _feed_watchdog(self) -> None:
        """Ping systemd's watchdog only while the exporter can answer (its accept loop runs, its
        event loop turns): an exporter gone deaf is restarted by systemd instead of looking alive."""
        problem = self.server.serving_problem()
        if problem is None:
            if self._deaf:
                log.warning("the exporter answers again; the systemd watchdog is fed again")
                self._deaf = False
            self.notifier.watchdog()
            return
        if not self._deaf:
            log.error("the exporter cannot answer (%s); the systemd watchdog is no longer fed", problem)
            self._deaf = True

    def reload(self) -> bool:
        """Re-read the configuration and apply what can change live. True when applied; never raises
        (gpumon.daemon_reload: a reload that fails keeps the running configuration, logged in one line)."""
        return self._reloads.reload()

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

    def _self_stats(self) -> SelfStats:
        return SelfStats(
            poll_skipped_total=self.poll_job.skipped_total,
            config_last_reload_successful=self._reloads.last_successful,
            config_last_reload_success_timestamp_seconds=self._reloads.last_success_at_seconds,
            http_connections_open=self.server.open_connections,
            http_connections_shed_total=self.server.shed_connections_total,
            kernel_log_xids_total=None if self.kernel_log is None else self.kernel_log.events_total,
        )

    def _status(self) -> str:
        snapshot = self.store.latest()
        if snapshot is None:
            return "starting"
        if not snapshot.nvml_up:
            return f"NVML unavailable: {snapshot.nvml_error}"
        lost = sum(1 for g in snapshot.gpus if not g.up)
        return f"{len(snapshot.gpus)} GPU(s), {lost} lost, serving on port {self.server.port}"

    def _snapshot_route(self) -> tuple[int, str, bytes]:
        return snapshot_response(self.store.latest(), processes=self.config.exporter.processes, monotonic=self._mono)

    def _install_signals(self) -> None:
        """Handlers that only set a flag (``gpumon.wakeup``); each signal also rings the wake-up fd."""
        self._wake.take_signals()
        signal.signal(signal.SIGTERM, self._signals.on_stop)
        signal.signal(signal.SIGINT, self._signals.on_stop)
        if received_early(signal.signal(signal.SIGHUP, self._signals.on_hangup)):
            self.request_reload()  # a SIGHUP while gpumon started (gpumon.early_hangup)
