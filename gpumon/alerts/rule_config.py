"""Alert rules from YAML: one rule mapping validated into a Rule, and the built-in pack with overrides.

``parse_rule`` checks one mapping of ``alerting.rules`` (or of the built-in pack) against
its kind's keys (``KIND_KEYS``) and adds every problem to the caller's ``Problems``;
``builtin_with_overrides`` applies ``alerting.builtin`` to the shipped pack.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from typing import Any

from gpumon.alerts.builtin import builtin_rules_raw
from gpumon.alerts.config_values import LABEL_RE, Problems, finite_number, read_duration
from gpumon.alerts.rules import (
    FINDING_SEVERITIES,
    FROM_FINDING,
    KINDS,
    OPS,
    SEVERITIES,
    Rule,
    default_burn_hold_back,
    field_problem,
    template_problems,
)
from gpumon.model.xid_catalog import MAX_XID, MIN_XID, xid_code
from gpumon.util.yamlfile import brief

RESERVED_LABELS = frozenset({"alertname", "severity", "gpu", "uuid", "link", "xid", "finding"})
"""Labels gpumon sets itself; rules may not override them (nor the host label)."""
MAX_FOR_SECONDS = 7 * 86400.0
"""for, keep_firing_for and hold: at most 168h (a week)."""
MIN_HOLD_SECONDS = 1.0
MAX_STALE_SECONDS = 86400.0
"""stale_snapshot rules: threshold more than 0, at most 86400 seconds."""
_KIND_RE = re.compile(r"^[a-z0-9_*]+$")

_RULE_KEYS = {
    "name",
    "kind",
    "field",
    "op",
    "threshold",
    "clear_threshold",
    "for",
    "keep_firing_for",
    "severity",
    "labels",
    "annotations",
    "burn_hold_back",
    "actions",
    "exclude_actions",
    "codes",
    "exclude_codes",
    "hold",
    "min_utilization",
    "kinds",
    "min_severity",
}
KIND_KEYS: Mapping[str, frozenset[str]] = {
    "threshold": frozenset({"field", "op", "threshold", "clear_threshold"}),
    "nvml_down": frozenset(),
    "stale_snapshot": frozenset({"threshold"}),
    "xid": frozenset({"actions", "exclude_actions", "codes", "exclude_codes", "hold"}),
    "ecc_uncorrectable": frozenset(),
    "nvlink_down": frozenset(),
    "pcie_degraded": frozenset({"min_utilization"}),
    "idle_with_memory": frozenset({"threshold"}),
    "finding": frozenset({"kinds", "min_severity"}),
}
_COMMON_KEYS = frozenset(
    {"name", "kind", "for", "keep_firing_for", "severity", "labels", "annotations", "burn_hold_back"}
)
_OVERRIDE_KEYS = (_RULE_KEYS - {"name", "kind", "field", "op"}) | {"enabled"}


def _str_map(raw: Any, what: str, where: str, p: Problems) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        p.add(where, f"{what} must be a mapping of names to strings, got {brief(raw)}")
        return {}
    out = {}
    for k, v in raw.items():
        if not isinstance(k, str) or not LABEL_RE.match(k) or k.startswith("__"):
            p.add(where, f"{what}: {brief(k)} is not a valid label name")
            continue
        if (
            isinstance(v, bool)
            or not isinstance(v, (str, int, float))
            or (isinstance(v, float) and not math.isfinite(v))
        ):
            p.add(where, f"{what}.{k} must be a string, got {brief(v)}")
            continue
        out[k] = str(v)
    return out


def _str_set(raw: Any, key: str, where: str, p: Problems) -> frozenset[str]:
    if raw is None:
        return frozenset()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(a, str) and a for a in items):
        p.add(where, f"{key} must be a list of strings")
        return frozenset()
    return frozenset(normalize_action(a) for a in items)


def _finding_kinds(raw: Any, where: str, p: Problems) -> frozenset[str]:
    """finding rules' ``kinds``: finding kinds as ``gpumon health --json`` names them; ``*`` matches any text."""
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items or not all(isinstance(k, str) and _KIND_RE.match(k) for k in items):
        p.add(
            where,
            "kinds must be a list of finding kinds (lower-case words with _, * matches any text; "
            f"e.g. [straggler, '*_trend']), got {brief(raw)}",
        )
        return frozenset()
    return frozenset(items)


