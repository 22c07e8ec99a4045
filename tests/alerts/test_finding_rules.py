"""Finding rules: gpumon's health findings (gpumon health) as alerts, with the action to take."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpumon.alerts.config import parse
from gpumon.alerts.engine import AlertEngine
from gpumon.alerts.service import AlertService
from gpumon.model.findings import CRITICAL, UNKNOWN, WARNING, Finding
from gpumon.state.burn_marker import BurnHoldBack
from tests.alerts.helpers import UUID0, UUID1, FakeClock, alerting
from tests.helpers import DaemonProcess, run_cli, wait_for

T0 = 1_800_000_000.0

STRAGGLER = Finding(
    "straggler", WARNING, "inspect_hardware", "runs 45 % lower SM clocks than its 3 peers", gpu=1, uuid=UUID1
)
XID79 = Finding("xid", CRITICAL, "reboot_node", "xid 79 fallen off the bus", gpu=0, uuid=UUID0)
XID13 = Finding("xid", WARNING, "restart_job", "xid 13 graphics engine exception", gpu=0, uuid=UUID0)
ECC_TREND = Finding(
    "ecc_corrected_trend", WARNING, "replace", "corrected ECC errors rising: 120 in the last 1h", gpu=0, uuid=UUID0
)
DRIVER = Finding("driver_changed", WARNING, "none", "driver 550.90, baseline 550.54")
MISSING = Finding("gpu_missing", CRITICAL, "inspect_hardware", "missing (on the PCI bus, not in NVML)", gpu=3)


def engine(*rules: dict[str, Any], builtin: bool = False, **kw: Any) -> AlertEngine:
    config = alerting({"builtin_rules": builtin, "rules": list(rules)})
    return AlertEngine(config.all_rules(), host="node1", started_at=T0, **kw)


def firing(e: AlertEngine) -> dict[tuple[str, str, str], dict[str, str]]:
    """(alertname, gpu, finding) -> annotations of the firing alerts."""
    return {(a.alertname, a.gpu, a.labels["finding"]): dict(a.annotations) for a in e.alerts() if a.state == "firing"}


STRAGGLER_RULE = {
    "name": "Slow",
    "kind": "finding",
    "kinds": ["straggler"],
    "annotations": {"summary": "{{ detail }}", "action": "{{ action }}"},
}


def test_a_finding_fires_one_alert_per_gpu_and_kind_with_its_summary_and_action_and_resolves_when_gone() -> None:
    e = engine(STRAGGLER_RULE)
    [change] = e.on_findings([STRAGGLER, XID79], T0)
    assert (change.previous, change.alert.state) == ("inactive", "firing")
    alert = change.alert
    assert alert.labels == {
        "alertname": "Slow",
        "severity": "warning",
        "host": "node1",
        "gpu": "1",
        "uuid": UUID1,
        "finding": "straggler",
    }
    assert alert.annotations == {"summary": STRAGGLER.summary, "action": "inspect the hardware"}
    assert e.on_findings([STRAGGLER], T0 + 5) == []
    [change] = e.on_findings([XID79], T0 + 10)
    assert (change.previous, change.alert.state, change.alert.ends_at) == ("firing", "resolved", T0 + 10)
    assert e.alerts() == []


def test_for_keeps_a_finding_alert_pending_until_it_lasted() -> None:
    e = engine({**STRAGGLER_RULE, "for": "1m"})
    e.on_findings([STRAGGLER], T0)
    assert [a.state for a in e.alerts()] == ["pending"]
    e.on_findings([STRAGGLER], T0 + 59)
    assert [a.state for a in e.alerts()] == ["pending"]
    e.on_findings([STRAGGLER], T0 + 60)
    assert [a.state for a in e.alerts()] == ["firing"]
    [change] = e.on_findings([], T0 + 65)
    assert change.alert.state == "resolved"


def test_kinds_min_severity_and_patterns_select_findings() -> None:
    e = engine(
        {"name": "Repair", "kind": "finding", "kinds": ["xid"], "min_severity": "CRITICAL", "severity": "critical"},
        {"name": "Rising", "kind": "finding", "kinds": ["*_trend"]},
    )
    e.on_findings([XID13, ECC_TREND, STRAGGLER, Finding("no_data", UNKNOWN, "none", "no GPU reading yet")], T0)
    assert set(firing(e)) == {("Rising", "0", "ecc_corrected_trend")}
    e.on_findings([XID13, XID79, ECC_TREND], T0 + 5)
    assert set(firing(e)) == {("Repair", "0", "xid"), ("Rising", "0", "ecc_corrected_trend")}
    assert [a.severity for a in e.alerts() if a.alertname == "Repair"] == ["critical"]


def test_the_worst_of_several_findings_of_one_kind_on_one_gpu_speaks_for_the_alert() -> None:
    e = engine({"name": "AnyXid", "kind": "finding", "kinds": ["xid"], "severity": "from_finding"})
    e.on_findings([XID13, XID79], T0)
    [alert] = e.alerts()
    assert (alert.severity, alert.labels["severity"], alert.annotations["summary"]) == (
        "critical",
        "critical",
        "AnyXid on node1 GPU 0: xid 79 fallen off the bus",
    )


def test_host_findings_carry_no_gpu_label_and_severity_can_come_from_the_finding() -> None:
    e = engine(
        {"name": "Drift", "kind": "finding", "kinds": ["driver_changed", "gpu_missing"], "severity": "from_finding"}
    )
    e.on_findings([DRIVER, MISSING], T0)
    by_finding = {a.labels["finding"]: a for a in e.alerts()}
    assert "gpu" not in by_finding["driver_changed"].labels and "uuid" not in by_finding["driver_changed"].labels
    assert by_finding["driver_changed"].severity == "warning"
    assert (by_finding["gpu_missing"].gpu, by_finding["gpu_missing"].severity) == ("3", "critical")


def test_snapshots_and_ticks_leave_finding_alerts_alone() -> None:
    from tests.alerts.helpers import gpu, snap

    e = engine(STRAGGLER_RULE)
    e.on_findings([STRAGGLER], T0)
    e.evaluate(snap(T0 + 1, gpu(0), gpu(1, uuid=UUID1)), T0 + 1)
    e.tick(T0 + 2)
    assert set(firing(e)) == {("Slow", "1", "straggler")}


def test_the_builtin_pack_alerts_on_repair_straggler_error_trend_and_drift() -> None:
    e = AlertEngine(alerting().all_rules(), host="node1", started_at=T0)
    found = [XID79, XID13, STRAGGLER, ECC_TREND, DRIVER, MISSING]
    e.on_findings(found, T0)
    assert set(firing(e)) == {
        ("GpuStraggler", "1", "straggler"),
        ("GpuErrorRateRising", "0", "ecc_corrected_trend"),
        ("GpuInventoryDrift", "", "driver_changed"),
        ("GpuInventoryDrift", "3", "gpu_missing"),
    }
    # GpuXidCritical pages for the XID itself; GpuNeedsRepair is the fault still open 5m later
    e.on_findings(found, T0 + 300)
    repair = firing(e)[("GpuNeedsRepair", "0", "xid")]
    assert repair["summary"] == "GPU 0 of node1 needs repair: xid 79 fallen off the bus"
    assert repair["action"] == "reboot the node"
    assert [a.severity for a in e.alerts() if a.alertname == "GpuNeedsRepair"] == ["critical"]
    assert firing(e)[("GpuStraggler", "1", "straggler")]["action"] == "inspect the hardware"


def test_a_straggler_alert_is_held_back_on_a_burning_gpu() -> None:
    e = AlertEngine(alerting().all_rules(), host="node1", started_at=T0)
    e.tick(T0, BurnHoldBack(pid=42, gpu_indices=frozenset({1}), uuids=frozenset(), started_at=T0))
    e.on_findings([STRAGGLER], T0)
    [alert] = e.alerts()
    assert alert.alertname == "GpuStraggler" and alert.held_back is not None


@pytest.mark.parametrize(
    ("rule", "problem"),
    [
        ({"kind": "finding"}, "kinds must be a list of finding kinds"),
        ({"kind": "finding", "kinds": []}, "kinds must be a list of finding kinds"),
        ({"kind": "finding", "kinds": ["Straggler!"]}, "kinds must be a list of finding kinds"),
        (
            {"kind": "finding", "kinds": ["xid"], "min_severity": "warning"},
            "min_severity must be one of WARNING, CRITICAL",
        ),
        ({"kind": "finding", "kinds": ["xid"], "severity": "loud"}, "severity must be one of critical, warning, info"),
        ({"field": "temperature_celsius", "op": ">", "threshold": 1, "severity": "from_finding"}, "severity must be"),
        ({"field": "temperature_celsius", "op": ">", "threshold": 1, "kinds": ["xid"]}, "key 'kinds' does not apply"),
        ({"kind": "finding", "kinds": ["xid"], "labels": {"finding": "x"}}, "labels.finding is set by gpumon"),
    ],
)
def test_finding_rule_problems(rule: dict[str, Any], problem: str) -> None:
    config, problems = parse({"rules": [{"name": "R", **rule}]})
    assert config is None
    assert any(problem in line for line in problems), problems


def test_every_problem_of_a_finding_rule_is_listed_at_once() -> None:
    _, problems = parse(
        {"rules": [{"name": "R", "kind": "finding", "kinds": "", "min_severity": "LOW", "severity": "loud", "op": ">"}]}
    )
    assert len(problems) == 4, problems


def test_a_builtin_finding_rule_can_be_retuned_or_turned_off() -> None:
    config = alerting(
        {
            "builtin": {
                "GpuStraggler": {"kinds": ["straggler"], "for": "10m", "severity": "critical"},
                "GpuInventoryDrift": False,
            }
        }
    )
    rules = {r.name: r for r in config.all_rules()}
    assert (rules["GpuStraggler"].for_seconds, rules["GpuStraggler"].severity) == (600, "critical")
    assert "GpuInventoryDrift" not in rules


def test_the_service_asks_for_findings_on_its_timer_at_most_every_interval(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    asked: list[float] = []
    current: list[Finding] = [STRAGGLER]

    def findings(kinds: frozenset[str]) -> Sequence[Finding]:
        asked.append(clock())
        return current

    service = AlertService(alerting(), tmp_path, host="node1", clock=clock, findings=findings)
    service.tick()
    assert [a["alertname"] for a in service.active_alerts()] == ["GpuStraggler"]
    clock.advance(1)
    current = []
    service.tick()
    assert asked == [T0] and len(service.active_alerts()) == 1
    clock.advance(4)
    service.tick()
    assert asked == [T0, T0 + 5] and service.active_alerts() == []


def test_without_finding_rules_the_service_never_asks_for_findings(tmp_path: Path) -> None:
    def findings(kinds: frozenset[str]) -> Sequence[Finding]:
        raise AssertionError("asked")

    service = AlertService(alerting({"builtin_rules": False}), tmp_path, host="node1", findings=findings)
    service.tick()
    assert service.active_alerts() == []


def test_the_straggler_scenario_shows_a_straggler_alert_with_its_action(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    config = tmp_path / "gpumon.yaml"
    config.write_text(
        json.dumps(
            {"interval_seconds": 0.5, "slow_interval_seconds": 0.5, "health": {"stragglers": {"window_seconds": 3}}}
        )
    )
    daemon = start_daemon("--backend", "fake:straggler", "--config", str(config))

    def straggler_alert() -> dict[str, Any] | None:
        alerts = daemon.get("/api/alerts").json()["alerts"]
        return next((a for a in alerts if a["alertname"] == "GpuStraggler"), None)

    alert = wait_for(straggler_alert, 30, 0.5, f"a GpuStraggler alert; {daemon.log()}")
    assert (alert["state"], alert["severity"], alert["gpu"]) == ("firing", "warning", "2")
    assert alert["labels"]["finding"] == "straggler"
    assert alert["annotations"]["action"] == "inspect the hardware"
    assert "45 % lower SM clocks than its 3 peers" in alert["annotations"]["summary"]
    listed = run_cli("alerts", "--url", daemon.url)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert "GpuStraggler" in listed.stdout
