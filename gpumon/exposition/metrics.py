"""The metric table: one row per per-GPU ``gpumon_*`` family, built from the field declarations.

Each GpuSnapshot field declares the family it feeds (``metric=Metric(...)`` in gpumon/model/fields/);
this module turns the declarations into rows with a sampler each. Adding a metric: see
docs/architecture.md, "Adding a field".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from gpumon.model.fields.spec import FieldSpec, Metric, MetricPart, Sample, Sampler, as_number, natural
from gpumon.model.snapshot import GpuSnapshot, Tier, field_specs

__all__ = ["MetricRow", "Sample", "by_label", "gpu_rows", "mapping", "scalar"]


@dataclass(frozen=True)
class MetricRow:
    """One per-GPU metric family; every sample also gets the ``gpu`` and ``uuid`` labels."""

    name: str
    """Full exposition name; counters end in ``_total``."""
    kind: str
    """``gauge`` or ``counter``."""
    help: str
    tier: Tier
    samples: Callable[[GpuSnapshot], Iterable[Sample]]
    labels: tuple[str, ...] = ()
    plain_labels: bool = True
    """Label values come from fixed vocabularies (no escaping needed when rendering)."""
    fields: tuple[str, ...] = ()
    """The GpuSnapshot fields ``samples`` reads: a GPU's samples change only when these values do."""
    read_every_seconds: float | None = None
    """Read at most this often though its tier is read more often (``Metric.read_every_seconds``)."""
    detail: str | None = None
    """The ``exporter.detail`` opt-in that serves every sample (``Metric.detail``); None: always all."""
    keep: Callable[[Sample], bool] | None = None
    """Without that opt-in, the samples served (``Metric.keep``); None: the row is not served."""

    def served(self, detail: frozenset[str]) -> MetricRow | None:
        """This row as served with the ``detail`` opt-ins: itself, the row with only the samples
        ``keep`` passes, or None (not served)."""
        if self.detail is None or self.detail in detail:
            return self
        if self.keep is None:
            return None
        keep, samples = self.keep, self.samples
        counter = self.kind == "counter" and self.detail == "zero_rows"  # per-link rows have their GPU's sum

        def kept(gpu: GpuSnapshot) -> list[Sample]:
            every = list(samples(gpu))
            said = [s for s in every if keep(s)]
            return said if said or not counter else every[:1]  # a counter keeps one row at 0: never blank

        return replace(
            self,
            help=f"{self.help} Only the rows that say something (exporter.detail {self.detail}: every row)"
            + ("; a GPU where none does: its first row, at 0." if counter else "."),
            samples=kept,
        )


def scalar(field: str) -> Callable[[GpuSnapshot], Iterable[Sample]]:
    """A single sample from a scalar field; nothing when the field is None."""

    def samples(gpu: GpuSnapshot) -> Iterable[Sample]:
        value = as_number(getattr(gpu, field))
        return [] if value is None else [((), value)]

    return samples


def by_label(fields: Mapping[str, str]) -> Callable[[GpuSnapshot], Iterable[Sample]]:
    """One sample per (label value -> scalar field) pair that is not None."""

    def samples(gpu: GpuSnapshot) -> Iterable[Sample]:
        out = []
        for label, field in fields.items():
            value = as_number(getattr(gpu, field))
            if value is not None:
                out.append(((label,), value))
        return out

    return samples


def mapping(
    field: str, keys: Callable[[str], tuple[str, ...]] = lambda k: (k,)
) -> Callable[[GpuSnapshot], Iterable[Sample]]:
    """One sample per key of a mapping field; ``keys`` splits a key into label values."""

    def samples(gpu: GpuSnapshot) -> Iterable[Sample]:
        values: Mapping[str, object] | None = getattr(gpu, field)
        if not values:
            return []
        out = []
        for key in sorted(values, key=natural):
            value = as_number(values[key])
            if value is not None:
                out.append((keys(key), value))
        return out

    return samples


def custom(field: str, sampler: Sampler) -> Callable[[GpuSnapshot], Iterable[Sample]]:
    """A declared sampler of the field's value; nothing when the field is None."""

    def samples(gpu: GpuSnapshot) -> Iterable[Sample]:
        value = getattr(gpu, field)
        return [] if value is None else sampler(value)

    return samples


def _sampler(field: str, spec: FieldSpec, metric: Metric) -> Callable[[GpuSnapshot], Iterable[Sample]]:
    if metric.samples is not None:
        return custom(field, metric.samples)
    if spec.mapping:
        return mapping(field, metric.keys) if metric.keys is not None else mapping(field)
    return scalar(field)


def gpu_rows() -> tuple[MetricRow, ...]:
    """Every per-GPU metric except gpumon_gpu_info and gpumon_gpu_up (built by the collector), in declaration order,
    each with all its samples (``MetricRow.served`` gives it as a set of opt-ins serves it).

    A family comes where its first field is declared; ``MetricPart`` fields add their label value to it.
    """
    families: dict[str, tuple[Metric, Tier, str]] = {}
    parts: dict[str, dict[str, str]] = {}
    for name, spec in field_specs():
        for metric in spec.metrics:
            if isinstance(metric, MetricPart):
                if metric.name not in parts:
                    raise ValueError(
                        f"{name}: MetricPart of {metric.name}, which no earlier field declares with label="
                    )
                parts[metric.name][metric.label] = name
                continue
            if metric.name in families:
                raise ValueError(f"{name}: {metric.name} is declared twice")
            families[metric.name] = (metric, spec.tier, name)
            if metric.label is not None:
                parts[metric.name] = {metric.label: name}
    rows = []
    specs = dict(field_specs())
    for metric, tier, field in families.values():
        if metric.name in parts:
            samples, fields = by_label(parts[metric.name]), tuple(parts[metric.name].values())
        else:
            samples, fields = _sampler(field, specs[field], metric), (field,)
        rows.append(
            MetricRow(
                metric.name,
                metric.kind,
                metric.help,
                tier,
                samples,
                metric.labels,
                fields=fields,
                read_every_seconds=metric.read_every_seconds,
                detail=metric.detail,
                keep=metric.keep,
            )
        )
    return tuple(rows)
