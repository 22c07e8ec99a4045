"""One alert's life inside the engine: its mutable state, the Alert it shows, its form in the spool.

The engine keeps one ``AlertState`` per rule and target while the alert is pending or firing;
``to_alert`` makes the Alert (labels, rendered annotations, fingerprint) the callers see, and
``state_json`` / ``state_from_json`` carry a state through the spool across a restart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpumon.alerts.alert import Alert, Target, fingerprint
from gpumon.alerts.notification import is_time
from gpumon.alerts.rules import FROM_FINDING, Rule, format_value, render


@dataclass
class AlertState:
    """Mutable life of one alert inside the engine."""

    rule: str
    target: Target
    state: str
    active_since: float
    fired_at: float | None = None
    last_true_at: float = 0.0
    value: float | None = None
    context: dict[str, str] = field(default_factory=dict)
    last_event_at: float = 0.0
    count: int = 0
    held_back: str | None = None


def severity_of(st: AlertState, rule: Rule | None) -> str:
    """The alert's severity: its rule's, or its finding's for a rule that takes it from the finding."""
    severity = rule.severity if rule else "warning"
    if severity == FROM_FINDING:
        return st.context.get("finding_severity", "warning")
    return severity


def to_alert(st: AlertState, rule: Rule | None, host: str, host_label: str, ended_at: float | None = None) -> Alert:
    """The Alert ``st`` shows on ``host`` (labelled ``host_label``); ``ended_at``: when it resolved (Unix seconds)."""
    severity = severity_of(st, rule)
    labels = {"alertname": st.rule, "severity": severity, host_label: host}
    labels.update({k: v for k, v in st.target if v != ""})
    if rule is not None:
        labels.update(rule.labels)
    values = {
        "alertname": st.rule,
        "severity": severity,
        "host": host,
        "gpu": "",
        "uuid": "",
        "value": format_value(st.value, rule.field if rule else None),
        "threshold": format_value(rule.threshold, rule.field) if rule else "",
        "field": (rule.field or "") if rule else "",
        **dict(st.target),
        **st.context,
    }
    templates = dict(rule.annotations) if rule else {}
    templates.setdefault("summary", "{{ alertname }} on {{ host }} GPU {{ gpu }}: {{ detail }}")
    annotations = {k: render(v, values).strip() for k, v in templates.items()}
    if st.held_back:
        annotations["held_back"] = st.held_back
    return Alert(
        fingerprint=fingerprint(labels),
        alertname=st.rule,
        severity=severity,
        state=st.state,
        labels=labels,
        annotations=annotations,
        active_since=st.active_since,
        starts_at=st.fired_at,
        ends_at=ended_at,
        value=st.value,
        held_back=st.held_back,
    )


def state_json(st: AlertState) -> dict[str, Any]:
    """``st`` as JSON-ready data for the spool (times in the engine's seconds)."""
    return {
        "rule": st.rule,
        "target": [list(p) for p in st.target],
        "state": st.state,
        "active_since": st.active_since,
        "fired_at": st.fired_at,
        "last_true_at": st.last_true_at,
        "value": st.value,
        "context": st.context,
        "last_event_at": st.last_event_at,
        "count": st.count,
    }


def state_from_json(item: Any) -> AlertState | None:
    """A state saved by ``state_json``; None when it is damaged (a field missing, a time that is NaN or Infinity)."""
    try:
        target: Target = tuple((str(k), str(v)) for k, v in item["target"])
        st = AlertState(
            rule=str(item["rule"]),
            target=target,
            state=str(item["state"]),
            active_since=float(item["active_since"]),
            fired_at=None if item.get("fired_at") is None else float(item["fired_at"]),
            last_true_at=float(item.get("last_true_at", 0.0)),
            value=None if item.get("value") is None else float(item["value"]),
            context={str(k): str(v) for k, v in dict(item.get("context") or {}).items()},
            last_event_at=float(item.get("last_event_at", 0.0)),
            count=int(item.get("count", 0)),
        )
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        return None
    if not all(t is None or is_time(t) for t in (st.active_since, st.fired_at, st.last_event_at)):
        return None
    return st
