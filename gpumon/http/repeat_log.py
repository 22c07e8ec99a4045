"""A log that says a repeated problem once, then how often it repeated, once per period."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class RepeatLog:
    """Logs the first occurrence of each kind of problem, then how often it repeated, once per period."""

    def __init__(
        self, logger: logging.Logger, period_seconds: float = 300.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._log = logger
        self._period = period_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, int]] = {}
        """kind -> (when last logged, occurrences since)."""

    def __call__(self, level: int, kind: str, message: str, *args: object, exc_info: bool = False) -> None:
        now = self._clock()
        with self._lock:
            last = self._seen.get(kind)
            if last is None:
                self._seen[kind] = (now, 0)
            elif now - last[0] < self._period:
                self._seen[kind] = (last[0], last[1] + 1)
                return
            else:
                self._seen[kind] = (now, 0)
        if last is not None and last[1]:
            message += " (and %d more times in the last %ds)"
            args = (*args, last[1], int(now - last[0]))
        self._log.log(level, message, *args, exc_info=exc_info)

    def flush(self) -> None:
        """Log how often each kind repeated since it was last logged, once its period is over."""
        now = self._clock()
        with self._lock:
            due = [(k, n) for k, (when, n) in self._seen.items() if n and now - when >= self._period]
            for kind, _count in due:
                self._seen[kind] = (now, 0)
        for kind, count in due:
            self._log.warning("%s: repeated %d more times in the last %ds", kind, count, int(self._period))
