"""The ``exporter.compat*`` settings: which dcgm-exporter name sets ``--compat`` serves, and how.

Names only (gpumon.exposition.dcgm_sets holds the sets themselves; a test keeps the two in step),
so reading a config imports nothing of the exporter.
"""

from __future__ import annotations

from typing import Any

from gpumon.util.yamlfile import brief

COMPAT_MODES = ("dcgm", "dcgm-4.9")
"""Name sets ``exporter.compat`` accepts: dcgm-exporter <= 4.8.x's names, 4.9's (DCGM 4.7) names."""
COMPAT_HOSTNAME_LABELS = ("Hostname", "hostname")
COMPAT_LABELS = ("nvml_version", "serial", "vbios_version", "hpc_job")
"""Optional labels of the DCGM sets (gpumon.exposition.dcgm_sets.COMPAT_LABELS)."""


def parse_compat(
    raw: dict[str, Any], problems: list[str], where: str
) -> tuple[tuple[str, ...], str | None, tuple[str, ...]]:
    """``compat``, ``compat_hostname_label`` and ``compat_labels`` of the exporter section; each
    problem appended as one line."""
    compat = _choices(raw, "compat", COMPAT_MODES, "mode", problems, where)
    labels = _choices(raw, "compat_labels", COMPAT_LABELS, "label", problems, where)
    spelling = raw.get("compat_hostname_label")
    if spelling is not None and spelling not in COMPAT_HOSTNAME_LABELS:
        problems.append(
            f"{where}: exporter.compat_hostname_label must be one of {', '.join(COMPAT_HOSTNAME_LABELS)},"
            f" got {brief(spelling)}"
        )
        spelling = None
    if (spelling is not None or labels) and not compat:
        problems.append(
            f"{where}: exporter.compat_hostname_label and compat_labels need exporter.compat (dcgm, dcgm-4.9)"
        )
    return compat, spelling, labels


def _choices(
    raw: dict[str, Any], key: str, known: tuple[str, ...], what: str, problems: list[str], where: str
) -> tuple[str, ...]:
    """A list setting of names out of ``known`` (a list, or a comma-separated string), in order, once each."""
    value = raw.get(key, [])
    if value is None:
        value = []
    if isinstance(value, str):
        value = [c.strip() for c in value.split(",") if c.strip()]
    chosen: list[str] = []
    if not isinstance(value, list):
        problems.append(f"{where}: exporter.{key} must be a list, got {brief(value)}")
        return ()
    for c in value:
        if not isinstance(c, str) or c not in known:
            problems.append(f"{where}: exporter.{key}: unknown {what} {brief(c)} (known: {', '.join(known)})")
        elif c not in chosen:
            chosen.append(c)
    return tuple(chosen)
