"""The per-GPU families of a snapshot, built once and kept: gpumon_gpu_info, gpumon_gpu_up, every
metric row of gpumon/exporter/metrics.py, and the per-process families when enabled.

Every scrape of one snapshot reuses its families; a fast-tier family whose samples are the
previous snapshot's keeps its text; slow and static rows are rendered when those tiers are read
(GPU by GPU, since slow reads are spread over polls) and reused until the next read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

from gpumon.exporter.metrics import MetricRow, gpu_rows
from gpumon.exporter.text import Family, render, render_samples
from gpumon.poller import PollIntervals
from gpumon.snapshot import GpuSnapshot, Snapshot, Tier, fields_of_tier

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


def refreshed(tier: Tier, intervals: PollIntervals) -> str:
    """The end of a HELP text: how often the family's values are read."""
    if tier is Tier.DAEMON:
        return " Updated as events arrive."
    return f" Refreshed every {intervals.of(tier):g}s."


class GpuFamilies:
    """The per-GPU families of snapshots, with the text of what did not change kept."""

    def __init__(self, intervals: PollIntervals, *, processes: bool) -> None:
        self._intervals = intervals
        self._processes = processes
        self._rows = gpu_rows()
        self._row_cache: dict[str, tuple[tuple[object, ...], Family]] = {}
        self._gpu_cache: tuple[Snapshot, tuple[PollIntervals, bool], list[Family]] | None = None
        self._fresh_families: dict[str, Family] = {}
        """The per-GPU families of the last snapshot rendered, by name: one whose samples did not change is reused."""
        self._slower_fields = tuple(sorted(fields_of_tier(Tier.SLOW) | fields_of_tier(Tier.STATIC)))
        self._slower_by_gpu: dict[
            tuple[int, str],
            tuple[GpuSnapshot, tuple[object, ...], dict[str, tuple[list[tuple[tuple[str, ...], float]], str]]],
        ] = {}
        """Per GPU: its last snapshot, its slow and static values then, and the samples and sample
        lines they give by row."""
        self._build_lock = threading.Lock()
        """Held while the per-GPU families of a snapshot are built: a scrape that needs the ones
        the polling thread is building waits for them instead of building them too."""

    def set_options(self, intervals: PollIntervals, *, processes: bool) -> None:
        """New intervals (for HELP texts) and per-process opt-in after a reload."""
        self._intervals = intervals
        self._processes = processes

    def prepare_slower(self, snapshot: Snapshot) -> None:
        """Render the slow and static rows of ``snapshot`` now (the polling thread, right after a read)."""
        live = [g for g in snapshot.gpus if g.up]
        for row, key in self._row_keys(snapshot) if live else ():
            if key is not None:
                self._cached_row_family(row, live, key)

    def of(self, snapshot: Snapshot) -> list[Family]:
        """The per-GPU families of ``snapshot``, rendered once: every scrape of one snapshot
        (concurrent ones, or several scrapers) reuses the text, and a family whose samples are the
        previous snapshot's (values that did not move since the last poll) keeps its text."""
        cached = self._gpu_cache
        if cached is not None and cached[0] is snapshot and cached[1] == (self._intervals, self._processes):
            return cached[2]
        with self._build_lock:
            cached = self._gpu_cache
            if cached is not None and cached[0] is snapshot and cached[1] == (self._intervals, self._processes):
                return cached[2]  # built by another thread meanwhile
            return self._new_gpu_metrics(snapshot)

    def _new_gpu_metrics(self, snapshot: Snapshot) -> list[Family]:
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
            row.help + refreshed(row.tier, self._intervals),
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
