"""One alert state to deliver, and the JSON bodies it travels in to Alertmanagers and webhooks.

* Alertmanager: ``POST <url>/api/v2/alerts`` with a JSON list of
  ``{labels, annotations, startsAt, endsAt, generatorURL}``. A firing alert's ``endsAt``
  is set at send time to ``now + valid_for`` (4 × resend interval, as Prometheus does), so
  Alertmanager resolves it by itself if gpumon disappears; a resolved alert carries
  ``endsAt`` in the past.
* Webhook: Alertmanager's webhook body (``version: "4"``, ``status``, ``receiver``,
  ``groupLabels``, ``commonLabels``, ``commonAnnotations``, ``externalURL``, ``alerts[]``);
  each alert also carries ``notificationID``, the same whenever the same alert state is sent
  again (after a restart too), for a receiver to deduplicate.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

MAX_TIMESTAMP_SECONDS = 253_402_300_799.0
"""9999-12-31T23:59:59Z, the last second RFC 3339 (and Python's datetime) can write."""


def is_time(seconds: object) -> bool:
    """Whether ``seconds`` is Unix seconds an alert can carry: a finite number from 0 to year 9999."""
    return (
        isinstance(seconds, (int, float))
        and not isinstance(seconds, bool)
        and math.isfinite(seconds)
        and 0 <= seconds <= MAX_TIMESTAMP_SECONDS
    )


@dataclass(frozen=True)
class Notification:
    """One alert state to deliver (the latest one for its fingerprint)."""

    fingerprint: str
    status: str
    """firing | resolved."""
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: float
    """Unix seconds the alert fired."""
    ends_at: float | None = None
    """Unix seconds it resolved; None while firing (set at send time)."""
    generator_url: str = ""

    @property
    def identity(self) -> str:
        """This notification's identity (32 hex digits): the same for the same alert state (fingerprint,
        status, start, end), also when a restart sends it again from the spool, so a webhook receiver can
        deduplicate (webhook bodies carry it as ``notificationID``)."""
        key = f"{self.fingerprint}\0{self.status}\0{self.starts_at!r}\0{self.ends_at!r}"
        return hashlib.sha256(key.encode("utf-8", errors="surrogatepass")).hexdigest()[:32]

    def to_json(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "status": self.status,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "starts_at": self.starts_at,
            "ends_at": self.ends_at,
            "generator_url": self.generator_url,
        }

    def time_problem(self) -> str | None:
        """Why this alert's times cannot be sent (NaN, Infinity, beyond year 9999), or None."""
        if not is_time(self.starts_at):
            return f"starts_at {self.starts_at!r} is not a time"
        if self.ends_at is not None and not is_time(self.ends_at):
            return f"ends_at {self.ends_at!r} is not a time"
        return None

    def with_times_clamped(self, now: float) -> Notification:
        """The same alert with a start or end time that is not a time replaced by ``now`` (Unix seconds)."""
        ends_at = self.ends_at if self.ends_at is None or is_time(self.ends_at) else now
        return replace(self, starts_at=self.starts_at if is_time(self.starts_at) else now, ends_at=ends_at)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Notification:
        """The notification a spool entry holds (its times as they are: see ``time_problem``);
        raises KeyError, TypeError or ValueError for an entry that is not one."""
        return cls(
            fingerprint=str(raw["fingerprint"]),
            status=str(raw["status"]),
            labels={str(k): str(v) for k, v in dict(raw["labels"]).items()},
            annotations={str(k): str(v) for k, v in dict(raw.get("annotations") or {}).items()},
            starts_at=float(raw["starts_at"]),
            ends_at=None if raw.get("ends_at") is None else float(raw["ends_at"]),
            generator_url=str(raw.get("generator_url") or ""),
        )


def from_spool(raw_items: Iterable[Any], now: float) -> tuple[list[Notification], int, int]:
    """The notifications a spool's entries hold: (notifications, clamped, dropped). An entry whose
    start or end is not a time (NaN, Infinity, 1e20) gets ``now`` (Unix seconds) in its place
    (clamped); one that is not a notification at all is dropped."""
    out: list[Notification] = []
    clamped = dropped = 0
    for raw in raw_items:
        try:
            n = Notification.from_json(raw)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
            dropped += 1
            continue
        if n.time_problem() is not None:
            n = n.with_times_clamped(now)
            clamped += 1
        out.append(n)
    return out, clamped, dropped


def rfc3339(seconds: float) -> str:
    """Unix seconds -> ``2026-11-22T14:26:51.123Z``."""
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ends_at(n: Notification, now: float, valid_for: float) -> float:
    return n.ends_at if n.ends_at is not None else now + valid_for


def alertmanager_body(items: Sequence[Notification], now: float, valid_for: float) -> list[dict[str, Any]]:
    """The JSON list for ``POST /api/v2/alerts``."""
    out = []
    for n in items:
        alert: dict[str, Any] = {
            "labels": dict(n.labels),
            "annotations": dict(n.annotations),
            "startsAt": rfc3339(n.starts_at),
            "endsAt": rfc3339(_ends_at(n, now, valid_for)),
        }
        if n.generator_url:
            alert["generatorURL"] = n.generator_url
        out.append(alert)
    return out


def _common(maps: Iterable[Mapping[str, str]]) -> dict[str, str]:
    maps = list(maps)
    if not maps:
        return {}
    common = dict(maps[0])
    for m in maps[1:]:
        common = {k: v for k, v in common.items() if m.get(k) == v}
    return common


def webhook_body(
    items: Sequence[Notification], now: float, valid_for: float, receiver: str, external_url: str
) -> dict[str, Any]:
    """Alertmanager's webhook payload (version "4") for ``items``."""
    firing = any(n.status == "firing" for n in items)
    return {
        "version": "4",
        "groupKey": "{}:{}",
        "truncatedAlerts": 0,
        "status": "firing" if firing else "resolved",
        "receiver": receiver,
        "groupLabels": {},
        "commonLabels": _common(n.labels for n in items),
        "commonAnnotations": _common(n.annotations for n in items),
        "externalURL": external_url,
        "alerts": [
            {
                "status": n.status,
                "labels": dict(n.labels),
                "annotations": dict(n.annotations),
                "startsAt": rfc3339(n.starts_at),
                # Alertmanager sends the zero time for firing alerts in webhooks.
                "endsAt": rfc3339(n.ends_at) if n.ends_at is not None else "0001-01-01T00:00:00Z",
                "generatorURL": n.generator_url,
                "fingerprint": n.fingerprint,
                "notificationID": n.identity,
            }
            for n in items
        ],
    }


def replace_status(n: Notification, status: str, ends_at: float | None) -> Notification:
    """The same alert with another status and end time (Unix seconds; None while firing)."""
    return replace(n, status=status, ends_at=ends_at)
