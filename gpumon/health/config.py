"""The ``health:`` section of gpumon.yaml (with ``health.slurm``), validated; every problem at once.

health:
  expected_gpu_count: 8            # else the recorded inventory's count
  sysfs_root: /sys
  defer_window_seconds: 60         # an XID that follows another within this defers to it
  transient_window_seconds: 3600   # how long a non-fatal XID shows as WARNING
  stuck_process_seconds: 300       # a process holding a GPU in D state this long is a finding
  xid_escalation:                  # per code; overrides the catalog's escalate
    48: {count: 3, window_seconds: 86400, action: replace}
  slurm:
    enabled: true                  # nothing is drained unless this is true
    node_name: gpu017              # default: $SLURMD_NODENAME, else the short host name
    partition: gpu                 # the breaker's partition (default: the node's partitions)
    max_drained_share: 0.25        # never let more than this share of the partition be unable to take work
    max_drained_nodes: 10          # ...nor more than this many nodes (the lower wins; default: no cap)
    bring_up: false                # true while nodes join at once: only drains count against the breaker
    reason_prefix: "gpumon:"
    sinfo: sinfo                   # reads the nodes (sinfo --json; scontrol show node -o without it)
    scontrol: scontrol             # drains and undrains
    timeout_seconds: 10            # each sinfo / scontrol call
    epilog_burn: false             # epilog: gpumon burn --quick on the job's GPUs when the job failed
    prolog_timeout_seconds: 5      # the prolog's own budget; not judged in time: UNKNOWN, the job goes through
    slurm_conf: /etc/slurm/slurm.conf  # SLURM_CONF for scontrol (slurmd gives HealthCheckProgram none)
  stragglers:                      # passive straggler detection (docs/early-signals.md)
    enabled: true
    window_seconds: 300
    busy_utilization_ratio: 0.8
    margin_ratio: 0.10
    persistence_ratio: 0.8
  trends:                          # error counters rising (docs/early-signals.md)
    enabled: true
    pcie_replays: {window_seconds: 60, max_increase: 8}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumon.health.stragglers import StragglerConfig
from gpumon.health.trends import DEFAULT_RULES, TrendRule, TrendsConfig
from gpumon.model.findings import ACTIONS
from gpumon.model.xid_catalog import Escalation
from gpumon.util.yamlfile import brief


@dataclass(frozen=True)
class SlurmConfig:
    enabled: bool = False
    node_name: str | None = None
    partition: str | None = None
    max_drained_share: float = 0.25
    max_drained_nodes: int | None = None
    """An absolute cap beside the share: never more than this many nodes unable to take work (the lower
    of the two wins); None: the share alone."""
    bring_up: bool = False
    """The cluster is being brought up (nodes joining at once): only drains count against the breaker,
    not nodes that are DOWN, NOT_RESPONDING or FUTURE while their slurmd registers."""
    reason_prefix: str = "gpumon:"
    scontrol: str = "scontrol"
    sinfo: str = "sinfo"
    timeout_seconds: float = 10.0
    epilog_burn: bool = False
    prolog_timeout_seconds: float = 5.0
    """``--slurm-prolog``: the whole run (from the process's start: daemon, poll, every sinfo / scontrol call)
    within this, well inside Slurm's default 10 s MessageTimeout; not judged in time: UNKNOWN, the job goes on."""
    slurm_conf: Path | None = None
    """Given to scontrol as SLURM_CONF (slurmd gives HealthCheckProgram none); None: the environment's,
    else scontrol's built-in default (/etc/slurm/slurm.conf)."""


@dataclass(frozen=True)
class HealthConfig:
    expected_gpu_count: int | None = None
    sysfs_root: Path | None = None
    """Where to look for GPUs on the PCI bus; None: /sys, except with simulated GPUs (not checked)."""
    boot_id_path: Path = Path("/proc/sys/kernel/random/boot_id")
    defer_window_seconds: float = 60.0
    transient_window_seconds: float = 3600.0
    poll_timeout_seconds: float = 20.0
    """gpumon health without a daemon: how long one poll of the GPUs may take before the verdict is CRITICAL."""
    stuck_process_seconds: float = 300.0
    """A process holding a GPU in uninterruptible sleep (D state) this long is a finding (gpumon.health.stuck_processes)."""
    xid_escalation: Mapping[int, Escalation] = field(default_factory=dict)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)
    trends: TrendsConfig = field(default_factory=TrendsConfig)


_HEALTH_KEYS = {
    "stragglers",
    "trends",
    "expected_gpu_count",
    "sysfs_root",
    "boot_id_path",
    "defer_window_seconds",
    "transient_window_seconds",
    "poll_timeout_seconds",
    "stuck_process_seconds",
    "xid_escalation",
    "slurm",
}


