"""The per-GPU families of a snapshot, built once and kept: gpumon_gpu_info, gpumon_gpu_up, every
metric row of gpumon/exporter/metrics.py, and the per-process families when enabled.

Every scrape of one snapshot reuses its families. A row's text is put together GPU by GPU, and a
GPU's part (its samples and lines) is made again only when the row's field values of that GPU
changed: most do not from one poll to the next, and slow reads are spread over polls, a few GPUs
a poll. Slow and static rows are put together when those tiers are read and kept until the next read."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence

from gpumon.exporter.metrics import MetricRow, gpu_rows
from gpumon.exporter.text import Family, header, render, sample_lines, sample_template
from gpumon.poller import PollIntervals
from gpumon.same import same_objects
from gpumon.snapshot import GpuSnapshot, Snapshot, Tier

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


def refreshed(tier: Tier, intervals: PollIntervals, read_every_seconds: float | None = None) -> str:
    """The end of a HELP text: how often the family's values are read (its tier's interval, or the
    field's own ``read_every_seconds`` when that is longer)."""
    if tier is Tier.DAEMON:
        return " Updated as events arrive."
    return f" Refreshed every {max(intervals.of(tier), read_every_seconds or 0.0):g}s."


SampleRow = list[tuple[tuple[str, ...], float]]
GpuRowText = tuple[tuple[object, ...], SampleRow, str]
"""A row's part for one GPU: the row's field values it was made from, its samples (with the
``gpu`` and ``uuid`` labels) and their lines."""


