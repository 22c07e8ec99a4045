"""Logging for a failure that may repeat every second: one line when it starts, one summary
line per period while it lasts (with the count), one line when it ends."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class FailureLog:
    """Says that ``what`` (an action: "writing the alert spool") fails, without a log line per attempt.

    ``failed(reason)`` on every failed attempt, ``succeeded()`` on every good one. Logged:
    the first failure (with the traceback when ``exc_info``), then at most one line every
    ``period_seconds`` with the number of failures since the last line and the latest reason,
    and one line when it works again.
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        period_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._what = what
        self._period = period_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._failing_since: float | None = None
        self._failures = 0
        self._unreported = 0
        self._reported_at = 0.0

    @property
    def failing(self) -> bool:
        return self._failing_since is not None

    def failed(self, reason: str, exc_info: bool = False) -> None:
        now = self._clock()
        with self._lock:
            self._failures += 1
            if self._failing_since is None:
                self._failing_since = self._reported_at = now
                self._unreported = 0
                first = True
            else:
                self._unreported += 1
                first = False
                if now - self._reported_at < self._period:
                    return
                count, span = self._unreported, now - self._reported_at
                self._unreported, self._reported_at = 0, now
        if first:
            self._log.error(
                "%s failed: %s (further failures are summed up every %g s)",
                self._what,
                reason,
                self._period,
                exc_info=exc_info,
            )
        else:
            self._log.error("%s failed %d more time(s) in the last %.0f s; latest: %s", self._what, count, span, reason)

    def succeeded(self) -> None:
        if self._failing_since is None:  # the usual case: no lock, no work
            return
        now = self._clock()
        with self._lock:
            if self._failing_since is None:
                return
            failures, span = self._failures, now - self._failing_since
            self._failing_since = None
            self._failures = self._unreported = 0
        self._log.warning("%s works again after %d failure(s) over %.0f s", self._what, failures, span)
