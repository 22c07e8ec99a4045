"""The Prometheus collector: fresh metric families from the latest snapshot.

A scrape never touches NVML: it reads the SnapshotStore. Series of a GPU that
vanished or is lost disappear by themselves because families are rebuilt per scrape.
Extra collectors (alerts, burn results, DCGM names) run inside this one, each timed and
guarded: one that fails is logged and reported by ``gpumon_collector_success 0``, and the
scrape still answers 200 with everything else.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpumon import __version__
from gpumon.exporter.metrics import MetricRow, gpu_rows
from gpumon.poller import PollIntervals
from gpumon.snapshot import GpuSnapshot, Snapshot, Tier
from gpumon.store import SnapshotStore

log = logging.getLogger(__name__)

GPU_LABELS = ("gpu", "uuid")
INFO_LABELS = (
    "name",
    "pci_bus_id",
    "serial",
    "vbios_version",
    "driver_version",
    "cuda_driver_version",
    "compute_capability",
)
PROCESS_LABELS = ("pid", "name", "user", "systemd_unit", "container_id", "pod_uid", "slurm_job_id")


class Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


@dataclass(frozen=True)
class SelfStats:
    """Daemon figures that are not part of a snapshot."""

    poll_skipped_total: int = 0


def _refreshed(tier: Tier, intervals: PollIntervals) -> str:
    if tier is Tier.DAEMON:
        return " Updated as events arrive."
    return f" Refreshed every {intervals.of(tier):g}s."


def _family(row_name: str, kind: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily | CounterMetricFamily:
    if kind == "counter":
        return CounterMetricFamily(row_name.removesuffix("_total"), doc, labels=list(labels))
    return GaugeMetricFamily(row_name, doc, labels=list(labels))


class GpumonCollector:
    """Builds every gpumon_* family from the store on each scrape."""

    def __init__(
        self,
        store: SnapshotStore,
        intervals: PollIntervals,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        self_stats: Callable[[], SelfStats] = SelfStats,
        processes: bool = False,
        extra: Sequence[tuple[str, Collector]] = (),
        version: str = __version__,
        python_version: str | None = None,
    ) -> None:
        self._store = store
        self._intervals = intervals
        self._mono = monotonic
        self._self_stats = self_stats
        self._processes = processes
        self._rows = gpu_rows()
        self._extra = list(extra)
        self._version = version
        self._python_version = python_version or platform.python_version()

    def set_options(self, intervals: PollIntervals, *, processes: bool) -> None:
        """New intervals (for HELP texts) and per-process opt-in after a reload."""
        self._intervals = intervals
        self._processes = processes

    def add(self, name: str, collector: Collector) -> None:
        """Run ``collector`` inside every scrape, guarded and timed as ``name``."""
        self._extra.append((name, collector))

    def collect(self) -> Iterator[Metric]:
        success = GaugeMetricFamily(
            "gpumon_collector_success",
            "1 when the named collector ran without error in this scrape.",
            labels=["collector"],
        )
        duration = GaugeMetricFamily(
            "gpumon_collector_duration_seconds",
            "Time the named collector took in this scrape, seconds.",
            labels=["collector"],
        )
        for name, collector in [("gpumon", self._Core(self)), *self._extra]:
            start = self._mono()
            try:
                families = list(collector.collect())
            except Exception:
                log.exception("collector %s failed; its metrics are left out of this scrape", name)
                families = []
                ok = 0.0
            else:
                ok = 1.0
            success.add_metric([name], ok)
            duration.add_metric([name], self._mono() - start)
            yield from families
        yield success
        yield duration

    class _Core:
        def __init__(self, outer: GpumonCollector) -> None:
            self.outer = outer

        def collect(self) -> Iterable[Metric]:
            return self.outer._collect_core()

    # ------------------------------------------------------------------
    def _collect_core(self) -> Iterator[Metric]:
        snapshot = self._store.latest()
        build = GaugeMetricFamily(
            "gpumon_build_info", "gpumon version and Python version; always 1.", labels=["version", "python_version"]
        )
        build.add_metric([self._version, self._python_version], 1.0)
        yield build
        nvml_up = GaugeMetricFamily("gpumon_nvml_up", "1 when NVML is loaded and answering.")
        nvml_up.add_metric([], 1.0 if snapshot is not None and snapshot.nvml_up else 0.0)
        yield nvml_up
        skipped = CounterMetricFamily(
            "gpumon_poll_skipped",
            "Polls skipped because the previous one was still running (an NVML call hangs).",
        )
        skipped.add_metric([], float(self._self_stats().poll_skipped_total))
        yield skipped
        if snapshot is None:
            return
        yield from self._self_metrics(snapshot)
        yield from self._host_metrics(snapshot)
        yield from self._gpu_metrics(snapshot)

    def _self_metrics(self, snapshot: Snapshot) -> Iterator[Metric]:
        age = GaugeMetricFamily(
            "gpumon_snapshot_age_seconds",
            "Seconds since the snapshot these metrics come from was taken; grows while a poll hangs.",
        )
        age.add_metric([], max(0.0, self._mono() - snapshot.monotonic_seconds))
        yield age
        taken = GaugeMetricFamily("gpumon_snapshot_timestamp_seconds", "Unix time the served snapshot was taken.")
        taken.add_metric([], snapshot.timestamp_seconds)
        yield taken
        duration = GaugeMetricFamily(
            "gpumon_poll_duration_seconds", "Time the last read of a tier took over all GPUs, seconds.", labels=["tier"]
        )
        errors = CounterMetricFamily(
            "gpumon_poll_errors", "Failed backend reads by tier since the daemon started.", labels=["tier"]
        )
        last = GaugeMetricFamily(
            "gpumon_last_poll_timestamp_seconds", "Unix time a tier was last read.", labels=["tier"]
        )
        for tier in sorted(snapshot.tiers):
            stats = snapshot.tiers[tier]
            duration.add_metric([tier], stats.duration_seconds)
            errors.add_metric([tier], float(stats.errors_total))
            last.add_metric([tier], stats.last_timestamp_seconds)
        yield duration
        yield errors
        yield last

    def _host_metrics(self, snapshot: Snapshot) -> Iterator[Metric]:
        host = snapshot.host
        for name, value, doc in (
            ("gpumon_host_cpu_utilization_ratio", host.cpu_utilization_ratio, "Host CPU busy share, 0-1 (psutil)."),
            ("gpumon_host_memory_used_bytes", host.memory_used_bytes, "Host memory in use, bytes (psutil)."),
            ("gpumon_host_memory_total_bytes", host.memory_total_bytes, "Host memory, bytes (psutil)."),
        ):
            if value is not None:
                family = GaugeMetricFamily(name, doc)
                family.add_metric([], float(value))
                yield family
        if snapshot.nvml_up:
            count = GaugeMetricFamily("gpumon_gpus", "GPUs NVML reports on this host.")
            count.add_metric([], float(len(snapshot.gpus)))
            yield count

    def _gpu_metrics(self, snapshot: Snapshot) -> Iterator[Metric]:
        if not snapshot.gpus:
            return
        info = GaugeMetricFamily(
            "gpumon_gpu_info", "Identity of the GPU; always 1 (nvidia-smi -q).", labels=[*GPU_LABELS, *INFO_LABELS]
        )
        up = GaugeMetricFamily(
            "gpumon_gpu_up",
            "1 when the GPU answers NVML, 0 when it is lost (fallen off the bus, needs reset).",
            labels=list(GPU_LABELS),
        )
        host = snapshot.host
        for gpu in snapshot.gpus:
            ids = [str(gpu.index), gpu.uuid]
            info.add_metric(
                [
                    *ids,
                    gpu.name or "",
                    gpu.pci_bus_id or "",
                    gpu.serial or "",
                    gpu.vbios_version or "",
                    host.driver_version or "",
                    host.cuda_driver_version or "",
                    gpu.compute_capability or "",
                ],
                1.0,
            )
            up.add_metric(ids, 1.0 if gpu.up else 0.0)
        yield info
        yield up
        live = [g for g in snapshot.gpus if g.up]
        for row in self._rows:
            family = self._row_family(row, live)
            if family is not None:
                yield family
        if self._processes:
            yield from self._process_metrics(live)

    def _row_family(self, row: MetricRow, gpus: Sequence[GpuSnapshot]) -> Metric | None:
        family = _family(
            row.name, row.kind, row.help + _refreshed(row.tier, self._intervals), [*GPU_LABELS, *row.labels]
        )
        any_sample = False
        for gpu in gpus:
            ids = [str(gpu.index), gpu.uuid]
            for labels, value in row.samples(gpu):
                family.add_metric([*ids, *labels], value)
                any_sample = True
        return family if any_sample else None

    def _process_metrics(self, gpus: Sequence[GpuSnapshot]) -> Iterator[Metric]:
        memory = GaugeMetricFamily(
            "gpumon_process_used_memory_bytes",
            "GPU memory held by one compute process, bytes (nvidia-smi --query-compute-apps used_memory).",
            labels=[*GPU_LABELS, *PROCESS_LABELS],
        )
        sm = GaugeMetricFamily(
            "gpumon_process_sm_utilization_ratio",
            "Share of SM time used by one compute process, 0-1 (nvidia-smi pmon sm / 100).",
            labels=[*GPU_LABELS, *PROCESS_LABELS],
        )
        for gpu in gpus:
            for p in gpu.processes or ():
                labels = [
                    str(gpu.index),
                    gpu.uuid,
                    str(p.pid),
                    p.name or "",
                    p.user or "",
                    p.systemd_unit or "",
                    p.container_id or "",
                    p.pod_uid or "",
                    p.slurm_job_id or "",
                ]
                if p.used_memory_bytes is not None:
                    memory.add_metric(labels, float(p.used_memory_bytes))
                if p.sm_utilization_ratio is not None:
                    sm.add_metric(labels, p.sm_utilization_ratio)
        if memory.samples:
            yield memory
        if sm.samples:
            yield sm
