"""SIGHUP while ``gpumon run`` starts: kept for the daemon, never the end of it.

SIGHUP's default action ends a process, and the daemon installs its own handler only once it is
built (imports, the config, the backend, the port: a few hundred milliseconds). A service manager
that reloads right after a start would kill it. ``hold_hangups(argv)`` (first thing for ``run``)
installs a handler that only notes a SIGHUP; the daemon's own handler replaces it and
``received_early`` says whether one came meanwhile (the daemon then reloads once)."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Sequence
from types import FrameType


class EarlyHangup:
    """A SIGHUP handler that notes the signal."""

    def __init__(self) -> None:
        self.received = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.received = True


def hold_hangups(argv: Sequence[str]) -> None:
    """For ``gpumon run`` (the first word of ``argv`` that is not an option), note SIGHUP instead of
    dying of it; other commands keep the default (a terminal's hangup ends them)."""
    if next((word for word in argv if not word.startswith("-")), None) != "run":
        return
    if isinstance(signal.getsignal(signal.SIGHUP), EarlyHangup):
        return  # held already (python -m gpumon, then main()): keep what it noted
    with contextlib.suppress(ValueError):  # not the main thread (main() called from a test's thread)
        signal.signal(signal.SIGHUP, EarlyHangup())


def received_early(previous_handler: object) -> bool:
    """Whether ``previous_handler`` (what ``signal.signal`` returned) noted a SIGHUP."""
    return isinstance(previous_handler, EarlyHangup) and previous_handler.received
