"""The XID event thread follows NVML going and coming: it waits for events only while NVML is up, and
starts waiting at once when NVML comes up (the daemon says so after each poll), not at the end of its wait."""

from __future__ import annotations

import threading
from typing import Any

from gpumon.events.xid_thread import XidEventThread
from gpumon.model.xid import XidEvent

LONG_WAIT_SECONDS = 60.0
"""The thread's wait: far longer than the test waits for anything, so only ``nvml_up`` can end it."""
EVENTUALLY_SECONDS = 20.0


class Backend:
    """Counts the event waits; each returns at once (no XID)."""

    def __init__(self) -> None:
        self.waits = 0
        self.waited = threading.Event()
        self.stop = threading.Event()

    def wait_events(self, timeout_seconds: float) -> list[XidEvent]:
        self.waits += 1
        self.waited.set()
        self.stop.wait(0.01)  # a real wait blocks; this one lets the test run
        return []


def test_the_thread_starts_waiting_when_nvml_comes_up_and_again_after_nvml_went_and_came_back() -> None:
    backend = Backend()
    up = [False]
    thread = XidEventThread(backend, lambda event: None, ready=lambda: up[0], wait_seconds=LONG_WAIT_SECONDS)
    thread.start()
    try:
        for _ in range(2):  # NVML comes up, goes away, comes up again
            assert not backend.waited.wait(0.2), "no event wait while NVML is down"
            up[0] = True
            for _ in range(3):  # the daemon says so after every poll; once set, a no-op
                thread.nvml_up()
            assert backend.waited.wait(EVENTUALLY_SECONDS), "NVML up: the thread waits for events at once"
            up[0] = False  # NVML goes away: the thread stops waiting for events
            _settle(backend)
    finally:
        up[0] = False
        thread.request_stop()
        backend.stop.set()
        thread.stop(timeout=5.0)


def _settle(backend: Any) -> None:
    """Wait until the thread no longer asks for events (NVML down), then forget that it did."""
    while True:
        backend.waited.clear()
        if not backend.waited.wait(0.3):
            return
