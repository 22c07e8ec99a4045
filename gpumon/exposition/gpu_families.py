"""The per-GPU families of a snapshot, built once and kept: gpumon_gpu_info, gpumon_gpu_up, every
metric row of gpumon/exposition/metrics.py, and the per-process families when enabled.

Every scrape of one snapshot reuses its families. A row's text is put together GPU by GPU, and a
GPU's part (its samples and lines) is made again only when the row's field values of that GPU
changed: most do not from one poll to the next, and slow reads are spread over polls, a few GPUs
a poll. Slow and static rows are put together when those tiers are read and kept until the next read;
a GPU whose slow (or static) values are all those its parts were made from is passed over whole, so
a slow read of one GPU looks at that GPU's values only."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter

from gpumon.exposition.metrics import gpu_rows
from gpumon.exposition.openmetrics import om_header
from gpumon.exposition.text import header, render, sample_lines, sample_template
from gpumon.model.families import Family, family_name, refuse_twins
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.snapshot import GpuSnapshot, Snapshot, Tier
from gpumon.util.reuse import Reuse

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
GPU_INFO, GPU_UP = "gpumon_gpu_info", "gpumon_gpu_up"
PROCESS_MEMORY, PROCESS_SM = "gpumon_process_used_memory_bytes", "gpumon_process_sm_utilization_ratio"
FIXED_FAMILIES = (GPU_INFO, GPU_UP)
"""The per-GPU families made here, not from the metric table."""
PROCESS_FAMILIES = (PROCESS_MEMORY, PROCESS_SM)
"""The per-process families (``exporter.processes``)."""
PROCESS_LABELS = ("pid", "name", "user", "systemd_unit", "container_id", "pod_uid", "slurm_job_id")


def refreshed(tier: Tier, intervals: PollIntervals, read_every_seconds: float | None = None) -> str:
    """The end of a HELP text: how often the family's values are read (its tier's interval, or the
    field's own ``read_every_seconds`` when that is longer)."""
    if tier is Tier.DAEMON:
        return " Updated as events arrive."
    return f" Refreshed every {max(intervals.of(tier), read_every_seconds or 0.0):g}s."


SampleRow = list[tuple[tuple[str, ...], float]]
GpuRowText = tuple[SampleRow, str]
"""A row's part for one GPU: its samples (with the ``gpu`` and ``uuid`` labels) and their lines."""

_NOT_MADE = object()
"""What a GPU's part of a row was made from before it was made: equal to no field values."""


def _values_of(fields: Sequence[str]) -> Callable[[Mapping[str, object]], object]:
    """The function that takes ``fields``' values out of a GPU's ``__dict__`` (one C call: it runs
    for every row and GPU of every poll). With no fields, a constant."""
    if not fields:
        return lambda _values: ()
    return itemgetter(*fields)


@dataclass(frozen=True)
class _Group:
    """Rows whose families are kept together. The slow and static tiers' rows (``tier``) change
    only when that tier is read; every other row (``tier`` None) may change with every snapshot."""

    tier: Tier | None
    tier_name: str | None
    """``tier.value`` (the key of its stats in a snapshot), taken once: an Enum's value is a Python call."""
    positions: tuple[int, ...]
    """The rows' positions in the metric table."""
    values_of: Callable[[Mapping[str, object]], object]
    """Every field the rows read, out of a GPU's ``__dict__``: a GPU whose values are those its
    parts of the group were made from needs nothing made (kept groups only)."""


class _GpuParts:
    """One served GPU's part of every row, by row position, and what each was made from."""

    __slots__ = ("group_values", "made_from", "parts")

    def __init__(self, rows: int) -> None:
        self.made_from: list[object] = [_NOT_MADE] * rows
        """Per row: the row's field values the part was made from."""
        self.parts: list[GpuRowText] = [([], "")] * rows
        self.group_values: dict[Tier, object] = {}
        """Per kept group: the group's field values when every part of it was last made from them."""


