"""The daemon's own families before the per-GPU ones: build, NVML up, polls, reloads, connections, host.

``head_families`` gives them for one snapshot (or none yet): gpumon_build_info, gpumon_nvml_up,
the daemon's counters (``SelfStats``), and with a snapshot its age and the tiers' timings and
errors, the host's CPU and memory and the GPU count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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
    build = Family(
        "gpumon_build_info", "gauge", "gpumon version and Python version; always 1.", ("version", "python_version")
    )
    build.add([version, python_version], 1.0)
    nvml_up = Family("gpumon_nvml_up", "gauge", "1 when NVML is loaded and answering.")
    nvml_up.add([], 1.0 if snapshot is not None and snapshot.nvml_up else 0.0)
    out = [build, nvml_up, *_daemon_families(self_stats())]
    if snapshot is not None:
        out += _snapshot_metrics(snapshot, monotonic)
        out += _host_metrics(snapshot)
    return out


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


def _snapshot_metrics(snapshot: Snapshot, monotonic: Callable[[], float]) -> list[Family]:
    """The snapshot's age and time, and each tier's last read: its duration, errors and time."""
    age = Family(
        "gpumon_snapshot_age_seconds",
        "gauge",
        "Seconds since the snapshot these metrics come from was taken; grows while a poll hangs.",
    )
    age.add([], max(0.0, monotonic() - snapshot.monotonic_seconds))
    taken = Family("gpumon_snapshot_timestamp_seconds", "gauge", "Unix time the served snapshot was taken.")
    taken.add([], snapshot.timestamp_seconds)
    duration = Family(
        "gpumon_poll_duration_seconds",
        "gauge",
        "Time the last read of a tier took over all GPUs, seconds (a poll of the fast tier alone is timed whole).",
        ("tier",),
    )
    errors = Family(
        "gpumon_poll_errors_total", "counter", "Failed backend reads by tier since the daemon started.", ("tier",)
    )
    last = Family("gpumon_last_poll_timestamp_seconds", "gauge", "Unix time a tier was last read.", ("tier",))
    for tier in sorted(snapshot.tiers):
        stats = snapshot.tiers[tier]
        duration.add([tier], stats.duration_seconds)
        errors.add([tier], float(stats.errors_total))
        last.add([tier], stats.last_timestamp_seconds)
    return [age, taken, duration, errors, last]


def _host_metrics(snapshot: Snapshot) -> list[Family]:
    """The host's CPU and memory (those psutil gave) and, while NVML is up, the GPU count."""
    out = []
    host = snapshot.host
    for name, value, doc in (
        ("gpumon_host_cpu_utilization_ratio", host.cpu_utilization_ratio, "Host CPU busy share, 0-1 (psutil)."),
        ("gpumon_host_memory_used_bytes", host.memory_used_bytes, "Host memory in use, bytes (psutil)."),
        ("gpumon_host_memory_total_bytes", host.memory_total_bytes, "Host memory, bytes (psutil)."),
    ):
        if value is not None:
            family = Family(name, "gauge", doc)
            family.add([], float(value))
            out.append(family)
    if snapshot.nvml_up:
        count = Family("gpumon_gpus", "gauge", "GPUs NVML reports on this host.")
        count.add([], float(len(snapshot.gpus)))
        out.append(count)
    return out
