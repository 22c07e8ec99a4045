"""A scenario played to its point of interest by the one-shot commands (``gpumon once``,
``gpumon health``).

A scenario's faults happen at ticks (a GPU's tick is the number of its reads so far): ``fake:gpu-lost``
loses GPU 1 at tick 5. One poll sees tick 0 only, where nothing has happened yet, so a one-shot
command polls the scenario up to its last scripted tick (``FakeBackend.last_scripted_tick``), or to
the tick the user names (``--tick N``; 0 is the first poll). Polls follow each other at once: a tick
is a read, not a second. Real GPUs are polled once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpumon.model.snapshot import Snapshot

MAX_DEFAULT_TICK = 1000
"""The furthest a scenario is played without --tick (a value list of a million entries is not played out)."""


def tick_to_show(backend: Any, tick: int | None) -> int | None:
    """The tick a one-shot command shows: ``tick`` when given, else the scenario's last scripted tick;
    None for a backend that is not simulated (one poll)."""
    last = getattr(backend, "last_scripted_tick", None)
    if last is None:
        return None
    return min(int(last()), MAX_DEFAULT_TICK) if tick is None else tick


def play(poll: Callable[[], Snapshot], tick: int | None) -> Snapshot:
    """Poll until the reads of tick ``tick`` have been made (``tick + 1`` polls; None: one poll)."""
    snapshot = poll()
    for _ in range(tick or 0):
        snapshot = poll()
    return snapshot


def tick_note(tick: int, given: bool) -> str:
    """The line that says which tick of the scenario is shown (within 80 columns)."""
    if given:
        return f"simulated: tick {tick} of the scenario (--tick)"
    return f"simulated: tick {tick}, the scenario's last scripted event (--tick N for another)"