def normalize_action(action: str) -> str:
    """``Reset GPU`` / ``reset-gpu`` -> ``reset_gpu``: catalog actions compared loosely."""
    return re.sub(r"[^a-z0-9]+", "_", action.strip().lower()).strip("_")


def _xid_codes(raw: Mapping[str, Any], key: str, where: str, p: Problems) -> frozenset[int]:
    """A list of XID numbers under ``key`` (a single number is accepted too)."""
    value = raw.get(key)
    if value is None:
        return frozenset()
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(c, int) and xid_code(c) is not None for c in items):
        p.add(
            where, f"{key} must be a list of XID codes (whole numbers from {MIN_XID} to {MAX_XID}), got {brief(value)}"
        )
        return frozenset()
    return frozenset(items)


def parse_rule(raw: Any, where: str, p: Problems, host_label: str, builtin: bool = False) -> Rule | None:
    """One rule mapping -> Rule, or None with its problems added."""
    if not isinstance(raw, dict):
        p.add(where, "each rule must be a mapping")
        return None
    before = len(p.items)
    name, kind, where = _name_and_kind(raw, where, p)
    field_name, op = _field_and_op(raw, kind, where, p)
    threshold = _threshold(raw, kind, where, p)
    clear = _clear_threshold(raw, op, threshold, where, p)
    severity, finding_kinds, min_severity = _severity_and_findings(raw, kind, where, p)
    labels, annotations = _labels_and_annotations(raw, host_label, where, p)
    burn = raw.get("burn_hold_back")
    if burn is not None and not isinstance(burn, bool):
        p.add(where, f"burn_hold_back must be true or false, got {brief(burn)}")
        burn = None
    codes = _xid_codes(raw, "codes", where, p)
    exclude_codes = _xid_codes(raw, "exclude_codes", where, p)
    min_util = _min_utilization(raw, where, p)
    for_seconds = read_duration(raw, "for", 0.0, where, p, 0.0, MAX_FOR_SECONDS)
    if kind == "xid" and raw.get("for"):
        p.add(where, "xid rules fire at once; 'for' does not apply (use hold)")
    keep = read_duration(raw, "keep_firing_for", 0.0, where, p, 0.0, MAX_FOR_SECONDS)
    hold = read_duration(raw, "hold", 300.0, where, p, MIN_HOLD_SECONDS, MAX_FOR_SECONDS)
    actions = _str_set(raw.get("actions"), "actions", where, p)
    exclude_actions = _str_set(raw.get("exclude_actions"), "exclude_actions", where, p)
    if len(p.items) > before or kind is None:
        return None
    return Rule(
        name=str(name),
        kind=str(kind),
        field=field_name if kind == "threshold" else None,
        op=op,
        threshold=threshold,
        clear_threshold=clear,
        for_seconds=for_seconds,
        keep_firing_for_seconds=keep,
        severity=str(severity),
        labels=labels,
        annotations=annotations,
        burn_hold_back=burn if burn is not None else default_burn_hold_back(kind, field_name),
        actions=actions,
        exclude_actions=exclude_actions,
        codes=codes,
        exclude_codes=exclude_codes,
        hold_seconds=hold,
        min_utilization_ratio=min_util,
        finding_kinds=finding_kinds,
        min_severity=str(min_severity),
        builtin=builtin,
    )


