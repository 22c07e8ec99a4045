"""A tiny sd_notify(3) client: tell systemd that gpumon is ready, alive, reloading or stopping.

No dependency: one datagram to the socket named by ``NOTIFY_SOCKET`` (a path, or an
abstract socket when it starts with ``@``). When ``NOTIFY_SOCKET`` is unset (gpumon
not started by systemd, or a unit without ``Type=notify``) every call does nothing.

How the daemon uses it (see ``systemd/gpumon.service``, ``Type=notify``,
``WatchdogSec=30``):

* ``ready()`` once the first snapshot is published and the HTTP server listens.
* ``watchdog()`` every ``watchdog_interval_seconds() / 2`` (at least every second)
  from the daemon's main loop, which runs no poll and waits on no lock a poll holds,
  so the ping proves the process is alive and answering signals. It is deliberately
  NOT tied to the poll result: a GPU fallen off the bus hangs NVML, and a restart of
  gpumon cannot fix that — gpumon keeps serving the last snapshot with its age and
  alerts on it, which is worth more than a restart loop. A deadlocked main loop, on
  the other hand, is exactly what a restart fixes.
* ``reloading()`` when SIGHUP arrives, then ``ready()`` once the reload is over
  (``status`` says when it was rejected and the running configuration kept).
* ``stopping()`` when SIGTERM arrives.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping


class SystemdNotifier:
    """Sends sd_notify messages to the socket named in the environment.

    ``environ`` defaults to ``os.environ``; ``monotonic_usec`` defaults to
    ``CLOCK_MONOTONIC`` in microseconds (systemd >= 253 wants it with RELOADING=1 for
    ``Type=notify-reload``). Sending never raises: a failure is reported by the return
    value (False) so monitoring never dies over a lost notification.
    """

    def __init__(
        self,
        environ: Mapping[str, str] | None = None,
        monotonic_usec: Callable[[], int] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self._socket_path = env.get("NOTIFY_SOCKET") or None
        self._watchdog_usec = env.get("WATCHDOG_USEC")
        self._watchdog_pid = env.get("WATCHDOG_PID")
        self._monotonic_usec = monotonic_usec or _monotonic_usec

    @property
    def enabled(self) -> bool:
        """True when systemd gave us a notification socket."""
        return self._socket_path is not None

    def address(self) -> str | bytes | None:
        """The socket address to send to: a path, or a NUL-prefixed abstract name (bytes)."""
        if self._socket_path is None:
            return None
        if self._socket_path.startswith("@"):
            return b"\0" + self._socket_path[1:].encode()
        return self._socket_path

    def notify(self, *assignments: str) -> bool:
        """Send ``assignments`` (``"READY=1"``, ``"STATUS=..."``) as one newline-joined datagram.

        Returns True when sent, False when there is no socket or sending failed.
        """
        address = self.address()
        if address is None or not assignments:
            return False
        payload = "\n".join(assignments).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(address)
                sock.sendall(payload)
        except OSError:
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """READY=1 (and STATUS=), after start-up or at the end of a reload."""
        return self.notify("READY=1", *_status(status))

    def status(self, status: str) -> bool:
        """STATUS=<free text> shown by ``systemctl status gpumon``."""
        return self.notify(f"STATUS={_one_line(status)}")

    def watchdog(self) -> bool:
        """WATCHDOG=1: the keep-alive ping."""
        return self.notify("WATCHDOG=1")

    def reloading(self, status: str | None = None) -> bool:
        """RELOADING=1 with MONOTONIC_USEC (required by Type=notify-reload, harmless otherwise)."""
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={self._monotonic_usec()}", *_status(status))

    def stopping(self, status: str | None = None) -> bool:
        """STOPPING=1 when shutting down."""
        return self.notify("STOPPING=1", *_status(status))

    def watchdog_interval_seconds(self) -> float | None:
        """The watchdog timeout systemd enforces (``WatchdogSec=``), seconds, or None when off.

        None also when ``WATCHDOG_PID`` names another process (the watchdog is meant
        for someone else) or ``WATCHDOG_USEC`` is not a positive integer. Ping every
        half of this.
        """
        if self._watchdog_usec is None or self._socket_path is None:
            return None
        if self._watchdog_pid is not None and self._watchdog_pid.strip() != str(os.getpid()):
            return None
        try:
            usec = int(self._watchdog_usec)
        except ValueError:
            return None
        return usec / 1_000_000 if usec > 0 else None

    def watchdog_ping_period_seconds(self) -> float | None:
        """How often to call ``watchdog()``: half the watchdog timeout, or None when off."""
        interval = self.watchdog_interval_seconds()
        return None if interval is None else interval / 2


def _monotonic_usec() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _status(status: str | None) -> tuple[str, ...]:
    return () if status is None else (f"STATUS={_one_line(status)}",)
