"""The event thread: waits on the backend for XIDs; an XID ends the wait at once, so it is seen as it comes.

Each wait lasts at most ``wait_seconds`` (1 s): the thread wakes that often to see a stop or NVML
coming up. An idle wake costs CPU (docs/benchmarks.md, daemon CPU), and a stop waits for the wait
in progress (NVML's event set is never freed under it), so SIGTERM ends gpumon within about that."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpumon.backends.base import GpuBackend, GpuLostError
from gpumon.model.xid import XidEvent

log = logging.getLogger(__name__)


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
        wait_seconds: float = 1.0,
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
        NVML to come up starts waiting for events now, not at the end of its wait."""
        self._up.set()

    def request_stop(self) -> None:
        """Ask the thread to end after its current wait (at most ``wait_seconds``)."""
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
                self._stop.wait(self._wait)
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
