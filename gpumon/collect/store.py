"""The latest snapshot, shared between the polling thread and HTTP threads."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpumon.model.snapshot import Snapshot
from gpumon.util.repeat_log import RepeatLog

log = logging.getLogger(__name__)


class SnapshotStore:
    """Holds the most recent Snapshot; readers never block on a poll in progress.

    ``publish`` and ``latest`` take no lock: each stores or loads one reference, which is atomic in
    Python, and a snapshot is never changed once made. The lock only keeps two ``subscribe`` calls from
    losing one another's listener."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: Snapshot | None = None
        self._failures = RepeatLog(log, period_seconds=60.0)
        self._listeners: tuple[tuple[Callable[[Snapshot], None], str], ...] = ()
        """Replaced, never changed, by ``subscribe``: a publish iterates the tuple it read, without a copy."""

    def publish(self, snapshot: Snapshot) -> None:
        """Replace the latest snapshot and tell listeners (the alert engine). Never raises:
        a listener that raises is logged (once, then a summary a minute) and the others still run."""
        self._latest = snapshot
        for listener, what in self._listeners:
            try:
                listener(snapshot)
            except Exception as exc:
                self._failures.failed(what, f"{type(exc).__name__}: {exc}", exc_info=True)
            else:
                self._failures.succeeded(what)

    def latest(self) -> Snapshot | None:
        return self._latest

    def subscribe(self, listener: Callable[[Snapshot], None]) -> None:
        """Call ``listener(snapshot)`` on the polling thread after each publish."""
        name = getattr(listener, "__qualname__", None) or repr(listener)
        with self._lock:
            self._listeners = (*self._listeners, (listener, f"snapshot listener {name}"))
