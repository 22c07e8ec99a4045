"""The ``alerting:`` section of the gpumon config, validated into a frozen AlertingConfig.

``parse(raw)`` never raises: it returns the config (or None when it has problems) and
every problem found, one line each, so ``gpumon check-config`` lists them all at once.

.. code-block:: yaml

    alerting:
      builtin_rules: true            # the built-in pack (docs/alerting.md); false turns it all off
      builtin:                       # per built-in rule: false, or the keys to change
        GpuMemoryHigh: false
        GpuTemperatureNearSlowdown: {threshold: 3, for: 2m, severity: critical}
      rules:
        - name: GpuHot
          field: temperature_celsius
          op: ">"
          threshold: 85
          clear_threshold: 80        # hysteresis: stays firing until <= 80
          for: 1m
          keep_firing_for: 2m
          severity: warning
          labels: {team: ml}
          annotations: {summary: "GPU {{ gpu }} on {{ host }} is at {{ value }} °C"}
      alertmanagers: [http://alertmanager-1:9093, http://alertmanager-2:9093]
      webhooks:
        - http://hooks.example/gpumon
        - url: https://hooks.internal/gpu          # a mapping for TLS and auth options:
          ca_file: /etc/gpumon/hooks-ca.pem         #   CA bundle that signed the receiver's certificate
          cert_file: /etc/gpumon/client.pem         #   client certificate and key (mutual TLS)
          key_file: /etc/gpumon/client.key
          bearer_token_file: /etc/gpumon/hooks.token  # "Authorization: Bearer ...", re-read every send
      resend_interval: 1m            # 30s - 3m
      host_label: host
      host: gpu-node-17              # default: this machine's name
      retry: {initial_backoff: 500ms, max_backoff: 30s, timeout: 5s}
      queue_capacity: 1000
      burn_hold_back: true
      external_url: http://gpu-node-17:10480
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from gpumon.alerts.builtin import builtin_rules_raw
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
from gpumon.events.catalog import MAX_XID, MIN_XID, xid_code
from gpumon.yamlfile import brief

RESERVED_LABELS = frozenset({"alertname", "severity", "gpu", "uuid", "link", "xid", "finding"})
"""Labels gpumon sets itself; rules may not override them (nor the host label)."""
MIN_RESEND_SECONDS = 30.0
MAX_RESEND_SECONDS = 180.0
MAX_FOR_SECONDS = 7 * 86400.0
"""for, keep_firing_for and hold: at most 168h (a week)."""
MIN_HOLD_SECONDS = 1.0
MIN_RETRY_SECONDS = 0.001
MAX_BACKOFF_SECONDS = 3600.0
"""retry.initial_backoff and retry.max_backoff: 1ms to 1h."""
MAX_TIMEOUT_SECONDS = 300.0
"""retry.timeout (one HTTP request): 1ms to 5m."""
MAX_STALE_SECONDS = 86400.0
"""stale_snapshot rules: threshold more than 0, at most 86400 seconds."""

_DURATION_RE = re.compile(r"^(?:(\d+)h)?(?:(\d+)m(?!s))?(?:(\d+)s)?(?:(\d+)ms)?$")
_LABEL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
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
_KIND_KEYS: Mapping[str, frozenset[str]] = {
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
_TOP_KEYS = {
    "rules",
    "builtin_rules",
    "builtin",
    "alertmanagers",
    "webhooks",
    "resend_interval",
    "host_label",
    "host",
    "retry",
    "queue_capacity",
    "burn_hold_back",
    "external_url",
}


@dataclass(frozen=True)
class RetryConfig:
    """How a receiver that fails is retried: exponential backoff with jitter, for ever."""

    initial_backoff_seconds: float = 0.5
    max_backoff_seconds: float = 30.0
    timeout_seconds: float = 5.0
    """Connect and read timeout of one HTTP request."""


@dataclass(frozen=True)
class ReceiverHttp:
    """TLS and auth options of one receiver (basic auth goes in the URL: https://user:pass@host)."""

    ca_file: str | None = None
    """PEM bundle the receiver's certificate must chain to; None: the system's CAs."""
    cert_file: str | None = None
    """Client certificate (PEM) for mutual TLS, with ``key_file``."""
    key_file: str | None = None
    bearer_token_file: str | None = None
    """File holding a token sent as ``Authorization: Bearer <token>``; re-read on every send."""


_RECEIVER_KEYS = ("url", "ca_file", "cert_file", "key_file", "bearer_token_file")


@dataclass(frozen=True)
class AlertingConfig:
    """The validated ``alerting:`` section."""

    rules: tuple[Rule, ...] = ()
    """User rules."""
    builtin: tuple[Rule, ...] = ()
    """The built-in pack after per-rule overrides; empty when ``builtin_rules: false``."""
    builtin_rules: bool = True
    alertmanagers: tuple[str, ...] = ()
    """Alertmanager base URLs; alerts go to ``<url>/api/v2/alerts``."""
    webhooks: tuple[str, ...] = ()
    """Generic webhook URLs; they receive Alertmanager's webhook body (version "4")."""
    receiver_http: Mapping[str, ReceiverHttp] = field(default_factory=dict)
    """TLS and auth options by receiver URL, for the receivers given as a mapping."""
    resend_interval_seconds: float = 60.0
    """Firing alerts are re-sent to Alertmanagers this often (30 s - 3 min)."""
    host_label: str = "host"
    host: str | None = None
    """The host label's value; None means the machine's name (the daemon passes it)."""
    retry: RetryConfig = field(default_factory=RetryConfig)
    queue_capacity: int = 1000
    """Most alerts waiting per receiver; only the latest state of an alert is kept."""
    burn_hold_back: bool = True
    """Hold back temperature, power and utilization alerts of a GPU that gpumon burn runs on."""
    external_url: str = ""
    """gpumon's own URL, for generatorURL and the webhook externalURL."""

    def all_rules(self) -> tuple[Rule, ...]:
        """Built-in rules (after overrides) then user rules."""
        return self.builtin + self.rules


def parse_duration(value: Any) -> float | None:
    """Seconds from ``90``, ``1.5``, ``500ms``, ``30s``, ``5m``, ``1h``, ``1h30m``; None when not a duration.

    A duration too long for a float (``999...9h``) is ``math.inf``, for the caller's range check to reject."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if value < 0 else (float(value) if value < 2**63 else math.inf)
    if isinstance(value, float):
        return value if value >= 0 else None  # NaN fails the comparison too
    if not isinstance(value, str):
        return None
    m = _DURATION_RE.match(value.strip())
    if not m or not any(m.groups()):
        return None
    h, mi, s, ms = (float(g) if g else 0.0 for g in m.groups())  # float(): no limit on digits, overflow is inf
    return h * 3600.0 + mi * 60.0 + s + ms / 1000.0


def format_duration(seconds: float) -> str:
    """``90`` -> ``1m30s``: the inverse of parse_duration for whole milliseconds."""
    total_ms = round(seconds * 1000)
    if total_ms == 0:
        return "0s"
    h, rest = divmod(total_ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return "".join(f"{n}{u}" for n, u in ((h, "h"), (m, "m"), (s, "s"), (ms, "ms")) if n)


def url_problem(url: Any) -> str | None:
    """Why ``url`` is not an http(s) URL, or None."""
    if not isinstance(url, str) or not url:
        return f"URL must be a string, got {brief(url)}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"URL {brief(url)} is not valid: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"URL {brief(url)} must be http:// or https:// with a host"
    if any(c.isspace() for c in url):
        return f"URL {brief(url)} contains white space"
    del port
    return None


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, text: str) -> None:
        self.items.append(f"alerting.{where}: {text}" if where else f"alerting: {text}")


def _duration(
    raw: Mapping[str, Any], key: str, default: float, where: str, p: _Problems, low: float, high: float
) -> float:
    """``raw[key]`` in seconds, from ``low`` to ``high``; ``default`` (with a problem added) otherwise."""
    if key not in raw or raw[key] is None:
        return default
    seconds = parse_duration(raw[key])
    if seconds is None or not low <= seconds <= high:
        p.add(
            where,
            f"{key} must be a duration from {format_duration(low)} to {format_duration(high)} "
            f"(like 30s, 5m, 1h, or a number of seconds), got {brief(raw[key])}",
        )
        return default
    return seconds


def _number(value: Any) -> float | None:
    """A finite number (booleans as 1/0), or None."""
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:
            return None
        return number if math.isfinite(number) else None
    return None


def _str_map(raw: Any, what: str, where: str, p: _Problems) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        p.add(where, f"{what} must be a mapping of names to strings, got {brief(raw)}")
        return {}
    out = {}
    for k, v in raw.items():
        if not isinstance(k, str) or not _LABEL_RE.match(k) or k.startswith("__"):
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


def _str_set(raw: Any, key: str, where: str, p: _Problems) -> frozenset[str]:
    if raw is None:
        return frozenset()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(a, str) and a for a in items):
        p.add(where, f"{key} must be a list of strings")
        return frozenset()
    return frozenset(normalize_action(a) for a in items)


def _finding_kinds(raw: Any, where: str, p: _Problems) -> frozenset[str]:
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


def _xid_codes(raw: Mapping[str, Any], key: str, where: str, p: _Problems) -> frozenset[int]:
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


def parse_rule(raw: Any, where: str, p: _Problems, host_label: str, builtin: bool = False) -> Rule | None:
    """One rule mapping -> Rule, or None with its problems added."""
    if not isinstance(raw, dict):
        p.add(where, "each rule must be a mapping")
        return None
    before = len(p.items)
    name = raw.get("name")
    if not isinstance(name, str) or not _LABEL_RE.match(name):
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
        elif kind is not None and key not in _COMMON_KEYS and key not in _KIND_KEYS[kind]:
            p.add(where, f"key {brief(key)} does not apply to kind {kind}")

    field_name = raw.get("field")
    op = raw.get("op")
    threshold = None
    clear = None
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
    if kind in ("threshold", "stale_snapshot", "idle_with_memory"):
        defaults = {"threshold": None, "stale_snapshot": None, "idle_with_memory": 0.3}
        if raw.get("threshold") is None:
            threshold = defaults[kind]
            if threshold is None:
                p.add(where, f"{kind} rules need threshold")
        else:
            threshold = _number(raw["threshold"])
            if threshold is None:
                p.add(where, f"threshold must be a finite number or true/false, got {brief(raw['threshold'])}")
        if kind == "stale_snapshot" and threshold is not None and not 0 < threshold <= MAX_STALE_SECONDS:
            p.add(where, f"threshold must be more than 0 and at most {MAX_STALE_SECONDS:g} seconds, got {threshold:g}")
        if kind == "idle_with_memory" and threshold is not None and not 0 <= threshold <= 1:
            p.add(where, f"threshold (a utilization ratio) must be from 0 to 1, got {threshold:g}")
    if raw.get("clear_threshold") is not None:
        clear = _number(raw["clear_threshold"])
        if clear is None:
            p.add(where, f"clear_threshold must be a finite number, got {brief(raw['clear_threshold'])}")
        elif op in ("==", "!="):
            p.add(where, "clear_threshold needs op > >= < or <=")
        elif threshold is not None and op in (">", ">=") and clear > threshold:
            p.add(where, f"clear_threshold {clear:g} must not be above threshold {threshold:g} for op {op}")
        elif threshold is not None and op in ("<", "<=") and clear < threshold:
            p.add(where, f"clear_threshold {clear:g} must not be below threshold {threshold:g} for op {op}")

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
    labels = _str_map(raw.get("labels"), "labels", where, p)
    for k in labels:
        if k in RESERVED_LABELS or k == host_label:
            p.add(where, f"labels.{k} is set by gpumon and cannot be overridden")
    annotations = _str_map(raw.get("annotations"), "annotations", where, p)
    for k, text in annotations.items():
        for problem in template_problems(text):
            p.add(where, f"annotations.{k}: {problem}")
    burn = raw.get("burn_hold_back")
    if burn is not None and not isinstance(burn, bool):
        p.add(where, f"burn_hold_back must be true or false, got {brief(burn)}")
        burn = None
    codes = _xid_codes(raw, "codes", where, p)
    exclude_codes = _xid_codes(raw, "exclude_codes", where, p)
    min_util = 0.5
    if raw.get("min_utilization") is not None:
        value = _number(raw["min_utilization"])
        if value is None or isinstance(raw["min_utilization"], bool) or not 0 <= value <= 1:
            p.add(where, f"min_utilization must be a ratio from 0 to 1, got {brief(raw['min_utilization'])}")
        else:
            min_util = value
    for_seconds = _duration(raw, "for", 0.0, where, p, 0.0, MAX_FOR_SECONDS)
    if kind == "xid" and raw.get("for"):
        p.add(where, "xid rules fire at once; 'for' does not apply (use hold)")
    keep = _duration(raw, "keep_firing_for", 0.0, where, p, 0.0, MAX_FOR_SECONDS)
    hold = _duration(raw, "hold", 300.0, where, p, MIN_HOLD_SECONDS, MAX_FOR_SECONDS)
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


def _merge_override(base: dict[str, Any], override: Any, where: str, p: _Problems) -> dict[str, Any] | None:
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


def _urls(raw: Any, key: str, p: _Problems, http: dict[str, ReceiverHttp]) -> tuple[str, ...]:
    """Receiver URLs, each a string or a mapping with ``url`` and TLS/auth options (into ``http``)."""
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, (str, dict)) else raw
    if not isinstance(items, list):
        p.add("", f"{key} must be a list of URLs, got {brief(raw)}")
        return ()
    out = []
    for i, item in enumerate(items):
        options = None
        url = item
        if isinstance(item, dict):
            url = item.get("url")
            options = _receiver_http(item, url, f"{key}[{i}]", p)
        problem = url_problem(url)
        if problem:
            p.add(f"{key}[{i}]", problem)
        elif url in out:
            p.add(f"{key}[{i}]", f"{brief(url)} is listed twice")
        else:
            out.append(url)
            if options is not None:
                http[url] = options
    return tuple(out)


def _receiver_http(item: Mapping[str, Any], url: Any, where: str, p: _Problems) -> ReceiverHttp | None:
    for k in item:
        if k not in _RECEIVER_KEYS:
            p.add(where, f"unknown key {brief(k)} (known: {', '.join(_RECEIVER_KEYS)})")
    files: dict[str, str | None] = {}
    for k in _RECEIVER_KEYS[1:]:
        value = item.get(k)
        if value is None:
            files[k] = None
        elif not isinstance(value, str) or not value:
            p.add(where, f"{k} must be a file path, got {brief(value)}")
            files[k] = None
        elif "\0" in value or not os.path.isfile(value) or not os.access(value, os.R_OK):
            p.add(where, f"{k} {brief(value, 200)} is not a readable file")
            files[k] = None
        else:
            files[k] = value
    if (item.get("cert_file") is None) != (item.get("key_file") is None):
        p.add(where, "cert_file and key_file go together (a client certificate and its key)")
    uses_tls = any(item.get(k) is not None for k in ("ca_file", "cert_file", "key_file"))
    if uses_tls and isinstance(url, str) and not url.startswith("https://"):
        p.add(where, "ca_file, cert_file and key_file need an https:// URL")
    return ReceiverHttp(**files)


@functools.cache
def _builtin_pack() -> tuple[Mapping[str, Any], ...]:
    """The shipped pack as raw mappings, read once (nothing here changes them: overrides make copies)."""
    return tuple(builtin_rules_raw())


@functools.lru_cache(maxsize=8)
def _default_builtin(host_label: str) -> tuple[Rule, ...]:
    """The built-in rules without overrides (parsed once per host label: every config load needs them)."""
    p = _Problems()
    return tuple(_builtin_with_overrides(_builtin_pack(), {}, host_label, p))


def _builtin_with_overrides(
    pack: tuple[Mapping[str, Any], ...], overrides: Mapping[Any, Any], host_label: str, p: _Problems
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


def parse(raw: Any) -> tuple[AlertingConfig | None, list[str]]:
    """Validate the ``alerting:`` mapping; None means defaults (built-in pack on, no receivers)."""
    p = _Problems()
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        return None, ["alerting: must be a mapping"]
    for key in raw:
        if key not in _TOP_KEYS:
            p.add("", f"unknown key {brief(key)} (known: {', '.join(sorted(_TOP_KEYS))})")

    host_label = raw.get("host_label", "host")
    if not isinstance(host_label, str) or not _LABEL_RE.match(host_label) or host_label in RESERVED_LABELS:
        p.add(
            "host_label",
            f"must be a label name other than {', '.join(sorted(RESERVED_LABELS))}, got {brief(host_label)}",
        )
        host_label = "host"
    host = raw.get("host")
    if host is not None and (not isinstance(host, str) or not host):
        p.add("host", f"must be a non-empty string, got {brief(host)}")
        host = None

    builtin_on = raw.get("builtin_rules", True)
    if not isinstance(builtin_on, bool):
        p.add("builtin_rules", f"must be true or false, got {brief(builtin_on)}")
        builtin_on = True
    overrides = raw.get("builtin") or {}
    if not isinstance(overrides, dict):
        p.add("builtin", "must be a mapping of built-in rule names to false or overrides")
        overrides = {}
    pack = _builtin_pack()
    known = {r["name"] for r in pack}
    for name in overrides:
        if name not in known:
            p.add("builtin", f"no built-in rule named {brief(name)} (known: {', '.join(sorted(known))})")
    builtin: list[Rule] = []
    if builtin_on and not overrides:
        builtin = list(_default_builtin(host_label))
    elif builtin_on:
        builtin = _builtin_with_overrides(pack, overrides, host_label, p)

    rules: list[Rule] = []
    rules_raw = raw.get("rules") or []
    if not isinstance(rules_raw, list):
        p.add("rules", "must be a list of rules")
        rules_raw = []
    seen = set(known)
    for i, item in enumerate(rules_raw):
        rule = parse_rule(item, f"rules[{i}]", p, host_label)
        if rule is None:
            continue
        if rule.name in seen:
            what = "a built-in rule (change it under alerting.builtin)" if rule.name in known else "another rule"
            p.add(f"rules[{i}]({rule.name})", f"name is already used by {what}")
            continue
        seen.add(rule.name)
        rules.append(rule)

    receiver_http: dict[str, ReceiverHttp] = {}
    alertmanagers = _urls(raw.get("alertmanagers"), "alertmanagers", p, receiver_http)
    webhooks = _urls(raw.get("webhooks"), "webhooks", p, receiver_http)
    resend = _duration(raw, "resend_interval", 60.0, "", p, MIN_RESEND_SECONDS, MAX_RESEND_SECONDS)

    retry_raw = raw.get("retry") or {}
    retry = RetryConfig()
    if not isinstance(retry_raw, dict):
        p.add("retry", "must be a mapping with initial_backoff, max_backoff, timeout")
    else:
        for key in retry_raw:
            if key not in ("initial_backoff", "max_backoff", "timeout"):
                p.add("retry", f"unknown key {key!r} (known: initial_backoff, max_backoff, timeout)")
        initial = _duration(retry_raw, "initial_backoff", 0.5, "retry", p, MIN_RETRY_SECONDS, MAX_BACKOFF_SECONDS)
        maximum = _duration(retry_raw, "max_backoff", 30.0, "retry", p, MIN_RETRY_SECONDS, MAX_BACKOFF_SECONDS)
        timeout = _duration(retry_raw, "timeout", 5.0, "retry", p, MIN_RETRY_SECONDS, MAX_TIMEOUT_SECONDS)
        if maximum < initial:
            p.add("retry", "max_backoff must not be shorter than initial_backoff")
        retry = RetryConfig(initial, maximum, timeout)

    capacity = raw.get("queue_capacity", 1000)
    if isinstance(capacity, bool) or not isinstance(capacity, int) or not 10 <= capacity <= 1_000_000:
        p.add("queue_capacity", f"must be a whole number from 10 to 1000000, got {brief(capacity)}")
        capacity = 1000
    burn = raw.get("burn_hold_back", True)
    if not isinstance(burn, bool):
        p.add("burn_hold_back", f"must be true or false, got {brief(burn)}")
        burn = True
    external_url = raw.get("external_url", "")
    if external_url:
        problem = url_problem(external_url)
        if problem:
            p.add("external_url", problem)
            external_url = ""

    if p.items:
        return None, p.items
    return (
        AlertingConfig(
            rules=tuple(rules),
            builtin=tuple(builtin),
            builtin_rules=builtin_on,
            alertmanagers=alertmanagers,
            webhooks=webhooks,
            receiver_http=receiver_http,
            resend_interval_seconds=resend,
            host_label=host_label,
            host=host,
            retry=retry,
            queue_capacity=capacity,
            burn_hold_back=burn,
            external_url=str(external_url or ""),
        ),
        [],
    )
