"""NVLink error trends follow each counter per link: a link missing from a read is neither a reset
nor a rise, a link's own reset is that link's, and a finding names the links that rose."""

from __future__ import annotations

from typing import Any

from gpumon.health.trends import TrendsConfig, TrendTracker
from tests.signals.helpers import gpu, snap

T0 = 1_000_000.0


def links(**replays: int) -> dict[str, dict[str, int]]:
    """``nvlink_errors_total`` with these replay counts by link (``l0=5``: link 0)."""
    return {name[1:]: {"replay": count, "recovery": 0, "crc": 0} for name, count in replays.items()}


def feed(tracker: TrendTracker, reads: list[dict[str, Any]]) -> None:
    """One snapshot a second of GPU 0, one read each."""
    for t, read in enumerate(reads):
        tracker.observe(snap(T0 + t, gpu(0, nvlink_errors_total=read)))


def replays(tracker: TrendTracker, t: float) -> float:
    return next(i.increase for i in tracker.increases(T0 + t) if i.counter == "nvlink_replay")


def test_a_link_missing_from_some_reads_is_neither_a_reset_nor_a_rise() -> None:
    tracker = TrendTracker(TrendsConfig())
    steady = links(l0=1000, l1=850, l2=3)
    flapping = links(l0=1000, l2=3)  # link 1 left out of the read, then back with the same count
    feed(tracker, [steady, flapping, steady, flapping, steady, steady, flapping, steady])
    assert replays(tracker, 7) == 0
    assert tracker.findings(T0 + 7) == []


def test_a_rise_on_one_link_counts_while_another_flaps() -> None:
    tracker = TrendTracker(TrendsConfig())
    feed(
        tracker,
        [links(l0=10, l1=850), links(l0=10), links(l0=70, l1=850), links(l0=130), links(l0=160, l1=850)],
    )
    assert replays(tracker, 4) == 150
    (finding,) = tracker.findings(T0 + 4)
    assert finding.kind == "nvlink_replay_trend" and finding.gpu == 0
    assert finding.evidence["links"] == {"0": 150}
    assert "link 0" in finding.reason()


def test_one_links_reset_counts_that_link_from_zero_and_leaves_the_others_alone() -> None:
    tracker = TrendTracker(TrendsConfig())
    feed(tracker, [links(l0=500, l1=900), links(l0=500, l1=920), links(l0=4, l1=930)])
    assert replays(tracker, 2) == 30 + 4  # link 1 rose by 30, link 0 was reset and counts its 4 again


def test_a_link_first_seen_later_starts_from_its_own_total() -> None:
    tracker = TrendTracker(TrendsConfig())
    feed(tracker, [links(l0=5), links(l0=5), links(l0=5, l1=4000), links(l0=6, l1=4000)])
    assert replays(tracker, 3) == 1
