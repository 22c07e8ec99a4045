"""The detectors the health service feeds every snapshot and asks for findings: stragglers among
same-model GPUs, error trends, profiling counters stuck at 0 under load, processes stuck in D state.

Each keeps its own window in memory (none is saved in the state directory); ``Detectors`` holds
them together so that the service observes and asks them in one place.

The service hands each snapshot over as it comes (``take``: a list append on the poll thread) and the
detectors observe the snapshots taken, in order, when they are next asked (the alert tick every 5 s, a
scrape's health series, ``gpumon health``) or once ``BATCH_POLLS`` wait: what they answer is what
observing each snapshot as it came gives (they are pure, each snapshot carries its own time, and
whether a burn ran is taken with it), while a daemon pays one pass over a few snapshots with its
caches warm instead of one after each idle second.
"""

from __future__ import annotations

import logging
from collections.abc import Set
from dataclasses import dataclass, field

from gpumon.health.config import HealthConfig
from gpumon.health.profiling_stuck import StuckProfiling
from gpumon.health.report_parts import DETECTORS as ALL
from gpumon.health.report_parts import PROFILING, STRAGGLERS, STUCK_PROCESSES, TRENDS
from gpumon.health.stragglers import Deviation, StragglerDetector
from gpumon.health.stuck_processes import StuckProcesses
from gpumon.health.trends import Increase, TrendTracker
from gpumon.model.findings import Finding
from gpumon.model.snapshot import Snapshot
from gpumon.model.xid_catalog import XidCatalog

log = logging.getLogger(__name__)

BATCH_POLLS = 10
"""The most snapshots taken and not yet observed (the energy listener holds as many: gpumon.collect.energy)."""


@dataclass(frozen=True)
class Detectors:
    """The snapshot-fed detectors of one health service."""

    stragglers: StragglerDetector
    trends: TrendTracker
    profiling: StuckProfiling
    stuck_processes: StuckProcesses
    pending: list[tuple[Snapshot, bool]] = field(default_factory=list)
    """The snapshots taken and not yet observed, oldest first, each with whether a burn ran then."""

    @classmethod
    def of(cls, config: HealthConfig, catalog: XidCatalog) -> Detectors:
        return cls(
            StragglerDetector(config.stragglers),
            TrendTracker(config.trends, words=lambda code: xid_meaning(catalog, code)),
            StuckProfiling(),
            StuckProcesses(config.stuck_process_seconds),
        )

    def take(self, snapshot: Snapshot, burning: bool) -> None:
        """A snapshot to observe before the next question (``burning``: a burn runs now)."""
        self.pending.append((snapshot, burning))
        if len(self.pending) >= BATCH_POLLS:
            self.catch_up()

    def catch_up(self) -> None:
        """Observe the snapshots taken, in order; one a detector cannot take is logged and passed over."""
        pending = self.pending[:]
        self.pending.clear()
        for snapshot, burning in pending:
            try:
                self.observe(snapshot, burning)
            except Exception:
                log.exception("health: cannot take the snapshot into account")

    def observe(self, snapshot: Snapshot, burning: bool) -> None:
        self.stragglers.observe(snapshot, burning=burning)
        self.trends.observe(snapshot)
        self.profiling.observe(snapshot)
        self.stuck_processes.observe(snapshot)

    def findings(self, now: float, burning: bool, parts: Set[str] = ALL) -> list[Finding]:
        """Their findings at ``now``; no stragglers while a burn makes the GPUs unequal on purpose. ``parts``:
        the detectors asked (gpumon.health.report_parts: ``stragglers``, ``trends``, ``profiling``,
        ``stuck_processes``), all of them by default."""
        self.catch_up()
        found = [] if burning or STRAGGLERS not in parts else self.stragglers.findings(now)
        found += self.trends.findings(now) if TRENDS in parts else []
        found += self.profiling.findings(now) if PROFILING in parts else []
        return found + (self.stuck_processes.findings(now) if STUCK_PROCESSES in parts else [])

    def signals(self, now: float) -> tuple[list[Deviation], list[Increase]]:
        self.catch_up()
        return self.stragglers.deviations(now), self.trends.increases(now)


def xid_meaning(catalog: XidCatalog, code: str) -> str:
    """The catalog's words for XID ``code`` ("" for a code that is not a number or not in the catalog)."""
    try:
        return catalog.lookup(int(code)).meaning
    except (ValueError, AttributeError):
        return ""
