"""Loaded at start by a gpumon a test runs with this folder first on PYTHONPATH (never otherwise).

``accept()`` fails as the file named by ``FAULT_ACCEPT_CONTROL`` says, read at every call:
``ERRNAME once`` (the next accept fails with errno.ERRNAME, then the file is removed) or
``ERRNAME always`` (every accept fails while the file says so); no file, no fault. This is how
a test meets the accept() errors the kernel gives rarely (ECONNABORTED, EPROTO)."""

from __future__ import annotations

import errno
import os
import socket

_CONTROL = os.environ.get("FAULT_ACCEPT_CONTROL")

if _CONTROL:
    _real_accept = socket.socket.accept

    def _accept(self: socket.socket) -> tuple[socket.socket, object]:
        try:
            with open(_CONTROL) as f:  # type: ignore[arg-type]
                words = f.read().split()
        except FileNotFoundError:
            words = []
        if len(words) == 2:
            code = getattr(errno, words[0])
            if words[1] == "once":
                os.unlink(_CONTROL)  # type: ignore[arg-type]
            raise OSError(code, os.strerror(code))
        return _real_accept(self)

    socket.socket.accept = _accept  # type: ignore[method-assign,assignment]

# The wall clock read from ``FAULT_WALL_OFFSET_FILE``: seconds added to the real wall clock (read at
# most every 50 ms), as ``time.time`` and as APScheduler's ``datetime.now`` see it. The monotonic
# clock runs on untouched, as it does when NTP steps the clock of a VM after a pause.
_WALL_OFFSET_FILE = os.environ.get("FAULT_WALL_OFFSET_FILE")

if _WALL_OFFSET_FILE:
    import datetime as _datetime
    import time as _time

    _real_time = _time.time
    _offset = {"seconds": 0.0, "read_at": -1.0}

    def _stepped_time() -> float:
        now = _time.monotonic()
        if now - _offset["read_at"] >= 0.05:
            _offset["read_at"] = now
            try:
                with open(_WALL_OFFSET_FILE) as f:  # type: ignore[arg-type]
                    _offset["seconds"] = float(f.read().strip() or 0)
            except (OSError, ValueError):
                pass
        return _real_time() + _offset["seconds"]

    class _SteppedDatetime(_datetime.datetime):
        @classmethod
        def now(cls, tz: _datetime.tzinfo | None = None) -> _datetime.datetime:  # type: ignore[override]
            return _datetime.datetime.fromtimestamp(_stepped_time(), tz)

    _time.time = _stepped_time  # type: ignore[assignment]
    import apscheduler.executors.base
    import apscheduler.schedulers.base

    apscheduler.schedulers.base.datetime = _SteppedDatetime  # type: ignore[misc]
    apscheduler.executors.base.datetime = _SteppedDatetime  # type: ignore[misc]
