"""``exporter.sources``: a switch and a time budget for each extra source (node_exporter's
``--collector.NAME`` / ``--no-collector.NAME``, with a time limit besides).

::

    exporter:
      sources:
        owner_energy: {enabled: true, budget_seconds: 1}   # gpumon_owner_energy_*, energy per job, pod, unit
        health: {enabled: true, budget_seconds: 1}         # gpumon_health_* series (the verdict itself runs on)
        burn: false                                        # gpumon_burn_*: the last burn's results
        host_figures: {budget_seconds: 0.5}                # gpumon_host_*: host CPU and memory (psutil)

A source turned off is not built: its series are not served and it has no ``gpumon_collector_success``
row. A source that takes longer than its budget is not waited for: the scrape (or the poll) goes on
without it, and its ``gpumon_collector_success`` row says 0 (see gpumon.util.budget).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gpumon.config.scalars import convert
from gpumon.util.yamlfile import brief

SOURCE_NAMES = ("owner_energy", "health", "burn", "host_figures")
"""The extra sources with a switch and a budget, by the name their ``gpumon_collector_success`` row has."""
SOURCE_KEYS = ("enabled", "budget_seconds")
DEFAULT_BUDGET_SECONDS = 1.0
MAX_BUDGET_SECONDS = 60.0


@dataclass(frozen=True)
class SourceSettings:
    """One extra source's switch and budget."""

    enabled: bool = True
    budget_seconds: float = DEFAULT_BUDGET_SECONDS
    """The longest a scrape or a poll waits for the source, seconds (0 < budget <= 60)."""


@dataclass(frozen=True)
class SourcesConfig:
    """``exporter.sources``: each extra source's settings."""

    owner_energy: SourceSettings = SourceSettings()
    """Energy per owner (gpumon.collect.energy): a store listener on the poll thread and a scrape source."""
    health: SourceSettings = SourceSettings()
    """The health verdict as series (gpumon_health_*), built once per snapshot on the poll thread."""
    burn: SourceSettings = SourceSettings()
    """The last gpumon burn's results and the running marker (gpumon_burn_*), read from the state directory."""
    host_figures: SourceSettings = SourceSettings()
    """The host's CPU and memory (gpumon_host_*), read by the poller every slow interval."""


def parse_sources(raw: Any, problems: list[str], where: str) -> SourcesConfig:
    """``exporter.sources`` (None: every source on, with the default budget); each problem one line."""
    if raw is None:
        return SourcesConfig()
    if not isinstance(raw, dict):
        problems.append(f"{where}: exporter.sources must be a mapping of {', '.join(SOURCE_NAMES)}, got {brief(raw)}")
        return SourcesConfig()
    settings: dict[str, SourceSettings] = {}
    for name, value in raw.items():
        if name not in SOURCE_NAMES:
            problems.append(
                f"{where}: unknown source exporter.sources.{_shown(name)} (known: {', '.join(SOURCE_NAMES)})"
            )
            continue
        settings[name] = _source(f"exporter.sources.{name}", value, problems, where)
    return SourcesConfig(**settings)


def _source(key: str, value: Any, problems: list[str], where: str) -> SourceSettings:
    """One source's value: true or false (its switch), or a mapping of ``enabled`` and ``budget_seconds``."""
    if value is None:
        return SourceSettings()
    if not isinstance(value, dict):
        enabled = convert(key, value, bool, problems, where)
        return SourceSettings(enabled=enabled is not False)
    for unknown in (k for k in value if k not in SOURCE_KEYS):
        problems.append(f"{where}: unknown key {key}.{_shown(unknown)} (known: {', '.join(SOURCE_KEYS)})")
    enabled = convert(f"{key}.enabled", value.get("enabled", True), bool, problems, where)
    budget = convert(
        f"{key}.budget_seconds", value.get("budget_seconds", DEFAULT_BUDGET_SECONDS), float, problems, where
    )
    if budget is not None and not (0 < budget <= MAX_BUDGET_SECONDS and math.isfinite(budget)):
        problems.append(
            f"{where}: {key}.budget_seconds must be more than 0 and at most {MAX_BUDGET_SECONDS:g}, got {budget:g}"
        )
        budget = None
    return SourceSettings(
        enabled=enabled is not False,
        budget_seconds=DEFAULT_BUDGET_SECONDS if budget is None else budget,
    )


def _shown(key: Any) -> str:
    """A key as a problem line names it: as written when it is a short printable word, else briefly."""
    return key if isinstance(key, str) and key.isprintable() and len(key) <= 60 else brief(key)
