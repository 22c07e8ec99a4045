"""The event thread: waits on the backend for XIDs; an XID ends the wait at once, so it is seen as it comes.

Each wait lasts at most ``wait_seconds`` (5 s): an idle wake costs CPU on a real host (docs/benchmarks.md,
daemon CPU), and nothing waits for its end: a stop does not wait for a wait in progress (NVML is
shut down after it, never under it: gpumon.backends.nvml.core), and NVML coming up ends a wait for it
at once. What the length does delay: a GPU that answers again after it was lost is registered
for events at the start of the next wait."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpumon.backends.base import GpuBackend, GpuLostError
from gpumon.model.xid import XidEvent

log = logging.getLogger(__name__)

WAIT_SECONDS = 5.0
"""The longest event wait: the thread wakes that often when no XID comes."""
LOST_BACKOFF_SECONDS = 1.0
"""After a GPU was lost inside a wait, the next wait (for the others) starts this much later."""


class XidEventThread:
    """Calls ``backend.wait_events(timeout)`` in a loop and hands each event to ``on_event``.

    Runs only while ``ready()`` says NVML is up. A GPU lost inside the wait is logged
    and the loop goes on for the other GPUs; any other error backs off a little.
    """

    def __init__(
        self,
        backend: GpuBackend,
        on_event: Callable[[XidEvent], object],
        ready: Callable[[], bool],
        wait_seconds: float = WAIT_SECONDS,
    ) -> None:
        self._backend = backend
        self._on_event = on_event
        self._ready = ready
        self._wait = wait_seconds
        self._stop = threading.Event()
        self._up = threading.Event()
        """Set by nvml_up() (or a stop): a wait for NVML to come up ends at once."""
        self._thread = threading.Thread(target=self._run, name="gpumon-xid", daemon=True)
        self.errors_total = 0

    def start(self) -> None:
        self._thread.start()

    def nvml_up(self) -> None:
        """NVML answers (the daemon calls it for each snapshot that says so): a thread waiting for
        NVML to come up starts waiting for events now, not at the end of its wait. Set only when not set:
        ``Event.set`` runs a Condition's Python (six calls), and once NVML is up it stays set."""
        if not self._up.is_set():
            self._up.set()

    def request_stop(self) -> None:
        """Ask the thread to end after its current wait (at most ``wait_seconds``; a simulated wait ends now)."""
        self._stop.set()
        self._up.set()

    def stop(self, timeout: float = 1.0) -> None:
        self.request_stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            if not self._ready():
                self._up.clear()
                if not self._ready() and not self._stop.is_set():  # asked again: a set in between is kept
                    self._up.wait(self._wait)
                continue
            try:
                events = self._backend.wait_events(self._wait)
                failures = 0
            except GpuLostError as exc:
                log.error("XID watch: GPU %d lost (%s); still watching the others", exc.index, exc.reason)
                self._stop.wait(min(self._wait, LOST_BACKOFF_SECONDS))
                continue
            except Exception:
                failures += 1
                self.errors_total += 1
                if failures == 1:
                    log.exception("XID watch failed; retrying")
                self._stop.wait(min(30.0, self._wait * 2**failures))
                continue
            for event in events:
                # logged by the tracker, one line per distinct fault (gpumon.events.xid_log): not per event
                try:
                    self._on_event(event)
                except Exception:
                    log.exception("handling XID %d failed", event.xid)
