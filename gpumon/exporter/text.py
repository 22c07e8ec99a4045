"""Fast Prometheus text-format (0.0.4) rendering of plain metric families.

prometheus_client renders about 7 µs per sample on a small CPU; a host with many GPUs
has tens of thousands of samples. gpumon builds its own families as plain tuples and
renders them here with one prepared template per family, producing byte for byte what
``prometheus_client.generate_latest`` produces for the same data (tests check this).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
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
    rendered: str | None = None
    """This family's text, once rendered; families of slow tiers are reused across scrapes."""
    """True when no label value can hold a backslash, quote or newline (indices, UUIDs, fixed
    names): rendering then skips escaping."""

    def add(self, labels: Sequence[str], value: float) -> None:
        self.samples.append((tuple(labels), float(value)))

    @property
    def family_name(self) -> str:
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name

    def to_metric(self) -> Metric:
        """The same family as a prometheus_client Metric (for registries and OpenMetrics)."""
        cls = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        metric = cls(self.family_name, self.help, labels=list(self.label_names))
        for labels, value in self.samples:
            metric.add_metric(list(labels), value)
        return metric


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


def render(families: Iterable[Family]) -> str:
    """Text exposition of ``families``, each with its HELP and TYPE lines."""
    out: list[str] = []
    formatted: dict[float, str] = {}
    for fam in families:
        if fam.rendered is not None:
            out.append(fam.rendered)
            continue
        out.append(f"# HELP {fam.name} {_escape_help(fam.help)}\n# TYPE {fam.name} {fam.kind}\n")
        template = _template(fam).format
        for labels, value in fam.samples:
            text = formatted.get(value)
            if text is None:
                text = formatted[value] = floatToGoString(value)  # type: ignore[no-untyped-call]
            if not fam.plain_labels:
                labels = tuple(_escape_label(v) for v in labels)
            out.append(template(*labels, text))
    return "".join(out)
