"""A SIGHUP's configuration: read and checked into a plan first, then put in force.

``ConfigReload`` is what the daemon calls on SIGHUP, and keeps how the last reload went for the
self-metrics (``gpumon_config_last_reload_successful``).

``prepare_reload`` builds everything that could fail (the poll timer, the XID catalog; the alerting
section the daemon hands to its alert service) and changes nothing; ``apply_reload`` then gives each
running part its new settings and cannot fail. Settings that take effect only after a restart keep
their running value and are named in the log.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gpumon.collect.scheduling import interval_trigger
from gpumon.config.daemon_settings import check_intervals, default_alerting, intervals_of, one_line_reason
from gpumon.model.xid_catalog import XidCatalog
from gpumon.util.log_setup import configure_logging

if TYPE_CHECKING:
    from apscheduler.triggers.interval import IntervalTrigger

    from gpumon.alerts import config as alerts_config
    from gpumon.alerts.service import AlertService
    from gpumon.collect.poller import Poller
    from gpumon.collect.scheduling import PollJob
    from gpumon.config.file import Config
    from gpumon.exposition.collector import GpumonCollector
    from gpumon.exposition.dcgm import DcgmCompatCollector
    from gpumon.http.server import MetricsServer
    from gpumon.http.webconfig_watcher import WebConfigWatcher

log = logging.getLogger("gpumon")
"""The daemon's logger (gpumon/daemon.py's): a reload's lines read ``gpumon: ...``."""

RESTART_ONLY = ("listen", "backend", "fake_gpus", "state_dir", "web_config_file", "kernel_log")
"""Top-level settings that take effect only after a restart."""


@dataclasses.dataclass(frozen=True)
class Reload:
    """A new configuration, read and checked, with everything built that could fail."""

    config: Config
    alerting: alerts_config.AlertingConfig
    """The new alerting section; the built-in pack and no receivers when there is none."""
    catalog: XidCatalog | None
    """None when xid_catalog did not change."""
    trigger: IntervalTrigger | None
    """None when interval_seconds did not change."""
    restart_only: tuple[str, ...]
    """Settings that changed but take effect only after a restart (kept as they run)."""


class Reloadable(Protocol):
    """The running parts a reload gives their new settings to (gpumon.daemon.Daemon)."""

    config: Config
    catalog: XidCatalog
    alerts: AlertService
    poll_job: PollJob
    poller: Poller
    collector: GpumonCollector
    server: MetricsServer
    dcgm: DcgmCompatCollector | None
    web: WebConfigWatcher | None


def prepare_reload(old: Config, new: Config) -> Reload:
    """Check ``new`` and build what could fail (timer, XID catalog, alerting); changes nothing."""
    restart_only = [key for key in RESTART_ONLY if getattr(new, key) != getattr(old, key)]
    for key in ("compat", "compat_hostname_label", "compat_labels", "sources"):
        if getattr(new.exporter, key) != getattr(old.exporter, key):
            restart_only.append(f"exporter.{key}")
    if new.health != old.health:
        restart_only.append("health")
    new = dataclasses.replace(
        new,
        listen=old.listen,
        backend=old.backend,
        fake_gpus=old.fake_gpus,
        state_dir=old.state_dir,
        web_config_file=old.web_config_file,
        kernel_log=old.kernel_log,
        exporter=dataclasses.replace(
            new.exporter,
            compat=old.exporter.compat,
            compat_hostname_label=old.exporter.compat_hostname_label,
            compat_labels=old.exporter.compat_labels,
            sources=old.exporter.sources,
        ),
        health=old.health,
    )
    check_intervals(new)
    return Reload(
        config=new,
        alerting=new.alerting if new.alerting is not None else default_alerting(),
        catalog=XidCatalog.load(new.xid_catalog) if new.xid_catalog != old.xid_catalog else None,
        trigger=interval_trigger(new.interval_seconds) if new.interval_seconds != old.interval_seconds else None,
        restart_only=tuple(restart_only),
    )


def apply_reload(parts: Reloadable, plan: Reload) -> None:
    """Put a prepared configuration in force (the alerting part already is); nothing here can fail."""
    new = plan.config
    configure_logging(new.log_level)
    for key in plan.restart_only:
        log.warning("%s changed in the configuration; it takes effect after a restart", key)
    if plan.trigger is not None:
        parts.poll_job.set_interval(plan.trigger, new.interval_seconds)
    parts.poller.set_intervals(intervals_of(new))
    parts.collector.set_options(
        intervals_of(new), processes=new.exporter.processes, detail=frozenset(new.exporter.detail)
    )
    parts.server.set_stale_after(new.stale_after)
    if plan.catalog is not None:
        parts.catalog = plan.catalog
        if parts.dcgm is not None:
            parts.dcgm.set_catalog(plan.catalog)
    parts.config = new
    if parts.web is not None:
        try:  # a file of its own, kept as it was when invalid (the watcher logs why)
            parts.web.reload()
        except Exception as exc:
            log.error("web config %s not reloaded: %s", parts.config.web_config_file, one_line_reason(exc))


class ConfigReload:
    """The daemon's reloads: each all or nothing, and how the last one went."""

    def __init__(
        self, parts: Reloadable, read_config: Callable[[], Config] | None, wall_clock: Callable[[], float]
    ) -> None:
        """``read_config``: reads and checks the configuration again (None: reloads are refused)."""
        self._parts = parts
        self._read_config = read_config
        self._wall = wall_clock
        self.last_successful = True
        self.last_success_at_seconds = wall_clock()
        """Wall-clock seconds of the last reload put in force (start-up counts as one)."""

    def reload(self) -> bool:
        """Re-read the configuration and apply what can change live. True when applied.

        Never raises: whatever goes wrong while reading or checking the new configuration
        (a ConfigError, a file that is not UTF-8, nesting too deep, numbers no timer can use,
        anything) keeps the running configuration, untouched, and is logged in one line."""
        if self._read_config is None:
            return False
        parts = self._parts
        try:
            plan = prepare_reload(parts.config, self._read_config())
            # first, as it is all or nothing: what could fail is built before anything changes
            parts.alerts.reload(plan.alerting)
        except Exception as exc:
            # the log line first: whoever sees gpumon_config_last_reload_successful change finds it
            log.error(
                "reload rejected, keeping the running configuration (%s): %s",
                parts.config.source or "defaults",
                one_line_reason(exc),
            )
            log.debug("reload failure", exc_info=True)
            self.last_successful = False
            return False
        apply_reload(parts, plan)
        log.info("configuration reloaded from %s", plan.config.source or "defaults")
        self.last_success_at_seconds = self._wall()
        self.last_successful = True
        return True
