"""gpumon's metric families for prometheus_client registries (``registry.register(MetricsOf(source))``).

The daemon renders its families itself (gpumon.exposition.text, gpumon.exposition.openmetrics) and
never imports this module; it is for code that puts gpumon's families into a prometheus_client
registry, and for the tests, which render the same families with prometheus_client as the
reference.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from gpumon.model.families import Family, FamilySource


class MetricsOf:
    """prometheus_client's collector interface over a family source:
    ``registry.register(MetricsOf(source))``."""

    def __init__(self, source: FamilySource) -> None:
        self._source = source

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> list[Metric]:
        return [FamilyMetric(family) for family in self._source.families()]


class FamilyMetric(Metric):
    """A Family as a prometheus_client Metric, equal to the CounterMetricFamily, GaugeMetricFamily
    or UnknownMetricFamily holding the same samples. Its ``samples`` are built only when read."""

    def __init__(self, family: Family) -> None:  # no super().__init__(): ``samples`` is built on first use
        self.family = family
        self.name = family.family_name
        self.documentation = family.help
        self.type = "unknown" if family.kind == "untyped" else family.kind
        self.unit = ""

    def __getattr__(self, attr: str) -> Any:
        if attr != "samples":
            raise AttributeError(attr)
        fam = self.family
        name = fam.family_name + "_total" if fam.kind == "counter" else fam.name
        names, optional = fam.label_names, fam.optional_labels
        samples = [
            Sample(
                name,
                {k: v for k, v in zip(names, labels, strict=True) if v or k not in optional},
                value,
            )
            for labels, value in fam.samples
        ]
        self.__dict__["samples"] = samples
        return samples
