"""The daemon's own families before the per-GPU ones: build, NVML up, polls, reloads, connections, host.

``head_families`` gives them for one snapshot (or none yet): gpumon_build_info, gpumon_nvml_up,
the daemon's counters (``SelfStats``), and with a snapshot its age and the tiers' timings and
errors, the host's CPU and memory and the GPU count. ``KeptHead`` gives the same families to the
scrapes, keeping each part while what it is made of holds: the first two while NVML's state does,
the counters while they are equal, the snapshot's while it is the same snapshot; only the age is
made for every scrape (so a scrape renders one family of the head, the others keep their text).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from gpumon.model.families import Family
from gpumon.model.snapshot import Snapshot


@dataclass(frozen=True)
class SelfStats:
    """Daemon figures that are not part of a snapshot."""

    poll_skipped_total: int = 0
    """Scheduled polls that did not run (one was still running, or it could not start in time)."""
    config_last_reload_successful: bool = True
    """Whether the last configuration reload (SIGHUP) was applied; True at start."""
    config_last_reload_success_timestamp_seconds: float = 0.0
    """Unix time the running configuration was loaded (start-up or the last good reload)."""
    http_connections_open: int = 0
    """Connections the exporter holds open now."""
    http_connections_shed_total: int = 0
    """Connections closed to stay under the connection limit (idle ones evicted or new ones refused)."""
    kernel_log_xids_total: int | None = None
    """XIDs read from the kernel log (the backfill since boot, then each as written); None while it is
    not followed (simulated GPUs, ``kernel_log: false``, nothing readable): no sample then."""


def head_families(
    snapshot: Snapshot | None,
    self_stats: Callable[[], SelfStats],
    monotonic: Callable[[], float],
    *,
    version: str,
    python_version: str,
) -> list[Family]:
    """gpumon's own families before the per-GPU ones, for ``snapshot`` (``monotonic``: seconds, the
    clock of ``snapshot.monotonic_seconds``)."""
    out = [*_build_families(snapshot is not None and snapshot.nvml_up, version, python_version)]
    out += _daemon_families(self_stats())
    if snapshot is not None:
        out += [_age(snapshot, monotonic), *_snapshot_metrics(snapshot), *_host_metrics(snapshot)]
    return out


class _Kept(NamedTuple):
    """A part of the head, what it was made of, and its families' names."""

    made_of: object
    families: list[Family]
    names: frozenset[str]


def _kept(made_of: object, families: list[Family]) -> _Kept:
    """``families`` kept, with their names."""
    return _Kept(made_of, families, frozenset([f.family_name for f in families]))


AGE = "gpumon_snapshot_age_seconds"


class KeptHead:
    """``head_families`` for scrape after scrape, each part kept while what it is made of holds (the
    families kept are sealed once rendered, and their text is rendered once). Scrapes may run at once:
    a part is replaced whole, and the worst a race does is make a part one more time."""

    def __init__(
        self, self_stats: Callable[[], SelfStats], monotonic: Callable[[], float], *, version: str, python_version: str
    ) -> None:
        self._self_stats = self_stats
        self._mono = monotonic
        self._version = version
        self._python_version = python_version
        none = _Kept(None, [], frozenset())
        self._build, self._daemon, self._snapshot = none, none, none
        self._names: tuple[_Kept, _Kept, _Kept, frozenset[str]] = (none, none, none, frozenset())
        """The parts the last names were worked out from, and the names."""

    def families(self, snapshot: Snapshot | None) -> tuple[list[Family], frozenset[str]]:
        """``head_families(snapshot, ...)`` (the same families, in the same order), and their names."""
        up = snapshot is not None and snapshot.nvml_up
        build = self._build
        if build.made_of != up:
            build = self._build = _kept(up, _build_families(up, self._version, self._python_version))
        stats = self._self_stats()
        daemon = self._daemon
        if daemon.made_of != stats:
            daemon = self._daemon = _kept(stats, _daemon_families(stats))
        if snapshot is None:
            return [*build.families, *daemon.families], build.names | daemon.names
        kept = self._snapshot
        if kept.made_of is not snapshot:
            kept = self._snapshot = _kept(snapshot, [*_snapshot_metrics(snapshot), *_host_metrics(snapshot)])
        last = self._names
        if last[0] is build and last[1] is daemon and last[2] is kept:
            names = last[3]
        else:
            names = build.names | daemon.names | kept.names | {AGE}
            self._names = (build, daemon, kept, names)
        return [*build.families, *daemon.families, _age(snapshot, self._mono), *kept.families], names


def _build_families(nvml_up: bool, version: str, python_version: str) -> list[Family]:
    """gpumon_build_info and gpumon_nvml_up."""
    build = Family(
        "gpumon_build_info", "gauge", "gpumon version and Python version; always 1.", ("version", "python_version")
    )
    build.add([version, python_version], 1.0)
    up = Family("gpumon_nvml_up", "gauge", "1 when NVML is loaded and answering.")
    up.add([], 1.0 if nvml_up else 0.0)
    return [build, up]


