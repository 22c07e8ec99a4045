"""The daemon's main loop woken without a lock: signals noted by flags and a wake-up fd.

A Python signal handler runs on the main thread between two bytecodes, also while that thread holds
a lock. ``threading.Event.set()`` takes the Event's lock, so a handler that calls it while the main
loop is inside ``Event.clear()`` or ``wait()`` deadlocks, and at a few thousand SIGHUPs a second the
handlers nest until a RecursionError ends the daemon. Here a handler only stores ``True`` in an
attribute (no lock, no call); the signal's arrival also writes a byte to the wake-up socket
(``signal.set_wakeup_fd``, done by the interpreter's C handler), and other threads write one the same
way (``ring``). The main loop waits on that socket with ``select`` and then reads the flags, which a
full socket (a SIGHUP storm) never loses: SIGTERM always stops, a burst of SIGHUPs is one reload.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
from types import FrameType


class SignalFlags:
    """What signals came, set by handlers that do nothing else; read (and cleared) by the main loop."""

    def __init__(self) -> None:
        self.stop = False
        """SIGTERM or SIGINT came (or ``request_stop``): never cleared."""
        self.reload = False
        """SIGHUP came since the main loop last cleared it."""

    def on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop = True

    def on_hangup(self, signum: int, frame: FrameType | None) -> None:
        self.reload = True


class Wakeup:
    """A socket pair: ``ring`` from any thread (or a signal) wakes ``wait`` on the main thread."""

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._previous_fd: int | None = None

    def ring(self) -> None:
        """Wake the waiter; never blocks (a full socket already holds a wake-up)."""
        with contextlib.suppress(OSError):
            self._writer.send(b"\0")

    def wait(self, timeout_seconds: float) -> None:
        """Return when rung (or a signal came) or after ``timeout_seconds``; every pending wake-up is consumed."""
        with contextlib.suppress(InterruptedError):
            select.select([self._reader], [], [], max(0.0, timeout_seconds))
        with contextlib.suppress(OSError):
            while self._reader.recv(4096):
                pass

    def take_signals(self) -> bool:
        """Make signals ring this (the interpreter writes a byte per signal); False off the main thread,
        where Python allows no signal handling."""
        try:
            self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        except ValueError:
            return False
        return True

    def close(self) -> None:
        """Give the wake-up fd back (the one before ``take_signals``) and close the sockets; once is enough."""
        if self._reader.fileno() < 0:
            return  # closed already
        if self._previous_fd is not None:
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(self._previous_fd)
            self._previous_fd = None
        self._reader.close()
        self._writer.close()
