"""The Prometheus collector: fresh metric families from the latest snapshot.

A scrape never touches NVML: it reads the SnapshotStore. Series of a GPU that
vanished or is lost disappear by themselves because families are rebuilt per scrape.
Extra sources (alerts, burn results, health, DCGM names) give their families inside each
scrape, each timed and guarded: one that fails is logged and reported by
``gpumon_collector_success 0``, and the scrape still answers 200 with everything else.

Every source gives gpumon.exporter.text.Family objects (``families()``); ``render()`` and
``render_openmetrics()`` write them all with the fast renderers, and ``collect()`` gives the
same families as prometheus_client Metric objects for registries.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client.core import Metric

from gpumon import __version__
from gpumon.exporter import openmetrics
from gpumon.exporter.metrics import MetricRow, gpu_rows
from gpumon.exporter.text import Family, FamilySource, render, render_samples
from gpumon.poller import PollIntervals
from gpumon.snapshot import GpuSnapshot, Snapshot, Tier, fields_of_tier
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


@dataclass(frozen=True)
class SelfStats:
    """Daemon figures that are not part of a snapshot."""

    poll_skipped_total: int = 0
    """Scheduled polls that did not run (one was still running, or it could not start in time)."""
    config_last_reload_successful: bool = True
    """Whether the last configuration reload (SIGHUP) was applied; True at start."""
    config_last_reload_success_timestamp_seconds: float = 0.0
    """Unix time the running configuration was loaded (start-up or the last good reload)."""


def _refreshed(tier: Tier, intervals: PollIntervals) -> str:
    if tier is Tier.DAEMON:
        return " Updated as events arrive."
    return f" Refreshed every {intervals.of(tier):g}s."


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
        extra: Sequence[tuple[str, FamilySource]] = (),
        version: str = __version__,
        python_version: str | None = None,
    ) -> None:
        self._store = store
        self._intervals = intervals
        self._mono = monotonic
        self._self_stats = self_stats
        self._processes = processes
        self._rows = gpu_rows()
        self._row_cache: dict[str, tuple[tuple[object, ...], Family]] = {}
        self._gpu_cache: tuple[Snapshot, tuple[PollIntervals, bool], list[Family]] | None = None
        self._fresh_families: dict[str, Family] = {}
        self._slower_fields = tuple(sorted(fields_of_tier(Tier.SLOW) | fields_of_tier(Tier.STATIC)))
        self._slower_by_gpu: dict[
            tuple[int, str],
            tuple[GpuSnapshot, tuple[object, ...], dict[str, tuple[list[tuple[tuple[str, ...], float]], str]]],
        ] = {}
        """Per GPU: its last snapshot, its slow and static values then, and the samples and sample
        lines they give by row."""
        """The per-GPU families of the last snapshot rendered, by name: one whose samples did not change is reused."""
        self._extra = list(extra)
        self._version = version
        self._python_version = python_version or platform.python_version()

    def set_options(self, intervals: PollIntervals, *, processes: bool) -> None:
        """New intervals (for HELP texts) and per-process opt-in after a reload."""
        self._intervals = intervals
        self._processes = processes

    def add(self, name: str, source: FamilySource) -> None:
        """Take ``source``'s families in every scrape, guarded and timed as ``name``."""
        self._extra.append((name, source))

    # ------------------------------------------------------------------
    def render(self) -> bytes:
        """The whole exposition in Prometheus text format 0.0.4."""
        return render(self.families()).encode()

    def render_openmetrics(self) -> bytes:
        """The whole exposition in OpenMetrics 1.0 text."""
        return openmetrics.render(self.families())

    def collect(self) -> Iterator[Metric]:
        """The same families as prometheus_client Metric objects (for registries)."""
        for family in self.families():
            yield family.to_metric()

    def families(self) -> list[Family]:
        """Every family of one scrape: gpumon's own, each extra source's, then the sources'
        success and duration."""
        start = self._mono()
        out = self.own_families()
        timings = [("gpumon", 1.0, self._mono() - start)]
        for name, source in self._extra:
            start = self._mono()
            try:
                families = list(source.families())
                ok = 1.0
            except Exception:
                log.exception("collector %s failed; its metrics are left out of this scrape", name)
                families, ok = [], 0.0
            out.extend(families)
            timings.append((name, ok, self._mono() - start))
        return out + self._meta(timings)

    def _meta(self, timings: list[tuple[str, float, float]]) -> list[Family]:
        success = Family(
            "gpumon_collector_success",
            "gauge",
            "1 when the named collector ran without error in this scrape.",
            ("collector",),
        )
        duration = Family(
            "gpumon_collector_duration_seconds",
            "gauge",
            "Time the named collector took in this scrape, seconds.",
            ("collector",),
        )
        for name, ok, seconds in timings:
            success.add([name], ok)
            duration.add([name], seconds)
        return [success, duration]

    # ------------------------------------------------------------------
    def own_families(self) -> list[Family]:
        """gpumon's own families for the latest snapshot."""
        snapshot = self._store.latest()
        build = Family(
            "gpumon_build_info", "gauge", "gpumon version and Python version; always 1.", ("version", "python_version")
        )
        build.add([self._version, self._python_version], 1.0)
        nvml_up = Family("gpumon_nvml_up", "gauge", "1 when NVML is loaded and answering.")
        nvml_up.add([], 1.0 if snapshot is not None and snapshot.nvml_up else 0.0)
        stats = self._self_stats()
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
        out = [build, nvml_up, skipped, reload_ok, reload_at]
        if snapshot is not None:
            out += self._self_metrics(snapshot)
            out += self._host_metrics(snapshot)
            out += self._gpu_metrics(snapshot)
        return out

    def _self_metrics(self, snapshot: Snapshot) -> list[Family]:
        age = Family(
            "gpumon_snapshot_age_seconds",
            "gauge",
            "Seconds since the snapshot these metrics come from was taken; grows while a poll hangs.",
        )
        age.add([], max(0.0, self._mono() - snapshot.monotonic_seconds))
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

    def _host_metrics(self, snapshot: Snapshot) -> list[Family]:
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

    def _gpu_metrics(self, snapshot: Snapshot) -> list[Family]:
        """The per-GPU families of ``snapshot``, rendered once: every scrape of one snapshot
        (concurrent ones, or several scrapers) reuses the text, and a family whose samples are the
        previous snapshot's (values that did not move since the last poll) keeps its text."""
        cached = self._gpu_cache
        if cached is not None and cached[0] is snapshot and cached[1] == (self._intervals, self._processes):
            return cached[2]
        previous = self._fresh_families
        families = self._build_gpu_metrics(snapshot)
        for i, family in enumerate(families):
            if family.rendered is None:
                same = previous.get(family.name)
                if same is not None and same.samples == family.samples and same.help == family.help:
                    families[i] = same  # fast values as the previous poll read them (an idle GPU): same text
                else:
                    family.rendered = render([family])
        self._fresh_families = {f.name: f for f in families}
        self._gpu_cache = (snapshot, (self._intervals, self._processes), families)
        return families

    def _build_gpu_metrics(self, snapshot: Snapshot) -> list[Family]:
        if not snapshot.gpus:
            return []
        info = Family(
            "gpumon_gpu_info", "gauge", "Identity of the GPU; always 1 (nvidia-smi -q).", (*GPU_LABELS, *INFO_LABELS)
        )
        up = Family(
            "gpumon_gpu_up",
            "gauge",
            "1 when the GPU answers NVML, 0 when it is lost (fallen off the bus, needs reset).",
            GPU_LABELS,
        )
        host = snapshot.host
        for gpu in snapshot.gpus:
            info.add(
                [
                    str(gpu.index),
                    gpu.uuid,
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
            up.add([str(gpu.index), gpu.uuid], 1.0 if gpu.up else 0.0)
        out = [info, up]
        live = [g for g in snapshot.gpus if g.up]
        for row, key in self._row_keys(snapshot):
            family = self._row_family(row, live) if key is None else self._cached_row_family(row, live, key)
            if family.samples:
                out.append(family)
        if self._processes:
            out += self._process_metrics(live)
        return out

    def _row_keys(self, snapshot: Snapshot) -> Iterator[tuple[MetricRow, tuple[object, ...] | None]]:
        """Each row with the key its cached text is valid for (slow and static tiers), or None (fast)."""
        gpu_set = tuple((g.index, g.uuid, g.up) for g in snapshot.gpus)
        for row in self._rows:
            stats = snapshot.tiers.get(row.tier.value) if row.tier in (Tier.SLOW, Tier.STATIC) else None
            yield row, None if stats is None else (stats.last_timestamp_seconds, gpu_set)

    def prepare(self, snapshot: Snapshot) -> None:
        """Store listener: right after a slow or static read, render those tiers' families on the
        polling thread (once per read, as the first scrape after it would), so no scrape waits for
        them. A poll of the fast tier alone costs a few key comparisons here."""
        live = [g for g in snapshot.gpus if g.up]
        if not live:
            return
        for row, key in self._row_keys(snapshot):
            if key is not None:
                self._cached_row_family(row, live, key)

    def _cached_row_family(self, row: MetricRow, gpus: Sequence[GpuSnapshot], key: tuple[object, ...]) -> Family:
        """Slow and static tiers change only when read: reuse their rendered text until then."""
        key = (*key, self._intervals)
        cached = self._row_cache.get(row.name)
        if cached is not None and cached[0] == key:
            return cached[1]
        family, texts = self._slower_row_family(row, gpus)
        if cached is not None and cached[1].samples == family.samples and cached[1].help == family.help:
            family = cached[1]  # read again, same values (error counters, topology): same text
        else:
            header = render([Family(family.name, family.kind, family.help, family.label_names)])
            family.rendered = header + "".join(texts)  # what render([family]) gives, GPU by GPU
        self._row_cache[row.name] = (key, family)
        return family

    def _slower_row_family(self, row: MetricRow, gpus: Sequence[GpuSnapshot]) -> tuple[Family, list[str]]:
        """``_row_family`` of a slow or static row and its sample lines GPU by GPU, reusing the samples
        and lines of each GPU not read since: slow reads are spread over polls (a few GPUs a poll),
        so most GPUs' are as before."""
        family = self._empty_row_family(row)
        samples = family.samples
        texts = []
        for gpu in gpus:
            by_row = self._slower_samples(gpu)
            done = by_row.get(row.name)
            if done is None:
                index, uuid = str(gpu.index), gpu.uuid
                one = Family(family.name, family.kind, "", family.label_names, plain_labels=family.plain_labels)
                one.samples.extend(((index, uuid, *labels), value) for labels, value in row.samples(gpu))
                lines: list[str] = []
                render_samples(one, lines, {})
                done = by_row[row.name] = (one.samples, "".join(lines))
            samples.extend(done[0])
            texts.append(done[1])
        return family, texts

    def _slower_samples(self, gpu: GpuSnapshot) -> dict[str, tuple[list[tuple[tuple[str, ...], float]], str]]:
        """This GPU's slow and static samples by row name, kept while its slow and static field
        values are the very objects they were (the poller keeps them until it reads that GPU's
        slower tier again); compared once per snapshot of the GPU."""
        where = (gpu.index, gpu.uuid)
        cached = self._slower_by_gpu.get(where)
        if cached is not None and cached[0] is gpu:
            return cached[2]
        values = gpu.__dict__
        key = tuple(values[name] for name in self._slower_fields)
        if cached is not None and all(a is b for a, b in zip(cached[1], key, strict=True)):
            self._slower_by_gpu[where] = (gpu, key, cached[2])
            return cached[2]
        fresh: dict[str, tuple[list[tuple[tuple[str, ...], float]], str]] = {}
        self._slower_by_gpu[where] = (gpu, key, fresh)
        return fresh

    def _empty_row_family(self, row: MetricRow) -> Family:
        """The family of a metric row, its HELP saying how often it refreshes, with no sample yet."""
        return Family(
            row.name,
            row.kind,
            row.help + _refreshed(row.tier, self._intervals),
            (*GPU_LABELS, *row.labels),
            plain_labels=row.plain_labels,
        )

    def _row_family(self, row: MetricRow, gpus: Sequence[GpuSnapshot]) -> Family:
        family = self._empty_row_family(row)
        samples = family.samples
        for gpu in gpus:
            index, uuid = str(gpu.index), gpu.uuid
            for labels, value in row.samples(gpu):
                samples.append(((index, uuid, *labels), value))
        return family

    def _process_metrics(self, gpus: Sequence[GpuSnapshot]) -> list[Family]:
        memory = Family(
            "gpumon_process_used_memory_bytes",
            "gauge",
            "GPU memory held by one compute process, bytes (nvidia-smi --query-compute-apps used_memory).",
            (*GPU_LABELS, *PROCESS_LABELS),
        )
        sm = Family(
            "gpumon_process_sm_utilization_ratio",
            "gauge",
            "Share of SM time used by one compute process, 0-1 (nvidia-smi pmon sm / 100).",
            (*GPU_LABELS, *PROCESS_LABELS),
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
                    memory.add(labels, float(p.used_memory_bytes))
                if p.sm_utilization_ratio is not None:
                    sm.add(labels, p.sm_utilization_ratio)
        return [f for f in (memory, sm) if f.samples]
