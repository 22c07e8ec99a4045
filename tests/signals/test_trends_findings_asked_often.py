"""Trend findings asked often are those a tracker asked once gives: the alert tick asks every 5 s and each
scrape's health report asks too, and the tracker keeps the findings of the increases it last worked out
instead of making each finding again; what it answers never depends on what was asked before."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.health.trends import TrendRule, TrendsConfig, TrendTracker
from tests.signals.helpers import gpu, snap

T0 = 1_000_000.0
CONFIG = TrendsConfig(
    rules={
        "ecc_corrected": TrendRule(window_seconds=40.0, max_increase=3),
        "pcie_replays": TrendRule(window_seconds=10.0, max_increase=0),
        "xid": TrendRule(window_seconds=25.0, max_increase=1),
    }
)

rise = st.fixed_dictionaries(
    {"gpu": st.integers(0, 1), "counter": st.sampled_from(["ecc", "pcie", "xid 79", "xid 13"]), "by": st.integers(0, 4)}
)
polls = st.lists(st.lists(rise, max_size=2), min_size=1, max_size=60)
"""Each poll (a second apart): the counters that rose since the poll before, by how much."""


def snapshots(rises_by_poll: list[list[dict[str, Any]]]) -> list[Any]:
    """The snapshots of two GPUs whose counters rose so; a counter that did not rise keeps its object."""
    counters: list[dict[str, Any]] = [{"ecc": {"corrected_volatile": 0}, "pcie": 0, "xid": {}} for _ in range(2)]
    out = []
    for t, rises in enumerate(rises_by_poll):
        for r in rises:
            mine = counters[r["gpu"]]
            if r["counter"] == "ecc":
                mine["ecc"] = {"corrected_volatile": mine["ecc"]["corrected_volatile"] + r["by"]}
            elif r["counter"] == "pcie":
                mine["pcie"] += r["by"]
            else:
                code = int(r["counter"].split()[1])
                mine["xid"] = {**mine["xid"], code: mine["xid"].get(code, 0) + r["by"]}
        gpus = [
            gpu(i, ecc_errors_total=c["ecc"], pcie_replays_total=c["pcie"], xid_errors_total=c["xid"] or None)
            for i, c in enumerate(counters)
        ]
        out.append(snap(T0 + t, *gpus))
    return out


@settings(max_examples=60, deadline=None)
@given(polls, st.lists(st.integers(0, 70), min_size=1, max_size=4))
def test_the_findings_asked_at_every_poll_are_those_of_a_tracker_asked_once(
    rises_by_poll: list[list[dict[str, Any]]], later: list[int]
) -> None:
    fed = snapshots(rises_by_poll)
    asked_often = TrendTracker(CONFIG)
    for n, snapshot in enumerate(fed):
        asked_often.observe(snapshot)
        for moment in [snapshot.timestamp_seconds, *(snapshot.timestamp_seconds + s for s in later)]:
            found = asked_often.findings(moment)
            assert found == asked_often.findings(moment)  # asked twice: the same
            fresh = TrendTracker(CONFIG)
            for earlier in fed[: n + 1]:
                fresh.observe(earlier)
            assert found == fresh.findings(moment)