def _name_and_kind(raw: Mapping[Any, Any], where: str, p: Problems) -> tuple[str, str | None, str]:
    """The rule's name (``?`` when unusable), its kind (None when unknown) and ``where`` with the name
    in it; every key is checked against the kind's keys."""
    name = raw.get("name")
    if not isinstance(name, str) or not LABEL_RE.match(name):
        p.add(where, f"name must be a word of letters, digits and _ (it becomes alertname), got {brief(name)}")
        name = "?"
    else:
        where = f"{where}({name})"
    kind = raw.get("kind", "threshold")
    if kind not in KINDS:
        p.add(where, f"unknown kind {brief(kind)} (known: {', '.join(KINDS)})")
        kind = None
    for key in raw:
        if key not in _RULE_KEYS:
            p.add(where, f"unknown key {brief(key)}")
        elif kind is not None and key not in _COMMON_KEYS and key not in KIND_KEYS[kind]:
            p.add(where, f"key {brief(key)} does not apply to kind {kind}")
    return name, kind, where


def _field_and_op(raw: Mapping[Any, Any], kind: str | None, where: str, p: Problems) -> tuple[Any, Any]:
    """``field`` and ``op`` (each None when a threshold rule's is unusable)."""
    field_name = raw.get("field")
    op = raw.get("op")
    if kind == "threshold":
        if not isinstance(field_name, str):
            p.add(where, "threshold rules need field (e.g. temperature_celsius)")
            field_name = None
        else:
            problem = field_problem(field_name)
            if problem:
                p.add(where, problem)
        if not isinstance(op, str) or op not in OPS:
            p.add(where, f"op must be one of {' '.join(OPS)}, got {brief(op)}")
            op = None
    return field_name, op


def _threshold(raw: Mapping[Any, Any], kind: str | None, where: str, p: Problems) -> float | None:
    """``threshold`` of the kinds that take one (idle_with_memory's defaults to 0.3), in its kind's range."""
    threshold = None
    if kind in ("threshold", "stale_snapshot", "idle_with_memory"):
        defaults = {"threshold": None, "stale_snapshot": None, "idle_with_memory": 0.3}
        if raw.get("threshold") is None:
            threshold = defaults[kind]
            if threshold is None:
                p.add(where, f"{kind} rules need threshold")
        else:
            threshold = finite_number(raw["threshold"])
            if threshold is None:
                p.add(where, f"threshold must be a finite number or true/false, got {brief(raw['threshold'])}")
        if kind == "stale_snapshot" and threshold is not None and not 0 < threshold <= MAX_STALE_SECONDS:
            p.add(where, f"threshold must be more than 0 and at most {MAX_STALE_SECONDS:g} seconds, got {threshold:g}")
        if kind == "idle_with_memory" and threshold is not None and not 0 <= threshold <= 1:
            p.add(where, f"threshold (a utilization ratio) must be from 0 to 1, got {threshold:g}")
    return threshold


def _clear_threshold(raw: Mapping[Any, Any], op: Any, threshold: float | None, where: str, p: Problems) -> float | None:
    """``clear_threshold`` (hysteresis): on the clearing side of ``threshold`` for ``op``."""
    clear = None
    if raw.get("clear_threshold") is not None:
        clear = finite_number(raw["clear_threshold"])
        if clear is None:
            p.add(where, f"clear_threshold must be a finite number, got {brief(raw['clear_threshold'])}")
        elif op in ("==", "!="):
            p.add(where, "clear_threshold needs op > >= < or <=")
        elif threshold is not None and op in (">", ">=") and clear > threshold:
            p.add(where, f"clear_threshold {clear:g} must not be above threshold {threshold:g} for op {op}")
        elif threshold is not None and op in ("<", "<=") and clear < threshold:
            p.add(where, f"clear_threshold {clear:g} must not be below threshold {threshold:g} for op {op}")
    return clear


