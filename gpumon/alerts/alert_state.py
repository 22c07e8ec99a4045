"""One alert's life inside the engine: its mutable state, the Alert it shows, its form in the spool.

The engine keeps one ``AlertState`` per rule and target while the alert is pending or firing;
``to_alert`` makes the Alert (labels, rendered annotations, fingerprint) the callers see, and
``state_json`` / ``state_from_json`` carry a state through the spool across a restart.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    shown: Shown | None = field(default=None, repr=False, compare=False)
    """The Alert ``to_alert`` last made of this state (not saved in the spool)."""


@dataclass(frozen=True)
class Shown:
    """An Alert ``to_alert`` made, and what its annotations were rendered from: a firing alert is made
    again every poll (``notifiable``), its labels, fingerprint and text mostly as they were."""

    rule: Rule | None
    values: dict[str, str]
    """The templates' values (placeholder -> text)."""
    alert: Alert


def severity_of(st: AlertState, rule: Rule | None) -> str:
    """The alert's severity: its rule's, or its finding's for a rule that takes it from the finding."""
    severity = rule.severity if rule else "warning"
    if severity == FROM_FINDING:
        return st.context.get("finding_severity", "warning")
    return severity


def to_alert(st: AlertState, rule: Rule | None, host: str, host_label: str, ended_at: float | None = None) -> Alert:
    """The Alert ``st`` shows on ``host`` (labelled ``host_label``); ``ended_at``: when it resolved (Unix seconds).

    What did not change since the state's last Alert is taken from it: the same Alert when nothing did;
    else its labels with their fingerprint (FNV over every byte: ~6 µs) when they are equal, its
    annotations when the templates and their values are (no template rendered again)."""
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
    old = st.shown.alert if st.shown is not None else None
    same_text = st.shown is not None and st.shown.rule is rule and st.shown.values == values
    shown_labels: Mapping[str, str] = labels
    if old is not None and old.labels == labels:
        shown_labels, print_ = old.labels, old.fingerprint
        if same_text and (old.state, old.value, old.active_since, old.starts_at, old.ends_at, old.held_back) == (
            st.state,
            st.value,
            st.active_since,
            st.fired_at,
            ended_at,
            st.held_back,
        ):
            return old
    else:
        print_ = fingerprint(labels)
    if old is not None and same_text and old.held_back == st.held_back:
        annotations = old.annotations
    else:
        annotations = _annotations(rule, values, st.held_back)
    alert = Alert(
        fingerprint=print_,
        alertname=st.rule,
        severity=severity,
        state=st.state,
        labels=shown_labels,
        annotations=annotations,
        active_since=st.active_since,
        starts_at=st.fired_at,
        ends_at=ended_at,
        value=st.value,
        held_back=st.held_back,
    )
    st.shown = Shown(rule, values, alert)
    return alert


def _annotations(rule: Rule | None, values: dict[str, str], held_back: str | None) -> dict[str, str]:
    templates = dict(rule.annotations) if rule else {}
    templates.setdefault("summary", "{{ alertname }} on {{ host }} GPU {{ gpu }}: {{ detail }}")
    annotations = {k: render(v, values).strip() for k, v in templates.items()}
    if held_back:
        annotations["held_back"] = held_back
    return annotations


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
