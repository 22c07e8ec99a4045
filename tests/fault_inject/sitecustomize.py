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