def _severity_and_findings(
    raw: Mapping[Any, Any], kind: str | None, where: str, p: Problems
) -> tuple[Any, frozenset[str], Any]:
    """``severity``, and a finding rule's ``kinds`` and ``min_severity``."""
    severity = raw.get("severity", "warning")
    if kind == "finding" and severity == FROM_FINDING:
        pass
    elif severity not in SEVERITIES:
        also = f" (or {FROM_FINDING} for finding rules)"
        p.add(where, f"severity must be one of {', '.join(SEVERITIES)}{also}, got {brief(severity)}")
    finding_kinds: frozenset[str] = frozenset()
    min_severity = raw.get("min_severity", "WARNING")
    if kind == "finding":
        finding_kinds = _finding_kinds(raw.get("kinds"), where, p)
        if min_severity not in FINDING_SEVERITIES:
            p.add(where, f"min_severity must be one of {', '.join(FINDING_SEVERITIES)}, got {brief(min_severity)}")
    return severity, finding_kinds, min_severity


def _labels_and_annotations(
    raw: Mapping[Any, Any], host_label: str, where: str, p: Problems
) -> tuple[dict[str, str], dict[str, str]]:
    """``labels`` (none of gpumon's own) and ``annotations`` (templates that render)."""
    labels = _str_map(raw.get("labels"), "labels", where, p)
    for k in labels:
        if k in RESERVED_LABELS or k == host_label:
            p.add(where, f"labels.{k} is set by gpumon and cannot be overridden")
    annotations = _str_map(raw.get("annotations"), "annotations", where, p)
    for k, text in annotations.items():
        for problem in template_problems(text):
            p.add(where, f"annotations.{k}: {problem}")
    return labels, annotations


def _min_utilization(raw: Mapping[Any, Any], where: str, p: Problems) -> float:
    """pcie_degraded rules' ``min_utilization`` ratio (default 0.5)."""
    min_util = 0.5
    if raw.get("min_utilization") is not None:
        value = finite_number(raw["min_utilization"])
        if value is None or isinstance(raw["min_utilization"], bool) or not 0 <= value <= 1:
            p.add(where, f"min_utilization must be a ratio from 0 to 1, got {brief(raw['min_utilization'])}")
        else:
            min_util = value
    return min_util


def _merge_override(base: dict[str, Any], override: Any, where: str, p: Problems) -> dict[str, Any] | None:
    """A built-in rule's raw mapping with an override applied; None when disabled."""
    if override is None or override is True:
        return base
    if override is False:
        return None
    if not isinstance(override, dict):
        p.add(where, "a built-in override must be true, false or a mapping of rule keys")
        return base
    for key in override:
        if key not in _OVERRIDE_KEYS:
            p.add(where, f"key {brief(key)} cannot be overridden (allowed: {', '.join(sorted(_OVERRIDE_KEYS))})")
    enabled = override.get("enabled", True)
    if not isinstance(enabled, bool):
        p.add(where, f"enabled must be true or false, got {brief(enabled)}")
    elif not enabled:
        return None
    merged = dict(base)
    for key, value in override.items():
        if key not in _OVERRIDE_KEYS or key == "enabled":
            continue
        if key in ("labels", "annotations") and isinstance(value, dict) and isinstance(base.get(key), dict):
            merged[key] = {**base[key], **value}
        else:
            merged[key] = value
    return merged


@functools.cache
def builtin_pack() -> tuple[Mapping[str, Any], ...]:
    """The shipped pack as raw mappings, read once (nothing here changes them: overrides make copies)."""
    return tuple(builtin_rules_raw())


@functools.lru_cache(maxsize=8)
def default_builtin(host_label: str) -> tuple[Rule, ...]:
    """The built-in rules without overrides (parsed once per host label: every config load needs them)."""
    p = Problems()
    return tuple(builtin_with_overrides(builtin_pack(), {}, host_label, p))


def builtin_with_overrides(
    pack: tuple[Mapping[str, Any], ...], overrides: Mapping[Any, Any], host_label: str, p: Problems
) -> list[Rule]:
    builtin: list[Rule] = []
    for base in pack:
        where = f"builtin.{base['name']}"
        merged = _merge_override(dict(base), overrides.get(base["name"]), where, p)
        if merged is not None:
            rule = parse_rule(merged, "builtin", p, host_label, builtin=True)
            if rule is not None:
                builtin.append(rule)
    return builtin
