"""The health report's parts and the finding kinds each one can give, so that a caller who wants the
findings of some kinds only (the alert tick's finding rules) has only the parts that make them worked out.

A finding rule names kinds as ``gpumon health --json`` does, ``*`` matching any text (``*_trend``;
gpumon.alerts.rule_config); ``wanted`` turns such names into the parts to work out and the kinds they
stand for. Every kind a part gives is in its row of ``part_kinds`` (tests/health/test_findings_of_kinds.py
holds each part's findings to it): a kind missing there would be a finding an alert never sees.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

POLL = "poll"
"""The daemon's poll, hung or stopped (gpumon.health.poll_watch)."""
XID = "xid"
"""The XID lifecycle: open faults and recent XIDs (gpumon.health.xid_lifecycle)."""
SNAPSHOT = "snapshot"
"""What the latest snapshot alone shows (gpumon.health.gpu_state)."""
BURN = "burn"
"""The last burn's results (gpumon.health.burn_results)."""
CLEARS = "clears"
"""Operator clears that cannot be read (gpumon.health.clears_watch)."""
SET_ASIDE = "set_aside"
"""State files found damaged and moved aside (gpumon.health.service)."""
STRAGGLERS = "stragglers"
TRENDS = "trends"
PROFILING = "profiling"
STUCK_PROCESSES = "stuck_processes"
DETECTORS = frozenset({STRAGGLERS, TRENDS, PROFILING, STUCK_PROCESSES})
"""The snapshot-fed detectors (gpumon.health.detectors)."""
DRIFT = "drift"
"""Drift from the inventory baseline and links judged against the peers (gpumon.health.drift_check)."""

_FIXED_KINDS: Mapping[str, frozenset[str]] = {
    POLL: frozenset({"stale_reading", "nvml_hang"}),
    XID: frozenset({"xid"}),
    SNAPSHOT: frozenset(
        {
            "no_data",
            "nvml_down",
            "gpu_lost",
            "row_remap_failure",
            "row_remap_pending",
            "row_remap_banks_exhausted",
            "recovery_action",
            "retired_pages_pending",
            "ecc_uncorrectable",
            "fabric_not_ready",
            "overheating",
        }
    ),
    BURN: frozenset({"burn_failed"}),
    CLEARS: frozenset({"clears_unreadable"}),
    SET_ASIDE: frozenset({"state_damaged"}),
    STRAGGLERS: frozenset({"straggler"}),
    PROFILING: frozenset({"profiling_stuck"}),
    STUCK_PROCESSES: frozenset({"stuck_process"}),
    DRIFT: frozenset(
        {
            "gpu_missing",
            "gpu_count",
            "driver_changed",
            "vbios_changed",
            "model_changed",
            "nvlink_down",
            "pcie_degraded",
            "p2p_lost",
        }
    ),
}

ALL_PARTS = frozenset({*_FIXED_KINDS, TRENDS})
CLEARS_READERS = frozenset({XID, BURN, CLEARS})
"""The parts that read the operator clears (a clear resolves faults and failed burns)."""


def part_kinds(trend_counters: Iterable[str]) -> dict[str, frozenset[str]]:
    """Each part's finding kinds; ``trend_counters``: the counters the trends follow (``health.trends``),
    each ``COUNTER_trend``."""
    return {**_FIXED_KINDS, TRENDS: frozenset(f"{counter}_trend" for counter in trend_counters)}


@dataclass(frozen=True)
class Wanted:
    """What to work out for the findings of some kinds."""

    parts: frozenset[str]
    """The parts that can give a finding of those kinds."""
    kinds: frozenset[str]
    """The kinds those parts give that the names match: their findings of other kinds are left out."""


def wanted(names: Iterable[str], kinds_of: Mapping[str, frozenset[str]]) -> Wanted:
    """The parts and kinds for finding kinds named ``names`` (``*`` matches any text); ``kinds_of``: ``part_kinds``."""
    patterns = tuple(names)
    parts: set[str] = set()
    kinds: set[str] = set()
    for part, part_kinds_ in kinds_of.items():
        matched = {kind for kind in part_kinds_ if any(fnmatchcase(kind, p) for p in patterns)}
        if matched:
            parts.add(part)
            kinds |= matched
    return Wanted(frozenset(parts), frozenset(kinds))
