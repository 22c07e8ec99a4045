"""Wall-clock seconds that never step, for ageing things (``for: 10m``, a snapshot's age).

``SteadyClock(wall, monotonic)()`` is the wall time at its creation plus the monotonic time
since: it reads like Unix seconds (it can be saved and compared across a restart) but a step of
the wall clock (NTP after a VM pause, an operator's ``date -s``) does not move it. ``to_wall(t)``
and ``from_wall(t)`` convert between it and the wall clock as it reads now, for what is shown and
sent (an alert's startsAt) and for times that come from outside (an XID's kernel timestamp)."""

from __future__ import annotations

import time
from collections.abc import Callable


class SteadyClock:
    """Unix seconds advanced by the monotonic clock only; callable."""

    def __init__(self, wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._wall = wall
        self._mono = monotonic
        self._anchor = wall() - monotonic()

    def __call__(self) -> float:
        return self._anchor + self._mono()

    def to_wall(self, seconds: float) -> float:
        """``seconds`` on this clock as the wall clock reads that moment now (Unix seconds)."""
        return seconds + (self._wall() - self())

    def from_wall(self, seconds: float) -> float:
        """A wall-clock time (Unix seconds) on this clock."""
        return seconds - (self._wall() - self())
