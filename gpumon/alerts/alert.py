"""What the alert engine hands out: an Alert, its change of state, and Alertmanager's fingerprint.

Plain frozen data, so the service, the receivers, ``gpumon alerts`` and ``/api/alerts`` can use it
without the engine. The running burn that holds alerts back is gpumon.state.burn_marker.BurnHoldBack.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Target = tuple[tuple[str, str], ...]
"""Identity labels of one alert of a rule: (("gpu", "0"), ("uuid", "GPU-..."), ("link", "3"))."""


@dataclass(frozen=True)
class Alert:
    """One pending, firing or just resolved alert, as users and receivers see it."""

    fingerprint: str
    """Alertmanager's fingerprint of the label set (FNV-1a 64, hex)."""
    alertname: str
    severity: str
    state: str
    """pending | firing | resolved | inactive (a pending alert that never fired)."""
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    active_since: float
    """Unix seconds the condition started to hold."""
    starts_at: float | None
    """Unix seconds the alert fired (Alertmanager startsAt); None while pending."""
    ends_at: float | None
    """Unix seconds the alert resolved; None while active."""
    value: float | None
    held_back: str | None = None
    """Why it is not sent (``held back: gpumon burn running since ...``), or None."""

    @property
    def gpu(self) -> str:
        return self.labels.get("gpu", "")

    @property
    def uuid(self) -> str:
        return self.labels.get("uuid", "")

    def to_dict(self) -> dict[str, Any]:
        """JSON for /api/alerts."""
        return {
            "fingerprint": self.fingerprint,
            "alertname": self.alertname,
            "severity": self.severity,
            "state": self.state,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "active_since": self.active_since,
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
            "value": self.value,
            "held_back": self.held_back,
        }


@dataclass(frozen=True)
class AlertChange:
    """An alert moved from ``previous`` to ``alert.state``."""

    alert: Alert
    previous: str
    """inactive | pending | firing."""


def fingerprint(labels: Mapping[str, str]) -> str:
    """Alertmanager's label-set fingerprint: FNV-1a 64 over sorted name, 0xff, value, 0xff."""
    h = 0xCBF29CE484222325
    for name in sorted(labels):
        for part in (name.encode(), b"\xff", labels[name].encode(), b"\xff"):
            for byte in part:
                h ^= byte
                h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


@dataclass(frozen=True, slots=True)
class AlertCount:
    """What gpumon_alerts counts an active alert by."""

    alertname: str
    severity: str
    state: str
    """pending or firing"""
    gpu: str
    uuid: str
    held_back: bool
    """A burn holds it back (gpumon_alerts says ``suppressed``)."""
