"""The simulated GPUs keep one law of physics: their energy counter is the integral of their power."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gpumon.backends.fake import FakeBackend
from gpumon.backends.fake_physics import TICK_SECONDS
from gpumon.model.snapshot import Tier


def energies(backend: FakeBackend, ticks: int) -> list[float]:
    """The energy counter a poller sees at each tick (a FAST read moves the tick, the SLOW one reads energy)."""
    out = []
    for _ in range(ticks):
        out.append(backend.read(0, Tier.SLOW)["energy_joules_total"])
        backend.read(0, Tier.FAST)
    return out


def test_a_scenario_at_600_watts_uses_600_joules_a_second() -> None:
    backend = FakeBackend.from_mapping({"count": 1, "base": {"power_watts": 600.0}})
    seen = energies(backend, 5)
    assert [b - a for a, b in itertools.pairwise(seen)] == [600.0 * TICK_SECONDS] * 4


@pytest.mark.parametrize(
    "scenario",
    [
        {"gpus": [{"values": {"power_watts": [100.0, 300.0, 700.0]}}]},
        {"count": 1, "base": {"power_watts": [100.0, 300.0, 700.0]}},
    ],
)
def test_energy_follows_power_that_changes_by_tick(scenario: dict[str, Any]) -> None:
    seen = energies(FakeBackend.from_mapping(scenario), 5)
    assert [b - a for a, b in itertools.pairwise(seen)] == [100.0, 300.0, 700.0, 700.0]


def test_a_scenario_that_sets_energy_plays_its_own_energy() -> None:
    backend = FakeBackend.from_mapping({"count": 1, "base": {"power_watts": 600.0, "energy_joules_total": [5.0, 6.0]}})
    assert energies(backend, 3) == [5.0, 6.0, 6.0]


def test_the_plausible_gpus_energy_is_their_power_over_the_clock() -> None:
    now = [1000.0]
    backend = FakeBackend.plausible(1, clock=lambda: now[0])
    first = backend.read(0, Tier.SLOW)["energy_joules_total"]
    power = backend.read(0, Tier.FAST)["power_watts"]
    now[0] += 10.0
    second = backend.read(0, Tier.SLOW)["energy_joules_total"]
    assert second - first == pytest.approx(power * 10.0, rel=1e-6)
