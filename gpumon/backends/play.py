"""A scenario played to its point of interest by the one-shot commands (``gpumon once``,
``gpumon health``).

A scenario's faults happen at ticks (a GPU's tick is the number of its reads so far): ``fake:gpu-lost``
loses GPU 1 at tick 5. One poll sees tick 0 only, where nothing has happened yet, so a one-shot
command polls the scenario up to its last scripted tick (``FakeBackend.last_scripted_tick``), or to
the tick the user names (``--tick N``; 0 is the first poll). Polls follow each other at once: a tick
is a read, not a second. Real GPUs are polled once.

A scenario whose NVML comes later (``fake:nvml-missing``: the first initialisations fail) is polled
until it finds its GPUs, on a ``PlayClock`` that moves past each retry's backoff, as the daemon's
clock does between its polls; the GPUs' tick 0 is that poll's read.
"""

from __future__ import annotations

import time
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


NVML_RETRIES = 6
"""The NVML retries a one-shot command plays: those the daemon makes in its first minute (1, 2, 4, ... 32 s
apart). A scenario whose NVML stays away longer is shown without NVML, as the daemon shows it then."""
RETRY_STEP_SECONDS = 3600.0
"""How far a PlayClock moves after a poll without NVML: past any backoff of the poller's NVML retry."""


class PlayClock:
    """Monotonic seconds for a scenario played at once (the poller's ``monotonic``): the real clock,
    moved on by RETRY_STEP_SECONDS after each poll that found no NVML, so the next poll retries."""

    def __init__(self) -> None:
        self._ahead_seconds = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self._ahead_seconds

    def step(self) -> None:
        self._ahead_seconds += RETRY_STEP_SECONDS


def play(poll: Callable[[], Snapshot], tick: int | None, clock: PlayClock | None = None) -> Snapshot:
    """Poll until the reads of tick ``tick`` have been made (``tick + 1`` polls; None: one poll). A
    scenario without NVML at first (``clock`` given: the poller's) is polled until it has its GPUs
    (at most NVML_RETRIES more polls), and its tick 0 is the first poll that reads them."""
    snapshot = poll()
    retries = 0
    while clock is not None and tick is not None and not snapshot.nvml_up and retries < NVML_RETRIES:
        clock.step()
        snapshot = poll()
        retries += 1
    for _ in range(tick or 0):
        snapshot = poll()
    return snapshot


def tick_note(tick: int, given: bool) -> str:
    """The line that says which tick of the scenario is shown (within 80 columns)."""
    if given:
        return f"simulated: tick {tick} of the scenario (--tick)"
    return f"simulated: tick {tick}, the scenario's last scripted event (--tick N for another)"
