"""The ``alerting:`` section of the gpumon config, validated into a frozen AlertingConfig.

``parse(raw)`` never raises: it returns the config (or None when it has problems) and
every problem found, one line each, so ``gpumon check-config`` lists them all at once.
This module reads the section's top level and the receivers; one rule is read by
``gpumon.alerts.rule_config``, durations, numbers and URLs by ``gpumon.alerts.config_values``.

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

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumon.alerts.config_values import LABEL_RE, Problems, read_duration, url_problem
from gpumon.alerts.rule_config import RESERVED_LABELS, builtin_pack, builtin_with_overrides, default_builtin, parse_rule
from gpumon.alerts.rules import Rule
from gpumon.util.yamlfile import brief

MIN_RESEND_SECONDS = 30.0
MAX_RESEND_SECONDS = 180.0
MIN_RETRY_SECONDS = 0.001
MAX_BACKOFF_SECONDS = 3600.0
"""retry.initial_backoff and retry.max_backoff: 1ms to 1h."""
MAX_TIMEOUT_SECONDS = 300.0
"""retry.timeout (one HTTP request): 1ms to 5m."""
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


def _urls(raw: Any, key: str, p: Problems, http: dict[str, ReceiverHttp]) -> tuple[str, ...]:
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


def _receiver_http(item: Mapping[str, Any], url: Any, where: str, p: Problems) -> ReceiverHttp | None:
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


def parse(raw: Any) -> tuple[AlertingConfig | None, list[str]]:
    """Validate the ``alerting:`` mapping; None means defaults (built-in pack on, no receivers)."""
    p = Problems()
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        return None, ["alerting: must be a mapping"]
    for key in raw:
        if key not in _TOP_KEYS:
            p.add("", f"unknown key {brief(key)} (known: {', '.join(sorted(_TOP_KEYS))})")
    host_label, host = _host(raw, p)
    builtin_on, builtin, known = _builtin(raw, host_label, p)
    rules = _user_rules(raw, host_label, known, p)
    receiver_http: dict[str, ReceiverHttp] = {}
    alertmanagers = _urls(raw.get("alertmanagers"), "alertmanagers", p, receiver_http)
    webhooks = _urls(raw.get("webhooks"), "webhooks", p, receiver_http)
    resend = read_duration(raw, "resend_interval", 60.0, "", p, MIN_RESEND_SECONDS, MAX_RESEND_SECONDS)
    retry = _retry(raw, p)
    capacity, burn, external_url = _delivery(raw, p)
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


def _host(raw: Mapping[Any, Any], p: Problems) -> tuple[str, str | None]:
    """``host_label`` (a label name none of gpumon's own) and ``host`` (None: the machine's name)."""
    host_label = raw.get("host_label", "host")
    if not isinstance(host_label, str) or not LABEL_RE.match(host_label) or host_label in RESERVED_LABELS:
        p.add(
            "host_label",
            f"must be a label name other than {', '.join(sorted(RESERVED_LABELS))}, got {brief(host_label)}",
        )
        host_label = "host"
    host = raw.get("host")
    if host is not None and (not isinstance(host, str) or not host):
        p.add("host", f"must be a non-empty string, got {brief(host)}")
        host = None
    return host_label, host


def _builtin(raw: Mapping[Any, Any], host_label: str, p: Problems) -> tuple[bool, list[Rule], set[str]]:
    """``builtin_rules`` (on or off), the built-in rules after the ``builtin`` overrides, and the
    names of the shipped pack's rules."""
    builtin_on = raw.get("builtin_rules", True)
    if not isinstance(builtin_on, bool):
        p.add("builtin_rules", f"must be true or false, got {brief(builtin_on)}")
        builtin_on = True
    overrides = raw.get("builtin") or {}
    if not isinstance(overrides, dict):
        p.add("builtin", "must be a mapping of built-in rule names to false or overrides")
        overrides = {}
    pack = builtin_pack()
    known = {r["name"] for r in pack}
    for name in overrides:
        if name not in known:
            p.add("builtin", f"no built-in rule named {brief(name)} (known: {', '.join(sorted(known))})")
    builtin: list[Rule] = []
    if builtin_on and not overrides:
        builtin = list(default_builtin(host_label))
    elif builtin_on:
        builtin = builtin_with_overrides(pack, overrides, host_label, p)
    return builtin_on, builtin, known


def _user_rules(raw: Mapping[Any, Any], host_label: str, known: set[str], p: Problems) -> list[Rule]:
    """``rules``: the user's rules, each name used once (and by no built-in rule, ``known``)."""
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
    return rules


def _retry(raw: Mapping[Any, Any], p: Problems) -> RetryConfig:
    """``retry``: initial_backoff, max_backoff (not shorter) and one request's timeout."""
    retry_raw = raw.get("retry") or {}
    retry = RetryConfig()
    if not isinstance(retry_raw, dict):
        p.add("retry", "must be a mapping with initial_backoff, max_backoff, timeout")
    else:
        for key in retry_raw:
            if key not in ("initial_backoff", "max_backoff", "timeout"):
                p.add("retry", f"unknown key {key!r} (known: initial_backoff, max_backoff, timeout)")
        initial = read_duration(retry_raw, "initial_backoff", 0.5, "retry", p, MIN_RETRY_SECONDS, MAX_BACKOFF_SECONDS)
        maximum = read_duration(retry_raw, "max_backoff", 30.0, "retry", p, MIN_RETRY_SECONDS, MAX_BACKOFF_SECONDS)
        timeout = read_duration(retry_raw, "timeout", 5.0, "retry", p, MIN_RETRY_SECONDS, MAX_TIMEOUT_SECONDS)
        if maximum < initial:
            p.add("retry", "max_backoff must not be shorter than initial_backoff")
        retry = RetryConfig(initial, maximum, timeout)
    return retry


def _delivery(raw: Mapping[Any, Any], p: Problems) -> tuple[int, bool, Any]:
    """``queue_capacity`` (10 to 1000000 alerts), ``burn_hold_back`` and ``external_url``."""
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
    return capacity, burn, external_url
