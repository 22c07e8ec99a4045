"""Delivery of alerts to Alertmanagers and generic webhooks.

Each receiver owns a queue and a worker thread, so a dead receiver never holds back
another one, and nothing here runs on the polling thread. The queue keeps only the
latest state of each alert (keyed by fingerprint), up to ``capacity`` alerts.

What is sent is ``gpumon.alerts.notification``'s (the bodies for each receiver kind); one
POST and how its answer is classified is ``gpumon.alerts.http_post``'s. This module is the
sender: the queue, the worker thread, retries and the worker's health.

Before each batch the worker waits (``persisted``) until the spool holds every change so far:
the batch it sends, and the removal of the one it sent before. A restart, even after SIGKILL,
then sends again at most the batch that was in flight, and the same notifications (the same
``Notification.identity``), never states made afresh.

Failures: connection errors, timeouts, 5xx and 429 are retried for ever with exponential
backoff and jitter (429/503 ``Retry-After`` is honoured); other 4xx are logged and the
alerts dropped (the receiver refuses them and would refuse them again).

A worker thread survives any exception of its own (a bug, a broken clock, ...): it is
logged once per distinct error, counted in ``ReceiverStats.errors`` and the worker goes
on after a backoff. ``Receiver.health`` says whether the worker is up, stuck (alerts
queued and no delivery attempt for ``STUCK_AFTER_BACKOFFS`` × (max backoff + timeout)
past the planned retry) or stopped (its thread ended): ``gpumon.alerts.sender_health``
judges it.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpumon.alerts.config import ReceiverHttp, RetryConfig
from gpumon.alerts.delivery_words import failure_line, receiver_words, recovery_line
from gpumon.alerts.http_post import SendResult, new_session, post_json, safe_url
from gpumon.alerts.notification import Notification, alertmanager_body, from_spool, webhook_body
from gpumon.alerts.sender_health import ReceiverStats, SenderHealth, describe, judge_health, sender_json

if TYPE_CHECKING:
    import requests

log = logging.getLogger(__name__)

MAX_BATCH = 64
"""Alerts per HTTP request."""
MAX_RETRY_AFTER_SECONDS = 600.0
MAX_BACKOFF_EXPONENT = 62
"""``initial_backoff × 2**k`` is capped at k = 62 before ``min(max_backoff, …)``: 2.0**1024 overflows."""
_MAX_DISTINCT_ERRORS = 100


@dataclass
class _Item:
    seq: int
    notification: Notification


class Receiver:
    """One Alertmanager or webhook: its queue and its worker thread."""

    def __init__(
        self,
        kind: str,
        url: str,
        retry: RetryConfig,
        capacity: int,
        valid_for_seconds: float,
        external_url: str = "",
        on_change: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        session_factory: Callable[[], requests.Session] = new_session,
        http: ReceiverHttp | None = None,
        persisted: Callable[[], object] = lambda: None,
    ) -> None:
        """``persisted``: returns once the spool holds every change so far (or gives up waiting); called
        before each batch is sent (``_run``)."""
        if kind not in ("alertmanager", "webhook"):
            raise ValueError(f"unknown receiver kind {kind!r}")
        self.kind = kind
        self.url = url
        self.name = safe_url(url)
        self.endpoint = url.rstrip("/") + "/api/v2/alerts" if kind == "alertmanager" else url
        if kind == "alertmanager" and url.rstrip("/").endswith("/api/v2/alerts"):
            self.endpoint = url
        self.retry = retry
        self.capacity = capacity
        self.valid_for_seconds = valid_for_seconds
        self.external_url = external_url
        self.http = http or ReceiverHttp()
        """TLS and auth options; replaced on reload like ``retry``."""
        self.stats = ReceiverStats()
        self._on_change = on_change
        self._persisted = persisted
        self._clock = clock
        self._rng = rng
        self._session_factory = session_factory
        self._items: OrderedDict[str, _Item] = OrderedDict()
        self._last_enqueued: dict[str, float] = {}
        self._seq = 0
        self._attempt = 0
        self._failing_since_monotonic = 0.0
        """When the failed attempts in a row began (for the recovery's line)."""
        self._last_detail = ""
        self._next_attempt_monotonic = 0.0
        self._planned_retry_monotonic = 0.0
        """When the retry after the last failed delivery attempt is due (an internal error plans none)."""
        self._progress_monotonic = time.monotonic()
        """When the worker last attempted a delivery, started, or the queue became non-empty."""
        self._errors_seen: set[str] = set()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ---- queue -----------------------------------------------------------
    @property
    def resends(self) -> bool:
        """Alertmanagers get firing alerts again every resend interval; webhooks only on change."""
        return self.kind == "alertmanager"

    def enqueue(self, notification: Notification, now: float) -> None:
        """Queue the latest state of one alert, replacing an older queued state of it."""
        with self._cond:
            if not self._items:  # the worker is expected to act from now on
                self._progress_monotonic = max(self._progress_monotonic, time.monotonic())
            self._seq += 1
            self._items.pop(notification.fingerprint, None)
            self._items[notification.fingerprint] = _Item(self._seq, notification)
            self._last_enqueued[notification.fingerprint] = now
            if notification.status == "resolved":
                self._last_enqueued.pop(notification.fingerprint, None)
            while len(self._items) > self.capacity:
                fp, dropped = self._items.popitem(last=False)
                self.stats.outcomes["overflow"] += 1
                log.error(
                    "alert queue of %s is full (%d); dropped the oldest alert %s (%s)",
                    self.name,
                    self.capacity,
                    dropped.notification.labels.get("alertname"),
                    fp,
                )
            # marked for the spool before a worker can take it (it waits on this lock): the worker's
            # wait for the spool (``persisted``) then covers this notification. A failure here is the
            # worker's to meet and report (its own call after a delivery); the enqueuer never fails.
            with contextlib.suppress(Exception):
                self._on_change()
            self._cond.notify_all()

    def last_enqueued(self, fp: str) -> float | None:
        with self._cond:
            return self._last_enqueued.get(fp)

    def queue_length(self) -> int:
        with self._cond:
            return len(self._items)

    def export(self) -> list[dict[str, Any]]:
        """The queue for the spool, oldest first."""
        with self._cond:
            return [item.notification.to_json() for item in self._items.values()]

    def restore(self, items: Iterable[Any], now: float) -> tuple[int, int]:
        """Queue what the spool held (before start): (clamped, dropped). An entry whose start or
        end is not a time (NaN, Infinity, 1e20) is queued with ``now`` (Unix seconds) in its place;
        one that is not a notification at all is dropped. The caller logs the counts."""
        notifications, clamped, dropped = from_spool(items, now)
        with self._cond:
            for n in notifications:
                self._seq += 1
                self._items[n.fingerprint] = _Item(self._seq, n)
            self._cond.notify_all()
        return clamped, dropped

    # ---- worker ------------------------------------------------------------
    def start(self) -> None:
        with self._cond:
            if self._thread is not None:
                return
            self._stopping = False
            self._progress_monotonic = time.monotonic()
            self.stats.last_attempt_at = self._clock()
            self._thread = threading.Thread(target=self._run, name=f"gpumon-alerts-{self.kind}", daemon=True)
            self._thread.start()

    def stop(self, timeout_seconds: float) -> None:
        """Ask the worker to end and wait for it (a request in flight may take up to the HTTP timeout)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_seconds)
        with self._cond:
            self._thread = None

    def health(self) -> SenderHealth:
        """Whether the worker delivers (for metrics and ``gpumon alerts``; not for readiness)."""
        with self._cond:
            thread = self._thread
            running = thread is not None and thread.is_alive()
            progress, planned_retry = self._progress_monotonic, self._planned_retry_monotonic
            queued = len(self._items)
        return judge_health(running, queued, time.monotonic(), progress, planned_retry, self.retry)

    def sender_json(self) -> dict[str, Any]:
        """The worker's health for ``/api/alerts``: sender (up/stuck/stopped), its problem, errors, last attempt."""
        return sender_json(self.health(), self.stats)

    def _run(self) -> None:
        # The HTTP session is made for the first batch: a daemon that never alerts never loads requests.
        session: requests.Session | None = None
        try:
            while True:
                try:
                    batch = self._wait_for_batch()
                    if batch is None:
                        return
                    # What is sent is on disk first, and the last batch's settling too: a restart (even
                    # after SIGKILL) sends again only the batch in flight, as the same notifications.
                    self._persisted()
                    if session is None:
                        session = self._session_factory()
                    self._send(session, batch)
                except Exception as exc:
                    delay = self._survive(exc)
                    with self._cond:  # whatever failed, never spin: wait out the backoff (or a stop)
                        self._cond.wait_for(lambda: self._stopping, delay)
                    if session is not None:
                        session = self._fresh_session(session)
        finally:
            if session is not None:
                session.close()

    def _fresh_session(self, old: requests.Session) -> requests.Session:
        """A new HTTP session after an unexpected error (the old one may be what broke); the old one if none can be made."""
        try:
            new = self._session_factory()
        except Exception as exc:
            log.debug("alert sender for %s: no new HTTP session: %s", self.name, describe(exc))
            return old
        try:
            old.close()
        except Exception:
            log.debug("closing an HTTP session failed", exc_info=True)
        return new

    def _send(self, session: requests.Session, batch: list[_Item]) -> None:
        """POST one batch to the receiver and settle its alerts by the answer. An alert that
        cannot be written (its start a NaN) is dropped with one log line; the others go."""
        bad = [i for i in batch if i.notification.time_problem() is not None]
        if bad:
            self._drop_unsendable(bad)
            batch = [i for i in batch if i.notification.time_problem() is None]
            if not batch:
                return
        now = self._clock()
        body: Any
        if self.kind == "alertmanager":
            body = alertmanager_body([i.notification for i in batch], now, self.valid_for_seconds)
        else:
            body = webhook_body(
                [i.notification for i in batch], now, self.valid_for_seconds, "gpumon", self.external_url
            )
        try:
            result = post_json(session, self.endpoint, body, self.retry.timeout_seconds, now, self.http)
        except Exception as exc:
            result = SendResult("retry", f"unexpected error: {exc!r}")
        self._settle(batch, result)

    def _drop_unsendable(self, items: list[_Item]) -> None:
        """Drop alerts no receiver could be sent (a start time of NaN): one log line, counted as dropped."""
        with self._cond:
            for item in items:
                current = self._items.get(item.notification.fingerprint)
                if current is not None and current.seq == item.seq:
                    del self._items[item.notification.fingerprint]
            self.stats.outcomes["dropped"] += len(items)
        first = items[0].notification
        log.error(
            "%d alert(s) for %s cannot be sent and are dropped (%s: %s)",
            len(items),
            self.name,
            first.labels.get("alertname"),
            first.time_problem(),
        )
        self._on_change()

    def _survive(self, exc: Exception) -> float:
        """An exception escaped one round of the worker: log it once per distinct error, count it; the backoff."""
        key = describe(exc)
        with self._cond:
            self.stats.errors += 1
            self._attempt += 1
            try:
                delay = self._backoff(self._attempt)
            except Exception:
                delay = self.retry.max_backoff_seconds
            # not progress: no delivery was attempted (a worker that only fails this way is stuck)
            self._next_attempt_monotonic = time.monotonic() + delay
            first = key not in self._errors_seen
            if first and len(self._errors_seen) < _MAX_DISTINCT_ERRORS:
                self._errors_seen.add(key)
            self.stats.last_error = f"internal error: {key}"
            count = self.stats.errors
        if first:
            log.error(
                "alert sender for %s failed (%s); it goes on, retry in %.1f s (%d error(s) so far; this one is "
                "logged once)",
                self.name,
                key,
                delay,
                count,
                exc_info=exc,
            )
        else:
            log.debug("alert sender for %s failed again: %s", self.name, key)
        return delay

    def _wait_for_batch(self) -> list[_Item] | None:
        with self._cond:
            while True:
                if self._stopping:
                    return None
                if self._items:
                    delay = self._next_attempt_monotonic - time.monotonic()
                    if delay <= 0:
                        return list(self._items.values())[:MAX_BATCH]
                    self._cond.wait(delay)
                else:
                    self._cond.wait()

    def _settle(self, batch: list[_Item], result: SendResult) -> None:
        with self._cond:
            n = len(batch)
            self._progress_monotonic = time.monotonic()
            self.stats.last_attempt_at = self._clock()
            if result.outcome == "retry":
                self._attempt += 1
                if self._attempt == 1:
                    self._failing_since_monotonic = self._progress_monotonic
                delay = self._backoff(self._attempt)
                if result.retry_after_seconds is not None:
                    delay = max(delay, min(result.retry_after_seconds, MAX_RETRY_AFTER_SECONDS))
                self._next_attempt_monotonic = time.monotonic() + delay
                self._planned_retry_monotonic = self._next_attempt_monotonic
                self.stats.outcomes["failed"] += n
                line = failure_line(self.kind, self.name, result.detail, self._attempt, delay)
                if self._last_detail != result.detail or self._attempt == 1:
                    log.warning("alert delivery failed: %s; %d alert(s) kept", line, len(self._items))
                self._last_detail = result.detail
                self.stats.last_error = line
                return
            failed_tries, self._attempt, self._last_detail = self._attempt, 0, ""
            self._next_attempt_monotonic = 0.0
            if result.outcome == "dropped":
                self.stats.outcomes["dropped"] += n
                self.stats.last_error = f"{receiver_words(self.kind, self.name)} refused them: {result.detail}"
                log.error("%s refused %d alert(s) (%s); they are dropped, not retried", self.name, n, result.detail)
            else:
                self.stats.outcomes["sent"] += n
                self.stats.last_success_at = self.stats.last_attempt_at
                self.stats.last_error = ""
                if failed_tries:
                    failing = self._progress_monotonic - self._failing_since_monotonic
                    log.info("alert delivery: %s", recovery_line(self.kind, self.name, failing, failed_tries))
            for item in batch:
                current = self._items.get(item.notification.fingerprint)
                if current is not None and current.seq == item.seq:
                    del self._items[item.notification.fingerprint]
        self._on_change()

    def _backoff(self, attempt: int) -> float:
        """Exponential with 'equal jitter': half the step fixed, half random (any attempt number)."""
        exponent = min(max(attempt - 1, 0), MAX_BACKOFF_EXPONENT)
        step = min(self.retry.max_backoff_seconds, self.retry.initial_backoff_seconds * 2.0**exponent)
        return float(step / 2 + self._rng() * step / 2)
