"""The detectors the health service feeds every snapshot and asks for findings: stragglers among
same-model GPUs, error trends, profiling counters stuck at 0 under load, processes stuck in D state.

Each keeps its own window in memory (none is saved in the state directory); ``Detectors`` holds
them together so that the service observes and asks them in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumon.health.config import HealthConfig
from gpumon.health.profiling_stuck import StuckProfiling
from gpumon.health.stragglers import Deviation, StragglerDetector
from gpumon.health.stuck_processes import StuckProcesses
from gpumon.health.trends import Increase, TrendTracker
from gpumon.model.findings import Finding
from gpumon.model.snapshot import Snapshot
from gpumon.model.xid_catalog import XidCatalog


@dataclass(frozen=True)
class Detectors:
    """The snapshot-fed detectors of one health service."""

    stragglers: StragglerDetector
    trends: TrendTracker
    profiling: StuckProfiling
    stuck_processes: StuckProcesses

    @classmethod
    def of(cls, config: HealthConfig, catalog: XidCatalog) -> Detectors:
        return cls(
            StragglerDetector(config.stragglers),
            TrendTracker(config.trends, words=lambda code: xid_meaning(catalog, code)),
            StuckProfiling(),
            StuckProcesses(config.stuck_process_seconds),
        )

    def observe(self, snapshot: Snapshot, burning: bool) -> None:
        self.stragglers.observe(snapshot, burning=burning)
        self.trends.observe(snapshot)
        self.profiling.observe(snapshot)
        self.stuck_processes.observe(snapshot)

    def findings(self, now: float, burning: bool) -> list[Finding]:
        """Their findings at ``now``; no stragglers while a burn makes the GPUs unequal on purpose."""
        found = [] if burning else self.stragglers.findings(now)
        return found + self.trends.findings(now) + self.profiling.findings(now) + self.stuck_processes.findings(now)

    def signals(self, now: float) -> tuple[list[Deviation], list[Increase]]:
        return self.stragglers.deviations(now), self.trends.increases(now)


def xid_meaning(catalog: XidCatalog, code: str) -> str:
    """The catalog's words for XID ``code`` ("" for a code that is not a number or not in the catalog)."""
    try:
        return catalog.lookup(int(code)).meaning
    except (ValueError, AttributeError):
        return ""
