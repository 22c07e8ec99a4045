"""The health verdict as metric series: ``gpumon_node_health_status``, ``gpumon_health_status`` per GPU,
``gpumon_health_findings`` (by kind: clears that cannot be read, state files set aside, …), and the
straggler and trend signals."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpumon.health.stragglers import Deviation
from gpumon.health.trends import Increase
from gpumon.model.families import Family
from gpumon.model.findings import HealthReport
from gpumon.util.reuse import ReuseSealed

if TYPE_CHECKING:
    from gpumon.health.service import HealthService

STATUS_VALUES = {"OK": 0, "WARNING": 1, "CRITICAL": 2, "UNKNOWN": 3}
"""Nagios' numbers, used for exit codes and the ``gpumon_health_status`` series."""


class HealthCollector:
    """``gpumon_health_status`` per GPU and ``gpumon_node_health_status``, with action and reason labels."""

    def __init__(self, service: HealthService) -> None:
        self._service = service
        self._of_report: ReuseSealed[Family] = ReuseSealed()
        """The families of the last report (``current_report`` hands out the very report while nothing changed)."""
        self._of_signals: ReuseSealed[Family] = ReuseSealed()
        """The families of the very deviations and increases the engines last gave (they keep their
        results while nothing changed), and how many deviations there were."""

    def families(self) -> Iterator[Family]:
        report = self._service.current_report()
        yield from self._of_report.get(lambda: list(self._report_families(report)), same=(report,))
        deviations, increases = self._service.signals()
        yield from self._of_signals.get(
            lambda: list(self._signal_families(deviations, increases)),
            same=(*deviations, *increases),
            equal=(len(deviations),),
        )

    @staticmethod
    def _report_families(report: HealthReport) -> Iterator[Family]:
        help_values = "0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (as gpumon health's exit code)"
        node = Family(
            "gpumon_node_health_status",
            "gauge",
            f"Node health verdict: {help_values}; action and reason of the worst finding.",
            ("action", "reason"),
        )
        node.add([report.action, report.reason()], STATUS_VALUES[report.status])
        yield node
        gpu = Family(
            "gpumon_health_status",
            "gauge",
            f"GPU health verdict: {help_values}; action and reason of its worst finding.",
            ("gpu", "uuid", "action", "reason"),
        )
        for g in report.gpus:
            gpu.add([str(g.index), g.uuid or "", g.action, g.reason], STATUS_VALUES[g.status])
        yield gpu
        findings = Family(
            "gpumon_health_findings",
            "gauge",
            "Health findings now, by kind and severity.",
            ("kind", "severity"),
        )
        counts: dict[tuple[str, str], int] = {}
        for f in report.findings:
            counts[(f.kind, f.severity)] = counts.get((f.kind, f.severity), 0) + 1
        for (kind, severity), n in sorted(counts.items()):
            findings.add([kind, severity], n)
        yield findings

    @staticmethod
    def _signal_families(deviations: list[Deviation], increases: list[Increase]) -> Iterator[Family]:
        deviation = Family(
            "gpumon_straggler_deviation_ratio",
            "gauge",
            "A busy GPU's mean deviation from the median of its same-model peers over the straggler window, "
            "by signal (sm_clock, compute_share, power, sm_active, tensor_active); -0.12 is 12 % below.",
            ("gpu", "uuid", "signal"),
        )
        for d in deviations:
            deviation.add([str(d.index), d.uuid, d.signal], d.ratio)
        yield deviation
        increase = Family(
            "gpumon_error_trend_increase",
            "gauge",
            "How much an error counter rose within its trend window (window_seconds label), resets "
            "counted as counters, only while above 0; counter is ecc_corrected, remapped_rows, retired_pages, "
            "pcie_replays, "
            "nvlink_replay, nvlink_recovery, nvlink_crc or xid (with its code).",
            ("gpu", "uuid", "counter", "xid", "window_seconds"),
        )
        for i in increases:
            if i.increase:  # a counter that did not rise is no series (the series budget, docs/benchmarks.md)
                increase.add([str(i.index), i.uuid, i.counter, i.label, f"{i.window_seconds:g}"], i.increase)
        yield increase
