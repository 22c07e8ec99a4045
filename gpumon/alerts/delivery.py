"""What the receivers are told: which alert states are queued for them, and when.

An alert is announced when it fires and is not held back by a burn, and withdrawn (sent
resolved, ``endsAt`` = now) when it resolves or becomes held back. ``delivered`` is the
announced set (fingerprint -> the firing notification), kept by the service and saved in the
spool. Alertmanagers are told of every announced alert again every resend interval (webhooks
only on change).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

from gpumon.alerts.alert import Alert
from gpumon.alerts.notification import Notification, replace_status
from gpumon.alerts.notify import Receiver


def deliver(
    notifiable: Iterable[Alert],
    delivered: dict[str, Notification],
    receivers: Collection[Receiver],
    now: float,
    external_url: str,
    to_wall: Callable[[float], float],
) -> bool:
    """Announce newly firing alerts and withdraw those no longer firing; True when anything was queued.

    ``notifiable``: the alerts receivers are to know of now (the engine's); ``delivered`` is updated
    in place. ``now`` is the engine's time (seconds); ``to_wall`` turns it into the wall clock's."""
    current = {a.fingerprint: a for a in notifiable}
    queued = False
    generator = external_url.rstrip("/") + "/api/alerts" if external_url else ""
    for fp, alert in current.items():
        starts_at = to_wall(alert.starts_at if alert.starts_at is not None else now)
        old = delivered.get(fp)
        if old is not None and _same(old, alert, starts_at, generator):
            continue  # announced, and as it is: most firing alerts, most polls
        notification = Notification(
            fingerprint=fp,
            status="firing",
            labels=alert.labels,
            annotations=alert.annotations,
            starts_at=starts_at,
            generator_url=generator,
        )
        if old is None:
            _enqueue_all(receivers, notification, now)
            queued = True
        delivered[fp] = notification
    for fp in [fp for fp in delivered if fp not in current]:
        resolved = replace_status(delivered.pop(fp), "resolved", to_wall(now))
        _enqueue_all(receivers, resolved, now)
        queued = True
    return queued


def resend(
    delivered: Mapping[str, Notification], receivers: Iterable[Receiver], now: float, interval_seconds: float
) -> bool:
    """Queue the announced alerts again for each receiver that resends and last had them ``interval_seconds`` ago."""
    queued = False
    for receiver in receivers:
        if not receiver.resends:
            continue
        for fp, notification in delivered.items():
            last = receiver.last_enqueued(fp)
            if last is None or now - last >= interval_seconds:
                receiver.enqueue(notification, now)
                queued = True
    return queued


def _same(announced: Notification, alert: Alert, starts_at: float, generator: str) -> bool:
    """Whether ``announced`` is what announcing the firing ``alert`` now gives (``deliver``)."""
    return (
        announced.status == "firing"
        and announced.ends_at is None
        and announced.starts_at == starts_at
        and announced.generator_url == generator
        and announced.labels == alert.labels
        and announced.annotations == alert.annotations
    )


def _enqueue_all(receivers: Iterable[Receiver], notification: Notification, now: float) -> None:
    for receiver in receivers:
        receiver.enqueue(notification, now)
