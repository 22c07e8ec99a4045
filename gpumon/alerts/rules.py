"""Alert rules: what a rule watches, and how its value, labels and annotations are computed.

A rule is plain frozen data (``Rule``). Its ``kind`` says what it watches:

* ``threshold`` — a GpuSnapshot field compared with a number: ``temperature_celsius > 85``.
  The field is a scalar field (``snapshot.numeric_field_names()``), a dotted key into a
  mapping field (``clocks_hertz.sm``, ``clock_events_active.hw_slowdown``,
  ``ecc_errors_total.uncorrected_volatile``, ``nvlink_errors_total.3.replay``) or a
  derived field (``DERIVED_FIELDS``: ``memory_used_ratio``, ...).
* ``nvml_down`` — the whole host: NVML could not be used in the last poll (no gpu label).
* ``stale_snapshot`` — the whole host: the latest snapshot is older than ``threshold`` seconds.
  Checked on a timer, because a hung poll publishes nothing.
* ``xid`` — XID events whose catalog action is in ``actions`` (and not in ``exclude_actions``)
  or whose code is in ``codes``; they fire at once and resolve ``hold`` after the last repeat.
* ``ecc_uncorrectable`` — volatile uncorrected ECC errors above 0, or the aggregate count
  grown since gpumon first saw the GPU.
* ``nvlink_down`` — an NVLink that gpumon saw up and that is now down; one alert per link.
* ``pcie_degraded`` — PCIe generation or width below the maximum while the GPU is busy
  (utilization at least ``min_utilization``): idle GPUs lower their link speed on purpose.
* ``idle_with_memory`` — utilization below ``threshold`` while compute processes hold memory.
* ``finding`` — a health finding (``gpumon health``) of one of ``kinds`` at ``min_severity`` or
  worse: one alert per GPU (or the host) and finding kind, while the finding lasts.

Nothing here keeps state; the engine (``engine.py``) does.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpumon.model.snapshot import GpuSnapshot, numeric_field_names
from gpumon.util.yamlfile import brief

OPS: Mapping[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
SEVERITIES = ("critical", "warning", "info")
KINDS = (
    "threshold",
    "nvml_down",
    "stale_snapshot",
    "xid",
    "ecc_uncorrectable",
    "nvlink_down",
    "pcie_degraded",
    "idle_with_memory",
    "finding",
)
FINDING_SEVERITIES = ("WARNING", "CRITICAL")
"""finding rules: ``min_severity`` values, from least to most severe (UNKNOWN findings never match)."""
FROM_FINDING = "from_finding"
"""finding rules: ``severity: from_finding`` gives each alert its finding's severity (lower case)."""
HOST_KINDS = frozenset({"nvml_down", "stale_snapshot"})
"""Kinds that watch the host, not one GPU: their alerts carry no gpu/uuid label."""

PLACEHOLDERS = (
    "alertname",
    "severity",
    "host",
    "gpu",
    "uuid",
    "name",
    "pci_bus_id",
    "value",
    "threshold",
    "field",
    "link",
    "xid",
    "action",
    "detail",
    "finding",
)
"""What an annotation template may use: ``{{ gpu }}`` and so on."""

_PLACEHOLDER_RE = re.compile(r"\{\{(.*?)\}\}")
_NAME_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*$")


def _memory_used_ratio(gpu: GpuSnapshot) -> float | None:
    if gpu.memory_used_bytes is None or not gpu.memory_total_bytes:
        return None
    return gpu.memory_used_bytes / gpu.memory_total_bytes


def _slowdown_margin(gpu: GpuSnapshot) -> float | None:
    if gpu.temperature_celsius is None or gpu.temperature_slowdown_threshold_celsius is None:
        return None
    return gpu.temperature_slowdown_threshold_celsius - gpu.temperature_celsius


def _process_count(gpu: GpuSnapshot) -> float | None:
    return None if gpu.processes is None else float(len(gpu.processes))


def _process_memory(gpu: GpuSnapshot) -> float | None:
    if gpu.processes is None:
        return None
    return float(sum(p.used_memory_bytes or 0 for p in gpu.processes))


