"""Error trends: a counter rising within its window warns, with the action; resets are counter resets."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.health.config import parse_health
from gpumon.health.trends import TrendRule, TrendsConfig, TrendTracker
from tests.helpers import run_cli
from tests.signals.helpers import gpu, snap

T0 = 1_000_000.0


def feed(tracker: TrendTracker, values_by_second: dict[int, dict[str, Any]], seconds: int) -> None:
    """One snapshot a second of GPU 0; ``values_by_second`` gives the fields from that second on."""
    current: dict[str, Any] = {}
    for t in range(seconds):
        current.update(values_by_second.get(t, {}))
        tracker.observe(snap(T0 + t, gpu(0, **current)))


def test_corrected_ecc_rising_past_the_limit_within_the_hour_warns_to_plan_a_replacement() -> None:
    tracker = TrendTracker(TrendsConfig())
    feed(
        tracker,
        {
            0: {"ecc_errors_total": {"corrected_volatile": 5000}},
            600: {"ecc_errors_total": {"corrected_volatile": 5150}},
        },
        700,
    )
    findings = tracker.findings(T0 + 699)
    assert [f.reason() for f in findings] == [
        "GPU 0 corrected ECC errors rising: 150 in the last 1 h (more than 100), plan a replacement, "
        "the memory is degrading: replace GPU"
    ]
    assert findings[0].kind == "ecc_corrected_trend" and findings[0].severity == "WARNING"
    assert tracker.findings(T0 + 600 + 3601) == []  # an hour later the rise is out of the window


def test_totals_from_before_gpumon_started_are_not_a_rate() -> None:
    tracker = TrendTracker(TrendsConfig())
    feed(tracker, {0: {"ecc_errors_total": {"corrected_volatile": 90000}, "pcie_replays_total": 4000}}, 30)
    assert tracker.findings(T0 + 29) == []


def test_a_counter_reset_by_a_driver_reload_is_not_a_negative_rate_nor_a_rise() -> None:
    tracker = TrendTracker(TrendsConfig())
    feed(
        tracker,
        {0: {"ecc_errors_total": {"corrected_volatile": 500}}, 10: {"ecc_errors_total": {"corrected_volatile": 3}}},
        20,
    )
    increases = {i.counter: i.increase for i in tracker.increases(T0 + 19)}
    assert increases["ecc_corrected"] == 3  # counted from 0 after the reset, as Prometheus' increase()
    assert tracker.findings(T0 + 19) == []


def test_pcie_replays_more_than_8_a_minute_warn_to_check_the_slot() -> None:
    tracker = TrendTracker(TrendsConfig())
    feed(tracker, {t: {"pcie_replays_total": 100 + t} for t in range(0, 12)}, 12)
    (finding,) = tracker.findings(T0 + 11)
    assert finding.reason() == (
        "GPU 0 PCIe replays rising: 11 in the last 1 min (more than 8), check the PCIe slot, riser and cabling: "
        "inspect hardware"
    )


def test_nvlink_errors_are_summed_over_links_by_type() -> None:
    tracker = TrendTracker(TrendsConfig())
    links = {"0": {"replay": 10, "recovery": 0, "crc": 1}, "1": {"replay": 5, "recovery": 0, "crc": 0}}
    later = {"0": {"replay": 90, "recovery": 1, "crc": 1}, "1": {"replay": 40, "recovery": 0, "crc": 0}}
    feed(tracker, {0: {"nvlink_errors_total": links}, 30: {"nvlink_errors_total": later}}, 40)
    increases = {i.counter: i.increase for i in tracker.increases(T0 + 39)}
    assert increases == {"nvlink_replay": 115, "nvlink_recovery": 1, "nvlink_crc": 0}
    assert [f.kind for f in tracker.findings(T0 + 39)] == ["nvlink_recovery_trend", "nvlink_replay_trend"]


def test_a_new_remapped_row_or_retired_page_within_a_day_warns() -> None:
    tracker = TrendTracker(TrendsConfig())
    feed(
        tracker,
        {
            0: {
                "remapped_rows": {"correctable": 2, "uncorrectable": 0},
                "retired_pages": {"single_bit": 0, "double_bit": 0},
            },
            50: {"remapped_rows": {"correctable": 3, "uncorrectable": 0}},
        },
        60,
    )
    assert [f.kind for f in tracker.findings(T0 + 59)] == ["remapped_rows_trend"]


def test_an_xid_repeating_within_the_hour_is_named_by_code() -> None:
    tracker = TrendTracker(TrendsConfig(), words=lambda code: "graphics engine exception" if code == "13" else "")
    feed(
        tracker,
        {
            0: {},
            5: {"xid_errors_total": {"13": 1}, "xid_last_timestamp_seconds": {"13": T0 + 5}},
            6: {"xid_errors_total": {"13": 3}, "xid_last_timestamp_seconds": {"13": T0 + 6}},
        },
        10,
    )
    (finding,) = tracker.findings(T0 + 9)
    assert finding.summary.startswith("XID 13 (graphics engine exception) events rising: 3 in the last 1 h")


def test_xids_read_back_from_the_kernel_log_from_earlier_in_the_boot_are_not_a_rise() -> None:
    tracker = TrendTracker(TrendsConfig())
    old = {"xid_errors_total": {"31": 7}, "xid_last_timestamp_seconds": {"31": T0 - 7200}}
    feed(tracker, {0: {}, 3: old}, 10)
    assert tracker.findings(T0 + 9) == []


def test_thresholds_and_windows_are_configurable_and_checked_all_at_once() -> None:
    config, problems = parse_health(
        {
            "trends": {"pcie_replays": {"window_seconds": 300, "max_increase": 50}, "enabled": True},
            "stragglers": {"window_seconds": 20, "margin_ratio": 0.2},
        }
    )
    assert problems == []
    assert config.trends.rules["pcie_replays"] == TrendRule(300.0, 50.0)
    assert config.stragglers.window_seconds == 20 and config.stragglers.margin_ratio == 0.2
    _, problems = parse_health(
        {
            "trends": {"pcie_replay": {}, "ecc_corrected": {"max_increase": -1, "window_seconds": 0}},
            "stragglers": {"margin_ratio": 1.5, "busy_utilization_ratio": "high", "speed": 1, "enabled": "yes"},
        }
    )
    assert problems == [
        "health.stragglers: unknown key 'speed' (busy_utilization_ratio, enabled, margin_ratio, "
        "persistence_ratio, window_seconds)",
        "health.stragglers.enabled must be true or false, got 'yes'",
        "health.stragglers.busy_utilization_ratio must be a number greater than 0 and at most 1, got 'high'",
        "health.stragglers.margin_ratio must be a number greater than 0 and below 1, got 1.5",
        "health.trends: unknown key 'pcie_replay' (enabled, ecc_corrected, nvlink_crc, nvlink_recovery, "
        "nvlink_replay, pcie_replays, remapped_rows, retired_pages, xid)",
        "health.trends.ecc_corrected.window_seconds must be a number of seconds from 1 to 604800, got 0",
        "health.trends.ecc_corrected.max_increase must be a number from 0 to 1e+12, got -1",
    ]


@given(st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=40))
def test_the_rise_is_never_negative_and_counts_a_drop_as_a_reset(values: list[int]) -> None:
    """As Prometheus' increase(): each step up counts its size, a drop counts the new value."""
    tracker = TrendTracker(TrendsConfig(rules={"pcie_replays": TrendRule(3600.0, 0.0)}))
    for t, value in enumerate(values):
        tracker.observe(snap(T0 + t, gpu(0, pcie_replays_total=value)))
    expected = sum(b - a if b >= a else b for a, b in itertools.pairwise(values))
    (increase,) = tracker.increases(T0 + len(values))
    assert increase.increase == expected >= 0


