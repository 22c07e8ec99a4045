"""Ctrl-C and SIGTERM held back while a burn starts threads and worker processes."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM for the block; one that came meanwhile is raised as KeyboardInterrupt after it.

    Blocking the signals in this thread also starts the spawned workers with them blocked
    (they unblock first thing, in worker.main). Blocking alone is not enough in the parent:
    another thread (the watcher, the queue's feeder) can take a process-directed signal, and
    Python then runs the handler in the main thread anyway, so the handlers are swapped too.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []

    def remember(signum: int, _frame: Any) -> None:
        pending.append(signum)

    previous = {sig: signal.signal(sig, remember) for sig in (signal.SIGINT, signal.SIGTERM)}
    held = signal.pthread_sigmask(signal.SIG_BLOCK, set(previous))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    if pending:
        raise KeyboardInterrupt