MAX_COUNT = 1_000_000
"""The largest count a health setting takes (GPUs on a node, XIDs before an escalation)."""
HIGHEST = {
    "expected_gpu_count": 4096,
    "defer_window_seconds": 86400.0,
    "transient_window_seconds": 30 * 86400.0,
    "poll_timeout_seconds": 3600.0,
    "stuck_process_seconds": 86400.0,
    "count": MAX_COUNT,
    "window_seconds": 30 * 86400.0,
    "timeout_seconds": 600.0,
    "prolog_timeout_seconds": 600.0,
    "max_drained_share": 1.0,
    "max_drained_nodes": 100_000,
}
"""Each number's largest value: finite and bounded (``.inf`` passed check-config and made ``gpumon
health`` exit 1, a WARNING to Nagios and a drain from an epilog), in check-config and run alike."""


def _number(raw: Mapping[str, Any], key: str, where: str, problems: list[str], *, integer: bool = False) -> Any:
    """``raw[key]`` as a number greater than 0 and at most ``HIGHEST[key]``, or None with a problem added."""
    value = raw[key]
    high = HIGHEST[key]
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not whole):
        problems.append(f"{where}.{key} must be {'an integer' if integer else 'a number'}, got {brief(value)}")
        return None
    if not (0 < value <= high):  # NaN fails both comparisons; inf and huge integers the second
        bounds = "a share between 0 and 1" if key == "max_drained_share" else f"greater than 0 and at most {high:g}"
        problems.append(f"{where}.{key} must be {bounds}, got {brief(value)}")
        return None
    return int(value) if integer else float(value)


def _string(raw: Mapping[str, Any], key: str, where: str, problems: list[str]) -> str | None:
    value = raw[key]
    if not isinstance(value, str) or not value.strip():
        problems.append(f"{where}.{key} must be a non-empty string, got {value!r}")
        return None
    return value


def parse_health(raw: Any, where: str = "health") -> tuple[HealthConfig, list[str]]:
    """The section (defaults when absent) and every problem found in it."""
    problems: list[str] = []
    if raw is None:
        return HealthConfig(), problems
    if not isinstance(raw, dict):
        return HealthConfig(), [f"{where} must be a mapping"]
    values: dict[str, Any] = {}
    for key in raw:
        if key not in _HEALTH_KEYS:
            problems.append(f"{where}: unknown key {key!r} ({', '.join(sorted(_HEALTH_KEYS))})")
    if "expected_gpu_count" in raw:
        values["expected_gpu_count"] = _number(raw, "expected_gpu_count", where, problems, integer=True)
    for key in ("defer_window_seconds", "transient_window_seconds", "poll_timeout_seconds", "stuck_process_seconds"):
        if key in raw:
            values[key] = _number(raw, key, where, problems)
    for key in ("sysfs_root", "boot_id_path"):
        if key in raw:
            text = _string(raw, key, where, problems)
            values[key] = Path(text) if text else None
    if "xid_escalation" in raw:
        values["xid_escalation"] = _parse_escalation(raw["xid_escalation"], f"{where}.xid_escalation", problems)
    slurm, slurm_problems = parse_slurm(raw.get("slurm"), f"{where}.slurm")
    problems.extend(slurm_problems)
    values["slurm"] = slurm
    values["stragglers"] = parse_stragglers(raw.get("stragglers"), f"{where}.stragglers", problems)
    values["trends"] = parse_trends(raw.get("trends"), f"{where}.trends", problems)
    values = {k: v for k, v in values.items() if v is not None}
    return HealthConfig(**values), problems


def _parse_escalation(raw: Any, where: str, problems: list[str]) -> dict[int, Escalation]:
    out: dict[int, Escalation] = {}
    if not isinstance(raw, dict):
        problems.append(f"{where} must map XID codes to {{count, window_seconds, action}}")
        return out
    for code, entry in raw.items():
        here = f"{where}.{code}"
        try:
            xid = int(code)
        except (TypeError, ValueError):
            problems.append(f"{where}: key {code!r} is not an integer XID code")
            continue
        if not isinstance(entry, dict):
            problems.append(f"{here} must be a mapping with count, window_seconds, action")
            continue
        for key in entry:
            if key not in ("count", "window_seconds", "action"):
                problems.append(f"{here}: unknown key {key!r} (count, window_seconds, action)")
        missing = [k for k in ("count", "window_seconds", "action") if k not in entry]
        if missing:
            problems.append(f"{here}: missing {', '.join(missing)}")
            continue
        count = _number(entry, "count", here, problems, integer=True)
        window = _number(entry, "window_seconds", here, problems)
        action = entry["action"]
        if action not in ACTIONS:
            problems.append(f"{here}.action must be one of {', '.join(ACTIONS)}, got {action!r}")
            continue
        if count is not None and window is not None:
            out[xid] = Escalation(count=count, window_seconds=window, action=str(action))
    return out


_SLURM_KEYS = {
    "enabled",
    "node_name",
    "partition",
    "max_drained_share",
    "max_drained_nodes",
    "bring_up",
    "reason_prefix",
    "scontrol",
    "sinfo",
    "timeout_seconds",
    "epilog_burn",
    "prolog_timeout_seconds",
    "slurm_conf",
}


