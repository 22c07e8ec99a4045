"""The alert spool kept up to date: the ``gpumon-alerts-spool`` thread writes it whenever something changed.

Every change (an engine state, the announced set, a receiver's queue) is marked dirty; the
thread writes the whole document and counts what is on disk, so ``sync`` can wait until
everything changed so far is saved. A failed write (a full or read-only state directory) is
counted, logged once and then once a minute (``RepeatLog``), and tried again after a second.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpumon.alerts.spool import Spool
from gpumon.util.repeat_log import RepeatLog


class SpoolWriter:
    """Writes ``document()`` to the spool after every change; counts the writes that failed."""

    def __init__(
        self,
        spool: Spool,
        document: Callable[[], dict[str, Any]],
        stop: threading.Event,
        log: logging.Logger,
        clock: Callable[[], float],
    ) -> None:
        """``document``: what to save, read when writing; ``stop``: set when the thread is to end;
        ``log``: the logger of write failures; ``clock``: seconds, for the once-a-minute repeats."""
        self.spool = spool
        self._document = document
        self._stop = stop
        self._action = f"writing the alert spool {spool.path}"
        self._failures = RepeatLog(log, period_seconds=60.0, clock=clock)
        """A full or read-only state directory fails every second: logged once, then once a minute."""
        self.errors_total = 0
        """Writes that failed."""
        self._dirty = 0
        self._written = 0
        self._last_failed = False
        self._cond = threading.Condition()

    @property
    def failing(self) -> bool:
        """Whether the last write failed (a full or read-only state directory): nothing waits for one then."""
        return self._last_failed

    def mark_dirty(self) -> None:
        """Something to save changed: the thread writes it."""
        with self._cond:
            self._dirty += 1
            self._cond.notify_all()

    def wake(self) -> None:
        """Wake the thread (to see ``stop`` set)."""
        with self._cond:
            self._cond.notify_all()

    def sync(self, timeout: float, running: Callable[[], bool]) -> bool:
        """Wait until everything changed so far is on disk; False on timeout (or when not ``running()``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            target = self._dirty
            while self._written < target:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not running():
                    return self._written >= target
                self._cond.wait(min(remaining, 0.1))
        return True

    def write(self) -> bool:
        """Write the document now; False when it failed (counted and logged)."""
        with self._cond:
            target = self._dirty
        try:
            self.spool.save(self._document())
        except OSError as exc:
            self._last_failed = True
            self.errors_total += 1
            self._failures.failed(self._action, str(exc))
            return False
        self._last_failed = False
        self._failures.succeeded(self._action)
        with self._cond:
            self._written = max(self._written, target)
            self._cond.notify_all()
        return True

    def loop(self) -> None:
        """The thread: write after every change until ``stop`` is set; a second's pause after a failure."""
        while not self._stop.is_set():
            with self._cond:
                while self._written >= self._dirty and not self._stop.is_set():
                    self._cond.wait()
            if self._stop.is_set():
                return
            if not self.write():
                self._stop.wait(1.0)
