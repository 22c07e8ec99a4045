"""The one physical law the simulated GPUs keep: energy is the integral of power.

A real GPU's energy counter (nvmlDeviceGetTotalEnergyConsumption, mJ; nvidia-smi "Total Energy
Consumption") grows by its power over time. The fake backend keeps that:

* a scenario that sets ``power_watts`` (a constant, a list by tick, for the GPU or in ``base``) and
  not ``energy_joules_total`` gets an energy counter that starts at the field's default and grows by
  the power of each tick times ``TICK_SECONDS`` (a tick is one FAST read, one second apart at the
  default interval): a scenario at 600 W shows 600 J more every tick, as a real GPU would;
* the plausible GPUs (``--backend fake``) integrate their power over the clock's seconds.

No other coupling is kept (docs/scenarios.md, "What the simulated GPUs keep"): a scenario's
utilization does not move its clocks or power, its power does not warm it up. The plausible GPUs
move utilization, clocks, power, temperature, memory and their process together, from one load
curve, without thermal lag.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

TICK_SECONDS = 1.0
"""Seconds a scenario tick stands for when energy is integrated (the default fast poll interval)."""


def scenario_values(defaults: Mapping[str, Any], base: Mapping[str, Any], gpu: Mapping[str, Any]) -> dict[str, Any]:
    """A scenario GPU's values: ``defaults``, then ``base``, then the GPU's own; energy follows power
    when the scenario sets power and not energy."""
    values = {**defaults, **base, **gpu}
    given = set(base) | set(gpu)
    if "power_watts" in given and "energy_joules_total" not in given:
        start = values.get("energy_joules_total")
        values["energy_joules_total"] = energy_by_tick(values["power_watts"], float(start or 0.0))
    return values


def _power_at(spec: Any, tick: int) -> float:
    """The power (W) a scenario value gives at ``tick``: a constant, a list by tick (last repeats), a callable."""
    if callable(spec):
        value = spec(tick)
    elif isinstance(spec, list):
        value = spec[min(tick, len(spec) - 1)] if spec else None
    else:
        value = spec
    return float(value) if isinstance(value, int | float) else 0.0


def energy_by_tick(power: Any, start_joules: float, seconds: float = TICK_SECONDS) -> Callable[[int], float]:
    """``energy(tick)``: ``start_joules`` plus the power of every tick before ``tick`` times ``seconds``, J."""
    totals = [start_joules]

    def energy(tick: int) -> float:
        while len(totals) <= tick:
            totals.append(totals[-1] + _power_at(power, len(totals) - 1) * seconds)
        return round(totals[max(tick, 0)], 3)

    return energy


def energy_over_time(
    power: Callable[[int], float], now: Callable[[], float], start_joules: float = 1_000_000.0
) -> Callable[[int], float]:
    """``energy(tick)`` of a GPU whose power is ``power(tick)``: the power of each read held until the next
    (``now()`` seconds), added up, J."""
    state = {"joules": start_joules, "at": now(), "watts": 0.0}

    def energy(tick: int) -> float:
        at = now()
        state["joules"] += state["watts"] * max(0.0, at - state["at"])
        state["at"], state["watts"] = at, float(power(tick))
        return round(state["joules"], 3)

    return energy
