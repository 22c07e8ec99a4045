"""The built-in rule pack: each rule fires on a crafted snapshot and only there."""

from __future__ import annotations

from typing import Any

import pytest

from gpumon.alerts.builtin import builtin_rules_raw, minimal_xid_action, xid_action_from_catalog
from gpumon.alerts.engine import AlertEngine
from gpumon.model.snapshot import ProcessSnapshot
from gpumon.model.xid import XidEvent
from gpumon.state.burn_marker import BurnHoldBack
from tests.alerts.helpers import UUID0, alerting, gpu, snap

T0 = 1_800_000_000.0
GIB = 2**30


def pack(overrides: dict[str, Any] | None = None, **kw: Any) -> AlertEngine:
    config = alerting({"builtin": overrides or {}})
    return AlertEngine(config.all_rules(), host="node1", started_at=T0, **kw)


def firing_after(e: AlertEngine, seconds: float, **fields: Any) -> set[str]:
    """Feed a healthy snapshot, then the crafted one every 10 s for ``seconds``; names of firing alerts."""
    e.evaluate(snap(T0, gpu()), T0)
    t = T0
    while t <= T0 + seconds:
        t += 10
        e.evaluate(snap(t, gpu(**fields)), t)
    return {a.alertname for a in e.alerts() if a.state == "firing"}


def test_a_healthy_busy_gpu_raises_nothing() -> None:
    assert firing_after(pack(), 3600) == set()


CASES = [
    ("GpuLost", 0, {"up": False, "lost_reason": "GPU is lost"}),
    ("GpuEccUncorrectable", 0, {"ecc_errors_total": {"uncorrected_volatile": 1, "uncorrected_aggregate": 3}}),
    ("GpuRowRemapPending", 0, {"row_remap_pending": True}),
    ("GpuRowRemapFailure", 0, {"row_remap_failure": True}),
    ("GpuFabricNotReady", 60, {"fabric_state": "in_progress", "fabric_status_ok": False}),
    ("GpuTemperatureNearSlowdown", 60, {"temperature_celsius": 86.0}),
    ("GpuHwSlowdown", 60, {"clock_events_active": {"hw_slowdown": True}}),
    ("GpuHwThermalSlowdown", 60, {"clock_events_active": {"hw_thermal_slowdown": True}}),
    ("GpuHwPowerBrakeSlowdown", 60, {"clock_events_active": {"hw_power_brake_slowdown": True}}),
    ("GpuSwThermalSlowdown", 60, {"clock_events_active": {"sw_thermal_slowdown": True}}),
    ("GpuNvlinkDown", 0, {"nvlink_up": {"0": True, "1": False}}),
    ("GpuPcieLinkDegraded", 300, {"pcie_link_width": 8}),
    ("GpuMemoryHigh", 300, {"memory_used_bytes": 130 * GIB}),
    (
        "GpuIdleWithMemoryHeld",
        600,
        {"utilization_ratio": 0.1, "processes": (ProcessSnapshot(pid=7, used_memory_bytes=8 * GIB),)},
    ),
]


@pytest.mark.parametrize(("name", "for_seconds", "fields"), CASES, ids=[c[0] for c in CASES])
def test_builtin_rule_fires_on_its_condition_after_its_for(
    name: str, for_seconds: float, fields: dict[str, Any]
) -> None:
    if for_seconds:
        assert firing_after(pack(), for_seconds - 20, **fields) == set(), "not before its for"
    assert firing_after(pack(), for_seconds + 10, **fields) == {name}


def test_every_builtin_rule_is_covered() -> None:
    names = {r["name"] for r in builtin_rules_raw()}
    covered = {c[0] for c in CASES} | {"GpuNvmlDown", "GpuSnapshotStale", "GpuXidCritical", "GpuXidError"}
    # the finding rules: tests/alerts/test_finding_rules.py
    covered |= {"GpuNeedsRepair", "GpuStraggler", "GpuErrorRateRising", "GpuInventoryDrift"}
    assert names == covered


def test_nvml_down_is_a_host_alert_after_one_minute() -> None:
    e = pack()
    e.evaluate(snap(T0, nvml_up=False, nvml_error="NVML Shared Library Not Found"), T0)
    e.evaluate(snap(T0 + 61, nvml_up=False, nvml_error="NVML Shared Library Not Found"), T0 + 61)
    [alert] = e.alerts()
    assert alert.alertname == "GpuNvmlDown" and alert.state == "firing"
    assert "gpu" not in alert.labels and "uuid" not in alert.labels
    assert "NVML Shared Library Not Found" in alert.annotations["description"]


def test_stale_snapshot_after_30_seconds_without_polls() -> None:
    e = pack()
    e.evaluate(snap(T0, gpu()), T0)
    assert e.tick(T0 + 30) == []
    assert [c.alert.alertname for c in e.tick(T0 + 31)] == ["GpuSnapshotStale"]


def test_pcie_downshift_of_an_idle_gpu_is_not_an_alert() -> None:
    idle = {"pcie_link_generation": 1, "utilization_ratio": 0.0}
    assert firing_after(pack(), 3600, **idle) == set()


