"""Fast Prometheus text-format (0.0.4) rendering of plain metric families.

prometheus_client renders about 7 µs per sample on a small CPU; a host with many GPUs
has tens of thousands of samples. gpumon builds its own families as plain tuples and
renders them here with one prepared template per family, producing byte for byte what
``prometheus_client.generate_latest`` produces for the same data (tests check this).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest as _generate_latest
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Family:
    """One metric family: ``samples`` hold label values in the order of ``label_names``."""

    name: str
    """Sample name; for counters it ends in ``_total``."""
    kind: str
    help: str
    label_names: tuple[str, ...] = ()
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)
    plain_labels: bool = False
    """True when no label value can hold a backslash, quote or newline (indices, UUIDs, fixed
    names): rendering then skips escaping."""
    rendered: str | None = None
    """This family's text, once rendered; families of slow tiers are reused across scrapes."""
    rendered_openmetrics: str | None = None
    """The same in OpenMetrics text, once rendered (gpumon.exporter.openmetrics)."""

    def add(self, labels: Sequence[str], value: float) -> None:
        self.samples.append((tuple(labels), float(value)))

    @property
    def family_name(self) -> str:
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name

    def to_metric(self) -> Metric:
        """The same family as a prometheus_client Metric (for registries and OpenMetrics)."""
        return FamilyMetric(self)


class FamilyMetric(Metric):
    """A Family as a prometheus_client Metric, equal to the CounterMetricFamily or
    GaugeMetricFamily holding the same samples. Its ``samples`` are built only when read:
    gpumon.exporter.openmetrics renders ``family`` directly without them."""

    def __init__(self, family: Family) -> None:  # no super().__init__(): ``samples`` is built on first use
        self.family = family
        self.name = family.family_name
        self.documentation = family.help
        self.type = family.kind
        self.unit = ""

    def __getattr__(self, attr: str) -> Any:
        if attr != "samples":
            raise AttributeError(attr)
        fam = self.family
        name = fam.family_name + "_total" if fam.kind == "counter" else fam.name
        names = fam.label_names
        samples = [Sample(name, dict(zip(names, labels, strict=True)), value) for labels, value in fam.samples]
        self.__dict__["samples"] = samples
        return samples


def _escape_label(value: str) -> str:
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _template(fam: Family) -> str:
    """A str.format template that writes labels sorted by name, as prometheus_client does."""
    names = fam.label_names
    order = sorted(range(len(names)), key=lambda i: names[i])
    name = fam.name.replace("{", "{{").replace("}", "}}")
    if not names:
        return name + " {0}\n"
    value_slot = "{" + str(len(names)) + "}"
    return name + "{{" + ",".join(f'{names[i]}="{{{i}}}"' for i in order) + "}} " + value_slot + "\n"


def _escape_help_openmetrics(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render_openmetrics_family(fam: Family) -> str | None:
    """``fam`` in OpenMetrics text as prometheus_client writes it; None where this shortcut does not apply."""
    sample_name = fam.family_name + "_total" if fam.kind == "counter" else fam.name
    if sample_name != fam.name:
        return None
    out = [f"# HELP {fam.family_name} {_escape_help_openmetrics(fam.help)}\n# TYPE {fam.family_name} {fam.kind}\n"]
    _render_samples(fam, out, {})
    return "".join(out)


def _render_samples(fam: Family, out: list[str], formatted: dict[float, str]) -> None:
    template = _template(fam).format
    for labels, value in fam.samples:
        text = formatted.get(value)
        if text is None:
            text = formatted[value] = floatToGoString(value)  # type: ignore[no-untyped-call]
        if not fam.plain_labels:
            labels = tuple(_escape_label(v) for v in labels)
        out.append(template(*labels, text))


def render(families: Iterable[Family]) -> str:
    """Text exposition of ``families``, each with its HELP and TYPE lines."""
    out: list[str] = []
    formatted: dict[float, str] = {}
    for fam in families:
        if fam.rendered is not None:
            out.append(fam.rendered)
            continue
        out.append(f"# HELP {fam.name} {_escape_help(fam.help)}\n# TYPE {fam.name} {fam.kind}\n")
        _render_samples(fam, out, formatted)
    return "".join(out)


_PLAIN_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


class _One:
    def __init__(self, metric: Metric) -> None:
        self._metric = metric

    def collect(self) -> list[Metric]:
        return [self._metric]


def _plain_gauge(metric: Metric) -> bool:
    """A gauge with plain names and no timestamps: rendered here as generate_latest would."""
    if metric.type != "gauge" or not _PLAIN_NAME.match(metric.name):
        return False
    name = metric.name
    for sample in metric.samples:
        if sample.name != name or sample.timestamp is not None or sample.exemplar is not None:
            return False
        if not all(_PLAIN_NAME.match(k) for k in sample.labels):
            return False
    return True


def render_metrics(metrics: Iterable[Metric]) -> str:
    """Text exposition of prometheus_client Metric objects, byte for byte as ``generate_latest``
    (plain-named gauges here, several times faster; any other metric through prometheus_client)."""
    out: list[str] = []
    formatted: dict[float, str] = {}
    for metric in metrics:
        if isinstance(metric, FamilyMetric):
            out.append(render([metric.family]))
            continue
        if not _plain_gauge(metric):
            out.append(_generate_latest(_One(metric)).decode())
            continue
        name = metric.name
        out.append(f"# HELP {name} {_escape_help(metric.documentation)}\n# TYPE {name} gauge\n")
        for sample in metric.samples:
            value = sample.value
            text = formatted.get(value)
            if text is None:
                text = formatted[value] = floatToGoString(value)  # type: ignore[no-untyped-call]
            if sample.labels:
                labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(sample.labels.items()))
                out.append(f"{name}{{{labels}}} {text}\n")
            else:
                out.append(f"{name} {text}\n")
    return "".join(out)