def parse_slurm(raw: Any, where: str = "health.slurm") -> tuple[SlurmConfig, list[str]]:
    problems: list[str] = []
    if raw is None:
        return SlurmConfig(), problems
    if not isinstance(raw, dict):
        return SlurmConfig(), [f"{where} must be a mapping"]
    values: dict[str, Any] = {}
    for key in raw:
        if key not in _SLURM_KEYS:
            problems.append(f"{where}: unknown key {key!r} ({', '.join(sorted(_SLURM_KEYS))})")
    for key in ("enabled", "epilog_burn", "bring_up"):
        if key in raw:
            if isinstance(raw[key], bool):
                values[key] = raw[key]
            else:
                problems.append(f"{where}.{key} must be true or false, got {raw[key]!r}")
    for key in ("node_name", "partition", "reason_prefix", "scontrol", "sinfo"):
        if key in raw:
            values[key] = _string(raw, key, where, problems)
    for key in ("timeout_seconds", "prolog_timeout_seconds"):
        if key in raw:
            values[key] = _number(raw, key, where, problems)
    if "slurm_conf" in raw:
        text = _string(raw, "slurm_conf", where, problems)
        values["slurm_conf"] = Path(text) if text else None
    if "max_drained_share" in raw:
        values["max_drained_share"] = _number(raw, "max_drained_share", where, problems)
    if "max_drained_nodes" in raw:
        values["max_drained_nodes"] = _number(raw, "max_drained_nodes", where, problems, integer=True)
    values = {k: v for k, v in values.items() if v is not None}
    return SlurmConfig(**values), problems


def _ratio(raw: Mapping[str, Any], key: str, where: str, problems: list[str], up_to_1: bool) -> float | None:
    """A share: 0 < value <= 1 (``up_to_1``) or 0 < value < 1."""
    value = raw[key]
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (0 < value <= 1 if up_to_1 else 0 < value < 1)
    ):
        bound = "at most 1" if up_to_1 else "below 1"
        problems.append(f"{where}.{key} must be a number greater than 0 and {bound}, got {value!r}")
        return None
    return float(value)


def _bool(raw: Mapping[str, Any], key: str, where: str, problems: list[str]) -> bool | None:
    if isinstance(raw[key], bool):
        return bool(raw[key])
    problems.append(f"{where}.{key} must be true or false, got {raw[key]!r}")
    return None


MAX_WINDOW_SECONDS = 7 * 86400.0


def _window(raw: Mapping[str, Any], key: str, where: str, problems: list[str]) -> float | None:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= MAX_WINDOW_SECONDS:
        problems.append(f"{where}.{key} must be a number of seconds from 1 to {MAX_WINDOW_SECONDS:g}, got {value!r}")
        return None
    return float(value)


_STRAGGLER_KEYS = {"enabled", "window_seconds", "busy_utilization_ratio", "margin_ratio", "persistence_ratio"}


def parse_stragglers(raw: Any, where: str, problems: list[str]) -> StragglerConfig:
    if raw is None:
        return StragglerConfig()
    if not isinstance(raw, dict):
        problems.append(f"{where} must be a mapping")
        return StragglerConfig()
    values: dict[str, Any] = {}
    for key in raw:
        if key not in _STRAGGLER_KEYS:
            problems.append(f"{where}: unknown key {key!r} ({', '.join(sorted(_STRAGGLER_KEYS))})")
    if "enabled" in raw:
        values["enabled"] = _bool(raw, "enabled", where, problems)
    if "window_seconds" in raw:
        values["window_seconds"] = _window(raw, "window_seconds", where, problems)
    for key, up_to_1 in (("busy_utilization_ratio", True), ("margin_ratio", False), ("persistence_ratio", True)):
        if key in raw:
            values[key] = _ratio(raw, key, where, problems, up_to_1)
    return StragglerConfig(**{k: v for k, v in values.items() if v is not None})


def parse_trends(raw: Any, where: str, problems: list[str]) -> TrendsConfig:
    if raw is None:
        return TrendsConfig()
    if not isinstance(raw, dict):
        problems.append(f"{where} must be a mapping")
        return TrendsConfig()
    enabled = True
    rules = dict(DEFAULT_RULES)
    for key, entry in raw.items():
        here = f"{where}.{key}"
        if key == "enabled":
            enabled = bool(_bool(raw, "enabled", where, problems) is not False)
            continue
        if key not in DEFAULT_RULES:
            problems.append(f"{where}: unknown key {key!r} (enabled, {', '.join(sorted(DEFAULT_RULES))})")
            continue
        if not isinstance(entry, dict):
            problems.append(f"{here} must be a mapping with window_seconds and/or max_increase")
            continue
        for sub in entry:
            if sub not in ("window_seconds", "max_increase"):
                problems.append(f"{here}: unknown key {sub!r} (max_increase, window_seconds)")
        window = _window(entry, "window_seconds", here, problems) if "window_seconds" in entry else None
        limit = None
        if "max_increase" in entry:
            value = entry["max_increase"]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1e12:
                problems.append(f"{here}.max_increase must be a number from 0 to 1e+12, got {value!r}")
            else:
                limit = float(value)
        rules[key] = TrendRule(
            window_seconds=window if window is not None else DEFAULT_RULES[key].window_seconds,
            max_increase=limit if limit is not None else DEFAULT_RULES[key].max_increase,
        )
    return TrendsConfig(enabled=enabled, rules=rules)
