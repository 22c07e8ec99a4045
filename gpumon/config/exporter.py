"""The ``exporter:`` section of the config: what /metrics serves beyond the contract.

``parse_exporter`` validates the section (``compat*`` in gpumon.config.compat, ``detail`` in
gpumon.config.exporter_detail, ``sources`` in gpumon.config.exporter_sources); ``set_exporter`` lays a ``GPUMON_EXPORTER_*`` variable or a flag over it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumon.config.compat import parse_compat
from gpumon.config.exporter_detail import parse_detail
from gpumon.config.exporter_sources import SourcesConfig, parse_sources
from gpumon.config.scalars import convert
from gpumon.util.yamlfile import brief

EXPORTER_KEYS = ("processes", "compat", "compat_hostname_label", "compat_labels", "detail", "sources")


@dataclass(frozen=True)
class ExporterConfig:
    """What /metrics serves beyond the contract."""

    processes: bool = False
    """Per-process series (gpumon_process_*); off by default for cardinality."""
    compat: tuple[str, ...] = ()
    """Extra name sets; ``dcgm`` adds dcgm-exporter's DCGM_FI_* names (<= 4.8.x), ``dcgm-4.9`` 4.9's."""
    compat_hostname_label: str | None = None
    """``Hostname`` or ``hostname`` on every DCGM set; None: each set's own (dcgm: Hostname, dcgm-4.9: hostname)."""
    compat_labels: tuple[str, ...] = ()
    """Optional labels of the DCGM sets: nvml_version, serial, vbios_version (dcgm-exporter's label
    rows) and hpc_job (the Slurm job of the GPU's processes)."""
    detail: tuple[str, ...] = ()
    """Opt-ins to series the default leaves out (gpumon.model.fields.spec.DETAILS; ``all`` for every one):
    each NVLink link's series, every P2P row, topology, rows that say nothing happened, GPM profiling detail."""
    sources: SourcesConfig = field(default_factory=SourcesConfig)
    """A switch and a time budget for each extra source (energy per owner, health series, burn results,
    host figures)."""


def parse_exporter(raw: Any, problems: list[str], where: str) -> ExporterConfig:
    """The section (None: the defaults), each problem appended as one line."""
    if raw is None:
        return ExporterConfig()
    if not isinstance(raw, dict):
        problems.append(f"{where}: exporter must be a mapping with processes, compat and detail, got {brief(raw)}")
        return ExporterConfig()
    for key in raw:
        if key not in EXPORTER_KEYS:
            shown = key if isinstance(key, str) and key.isprintable() and len(key) <= 60 else brief(key)
            problems.append(f"{where}: unknown key exporter.{shown} (known: {', '.join(EXPORTER_KEYS)})")
    processes = convert("exporter.processes", raw.get("processes", False), bool, problems, where)
    compat, spelling, labels = parse_compat(raw, problems, where)
    detail = parse_detail(raw.get("detail", []), problems, where)
    sources = parse_sources(raw.get("sources"), problems, where)
    return ExporterConfig(
        processes=bool(processes),
        compat=compat,
        compat_hostname_label=spelling,
        compat_labels=labels,
        detail=detail,
        sources=sources,
    )


def set_exporter(values: dict[str, Any], key: str, value: Any) -> None:
    """An exporter setting from the environment or a flag over the file's section (a broken section
    stays as it is, to be reported)."""
    section = values.get("exporter")
    if section is None or isinstance(section, dict):
        values["exporter"] = {**(section or {}), key: value}


def set_exporter_checked(
    values: dict[str, Any], settings: Mapping[str, Any], where: str, names: Mapping[str, str], problems: list[str]
) -> None:
    """Exporter settings from the environment or the command line (``where``) over the file's section.
    A problem they bring is theirs: said as ``where: --compat: unknown mode ...`` (``names``: key ->
    how the user gave it), not as the file's, and they are then left out."""
    before: list[str] = []
    parse_exporter(values.get("exporter"), before, "")
    trial = dict(values)
    for key, value in settings.items():
        set_exporter(trial, key, value)
    after: list[str] = []
    parse_exporter(trial.get("exporter"), after, "")
    brought = [p for p in after if p not in before]
    if not brought:
        values["exporter"] = trial.get("exporter")
        return
    for problem in brought:
        text = problem.removeprefix(": ")
        for key in sorted(names, key=len, reverse=True):
            text = text.replace(f"exporter.{key}", names[key])
        problems.append(f"{where}: {text}")
