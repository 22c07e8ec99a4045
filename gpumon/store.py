"""The latest snapshot, shared between the polling thread and HTTP threads."""

from __future__ import annotations

import threading
from collections.abc import Callable

from gpumon.snapshot import Snapshot


class SnapshotStore:
    """Holds the most recent Snapshot; readers never block on a poll in progress."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: Snapshot | None = None
        self._listeners: list[Callable[[Snapshot], None]] = []

    def publish(self, snapshot: Snapshot) -> None:
        """Replace the latest snapshot and tell listeners (the alert engine)."""
        with self._lock:
            self._latest = snapshot
            listeners = list(self._listeners)
        for listener in listeners:
            listener(snapshot)

    def latest(self) -> Snapshot | None:
        with self._lock:
            return self._latest

    def subscribe(self, listener: Callable[[Snapshot], None]) -> None:
        """Call ``listener(snapshot)`` on the polling thread after each publish."""
        with self._lock:
            self._listeners.append(listener)
