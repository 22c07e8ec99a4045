"""The alert service's metrics: ``gpumon_alerts``, ``gpumon_alerts_held_back`` and the
delivery self-metrics (notifications, queues, the sender threads' health, evaluation and spool
errors), as metric families for the exporter's collector."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from gpumon.alerts.alert import AlertCount
from gpumon.alerts.notify import Receiver
from gpumon.alerts.sender_health import STUCK_AFTER_BACKOFFS
from gpumon.model.families import Family
from gpumon.state.burn_marker import BurnHoldBack

MetricInputs = tuple[dict[AlertCount, int], list[Receiver], BurnHoldBack | None, int, int, int]
"""Active alerts counted, receivers, the burn hold-back (None when no burn runs), evaluation errors, spool write
errors, damaged parts of the spool found at start."""


class AlertCollector:
    """Gives gpumon_alerts, gpumon_alerts_held_back and the delivery self-metrics."""

    def __init__(self, inputs: Callable[[], MetricInputs]) -> None:
        """``inputs``: the service's alerts, receivers, burn hold-back and error counts, read
        under its lock."""
        self._inputs = inputs

    def families(self) -> Iterator[Family]:
        alert_counts, receivers, burn, errors, spool_errors, spool_damaged = self._inputs()
        active = Family(
            "gpumon_alerts",
            "gauge",
            "Active alerts evaluated by gpumon (count per name, severity, state and GPU); "
            "state is pending, firing or suppressed (held back while gpumon burn runs on the GPU).",
            ("alertname", "severity", "state", "gpu", "uuid"),
        )
        counts: dict[tuple[str, str, str, str, str], int] = {}
        held: dict[tuple[str, str], int] = {}
        for a, n in alert_counts.items():
            state = "suppressed" if a.held_back else a.state
            key = (a.alertname, a.severity, state, a.gpu, a.uuid)
            counts[key] = counts.get(key, 0) + n
            if a.held_back:
                held[(a.gpu, a.uuid)] = held.get((a.gpu, a.uuid), 0) + n
        for key, n in sorted(counts.items()):
            active.add(key, n)
        yield active
        held_back = Family(
            "gpumon_alerts_held_back",
            "gauge",
            "Alerts of this GPU held back (not sent) because gpumon burn runs on it.",
            ("gpu", "uuid"),
        )
        if burn is not None:
            for gpu, uuid in sorted(held):
                held_back.add([gpu, uuid], held[(gpu, uuid)])
        yield held_back
        sent = Family(
            "gpumon_alert_notifications_total",
            "counter",
            "Alerts handed to a receiver by outcome: sent, failed (attempt to retry), dropped (refused 4xx), "
            "overflow (queue full).",
            ("receiver", "outcome"),
        )
        queue = Family(
            "gpumon_alert_queue_length", "gauge", "Alerts waiting to be delivered to a receiver.", ("receiver",)
        )
        for r in receivers:
            for outcome, n in sorted(r.stats.outcomes.items()):
                sent.add([r.name, outcome], n)
            queue.add([r.name], r.queue_length())
        yield sent
        yield queue
        yield from sender_families(receivers)
        evaluation_errors = Family(
            "gpumon_alert_evaluation_errors_total", "counter", "Alert evaluations that failed (a bug: see the log)."
        )
        evaluation_errors.add([], errors)
        yield evaluation_errors
        yield from spool_families(spool_errors, spool_damaged)


def spool_families(write_errors: int, damaged: int) -> list[Family]:
    """``gpumon_alert_spool_write_errors_total`` and ``gpumon_alert_spool_damaged_total``."""
    spool_write_errors = Family(
        "gpumon_alert_spool_write_errors_total",
        "counter",
        "Failed writes of the alert spool in the state directory.",
    )
    spool_write_errors.add([], write_errors)
    damaged_parts = Family(
        "gpumon_alert_spool_damaged_total",
        "counter",
        "Damaged parts of the alert spool found when gpumon started (a spool or engine section set aside, "
        "saved states or queued notifications dropped or given the start's time); gpumon started anyway.",
    )
    damaged_parts.add([], damaged)
    return [spool_write_errors, damaged_parts]


def sender_families(receivers: Sequence[Receiver]) -> list[Family]:
    """``gpumon_alert_sender_up``, ``…_errors_total`` and ``…_last_attempt_timestamp_seconds`` per receiver.

    Self metrics about the delivery threads; deliberately not part of ``/ready`` (a receiver
    that is down must not make the exporter unready)."""
    up = Family(
        "gpumon_alert_sender_up",
        "gauge",
        "1 when the receiver's sender thread runs and makes delivery attempts; 0 when it stopped or is stuck "
        f"(alerts queued and no attempt for {STUCK_AFTER_BACKOFFS} x (max_backoff + timeout) past its planned retry).",
        ("receiver",),
    )
    errors = Family(
        "gpumon_alert_sender_errors_total",
        "counter",
        "Unexpected errors the receiver's sender thread survived (a bug: see the log; logged once per distinct error).",
        ("receiver",),
    )
    last = Family(
        "gpumon_alert_sender_last_attempt_timestamp_seconds",
        "gauge",
        "Unix time of the sender thread's last delivery attempt (or its start).",
        ("receiver",),
    )
    for r in receivers:
        up.add([r.name], 1.0 if r.health().up else 0.0)
        errors.add([r.name], r.stats.errors)
        if r.stats.last_attempt_at is not None:
            last.add([r.name], r.stats.last_attempt_at)
    return [up, errors, last]