def test_pcie_alert_is_not_cleared_by_idle_spells() -> None:
    e = pack()
    firing_after(e, 310, pcie_link_generation=3)
    e.evaluate(snap(T0 + 400, gpu(pcie_link_generation=1, utilization_ratio=0.0)), T0 + 400)
    assert [a.alertname for a in e.alerts()] == ["GpuPcieLinkDegraded"]
    e.evaluate(snap(T0 + 410, gpu()), T0 + 410)
    assert e.alerts() == [], "busy at full speed clears it"


def test_ecc_lifetime_count_alerts_only_when_it_grows() -> None:
    e = pack()
    e.evaluate(snap(T0, gpu(ecc_errors_total={"uncorrected_volatile": 0, "uncorrected_aggregate": 5})), T0)
    assert e.alerts() == [], "old errors from before gpumon watched are not news"
    e.evaluate(snap(T0 + 10, gpu(ecc_errors_total={"uncorrected_volatile": 0, "uncorrected_aggregate": 6})), T0 + 10)
    assert [a.alertname for a in e.alerts()] == ["GpuEccUncorrectable"]


def test_temperature_near_slowdown_has_hysteresis() -> None:
    e = pack()
    firing_after(e, 70, temperature_celsius=86.0)
    e.evaluate(snap(T0 + 100, gpu(temperature_celsius=83.0)), T0 + 100)
    assert [a.alertname for a in e.alerts()] == ["GpuTemperatureNearSlowdown"], "7 °C below: still firing"
    e.evaluate(snap(T0 + 110, gpu(temperature_celsius=81.0)), T0 + 110)
    assert e.alerts() == []


def test_idle_gpu_without_processes_is_fine() -> None:
    assert firing_after(pack(), 1200, utilization_ratio=0.0, processes=()) == set()


@pytest.mark.parametrize(
    ("code", "alertname", "severity"),
    [(79, "GpuXidCritical", "critical"), (48, "GpuXidCritical", "critical"), (13, "GpuXidError", "warning")],
)
def test_xid_rules_follow_the_catalog_action(code: int, alertname: str, severity: str) -> None:
    e = pack(xid_action=xid_action_from_catalog())
    event = XidEvent(xid=code, timestamp_seconds=T0, source="nvml", gpu_index=0, uuid=UUID0, message=f"Xid {code}")
    [change] = e.on_xid(event, T0)
    assert (change.alert.alertname, change.alert.severity) == (alertname, severity)
    assert change.alert.annotations["summary"].startswith(f"XID {code} on GPU 0 of node1")


@pytest.mark.parametrize("code", [43, 45, 63])
def test_xids_the_catalog_says_to_ignore_raise_nothing(code: int) -> None:
    e = pack(xid_action=xid_action_from_catalog())
    assert e.on_xid(XidEvent(xid=code, timestamp_seconds=T0, source="nvml", gpu_index=0), T0) == []


def test_unknown_xid_is_a_warning_not_dropped() -> None:
    e = pack(xid_action=minimal_xid_action)
    [change] = e.on_xid(XidEvent(xid=999, timestamp_seconds=T0, source="nvml", gpu_index=0), T0)
    assert change.alert.alertname == "GpuXidError"


def test_builtin_override_changes_threshold_and_severity_and_disables() -> None:
    e = pack(
        {
            "GpuTemperatureNearSlowdown": {"threshold": 2, "clear_threshold": 3, "for": 0, "severity": "critical"},
            "GpuRowRemapPending": False,
        }
    )
    e.evaluate(snap(T0, gpu(temperature_celsius=87.0, row_remap_pending=True)), T0)
    assert e.alerts() == []
    e.evaluate(snap(T0 + 1, gpu(temperature_celsius=88.5, row_remap_pending=True)), T0 + 1)
    [alert] = e.alerts()
    assert (alert.alertname, alert.severity, alert.state) == ("GpuTemperatureNearSlowdown", "critical", "firing")


def test_burn_holds_back_temperature_memory_and_idle_but_not_hardware_faults() -> None:
    e = pack({"GpuTemperatureNearSlowdown": {"for": 0}, "GpuMemoryHigh": {"for": 0}})
    burn = BurnHoldBack(pid=1, gpu_indices=frozenset({0}), uuids=frozenset(), started_at=T0)
    hot = gpu(temperature_celsius=88.0, memory_used_bytes=135 * GIB, row_remap_failure=True)
    e.evaluate(snap(T0, hot), T0, burn)
    held = {a.alertname: a.held_back is not None for a in e.alerts()}
    assert held == {"GpuTemperatureNearSlowdown": True, "GpuMemoryHigh": True, "GpuRowRemapFailure": False}


@pytest.mark.parametrize(
    ("code", "alertname", "severity"), [(74, "GpuXidCritical", "critical"), (145, "GpuXidError", "warning")]
)
def test_nvlink_xids_page_by_severity_once(code: int, alertname: str, severity: str) -> None:
    """XID 74 (NVLink error) is critical although its catalog action is check_nvlink; 145 is a warning."""
    e = pack(xid_action=xid_action_from_catalog())
    changes = e.on_xid(XidEvent(xid=code, timestamp_seconds=T0, source="nvml", gpu_index=0, uuid=UUID0), T0)
    assert [(c.alert.alertname, c.alert.labels["severity"]) for c in changes] == [(alertname, severity)]
