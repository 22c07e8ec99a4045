"""An XID storm through the real kernel-log follower (NVIDIA/NVSentinel#1120: about 800,000 XID 95 lines
for 29 distinct events): every event is counted, the verdict has one finding per distinct fault with
its count, the log one line per distinct fault (and one summary of its repeats), and the state file
and the lifecycle stay the same size whatever the number of lines.

The figures for 1,000,000 lines (memory, CPU time, state file size, log lines) come from
benchmarks/bench_xid_storm.py, which runs this same storm."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from gpumon.events.xid_log import XidLog
from gpumon.model.findings import CRITICAL, WARNING
from gpumon.model.xid_catalog import XidCatalog

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_xid_storm as storm

LINES = 20_000


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _deferred(pair: tuple[int, int], pairs: set[tuple[int, int]], catalog: XidCatalog) -> bool:
    """An XID that follows another one present on its GPU (the storm writes each GPU's cause first)."""
    gpu, code = pair
    others = {x for g, x in pairs if g == gpu and x != code}
    follows = catalog.lookup(code).follows
    return bool(others) if follows is None else bool(set(follows) & others)


def test_a_storm_is_counted_event_by_event_and_judged_and_logged_fault_by_fault(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    xid_log = XidLog(logging.getLogger("gpumon.events.tracker"), clock=clock)
    figures, health, tracker, lines = storm.run_storm(LINES, tmp_path, xid_log=xid_log)
    expected = storm.expected_counts(LINES)
    assert figures.counted == LINES
    assert {(g, int(x)): n for g in range(storm.GPUS) for x, n in tracker.counts(g).items()} == dict(expected)

    catalog = XidCatalog.load()
    report = health.report()
    xid_findings = [f for f in report.findings if f.kind == "xid"]
    judged = {(f.gpu, f.evidence["xid"]) for f in xid_findings}
    assert len(judged) == len(xid_findings)  # one finding per distinct fault
    own_faults = {
        p for p in expected if catalog.lookup(p[1]).severity != "info" and not _deferred(p, set(expected), catalog)
    }
    assert judged == own_faults
    for f in xid_findings:
        assert f.evidence["count"] == expected[f.gpu, f.evidence["xid"]], f
        assert f.severity in (CRITICAL, WARNING)
    assert report.status == CRITICAL

    xid_lines = [line for line in lines if line.startswith("XID ")]
    assert sorted(xid_lines) == sorted(set(xid_lines))  # the first of each fault, once
    assert len(xid_lines) == len(expected) == 29
    assert len(lines) <= len(expected) + 2  # and the follower's line about its source
    clock.now += 60
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpumon"):
        xid_log.flush()
    summaries = sorted(r.getMessage() for r in caplog.records)
    assert summaries == sorted(
        f"XID {x} on GPU {g} repeated {n - 1:,} times in the last 60 s" for (g, x), n in expected.items() if n > 1
    )


def test_the_state_and_the_lifecycle_stay_the_same_size_whatever_the_number_of_lines(tmp_path: Path) -> None:
    """Past a few thousand lines (the last 4000 identities and 16 entries per GPU and code are held), more
    lines of the same faults change nothing in size."""
    small, _, _, _ = storm.run_storm(LINES // 2, tmp_path / "small")
    big, health, _, _ = storm.run_storm(LINES, tmp_path / "big")
    assert big.state_bytes <= small.state_bytes * 1.2 + 4096, (small, big)
    assert len(health.lifecycle.recent.entries) <= 29 * health.lifecycle.recent.per_code
    assert big.log_lines == small.log_lines
