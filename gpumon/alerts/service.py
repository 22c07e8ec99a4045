"""AlertService: the engine, the receivers and the spool wired together for the daemon.

Threads:

* the polling thread calls ``on_snapshot`` (evaluation only: microseconds, no I/O);
* the XID event thread calls ``on_xid``;
* ``gpumon-alerts-tick`` runs every 5 s: stale-snapshot check (a hung poll publishes
  nothing), XID expiry, re-sending firing alerts to Alertmanagers every resend interval, and
  every ``findings_interval_seconds`` the finding rules on the health findings of the kinds
  they name (asked of the ``findings`` provider outside the lock: the poll never waits for them);
* ``gpumon-alerts-spool`` writes the spool whenever something changed;
* one ``gpumon-alerts-<kind>`` worker per receiver posts its queue.

What is delivered: an alert is announced when it fires and is not held back by a burn,
and withdrawn (sent resolved, ``endsAt`` = now) when it resolves or becomes held back
(``delivery``). The announced set (``delivered``), the engine states and every receiver's
queue live in the spool (``spool_writer``), so a restart (even after SIGKILL) resumes with
the same ``startsAt`` and delivers what was queued (``spool_restore``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpumon.alerts.alert import Alert
from gpumon.alerts.builtin import xid_action_from_catalog
from gpumon.alerts.config import AlertingConfig, ReceiverHttp
from gpumon.alerts.delivery import deliver, resend
from gpumon.alerts.engine import AlertEngine
from gpumon.alerts.metrics import AlertCollector, MetricInputs
from gpumon.alerts.notification import Notification
from gpumon.alerts.notify import Receiver
from gpumon.alerts.rules import finding_kinds
from gpumon.alerts.spool import Spool
from gpumon.alerts.spool_restore import restore_spool
from gpumon.alerts.spool_writer import SpoolWriter
from gpumon.model.findings import Finding
from gpumon.model.snapshot import Snapshot
from gpumon.model.xid import XidEvent
from gpumon.state.burn_marker import BurnHoldBack, BurnMarkerReader
from gpumon.util.steady_clock import SteadyClock

log = logging.getLogger(__name__)

FINDINGS_INTERVAL_SECONDS = 5.0
"""How often the tick thread asks for the health findings (when a finding rule exists)."""
TICK_SECONDS = 5.0
"""How often the tick thread runs. Rules are evaluated on every snapshot by the polling thread;
the tick only keeps time between them (a snapshot gone stale, XIDs expiring, re-sending firing
alerts, the finding rules), none of which needs a finer step: every wake costs CPU (docs/benchmarks.md)."""

PERSIST_WAIT_SECONDS = 5.0
"""How long a sender waits for the spool to hold what it is about to send (a write takes milliseconds)."""

Handler = Callable[[], tuple[int, str, bytes]]


class AlertService:
    """Evaluates alert rules on snapshots and XID events and delivers the alerts."""

    def __init__(
        self,
        config: AlertingConfig,
        state_dir: Path,
        host: str,
        clock: Callable[[], float] = time.time,
        xid_action: Callable[[int], str] | None = None,
        tick_seconds: float = TICK_SECONDS,
        rng: Callable[[], float] | None = None,
        findings: Callable[[frozenset[str]], Sequence[Finding]] | None = None,
        findings_interval_seconds: float = FINDINGS_INTERVAL_SECONDS,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        """``findings``: the health findings now of the kinds named (HealthService.findings_of: ``*`` matches
        any text), for the finding rules; asked with the kinds the finding rules name (``finding_kinds``).
        ``monotonic``: when given, alerts age on it (a ``SteadyClock`` of ``clock`` and it), so a
        step of the wall clock neither fires a ``for: 10m`` alert early nor holds back the stale
        snapshot alert; ``clock`` gives only the times shown and sent. None: everything on ``clock``."""
        self._config = config
        self._steady = SteadyClock(clock, monotonic) if monotonic is not None else None
        self._now: Callable[[], float] = self._steady if self._steady is not None else clock
        self._findings = findings
        self._finding_kinds = finding_kinds(config.all_rules())  # the kinds asked for (none: never asked)
        self._findings_interval_seconds = findings_interval_seconds
        self._findings_read_at: float | None = None
        self._clock = clock
        self._tick_seconds = tick_seconds
        self._rng = rng
        self._lock = threading.RLock()
        self._engine = AlertEngine(
            config.all_rules(),
            host=config.host or host,
            host_label=config.host_label,
            xid_action=xid_action or xid_action_from_catalog(),
            started_at=self._now(),
        )
        self._default_host = host
        self._burn_reader = BurnMarkerReader(state_dir)
        self._burn: BurnHoldBack | None = None
        self._stop = threading.Event()
        self._spool = Spool(state_dir)
        self._spool_writer = SpoolWriter(self._spool, self._spool_document, self._stop, log, monotonic or clock)
        self._delivered: dict[str, Notification] = {}
        """The announced alerts by fingerprint (``delivery``)."""
        self._receivers: dict[str, Receiver] = {}
        self._errors_total = 0
        self._spool_damaged = 0
        """Damaged parts of the spool found at start (``restore_spool``), a spool set aside counting one."""
        self._last_error_logged = 0.0
        self._threads: list[threading.Thread] = []
        self._running = False
        for kind, urls in (("alertmanager", config.alertmanagers), ("webhook", config.webhooks)):
            for url in urls:
                self._receivers[url] = self._make_receiver(kind, url, config)
        self._restore()

    # ---- lifecycle -------------------------------------------------------
    def start(self) -> None:
        """Start the receiver workers, the timer and the spool writer."""
        with self._lock:
            if self._running:
                return
            self._running = True
            self._stop.clear()
            for receiver in self._receivers.values():
                receiver.start()
            self._threads = [
                threading.Thread(target=self._tick_loop, name="gpumon-alerts-tick", daemon=True),
                threading.Thread(target=self._spool_writer.loop, name="gpumon-alerts-spool", daemon=True),
            ]
            for t in self._threads:
                t.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Write the spool one last time and end every thread (waiting at most about ``timeout`` s)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            if not self._running:
                return
            self._running = False
            receivers = list(self._receivers.values())
        self.sync(max(0.0, deadline - time.monotonic()))
        self._stop.set()
        self._spool_writer.wake()
        for receiver in receivers:
            receiver.stop(max(0.0, deadline - time.monotonic()))
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._spool_writer.write()

    def reload(self, config: AlertingConfig) -> None:
        """Apply a new config (SIGHUP): alert states of kept rules and queues of kept receivers survive."""
        with self._lock:
            now = self._now()
            # everything that may fail first, so that a failure changes nothing
            rules = config.all_rules()
            wanted = {url: "alertmanager" for url in config.alertmanagers}
            wanted.update({url: "webhook" for url in config.webhooks})
            added = {
                url: self._make_receiver(kind, url, config)
                for url, kind in wanted.items()
                if url not in self._receivers or self._receivers[url].kind != kind
            }
            self._engine.host = config.host or self._default_host
            self._engine.host_label = config.host_label
            self._engine.set_rules(rules, now)
            self._finding_kinds = finding_kinds(rules)
            for url, receiver in list(self._receivers.items()):
                if wanted.get(url) != receiver.kind:
                    receiver.stop(0.5)
                    del self._receivers[url]
            for url in wanted:
                if url in added:
                    self._receivers[url] = added[url]
                    if self._running:
                        added[url].start()
                receiver = self._receivers[url]
                receiver.retry = config.retry
                receiver.capacity = config.queue_capacity
                receiver.valid_for_seconds = 4 * config.resend_interval_seconds
                receiver.external_url = config.external_url
                receiver.http = config.receiver_http.get(url, ReceiverHttp())
            self._config = config
            self._deliver(now)
            self._mark_dirty()

    # ---- inputs ----------------------------------------------------------------
    def on_snapshot(self, snapshot: Snapshot) -> None:
        """Evaluate the rules on a new snapshot. Runs on the polling thread: quick, no I/O, never raises."""
        try:
            with self._lock:
                engine = self._engine
                now = self._now()
                revision = engine.revision
                taken_at = now if self._steady is not None else None  # on a steady clock its age counts from now
                engine.evaluate(snapshot, now, self._burn, taken_at)
                open_alerts = engine.has_open_alerts
                if open_alerts:  # a burn holds back only open alerts: its marker read (a stat) then
                    burn = self._read_burn()
                    if burn != self._burn:
                        self._burn = burn
                        engine.hold_back(burn)
                delivered = (open_alerts or bool(self._delivered)) and self._deliver(now)  # its first test, here
                if delivered or engine.revision != revision:
                    self._mark_dirty()
        except Exception:
            self._failed("alert evaluation failed")

    def on_xid(self, event: XidEvent) -> None:
        """Fire the XID rules that match ``event`` (called from the XID event thread); never raises."""
        try:
            with self._lock:
                now = self._now()
                if self._steady is not None:
                    event = dataclasses.replace(
                        event, timestamp_seconds=self._steady.from_wall(event.timestamp_seconds)
                    )
                if self._engine.on_xid(event, now):
                    self._burn = self._read_burn()  # the marker as it is now (no poll may have read it)
                    self._engine.hold_back(self._burn)
                    self._deliver(now)
                    self._mark_dirty()
        except Exception:
            self._failed(f"alert evaluation of XID event {event!r} failed")

    def tick(self) -> None:
        """Timer work (normally run by the tick thread every TICK_SECONDS); never raises."""
        try:
            findings = self._read_findings()
            with self._lock:
                now = self._now()
                revision = self._engine.revision
                self._burn = self._read_burn()
                self._engine.tick(now, self._burn)
                if findings is not None:
                    self._engine.on_findings(findings, now)
                changed = self._deliver(now)
                changed = self._resend(now) or changed
                if changed or self._engine.revision != revision:
                    self._mark_dirty()
        except Exception:
            self._failed("alert timer failed")

    # ---- outputs ---------------------------------------------------------------
    def active_alerts(self) -> list[dict[str, Any]]:
        """Pending, firing and suppressed (held back by a burn) alerts as JSON-ready dicts."""
        with self._lock:
            return [_public(a, self._to_wall) for a in self._engine.alerts()]

    def receivers(self) -> list[dict[str, Any]]:
        with self._lock:
            receivers = list(self._receivers.values())
        return [
            {
                "name": r.name,
                "kind": r.kind,
                "queue_length": r.queue_length(),
                "notifications": dict(r.stats.outcomes),
                "last_error": r.stats.last_error,
                "last_success_at": r.stats.last_success_at,
                **r.sender_json(),
            }
            for r in receivers
        ]

    def routes(self) -> dict[str, Handler]:
        """Extra HTTP routes for the exporter: ``/api/alerts``."""

        def api_alerts() -> tuple[int, str, bytes]:
            with self._lock:
                host = self._engine.host
            body = {"host": host, "alerts": self.active_alerts(), "receivers": self.receivers()}
            return 200, "application/json", json.dumps(body, indent=1).encode()

        return {"/api/alerts": api_alerts}

    def collector(self) -> AlertCollector:
        """A metric source (``families()``) of gpumon_alerts and the delivery self-metrics."""
        return AlertCollector(self._metric_snapshot)

    def sync(self, timeout: float) -> bool:
        """Wait until everything changed so far is on disk; False on timeout (or spool writer not running)."""
        return self._spool_writer.sync(timeout, lambda: self._running)

    # ---- internals ---------------------------------------------------------------
    def _failed(self, what: str) -> None:
        """Count a failure; log it with its traceback at most once a minute (it may repeat every poll)."""
        self._errors_total += 1
        now = time.monotonic()
        if now - self._last_error_logged >= 60.0 or self._errors_total == 1:
            self._last_error_logged = now
            log.exception("%s (%d failure(s) so far)", what, self._errors_total)

    def _make_receiver(self, kind: str, url: str, config: AlertingConfig) -> Receiver:
        extra: dict[str, Any] = {"rng": self._rng} if self._rng is not None else {}
        return Receiver(
            kind,
            url,
            retry=config.retry,
            capacity=config.queue_capacity,
            valid_for_seconds=4 * config.resend_interval_seconds,
            external_url=config.external_url,
            http=config.receiver_http.get(url, ReceiverHttp()),
            on_change=self._mark_dirty,
            persisted=self._persisted,
            clock=self._clock,
            **extra,
        )

    def _read_findings(self) -> Sequence[Finding] | None:
        """The health findings when they are due (None otherwise); called without the lock."""
        now = self._now()
        kinds = self._finding_kinds
        if self._findings is None or not kinds:
            return None
        if self._findings_read_at is not None and now - self._findings_read_at < self._findings_interval_seconds:
            return None
        self._findings_read_at = now
        return self._findings(kinds)

    def _read_burn(self) -> BurnHoldBack | None:
        return self._burn_reader.read() if self._config.burn_hold_back else None

    def _deliver(self, now: float) -> bool:
        """Announce newly firing alerts and withdraw those no longer firing; True when anything was queued."""
        if not self._delivered and not self._engine.has_open_alerts:
            return False  # nothing announced, nothing to announce: most polls of a healthy host
        return deliver(
            self._engine.notifiable(),
            self._delivered,
            self._receivers.values(),
            now,
            self._config.external_url,
            self._to_wall,
        )

    def _resend(self, now: float) -> bool:
        return resend(self._delivered, self._receivers.values(), now, self._config.resend_interval_seconds)

    def _mark_dirty(self) -> None:
        self._spool_writer.mark_dirty()

    def _persisted(self) -> bool:
        """Wait (a sender, before each batch) until the spool holds every change so far; not while its
        writes fail (a read-only state directory never holds deliveries back), at most PERSIST_WAIT_SECONDS."""
        writer = self._spool_writer
        return writer.sync(PERSIST_WAIT_SECONDS, lambda: self._running and not writer.failing)

    def _spool_document(self) -> dict[str, Any]:
        with self._lock:
            return {
                "engine": self._engine.export_state(),
                "delivered": [n.to_json() for n in self._delivered.values()],
                "queues": {url: r.export() for url, r in self._receivers.items()},
            }

    def _tick_loop(self) -> None:
        while not self._stop.wait(self._tick_seconds):
            self.tick()

    def _restore(self) -> None:
        data = self._spool.load()
        if data:
            self._spool_damaged = restore_spool(
                data, self._engine, self._delivered, self._receivers, self._clock, self._spool.path, log
            )
        self._spool_damaged += self._spool.set_aside

    def _to_wall(self, seconds: float) -> float:
        """A time of the alert engine as the wall clock shows it (what is shown and sent)."""
        return self._steady.to_wall(seconds) if self._steady is not None else seconds

    def _metric_snapshot(self) -> MetricInputs:
        with self._lock:
            return (
                self._engine.counts(),
                list(self._receivers.values()),
                self._burn,
                self._errors_total,
                self._spool_writer.errors_total,
                self._spool_damaged,
            )


def _public(alert: Alert, to_wall: Callable[[float], float]) -> dict[str, Any]:
    out = alert.to_dict()
    for key in ("active_since", "starts_at", "ends_at"):
        if isinstance(out.get(key), float):
            out[key] = to_wall(out[key])
    if alert.held_back is not None:
        out["state"] = "suppressed"
    return out