class GpuFamilies:
    """The per-GPU families of snapshots, with the text of what did not change kept."""

    def __init__(self, intervals: PollIntervals, *, processes: bool, detail: frozenset[str] = frozenset()) -> None:
        self._intervals = intervals
        self._processes = processes
        self._build_lock = threading.Lock()
        """Held while the per-GPU families of a snapshot are built or its slow rows made (everything
        kept below is changed under it): a scrape that needs the ones the polling thread is building
        waits for them instead of building them too."""
        self._setup(detail)

    def _setup(self, detail: frozenset[str]) -> None:
        """The rows served with the ``detail`` opt-ins (``exporter.detail``), and nothing kept yet."""
        self._detail = detail
        rows = gpu_rows()
        # every family a per-GPU part could serve, with any opt-ins, once: a twin is refused here
        refuse_twins([*FIXED_FAMILIES, *(family_name(row.name, row.kind) for row in rows), *PROCESS_FAMILIES])
        self._rows = tuple(served for row in rows if (served := row.served(detail)) is not None)
        self.names = frozenset((*FIXED_FAMILIES, *(family_name(r.name, r.kind) for r in self._rows), *PROCESS_FAMILIES))
        """The names of the families these options serve (some only where a GPU has the samples)."""
        self._values_of = [_values_of(row.fields) for row in self._rows]
        kept = {Tier.SLOW, Tier.STATIC}
        self._groups = tuple(
            _Group(
                tier,
                None if tier is None else tier.value,
                positions := tuple(
                    i for i, row in enumerate(self._rows) if (row.tier if row.tier in kept else None) is tier
                ),
                _values_of([f for i in positions for f in self._rows[i].fields]),
            )
            for tier in (Tier.STATIC, Tier.SLOW, None)
        )
        self._families: list[Family | None] = [None] * len(self._rows)
        """Per row: its family as last made (None: to be made), reused while no GPU's part of it changed."""
        self._group_keys: dict[Tier, float] = {}
        """Per kept group: the tier's last read (its stats' timestamp) its families were last made for;
        cleared when the served GPUs or the intervals change."""
        self._of_snapshot: Reuse[list[Family]] = Reuse()
        """The families of the last snapshot built, with the intervals and process opt-in they were built
        with; each one sealed as it was made (a row's, once put together; the others, once rendered)."""
        self._identity: Reuse[list[Family]] = Reuse()
        """gpumon_gpu_info and gpumon_gpu_up as last made, kept while the GPUs' identities and states are equal."""
        self._fresh_families: dict[str, Family] = {}
        """The families of the last snapshot rendered that are made whole (info, up, processes), by
        name: one whose samples did not change is reused."""
        self._by_gpu: dict[tuple[int, str], _GpuParts] = {}
        """Per served GPU (index, UUID): its parts of the rows, reused while the row's field values
        of the GPU are equal to those they were made from."""
        self._gpu_set: tuple[tuple[int, str, bool], ...] = ()
        """The GPUs (index, UUID, up) ``_by_gpu`` and ``_families`` were last made for."""
        self._heads: Reuse[list[tuple[Family, Callable[..., str], str]]] = Reuse()
        """The intervals the rows' HELP texts were written for; per row, its family without samples
        (``rendered``: its HELP and TYPE lines), its sample template and its OpenMetrics HELP and TYPE."""

    def set_options(self, intervals: PollIntervals, *, processes: bool, detail: frozenset[str] | None = None) -> None:
        """New intervals (for HELP texts), per-process and detail opt-ins after a reload."""
        with self._build_lock:
            if intervals != self._intervals:
                self._group_keys = {}  # every kept group made again, with the new HELP texts
            self._intervals = intervals
            self._processes = processes
            if detail is not None and detail != self._detail:
                self._setup(detail)

    def prepare_slower(self, snapshot: Snapshot) -> None:
        """Render the slow and static rows of ``snapshot`` now (the polling thread, right after a read)."""
        with self._build_lock:  # a scrape's ``of`` meanwhile waits, and then finds them made
            live = self._live(snapshot)
            if live:
                formatted: dict[float, str] = {}
                for group in self._groups:
                    if group.tier is not None:
                        self._make_group(group, snapshot, live, formatted)

    def of(self, snapshot: Snapshot) -> list[Family]:
        """The per-GPU families of ``snapshot``, rendered once: every scrape of one snapshot
        (concurrent ones, or several scrapers) reuses the text, and a GPU's part of a family whose
        values did not move since the last poll keeps its text."""
        options = (self._intervals, self._processes)
        kept = self._of_snapshot.kept(same=(snapshot,), equal=options)
        if kept is not None:
            return kept
        with self._build_lock:  # built by another thread meanwhile: ``get`` finds it kept
            return self._of_snapshot.get(lambda: self._new_gpu_metrics(snapshot), same=(snapshot,), equal=options)

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
        return families

    def _build_gpu_metrics(self, snapshot: Snapshot) -> list[Family]:
        if not snapshot.gpus:
            return []
        host = snapshot.host
        identity = [
            (g.index, g.uuid, g.name, g.pci_bus_id, g.serial, g.vbios_version, g.compute_capability, g.up)
            for g in snapshot.gpus
        ]
        out = self._identity.get(
            lambda: _identity_families(snapshot), equal=(identity, host.driver_version, host.cuda_driver_version)
        )
        out = list(out)
        live = self._live(snapshot)
        if live:
            formatted: dict[float, str] = {}
            for group in self._groups:
                self._make_group(group, snapshot, live, formatted)
            out += [family for family in self._families if family is not None and family.samples]
        if self._processes:
            out += self._process_metrics([g for g in live if g.up])
        return out

    def _live(self, snapshot: Snapshot) -> list[GpuSnapshot]:
        """The GPUs of ``snapshot`` whose rows are served: every GPU, a lost one with the fields it
        keeps (identity, counters, XIDs: DESIGN.md §4; its other fields are None and give no sample).
        When they, or whether each answers, are not those of the last snapshot, the parts kept of
        GPUs no longer among them are dropped and every row's family is made again (a GPU that is
        lost or back has every group made again, though no slower tier was read)."""
        live = list(snapshot.gpus)
        gpu_set = tuple([(g.index, g.uuid, g.up) for g in live])
        if gpu_set != self._gpu_set:
            keep = {(index, uuid) for index, uuid, _up in gpu_set}
            self._by_gpu = {where: parts for where, parts in self._by_gpu.items() if where in keep}
            self._families = [None] * len(self._rows)
            self._group_keys = {}
            self._gpu_set = gpu_set
        return live

    def _heads_now(self) -> list[tuple[Family, Callable[..., str], str]]:
        """Per row, its family without samples, its HELP saying how often it refreshes (``rendered``:
        its HELP and TYPE lines), and its sample template; made once per set of intervals (every
        family is then made again, with the new HELP)."""
        return self._heads.get(self._made_heads, equal=(self._intervals,))

    def _made_heads(self) -> list[tuple[Family, Callable[..., str], str]]:
        """Per row, its family without samples and its sample template, for the intervals now;
        every row's family is to be made again."""
        made = []
        for row in self._rows:
            empty = Family(
                row.name,
                row.kind,
                row.help + refreshed(row.tier, self._intervals, row.read_every_seconds),
                (*GPU_LABELS, *row.labels),
                plain_labels=row.plain_labels,
            )
            empty.rendered = header(empty)
            empty.seal()
            made.append((empty, sample_template(empty), om_header(empty)))
        self._families = [None] * len(self._rows)
        self._group_keys = {}
        return made

    def _make_group(
        self, group: _Group, snapshot: Snapshot, gpus: Sequence[GpuSnapshot], formatted: dict[float, str]
    ) -> None:
        """Bring the families of ``group``'s rows up to date with ``gpus`` (the served GPUs of ``snapshot``).

        A kept group (slow, static) whose tier was not read since its families were made is left
        as it is. Otherwise each GPU's part of a row is made again only when the row's field values
        of that GPU are no longer equal to those it was made from (most are not at every poll, and
        slow reads are spread over polls, a few GPUs a poll: a GPU whose values of the whole group
        are those of the last time is passed over at once), and a row's family only when one of
        its parts was made again."""
        key: float | None = None
        if group.tier is not None:
            stats = snapshot.tiers.get(group.tier_name or "")
            if stats is not None:
                key = stats.last_timestamp_seconds  # the served GPUs are the same: ``_live`` clears the keys
                if self._group_keys.get(group.tier) == key:
                    return  # (new intervals clear the keys: ``set_options``)
        heads = self._heads_now()
        rows, values_of, by_gpu, families = self._rows, self._values_of, self._by_gpu, self._families
        changed: set[int] = set()
        for gpu in gpus:
            values = gpu.__dict__
            kept = by_gpu.get((gpu.index, gpu.uuid))
            if kept is None:
                kept = by_gpu[(gpu.index, gpu.uuid)] = _GpuParts(len(rows))
            if group.tier is not None:
                now = group.values_of(values)
                before = kept.group_values.get(group.tier, _NOT_MADE)
                if before is now or before == now:
                    continue
            made_from, parts = kept.made_from, kept.parts
            for position in group.positions:
                row_values = values_of[position](values)
                was = made_from[position]
                if was is row_values or was == row_values:  # (``is`` first: measured faster, the hot loop)
                    continue
                row = rows[position]
                index, uuid = str(gpu.index), gpu.uuid
                mine = [((index, uuid, *labels), value) for labels, value in row.samples(gpu)]
                lines: list[str] = []
                sample_lines(mine, heads[position][1], row.plain_labels, lines, formatted)
                parts[position] = (mine, "".join(lines))
                made_from[position] = row_values
                changed.add(position)
            if group.tier is not None:
                kept.group_values[group.tier] = now
        for position in group.positions:
            if position in changed or families[position] is None:
                families[position] = self._row_family(position, heads[position], gpus)
        if group.tier is not None and key is not None:
            self._group_keys[group.tier] = key

    def _row_family(
        self, position: int, head: tuple[Family, Callable[..., str], str], gpus: Sequence[GpuSnapshot]
    ) -> Family:
        """Row ``position``'s family over ``gpus``, its text (``rendered``) and its OpenMetrics text
        (``rendered_openmetrics``: the same sample lines) put together from the GPUs' parts."""
        row = self._rows[position]
        empty = head[0]
        family = Family(row.name, row.kind, empty.help, empty.label_names, plain_labels=row.plain_labels)
        samples = family.samples
        texts = []
        by_gpu = self._by_gpu
        for gpu in gpus:
            part = by_gpu[(gpu.index, gpu.uuid)].parts[position]
            samples.extend(part[0])
            texts.append(part[1])
        lines = "".join(texts)
        family.rendered = (empty.rendered or "") + lines
        family.rendered_openmetrics = head[2] + lines
        family.seal()
        return family

    def _process_metrics(self, gpus: Sequence[GpuSnapshot]) -> list[Family]:
        memory = Family(
            PROCESS_MEMORY,
            "gauge",
            "GPU memory held by one compute process, bytes (nvidia-smi --query-compute-apps used_memory).",
            (*GPU_LABELS, *PROCESS_LABELS),
        )
        sm = Family(
            PROCESS_SM,
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


def _identity_families(snapshot: Snapshot) -> list[Family]:
    """gpumon_gpu_info and gpumon_gpu_up of ``snapshot``'s GPUs, rendered (and so sealed)."""
    info = Family(GPU_INFO, "gauge", "Identity of the GPU; always 1 (nvidia-smi -q).", (*GPU_LABELS, *INFO_LABELS))
    up = Family(
        GPU_UP, "gauge", "1 when the GPU answers NVML, 0 when it is lost (fallen off the bus, needs reset).", GPU_LABELS
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
    render([info, up])
    return [info, up]
