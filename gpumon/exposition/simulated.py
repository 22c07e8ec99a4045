"""``gpumon_simulated``: whether the GPUs on this exporter are simulated (``--backend fake``).

A demo scraped into a real Prometheus would otherwise look like real hardware. One series per
exporter, always present: 1 for the fake backend, 0 for real GPUs through NVML, so a rule such as
``gpumon_simulated == 1`` finds a demo left running in a fleet.
"""

from __future__ import annotations

from gpumon.model.families import Family


class SimulatedSource:
    """A metric source of the one ``gpumon_simulated`` gauge (fixed for the daemon's life)."""

    def __init__(self, simulated: bool) -> None:
        self._family = Family(
            "gpumon_simulated",
            "gauge",
            "1 when the GPUs are simulated by gpumon's fake backend (--backend fake), not real hardware; 0 for real GPUs.",
            samples=[((), 1.0 if simulated else 0.0)],
        )
        """The one family, made once: the same object every scrape (its text rendered once)."""

    def families(self) -> list[Family]:
        return [self._family]
