"""The health report as the daemon asks for it: each scrape's health series and the alert tick's finding rules.

``current`` hands out the report kept while nothing it reads changed (gpumon.health.report_inputs): the very
snapshot, no XID or accepted inventory since, the same stamps of its files and the same burn marker, and
less than REPORT_REUSE_SECONDS old (what only time changes, such as an XID leaving its window, is late by
at most that). Its files are stat'ed at every ask, so a clear, a baseline or a burn's results written
since the last ask show at this one: with a scrape every second the poll thread's render-ahead asks first
and the scrape again for the same snapshot, and a clear written in between shows in that scrape.

``findings_of`` answers the finding rules: the findings of the kinds they name, with only the report's
parts that give such kinds worked out (gpumon.health.report_parts), or taken from the kept report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpumon.health.report_inputs import ReportInputs
from gpumon.health.report_parts import Wanted, part_kinds, wanted
from gpumon.model.findings import Finding, HealthReport, verdict_order
from gpumon.model.snapshot import Snapshot
from gpumon.util.file_stamp import file_stamp
from gpumon.util.reuse import Reuse

if TYPE_CHECKING:
    from gpumon.health.service import HealthService

REPORT_REUSE_SECONDS = 1.0
"""How long the scrape may reuse an unchanged health report (the default poll interval)."""


class ReportCache:
    """The last report of a health service and what it read. Thread-safe as the service is (it locks)."""

    def __init__(self, service: HealthService, monotonic: Callable[[], float]) -> None:
        self._service = service
        self._monotonic = monotonic
        clears, inventory, burn_results, self._marker = service.report_files
        files = (*clears, inventory, burn_results, self._marker.path)
        self._paths = tuple(str(p) for p in files)
        """The files a report reads, stat'ed at every ask: the clears', the baseline, the burn's results and marker."""
        self._clears_count = len(clears)
        self._report: Reuse[tuple[float, HealthReport]] = Reuse()
        """The last report and when it was made (``monotonic``), with what it read."""
        self._part_kinds = part_kinds(service.config.trends.rules)
        self._wanted: Reuse[Wanted] = Reuse()
        """The parts and kinds of the kind names last asked for (``findings_of``)."""

    def inputs(self, generation: int) -> ReportInputs:
        """The stamps of the report's files and the burn marker now, with the service's input count."""
        stamps = tuple(map(file_stamp, self._paths))  # one pass of stats, no frame of ours a file
        n = self._clears_count
        burn = self._marker.read() if stamps[-1] is not None else None  # only a marker there is read (its pid checked)
        return ReportInputs(generation, stamps[:n], stamps[n], stamps[n + 1], burn)

    def current(self) -> HealthReport:
        """The service's report(), reused while nothing it reads changed."""
        snapshot, inputs = self._inputs_now()
        now = self._monotonic()
        kept = self._report.kept(same=(snapshot,), equal=(inputs,))
        if kept is not None and now - kept[0] < REPORT_REUSE_SECONDS:
            return kept[1]
        self._report.forget()  # the key read before: an input arriving meanwhile is not lost
        build = self._service.report
        return self._report.get(lambda: (now, build(inputs=inputs)), same=(snapshot,), equal=(inputs,))[1]

    def findings_of(self, names: frozenset[str]) -> list[Finding]:
        """The findings of ``current()`` of the kinds ``names`` names (``*`` matches any text), in its order."""
        want = self._wanted.get(lambda: wanted(names, self._part_kinds), equal=(names,))
        snapshot, inputs = self._inputs_now()
        kept = self._report.kept(same=(snapshot,), equal=(inputs,))
        if kept is not None and self._monotonic() - kept[0] < REPORT_REUSE_SECONDS:
            return [f for f in kept[1].findings if f.kind in want.kinds]
        if not want.parts:
            return []
        found = self._service.findings(want.parts, inputs)
        return sorted((f for f in found if f.kind in want.kinds), key=verdict_order)

    def _inputs_now(self) -> tuple[Snapshot | None, ReportInputs]:
        """What the report reads besides the clock: the snapshot (the very object), and what is compared by value."""
        snapshot, generation = self._service.snapshot_now()
        return snapshot, self.inputs(generation)