DERIVED_FIELDS: Mapping[str, Callable[[GpuSnapshot], float | None]] = {
    "memory_used_ratio": _memory_used_ratio,
    "temperature_slowdown_margin_celsius": _slowdown_margin,
    "process_count": _process_count,
    "process_memory_bytes": _process_memory,
}
"""Fields computed from others: memory_used_ratio = used / total (0-1); temperature_slowdown_margin_celsius =
slowdown threshold - temperature (°C); process_count; process_memory_bytes (sum over compute processes)."""
DERIVED_FIELD_INPUTS: Mapping[str, tuple[str, ...]] = {
    "memory_used_ratio": ("memory_used_bytes", "memory_total_bytes"),
    "temperature_slowdown_margin_celsius": ("temperature_celsius", "temperature_slowdown_threshold_celsius"),
    "process_count": ("processes",),
    "process_memory_bytes": ("processes",),
}
"""The GpuSnapshot fields each derived field is computed from (and nothing else)."""

_MAPPING_FIELDS = frozenset(f.name for f in dataclasses.fields(GpuSnapshot) if f.metadata.get("mapping"))
_NESTED_MAPPING_FIELDS = frozenset({"nvlink_errors_total"})

HOLD_BACK_FIELD_PREFIXES = (
    "temperature",
    "memory_temperature",
    "power",
    "energy",
    "utilization",
    "memory_bandwidth_utilization",
    "memory_used",
    "memory_free",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "fp64_active",
    "fp32_active",
    "fp16_active",
    "fan_speed",
    "process_",
)
"""A user threshold rule on a field starting with one of these is held back during ``gpumon burn`` unless
the rule says ``burn_hold_back: false``: a burn-in heats, loads and fills the GPU on purpose."""


@dataclass(frozen=True)
class Rule:
    """One alert rule, validated (see ``gpumon.alerts.config``)."""

    name: str
    """The ``alertname`` label."""
    kind: str = "threshold"
    field: str | None = None
    """threshold rules: the snapshot field compared."""
    op: str | None = None
    threshold: float | None = None
    """threshold rules: the number compared with (booleans as 1/0); stale_snapshot: seconds;
    idle_with_memory: utilization ratio 0-1."""
    clear_threshold: float | None = None
    """Hysteresis: once firing, the alert stays firing until the value no longer passes this
    (e.g. fire above 85 °C, clear below 80 °C)."""
    for_seconds: float = 0.0
    """How long the condition must hold before pending becomes firing."""
    keep_firing_for_seconds: float = 0.0
    """How long a firing alert stays firing after its condition stops holding."""
    severity: str = "warning"
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    burn_hold_back: bool = False
    """Held back (not sent) for a GPU that ``gpumon burn`` is running on."""
    actions: frozenset[str] = frozenset()
    """xid rules: catalog actions that match (empty: any action not excluded)."""
    exclude_actions: frozenset[str] = frozenset()
    codes: frozenset[int] = frozenset()
    """xid rules: XID codes that match whatever their action."""
    exclude_codes: frozenset[int] = frozenset()
    """xid rules: XID codes that never match (another rule takes them)."""
    hold_seconds: float = 300.0
    """xid rules: how long an XID alert stays firing after the last event."""
    min_utilization_ratio: float = 0.5
    """pcie_degraded rules: only judge the link while utilization is at least this (0-1)."""
    finding_kinds: frozenset[str] = frozenset()
    """finding rules: the finding kinds that match (``straggler``, ``xid``, ...)."""
    min_severity: str = "WARNING"
    """finding rules: the least severe finding that matches (WARNING or CRITICAL)."""
    builtin: bool = False

    @property
    def host_level(self) -> bool:
        return self.kind in HOST_KINDS


