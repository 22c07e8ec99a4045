"""Observations: what a rule sees on one target (a GPU, a link, an XID code, a finding or the host).

The engine turns each rule kind's observations into pending, firing and resolved alerts.
The snapshot kinds are observed in ``AlertEngine._observe`` (some need the engine's memory:
ECC baselines, links seen up); the finding and XID kinds need none and are here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from gpumon.alerts.alert import Target
from gpumon.alerts.rules import FINDING_SEVERITIES, Rule
from gpumon.model.findings import ACTION_WORDS, ACTIONS, STATUSES, Finding
from gpumon.model.snapshot import GpuSnapshot


@dataclass(frozen=True)
class Observation:
    """One rule's view of one target at one evaluation."""

    target: Target
    value: float | None
    fire: bool
    """The condition to become (or stay) pending / firing."""
    keep: bool
    """The condition to stay firing (hysteresis); equals ``fire`` without one."""
    context: Mapping[str, str] = field(default_factory=dict)


def gpu_target(gpu: GpuSnapshot, *extra: tuple[str, str]) -> Target:
    """The identity labels of a GPU's alert (gpu, uuid), then ``extra`` ones (link, ...)."""
    return (("gpu", str(gpu.index)), ("uuid", gpu.uuid), *extra)


def gpu_context(gpu: GpuSnapshot) -> dict[str, str]:
    """Template values every GPU alert has: the GPU's name and PCI bus id."""
    return {"name": gpu.name or "", "pci_bus_id": gpu.pci_bus_id or ""}


def finding_observations(rule: Rule, findings: Sequence[Finding]) -> list[Observation]:
    """One observation per (GPU or host, finding kind): the worst matching finding speaks for it."""
    least = FINDING_SEVERITIES.index(rule.min_severity)
    worst: dict[Target, Finding] = {}
    for f in findings:
        if not any(fnmatchcase(f.kind, k) for k in rule.finding_kinds) or f.severity not in FINDING_SEVERITIES[least:]:
            continue
        target: Target = (("finding", f.kind),)
        if f.gpu is not None:
            target = (("gpu", str(f.gpu)), ("uuid", f.uuid or ""), *target)
        old = worst.get(target)
        if old is None or _rank(f) > _rank(old):
            worst[target] = f
    return [
        Observation(
            target,
            None,
            True,
            True,
            {
                "detail": f.summary,
                "action": ACTION_WORDS.get(f.action, f.action),
                "finding_severity": f.severity.lower(),
            },
        )
        for target, f in worst.items()
    ]


def _rank(f: Finding) -> tuple[int, int]:
    return (STATUSES.index(f.severity), ACTIONS.index(f.action) if f.action in ACTIONS else 0)


def xid_matches(rule: Rule, code: int, action: str) -> bool:
    """Whether an xid rule fires for XID ``code`` whose catalog action is ``action``."""
    if code in rule.exclude_codes:
        return False
    if code in rule.codes:
        return True
    if action in rule.exclude_actions:
        return False
    if rule.actions:
        return action in rule.actions
    return not rule.codes
