"""A reload that shortens a tier's interval is honoured at once (issue 42 item 17): slow tier 60 s -> 5 s
reads the slow tier at the first poll after the reload when its last read is more than 5 s old, and every
5 s from then on, not 60 s after the last read."""

from __future__ import annotations

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.model.poll_intervals import PollIntervals


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def energies_per_second(poller: Poller, clock: Clock, seconds: int) -> list[float | None]:
    """The energy counter (a slow-tier field) each 1 s poll shows."""
    out = []
    for _ in range(seconds):
        out.append(poller.poll().gpus[0].energy_joules_total)
        clock.now += 1.0
    return out


def test_a_shortened_slow_interval_is_honoured_at_the_next_poll() -> None:
    # the fake backend plays one value per tick; a slow read shows the tick reached so far
    backend = FakeBackend.from_mapping({"gpus": [{"values": {"energy_joules_total": list(range(1, 200))}}]})
    clock = Clock()
    poller = Poller(
        backend, SnapshotStore(), PollIntervals(1, 60, 600), monotonic=clock, wall_clock=clock, host_figures=dict
    )
    before = energies_per_second(poller, clock, 10)
    assert len(set(before)) == 1, "one slow read in the first 10 s at 60 s"
    poller.set_intervals(PollIntervals(1, 5, 600))
    after = energies_per_second(poller, clock, 11)
    assert after[0] != before[-1], "the first poll after the reload reads the slow tier (last read 10 s ago)"
    changes = [i for i in range(1, len(after)) if after[i] != after[i - 1]]
    assert changes == [5, 10], "then every 5 s"


def test_a_lengthened_interval_waits_for_the_new_one() -> None:
    backend = FakeBackend.from_mapping({"gpus": [{"values": {"energy_joules_total": list(range(1, 200))}}]})
    clock = Clock()
    poller = Poller(
        backend, SnapshotStore(), PollIntervals(1, 5, 600), monotonic=clock, wall_clock=clock, host_figures=dict
    )
    energies_per_second(poller, clock, 3)
    poller.set_intervals(PollIntervals(1, 30, 600))
    after = energies_per_second(poller, clock, 25)
    assert len(set(after)) == 1, "no slow read before 30 s have passed since the last one"