def field_problem(name: str) -> str | None:
    """Why ``name`` cannot be used as a threshold field, or None when it can."""
    if name in DERIVED_FIELDS or name in numeric_field_names():
        return None
    base, dot, rest = name.partition(".")
    if dot and base in _MAPPING_FIELDS and rest:
        depth = rest.count(".") + 1
        want = 2 if base in _NESTED_MAPPING_FIELDS else 1
        if depth == want and all(rest.split(".")):
            return None
        return f"field {brief(name)}: {base} takes {want} key(s) after the dot"
    if name in _MAPPING_FIELDS:
        return f"field {name!r} is a mapping: name one key, e.g. {name}.<key>"
    return (
        f"unknown field {brief(name)} (use a numeric GpuSnapshot field, a {{mapping}}.<key>, or one of "
        + ", ".join(sorted(DERIVED_FIELDS))
        + ")"
    )


def field_reader(name: str) -> Callable[[GpuSnapshot], float | None]:
    """The function that reads threshold field ``name`` off a GPU as a float (booleans 1/0), or None
    when unknown: a plain field, else a derived one, else ``mapping.key`` (``mapping.key.key`` for
    nested ones). The name is taken apart once: rules read their field on every GPU at every poll."""
    derived = DERIVED_FIELDS.get(name)
    base, dot, rest = name.partition(".")
    keys = tuple(rest.split(".")) if dot else ()

    def read(gpu: GpuSnapshot) -> float | None:
        value: object = gpu.__dict__.get(name)  # a plain field: most rules
        if value is None:
            if derived is not None:
                value = derived(gpu)  # NaN or infinite from a NaN or infinite input: unknown, as a plain field's
            elif not dot:
                return None
            else:
                value = getattr(gpu, base, None)
                for key in keys:
                    if type(value) is not dict and not isinstance(value, Mapping):  # a dict: no ABC check
                        return None
                    value = value.get(key)
        if isinstance(value, bool):
            return 1.0 if value else 0.0
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
        return None

    return read


def default_burn_hold_back(kind: str, field_name: str | None) -> bool:
    """Whether a rule is held back during a burn when it does not say."""
    if kind == "idle_with_memory":
        return True
    if kind == "threshold" and field_name:
        return field_name.startswith(HOLD_BACK_FIELD_PREFIXES)
    return False


def template_problems(text: str) -> list[str]:
    """Why ``text`` is not a valid annotation template (empty list when it is)."""
    problems = []
    shown = brief(text)
    for match in _PLACEHOLDER_RE.finditer(text):
        m = _NAME_RE.match(match.group(1))
        if not m:
            problems.append(f"template {shown}: {brief(match.group(0))} is not a placeholder like {{{{ gpu }}}}")
        elif m.group(1) not in PLACEHOLDERS:
            problems.append(
                f"template {shown}: unknown placeholder {brief(m.group(1))} (known: {', '.join(PLACEHOLDERS)})"
            )
    rest = _PLACEHOLDER_RE.sub("", text)
    if "{{" in rest or "}}" in rest:
        problems.append(f"template {shown}: unbalanced '{{{{' or '}}}}'")
    return problems


def render(text: str, values: Mapping[str, str]) -> str:
    """Replace each ``{{ name }}`` with ``values[name]`` (empty when absent). No code runs."""

    def sub(match: re.Match[str]) -> str:
        m = _NAME_RE.match(match.group(1))
        return values.get(m.group(1), "") if m else match.group(0)

    return _PLACEHOLDER_RE.sub(sub, text)


def format_value(value: float | None, field_name: str | None = None) -> str:
    """A value for humans: 85 not 85.0, 0.934, 1.502e+11; booleans of bool fields as true/false."""
    if value is None:
        return ""
    if field_name is not None and _is_bool_field(field_name):
        return "true" if value else "false"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def _is_bool_field(name: str) -> bool:
    base = name.partition(".")[0]
    return base in ("clock_events_active", "nvlink_up") or name in _bool_fields()


@functools.cache
def _bool_fields() -> frozenset[str]:
    """GpuSnapshot's boolean fields (asked on every evaluation: dataclasses.fields costs ~8 µs)."""
    return frozenset(f.name for f in dataclasses.fields(GpuSnapshot) if f.type in ("bool", "bool | None"))


def finding_kinds(rules: Iterable[Rule]) -> frozenset[str]:
    """The finding kinds ``rules``' finding rules name (``*`` matches any text): the only findings they read."""
    return frozenset(kind for rule in rules if rule.kind == "finding" for kind in rule.finding_kinds)
