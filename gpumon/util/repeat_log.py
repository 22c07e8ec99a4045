"""A log for a problem that may repeat every second: one line the first time, then at most one line per
period saying how often it repeated since, and, for a failure that ends, one line when it works again."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Run:
    """One kind of problem while it repeats (clock seconds): when it was first seen and last logged, how
    many times it happened in all and how many of those since its last line."""

    started_at: float
    logged_at: float
    total: int = 1
    unlogged: int = 0


@dataclass(frozen=True)
class _Due:
    """What to say about an occurrence that is to be logged: whether it is the first of its kind, and how
    many occurrences before it went unlogged over how many seconds since the last line."""

    first: bool
    unlogged: int
    seconds: float


class RepeatLog:
    """Logs the first occurrence of each kind of problem, then how often it repeated, once per period.

    Two ways to tell it: calling it, ``(level, kind, message, *args)``, for a problem that has no end (its line, with
    "(and N more times in the last S s)" once the period is over; ``flush()`` says the count of a kind
    that went quiet); ``failed(what, reason)`` on every failed attempt at ``what`` (an action: "writing the
    alert spool") and ``succeeded(what)`` on every good one, which logs when it started failing, then at
    most one line per period with the count and the latest reason, and one line when it works again.
    """

    def __init__(
        self, logger: logging.Logger, period_seconds: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = logger
        self._period = period_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        """kind -> its run of occurrences."""

    def _occurred(self, kind: str, now: float) -> _Due | None:
        """Count one occurrence of ``kind``: None while it is within the period of its last line."""
        with self._lock:
            run = self._runs.get(kind)
            if run is None:
                self._runs[kind] = _Run(started_at=now, logged_at=now)
                return _Due(first=True, unlogged=0, seconds=0.0)
            run.total += 1
            if now - run.logged_at < self._period:
                run.unlogged += 1
                return None
            due = _Due(first=False, unlogged=run.unlogged, seconds=now - run.logged_at)
            run.logged_at, run.unlogged = now, 0
            return due

    def __call__(self, level: int, kind: str, message: str, *args: object, exc_info: bool = False) -> None:
        """Log ``message % args`` at ``level`` unless ``kind`` was logged within the period."""
        due = self._occurred(kind, self._clock())
        if due is None:
            return
        if due.unlogged:
            message += " (and %d more times in the last %ds)"
            args = (*args, due.unlogged, int(due.seconds))
        self._log.log(level, message, *args, exc_info=exc_info)

    def flush(self) -> None:
        """Log how often each kind repeated since it was last logged, once its period is over."""
        now = self._clock()
        with self._lock:
            due = [
                (k, run.unlogged)
                for k, run in self._runs.items()
                if run.unlogged and now - run.logged_at >= self._period
            ]
            for kind, _count in due:
                self._runs[kind].logged_at, self._runs[kind].unlogged = now, 0
        for kind, count in due:
            self._log.warning("%s: repeated %d more times in the last %ds", kind, count, int(self._period))

    def failed(self, what: str, reason: str, exc_info: bool = False) -> None:
        """One failed attempt at ``what``: logged as an error when it is the first since ``what`` last worked
        (with the traceback when ``exc_info``), then once per period with the count and ``reason``."""
        due = self._occurred(what, self._clock())
        if due is None:
            return
        if due.first:
            self._log.error(
                "%s failed: %s (further failures are summed up every %g s)",
                what,
                reason,
                self._period,
                exc_info=exc_info,
            )
        else:
            count = due.unlogged + 1  # this one included
            self._log.error(
                "%s failed %d more time(s) in the last %.0f s; latest: %s", what, count, due.seconds, reason
            )

    def succeeded(self, what: str) -> None:
        """One good attempt at ``what``: a warning when it failed before (how often, over how long)."""
        if what not in self._runs:  # the usual case: no lock, no work
            return
        now = self._clock()
        with self._lock:
            run = self._runs.pop(what, None)
        if run is not None:
            self._log.warning("%s works again after %d failure(s) over %.0f s", what, run.total, now - run.started_at)