def test_check_config_lists_every_early_signal_problem_and_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "gpumon.yaml"
    config.write_text("health:\n  stragglers: {window_seconds: 0}\n  trends: {pcie_replays: {max_increase: x}}\n")
    done = run_cli("check-config", str(config))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    out = done.stdout + done.stderr
    assert "health.stragglers.window_seconds must be a number of seconds from 1 to 604800, got 0" in out
    assert "health.trends.pcie_replays.max_increase must be a number from 0 to 1e+12, got 'x'" in out


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.integers(0, 120), st.integers(0, 50)), min_size=1, max_size=8),
    st.lists(st.integers(0, 400), min_size=1, max_size=12),
)
def test_the_increase_asked_at_any_moment_is_the_one_a_fresh_tracker_gives(
    steps: list[tuple[int, int]], asked: list[int]
) -> None:
    """Scrapes ask often; the answer never depends on what was asked before."""
    config = TrendsConfig(rules={"ecc_corrected": TrendRule(window_seconds=60.0, max_increase=10)})
    asked_often = TrendTracker(config)
    values = dict(sorted(steps))
    total = 0
    for t in range(150):
        total += values.get(t, 0)
        asked_often.observe(snap(T0 + t, gpu(0, ecc_errors_total={"corrected_volatile": total})))
        for moment in asked:
            asked_often.increases(T0 + moment)
    for moment in asked:
        fresh = TrendTracker(config)
        total = 0
        for t in range(150):
            total += values.get(t, 0)
            fresh.observe(snap(T0 + t, gpu(0, ecc_errors_total={"corrected_volatile": total})))
        assert asked_often.increases(T0 + moment) == fresh.increases(T0 + moment)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 50)), min_size=1, max_size=8))
def test_snapshots_that_carry_the_same_counter_objects_give_what_fresh_copies_give(
    steps: list[tuple[int, int]],
) -> None:
    """The poller hands the slow tier's objects from snapshot to snapshot until the next slow read, and the
    tracker skips a GPU whose counters are those very objects: the increases and findings at every moment
    are the ones a tracker fed a fresh copy every second computes."""
    config = TrendsConfig(rules={"ecc_corrected": TrendRule(window_seconds=60.0, max_increase=10)})
    shared, copied = TrendTracker(config), TrendTracker(config)
    values = dict(sorted(steps))
    ecc = {"corrected_volatile": 0}
    for t in range(260):
        if t in values:
            ecc = {"corrected_volatile": ecc["corrected_volatile"] + values[t]}  # a slow read: new objects
        shared.observe(snap(T0 + t, gpu(0, ecc_errors_total=ecc)))
        copied.observe(snap(T0 + t, gpu(0, ecc_errors_total=dict(ecc))))
        assert shared.increases(T0 + t) == copied.increases(T0 + t)
        assert shared.findings(T0 + t) == copied.findings(T0 + t)
