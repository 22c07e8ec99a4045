"""A finding, the action ladder and the node verdict: the words every health output shares.

``gpumon health``, ``/api/health``, the ``gpumon_health_status`` series and Slurm drain
reasons all render the same findings, so they never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

OK = "OK"
WARNING = "WARNING"
CRITICAL = "CRITICAL"
UNKNOWN = "UNKNOWN"
STATUSES = (OK, WARNING, UNKNOWN, CRITICAL)
"""From best to worst: a CRITICAL finding outweighs not knowing something else."""

ACTIONS = ("none", "restart_job", "reset_gpu", "reboot_node", "inspect_hardware", "replace")
"""The ladder, from least to most invasive. A GPU's action (and the node's) is its worst finding's: the one
its reason names."""

ACTION_WORDS = {
    "none": "no action",
    "restart_job": "restart the job",
    "reset_gpu": "reset the GPU",
    "reboot_node": "reboot the node",
    "inspect_hardware": "inspect the hardware",
    "replace": "replace the GPU",
}

CATALOG_TO_LADDER = {
    "ignore": "none",
    "follow_other_xid": "none",
    "restart_app": "restart_job",
    "reset_gpu": "reset_gpu",
    "reboot": "reboot_node",
    "contact_support": "inspect_hardware",
    "check_hardware": "inspect_hardware",
    "check_nvlink": "inspect_hardware",
    "read_recovery_action": "reset_gpu",
    "update_software": "none",
    "investigate": "none",
    "replace": "replace",
}
"""The XID catalog's actions on the ladder (an action the catalog does not know maps to none)."""

LIFECYCLE_OF_ACTION = {
    "reset_gpu": "needs_reset",
    "reboot_node": "needs_reboot",
    "inspect_hardware": "needs_inspection",
    "replace": "needs_replacement",
}
"""The rungs of the ladder an XID fault stays open on, and the lifecycle each one puts its GPU in
(gpumon.health.xid_lifecycle)."""


def ladder_action(catalog_action: str) -> str:
    return CATALOG_TO_LADDER.get(catalog_action, catalog_action if catalog_action in ACTIONS else "none")


def worst_status(statuses: Sequence[str]) -> str:
    return max(statuses, key=STATUSES.index, default=OK)


def top_action(actions: Sequence[str]) -> str:
    return max(actions, key=ACTIONS.index, default="none")


@dataclass(frozen=True)
class Finding:
    """One thing wrong (or unknown) about a GPU, a link or the host."""

    kind: str
    """What was found, e.g. ``xid``, ``gpu_lost``, ``gpu_missing``, ``nvlink_down``, ``driver_changed``."""
    severity: str
    """WARNING, CRITICAL or UNKNOWN."""
    action: str
    """The recommended rung of ``ACTIONS``."""
    summary: str
    """One line for people, e.g. ``xid 79 fallen off the bus``."""
    gpu: int | None = None
    """The GPU index, or None for the host."""
    uuid: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
    """Values, times and source the finding rests on (JSON-ready)."""

    @property
    def subject(self) -> str:
        return f"GPU {self.gpu}" if self.gpu is not None else "node"

    def reason(self) -> str:
        """``GPU 1 xid 79 fallen off the bus: reboot node`` (a node's finding: ``node: 1 GPUs seen, 2 expected:
        reboot node``) — the line a drain reason and an alert show (no action part when the action is ``none``)."""
        said = f"{self.subject if self.gpu is not None else 'node:'} {self.summary}"
        if self.action == "none":
            return said
        return f"{said}: {ACTION_WORDS.get(self.action, self.action).replace(' the ', ' ')}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "action": self.action,
            "summary": self.summary,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "reason": self.reason(),
            "evidence": dict(self.evidence),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Finding:
        return cls(
            kind=str(raw["kind"]),
            severity=str(raw["severity"]),
            action=str(raw["action"]),
            summary=str(raw["summary"]),
            gpu=raw.get("gpu"),
            uuid=raw.get("uuid"),
            evidence=dict(raw.get("evidence") or {}),
        )


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's verdict: the worst of its findings."""

    index: int
    uuid: str | None
    status: str
    action: str
    reason: str
    """The worst finding's reason, or ``ok``."""


@dataclass(frozen=True)
class HealthReport:
    """The node verdict with the findings behind it."""

    status: str
    timestamp_seconds: float
    findings: tuple[Finding, ...]
    gpus: tuple[GpuHealth, ...]
    source: str = "local"
    """``daemon`` (asked /api/health) or ``local`` (polled NVML itself)."""

    @property
    def action(self) -> str:
        """The worst finding's action: the one the headline (``reason()``) names."""
        worst = self.worst()
        return "none" if worst is None else worst.action

    def worst(self) -> Finding | None:
        """The finding that decides the verdict (highest severity, then highest action)."""
        if not self.findings:
            return None
        return max(self.findings, key=lambda f: (STATUSES.index(f.severity), ACTIONS.index(f.action)))

    def reason(self) -> str:
        worst = self.worst()
        return "all GPUs healthy" if worst is None else worst.reason()

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "timestamp_seconds": self.timestamp_seconds,
            "action": self.action,
            "reason": self.reason(),
            "source": self.source,
            "findings": [f.to_json() for f in self.findings],
            "gpus": [
                {"gpu": g.index, "uuid": g.uuid, "status": g.status, "action": g.action, "reason": g.reason}
                for g in self.gpus
            ],
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any], source: str = "daemon") -> HealthReport:
        return cls(
            status=str(raw["status"]),
            timestamp_seconds=float(raw["timestamp_seconds"]),
            findings=tuple(Finding.from_json(f) for f in raw.get("findings") or []),
            gpus=tuple(
                GpuHealth(
                    index=int(g["gpu"]),
                    uuid=g.get("uuid"),
                    status=str(g["status"]),
                    action=str(g["action"]),
                    reason=str(g["reason"]),
                )
                for g in raw.get("gpus") or []
            ),
            source=source,
        )


def verdict_order(f: Finding) -> tuple[int, int, int]:
    """Where a finding stands in a report: the most severe first, then the strongest action, then by GPU
    (the host's first); findings that tie keep their order (``sorted`` is stable)."""
    return -STATUSES.index(f.severity), -ACTIONS.index(f.action), f.gpu if f.gpu is not None else -1


def verdict(
    findings: Sequence[Finding], gpus: Sequence[tuple[int, str | None]], timestamp_seconds: float, source: str
) -> HealthReport:
    """The node verdict from findings; ``gpus`` are the (index, uuid) known, each gets a row."""
    ordered = tuple(sorted(findings, key=verdict_order))
    known = dict(gpus)
    by_gpu: dict[int, list[Finding]] = {}  # each GPU's findings, in the verdict's order (one pass, not one a GPU)
    for f in ordered:
        if f.gpu is not None:
            by_gpu.setdefault(f.gpu, []).append(f)
            if f.gpu not in known:
                known[f.gpu] = f.uuid
    rows = []
    for index in sorted(known):
        mine = by_gpu.get(index, [])
        rows.append(
            GpuHealth(
                index=index,
                uuid=known[index],
                status=worst_status([f.severity for f in mine]),
                action=mine[0].action if mine else "none",  # the action its reason names
                reason=mine[0].reason() if mine else "ok",
            )
        )
    return HealthReport(
        status=worst_status([f.severity for f in ordered]),
        timestamp_seconds=timestamp_seconds,
        findings=ordered,
        gpus=tuple(rows),
        source=source,
    )