def _daemon_families(stats: SelfStats) -> list[Family]:
    """The polls skipped, the last reload, then the connections and kernel-log counters."""
    skipped = Family(
        "gpumon_poll_skipped_total",
        "counter",
        "Scheduled polls that did not run: the previous poll was still running (a slow or hung backend read), "
        "or the poll could not start in time (the host was suspended or short of CPU).",
    )
    skipped.add([], float(stats.poll_skipped_total))
    reload_ok = Family(
        "gpumon_config_last_reload_successful",
        "gauge",
        "1 when the last configuration reload (SIGHUP) was applied, 0 when it was rejected and the running "
        "configuration kept.",
    )
    reload_ok.add([], 1.0 if stats.config_last_reload_successful else 0.0)
    reload_at = Family(
        "gpumon_config_last_reload_success_timestamp_seconds",
        "gauge",
        "Unix time the running configuration was loaded (start-up or the last successful reload).",
    )
    reload_at.add([], stats.config_last_reload_success_timestamp_seconds)
    return [skipped, reload_ok, reload_at, *_daemon_counters(stats)]


def _daemon_counters(stats: SelfStats) -> list[Family]:
    """The exporter's connections and the kernel log's XIDs: gpumon_http_connections_open,
    gpumon_http_connections_shed_total and gpumon_kernel_log_xids_total."""
    open_now = Family("gpumon_http_connections_open", "gauge", "Connections the exporter holds open now.")
    open_now.add([], float(stats.http_connections_open))
    shed = Family(
        "gpumon_http_connections_shed_total",
        "counter",
        "Connections the exporter closed to stay under its connection limit (idle ones evicted or new ones refused).",
    )
    shed.add([], float(stats.http_connections_shed_total))
    if stats.kernel_log_xids_total is None:
        return [open_now, shed]
    xids = Family(
        "gpumon_kernel_log_xids_total",
        "counter",
        "XIDs read from the kernel log: those since boot when gpumon started, then each as it is written.",
    )
    xids.add([], float(stats.kernel_log_xids_total))
    return [open_now, shed, xids]


def _age(snapshot: Snapshot, monotonic: Callable[[], float]) -> Family:
    """gpumon_snapshot_age_seconds now (``monotonic``: the clock of ``snapshot.monotonic_seconds``)."""
    age = Family(
        AGE,
        "gauge",
        "Seconds since the snapshot these metrics come from was taken; grows while a poll hangs.",
    )
    age.add([], max(0.0, monotonic() - snapshot.monotonic_seconds))
    return age


def _snapshot_metrics(snapshot: Snapshot) -> list[Family]:
    """The snapshot's time, and each tier's last read: its duration, errors and time (tier names
    are gpumon's own: plain labels)."""
    taken = Family(
        "gpumon_snapshot_timestamp_seconds",
        "gauge",
        "Unix time the served snapshot was taken.",
        samples=[((), float(snapshot.timestamp_seconds))],
    )
    tiers = [(tier, snapshot.tiers[tier]) for tier in sorted(snapshot.tiers)]
    duration = Family(
        "gpumon_poll_duration_seconds",
        "gauge",
        "Time the last read of a tier took over all GPUs, seconds (a poll of the fast tier alone is timed whole).",
        ("tier",),
        [((tier,), float(stats.duration_seconds)) for tier, stats in tiers],
        plain_labels=True,
    )
    errors = Family(
        "gpumon_poll_errors_total",
        "counter",
        "Failed backend reads by tier since the daemon started.",
        ("tier",),
        [((tier,), float(stats.errors_total)) for tier, stats in tiers],
        plain_labels=True,
    )
    last = Family(
        "gpumon_last_poll_timestamp_seconds",
        "gauge",
        "Unix time a tier was last read.",
        ("tier",),
        [((tier,), float(stats.last_timestamp_seconds)) for tier, stats in tiers],
        plain_labels=True,
    )
    return [taken, duration, errors, last]


def _host_metrics(snapshot: Snapshot) -> list[Family]:
    """The host's CPU and memory (those psutil gave) and, while NVML is up, the GPU count."""
    host = snapshot.host
    out = [
        Family(name, "gauge", doc, samples=[((), float(value))])
        for name, value, doc in (
            ("gpumon_host_cpu_utilization_ratio", host.cpu_utilization_ratio, "Host CPU busy share, 0-1 (psutil)."),
            ("gpumon_host_memory_used_bytes", host.memory_used_bytes, "Host memory in use, bytes (psutil)."),
            ("gpumon_host_memory_total_bytes", host.memory_total_bytes, "Host memory, bytes (psutil)."),
        )
        if value is not None
    ]
    if snapshot.nvml_up:
        out.append(
            Family("gpumon_gpus", "gauge", "GPUs NVML reports on this host.", samples=[((), float(len(snapshot.gpus)))])
        )
    return out
