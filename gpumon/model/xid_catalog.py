"""The XID catalog: what an XID code means, how bad it is and what to do first.

The data lives in ``xid_catalog.yaml`` next to this module (shipped with gpumon);
``config.xid_catalog`` overrides or extends it per code. A code in neither gets a
neutral default (warning, investigate) so an unknown XID is never dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import yaml

from gpumon.util.yamlfile import brief

SEVERITIES = ("info", "warning", "critical")
ACTIONS = (
    "ignore",
    "restart_app",
    "reset_gpu",
    "reboot",
    "contact_support",
    "check_nvlink",
    "check_hardware",
    "follow_other_xid",
    "read_recovery_action",
    "update_software",
    "investigate",
)
"""The actions the shipped catalog uses. Overrides may name others (they are shown as given)."""

_FIELDS = ("meaning", "severity", "action")
_RELATION_FIELDS = ("follows", "escalate", "resolves", "nvidia", "differs")
"""Optional keys of the shipped catalog: for the health verdict (gpumon.health), and where the entry comes from."""


class XidCatalogError(ValueError):
    """The catalog or its overrides are invalid; ``problems`` lists each one."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class XidInfo:
    """What one XID code means."""

    code: int
    meaning: str
    severity: str
    """info, warning or critical."""
    action: str
    """The first thing an operator should do, e.g. restart_app, reset_gpu, reboot (see ACTIONS)."""
    known: bool = True
    """False when neither the shipped catalog nor the config knows the code."""
    follows: tuple[int, ...] | None = ()
    """Codes this XID is a consequence of (it defers to them); None means any other XID."""
    escalate: Escalation | None = None
    """How many of this XID in a window raise the recommended action."""
    resolves: tuple[int, ...] = ()
    """Codes whose fault (or warning) on the same GPU this XID resolves when it comes after them."""
    nvidia_bucket: str | None = None
    """NVIDIA's resolution bucket (immediate action) for the code, e.g. RESET_GPU; None when not recorded."""
    nvidia_source: str | None = None
    """Which of NVIDIA's documents (``XidCatalog.sources``) the bucket was read from."""
    differs: str | None = None
    """Why gpumon's severity or action differs from NVIDIA's bucket, where it does."""


@dataclass(frozen=True)
class Escalation:
    """``count`` of one XID on one GPU within ``window_seconds`` -> ``action`` (a rung of the health ladder)."""

    count: int
    window_seconds: float
    action: str


def unknown_xid(code: int) -> XidInfo:
    """The entry used for a code nobody described."""
    return XidInfo(code=code, meaning=f"unknown XID {code}", severity="warning", action="investigate", known=False)


MIN_XID = 1
MAX_XID = 65535
"""XID codes are positive whole numbers; NVIDIA's list stays far below 65535."""