class GpuFamilies:
    """The per-GPU families of snapshots, with the text of what did not change kept."""

    def __init__(self, intervals: PollIntervals, *, processes: bool) -> None:
        self._intervals = intervals
        self._processes = processes
        self._rows = gpu_rows()
        self._row_cache: dict[str, tuple[tuple[object, ...], Family]] = {}
        """Slow and static rows' families by row name, with the key they are valid for (the tier's
        last read, the GPUs, the intervals)."""
        self._gpu_cache: tuple[Snapshot, tuple[PollIntervals, bool], list[Family]] | None = None
        self._fresh_families: dict[str, Family] = {}
        """The families of the last snapshot rendered that are made whole (info, up, processes), by
        name: one whose samples did not change is reused."""
        self._by_gpu: dict[tuple[int, str], dict[str, GpuRowText]] = {}
        """Per GPU (index, UUID), per row name: the GPU's part of the row, reused while the row's
        field values of the GPU are equal to those it was made from."""
        self._gpu_set: tuple[tuple[int, str], ...] = ()
        """The live GPUs ``_by_gpu`` was last trimmed to."""
        self._row_last: dict[str, tuple[list[GpuRowText], Family]] = {}
        """Per row: the parts its last family was made of, and that family (reused while they are the same)."""
        self._row_heads: dict[str, tuple[PollIntervals, Family, Callable[..., str]]] = {}
        """Per row: the intervals its HELP was written for, its family without samples (``rendered``:
        its HELP and TYPE lines) and its sample template."""
        self._build_lock = threading.Lock()
        """Held while the per-GPU families of a snapshot are built: a scrape that needs the ones
        the polling thread is building waits for them instead of building them too."""

    def set_options(self, intervals: PollIntervals, *, processes: bool) -> None:
        """New intervals (for HELP texts) and per-process opt-in after a reload."""
        self._intervals = intervals
        self._processes = processes

    def prepare_slower(self, snapshot: Snapshot) -> None:
        """Render the slow and static rows of ``snapshot`` now (the polling thread, right after a read)."""
        live = self._live(snapshot)
        formatted: dict[float, str] = {}
        for row, key in self._row_keys(snapshot) if live else ():
            if key is not None:
                self._cached_row_family(row, live, key, formatted)

    def of(self, snapshot: Snapshot) -> list[Family]:
        """The per-GPU families of ``snapshot``, rendered once: every scrape of one snapshot
        (concurrent ones, or several scrapers) reuses the text, and a GPU's part of a family whose
        values did not move since the last poll keeps its text."""
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
        fresh = {}
        for i, family in enumerate(families):
            if family.rendered is None:
                same = previous.get(family.name)
                if same is not None and same.samples == family.samples and same.help == family.help:
                    families[i] = same  # as the previous poll read them (an idle GPU): same text
                else:
                    family.rendered = render([family])
                fresh[family.name] = families[i]
        self._fresh_families = fresh
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
        live = self._live(snapshot)
        formatted: dict[float, str] = {}
        for row, key in self._row_keys(snapshot):
            if key is None:
                family = self._row_family(row, live, formatted)
            else:
                family = self._cached_row_family(row, live, key, formatted)
            if family.samples:
                out.append(family)
        if self._processes:
            out += self._process_metrics(live)
        return out

    def _live(self, snapshot: Snapshot) -> list[GpuSnapshot]:
        """The GPUs of ``snapshot`` that answer; the parts kept of GPUs no longer among them are dropped."""
        live = [g for g in snapshot.gpus if g.up]
        gpu_set = tuple((g.index, g.uuid) for g in live)
        if gpu_set != self._gpu_set:
            keep = set(gpu_set)
            self._by_gpu = {where: parts for where, parts in self._by_gpu.items() if where in keep}
            self._gpu_set = gpu_set
        return live

    def _row_keys(self, snapshot: Snapshot) -> Iterator[tuple[MetricRow, tuple[object, ...] | None]]:
        """Each row with the key its cached family is valid for (slow and static tiers), or None (fast)."""
        gpu_set = tuple((g.index, g.uuid, g.up) for g in snapshot.gpus)
        for row in self._rows:
            stats = snapshot.tiers.get(row.tier.value) if row.tier in (Tier.SLOW, Tier.STATIC) else None
            yield row, None if stats is None else (stats.last_timestamp_seconds, gpu_set)

    def _cached_row_family(
        self, row: MetricRow, gpus: Sequence[GpuSnapshot], key: tuple[object, ...], formatted: dict[float, str]
    ) -> Family:
        """Slow and static tiers change only when read: their family is kept until then."""
        key = (*key, self._intervals)
        cached = self._row_cache.get(row.name)
        if cached is not None and cached[0] == key:
            return cached[1]
        family = self._row_family(row, gpus, formatted)
        self._row_cache[row.name] = (key, family)
        return family

    def _row_family(self, row: MetricRow, gpus: Sequence[GpuSnapshot], formatted: dict[float, str]) -> Family:
        """The family of ``row`` over ``gpus``, its text (``rendered``) put together GPU by GPU; the
        family made last time when every GPU's part is the one it was made of."""
        empty, template = self._row_head(row)
        parts = self._parts(row, gpus, template, formatted)
        last = self._row_last.get(row.name)
        if last is not None and last[1].help == empty.help and same_objects(last[0], parts):
            return last[1]
        family = Family(row.name, row.kind, empty.help, empty.label_names, plain_labels=row.plain_labels)
        samples = family.samples
        for part in parts:
            samples.extend(part[1])
        family.rendered = (empty.rendered or "") + "".join([part[2] for part in parts])
        self._row_last[row.name] = (parts, family)
        return family

    def _parts(
        self,
        row: MetricRow,
        gpus: Sequence[GpuSnapshot],
        template: Callable[..., str],
        formatted: dict[float, str],
    ) -> list[GpuRowText]:
        """Each GPU's part of ``row``: made again only when the row's field values of that GPU are no
        longer equal to those it was made from (most are not at every poll, and slow reads are spread
        over polls, a few GPUs a poll)."""
        name, fields, plain = row.name, row.fields, row.plain_labels
        by_gpu = self._by_gpu
        out = []
        for gpu in gpus:
            where = (gpu.index, gpu.uuid)
            kept = by_gpu.get(where)
            if kept is None:
                kept = by_gpu[where] = {}
            values = gpu.__dict__
            now = tuple([values[f] for f in fields])
            part = kept.get(name)
            if part is None or part[0] != now:
                index, uuid = str(gpu.index), gpu.uuid
                mine = [((index, uuid, *labels), value) for labels, value in row.samples(gpu)]
                lines: list[str] = []
                sample_lines(mine, template, plain, lines, formatted)
                part = kept[name] = (now, mine, "".join(lines))
            out.append(part)
        return out

    def _row_head(self, row: MetricRow) -> tuple[Family, Callable[..., str]]:
        """``row``'s family without samples, its HELP saying how often it refreshes (``rendered``: its
        HELP and TYPE lines), and its sample template; made once per set of intervals."""
        kept = self._row_heads.get(row.name)
        if kept is not None and kept[0] == self._intervals:
            return kept[1], kept[2]
        empty = Family(
            row.name,
            row.kind,
            row.help + refreshed(row.tier, self._intervals, row.read_every_seconds),
            (*GPU_LABELS, *row.labels),
            plain_labels=row.plain_labels,
        )
        empty.rendered = header(empty)
        template = sample_template(empty)
        self._row_heads[row.name] = (self._intervals, empty, template)
        return empty, template

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