def xid_code(raw: Any) -> int | None:
    """``79`` or ``"79"`` -> 79; None for anything that is not a whole number from MIN_XID to MAX_XID."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, str) and raw.strip().isascii() and raw.strip().isdigit() and len(raw.strip()) <= 5:
        raw = int(raw.strip())
    if isinstance(raw, int) and MIN_XID <= raw <= MAX_XID:
        return raw
    return None


def override_problems(overrides: Mapping[Any, Any], where: str = "xid_catalog") -> list[str]:
    """Every problem in ``overrides`` (code -> {meaning, severity, action}), as lines."""
    problems: list[str] = []
    seen: set[int] = set()
    for raw_code, entry in overrides.items():
        code = xid_code(raw_code)
        if code is None:
            problems.append(
                f"{where}: key {brief(raw_code)} is not an XID code (a whole number from {MIN_XID} to {MAX_XID})"
            )
            continue
        if code in seen:
            problems.append(f"{where}: XID {code} is given twice")
            continue
        seen.add(code)
        if not isinstance(entry, Mapping):
            problems.append(f"{where}.{code} must be a mapping with meaning, severity, action, got {brief(entry)}")
            continue
        for key, value in entry.items():
            if key not in _FIELDS:
                problems.append(f"{where}.{code}: unknown key {brief(key)} (meaning, severity, action)")
            elif not isinstance(value, str) or not value.strip():
                problems.append(f"{where}.{code}.{key} must be a non-empty string, got {brief(value)}")
            elif key == "severity" and value not in SEVERITIES:
                problems.append(f"{where}.{code}.severity must be one of {', '.join(SEVERITIES)}, got {brief(value)}")
    return problems


def normalize_overrides(overrides: Mapping[Any, Mapping[Any, Any]]) -> dict[int, dict[str, str]]:
    """Overrides that ``override_problems`` found no problem in, keyed by int code."""
    out: dict[int, dict[str, str]] = {}
    for raw_code, entry in overrides.items():
        code = xid_code(raw_code)
        if code is not None:
            out[code] = {str(k): str(v) for k, v in entry.items()}
    return out


@dataclass(frozen=True)
class XidCatalog:
    """Lookup of XID codes; build it with ``XidCatalog.load``."""

    entries: Mapping[int, XidInfo]
    sources: Mapping[str, str] = field(default_factory=dict)
    """The shipped catalog's sources (``nvidia.source`` of an entry -> which document, version and date)."""

    @classmethod
    def load(cls, overrides: Mapping[int, Mapping[str, str]] | None = None) -> XidCatalog:
        """The shipped catalog with ``overrides`` applied field by field.

        An override may give only some fields (``{79: {action: contact_support}}``);
        the others keep the shipped value. Raises XidCatalogError on bad overrides.
        """
        shipped, sources = _read_shipped()
        overrides = overrides or {}
        problems = override_problems(overrides)
        if problems:
            raise XidCatalogError(problems)
        entries = dict(shipped)
        for code, entry in normalize_overrides(overrides).items():
            base = entries.get(code, unknown_xid(code))
            entries[code] = dataclasses.replace(
                base,
                meaning=str(entry.get("meaning", base.meaning)),
                severity=str(entry.get("severity", base.severity)),
                action=str(entry.get("action", base.action)),
                known=True,
            )
        return cls(entries=entries, sources=sources)

    def lookup(self, code: int) -> XidInfo:
        """The entry for ``code``; a default (warning, investigate) for an unknown code."""
        return self.entries.get(code) or unknown_xid(code)

    def codes(self) -> list[int]:
        return sorted(self.entries)


def _read_shipped() -> tuple[dict[int, XidInfo], dict[str, str]]:
    text = resources.files("gpumon.model").joinpath("xid_catalog.yaml").read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    if not isinstance(raw, dict):
        raise XidCatalogError(["shipped xid_catalog.yaml: top level must be a mapping"])
    sources = {str(k): str(v) for k, v in (raw.pop("_sources", None) or {}).items()}
    relations = {code: _relations(code, e) for code, e in raw.items() if isinstance(e, Mapping)}
    raw = {code: _without_relations(e) for code, e in raw.items()}
    problems = override_problems(raw, where="shipped xid_catalog.yaml")
    for code, entry in raw.items():
        if isinstance(entry, Mapping) and set(entry) != set(_FIELDS):
            problems.append(f"shipped xid_catalog.yaml: {code} must have exactly meaning, severity, action")
    if problems:
        raise XidCatalogError(problems)
    return {
        int(code): XidInfo(
            code=int(code), meaning=e["meaning"], severity=e["severity"], action=e["action"], **relations[code]
        )
        for code, e in raw.items()
    }, sources


def _without_relations(entry: Any) -> Any:
    if not isinstance(entry, Mapping):
        return entry
    return {k: v for k, v in entry.items() if k not in _RELATION_FIELDS}


def _relations(code: Any, entry: Mapping[str, Any]) -> dict[str, Any]:
    """``follows``, ``escalate``, ``resolves`` and the source fields of a shipped entry, as XidInfo's keyword
    arguments; a malformed one is a bug in the shipped file."""
    raw_follows = entry.get("follows", [])
    follows = None if raw_follows == "any" else tuple(int(c) for c in raw_follows)
    raw_escalate = entry.get("escalate")
    escalate = None
    if raw_escalate is not None:
        escalate = Escalation(
            count=int(raw_escalate["count"]),
            window_seconds=float(raw_escalate["window_seconds"]),
            action=str(raw_escalate["action"]),
        )
    nvidia = entry.get("nvidia") or {}
    return {
        "follows": follows,
        "escalate": escalate,
        "resolves": tuple(int(c) for c in entry.get("resolves", [])),
        "nvidia_bucket": str(nvidia["bucket"]) if "bucket" in nvidia else None,
        "nvidia_source": str(nvidia["source"]) if "source" in nvidia else None,
        "differs": str(entry["differs"]) if "differs" in entry else None,
    }
