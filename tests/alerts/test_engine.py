"""The alert engine: Prometheus' pending -> firing -> resolved life, driven by fake snapshots and times."""

from __future__ import annotations

from typing import Any

from gpumon.alerts.alert import AlertCount, fingerprint
from gpumon.alerts.engine import AlertEngine
from gpumon.model.xid import XidEvent
from gpumon.state.burn_marker import BurnHoldBack
from tests.alerts.helpers import UUID0, UUID1, alerting, gpu, snap

T0 = 1_800_000_000.0


def engine(*rules: dict[str, Any], builtin: bool = False, **kw: Any) -> AlertEngine:
    config = alerting({"builtin_rules": builtin, "rules": list(rules)})
    return AlertEngine(config.all_rules(), host="node1", started_at=kw.pop("started_at", T0), **kw)


HOT = {"name": "GpuHot", "field": "temperature_celsius", "op": ">", "threshold": 85, "for": "1m"}


def states(e: AlertEngine) -> dict[tuple[str, str], str]:
    return {(a.alertname, a.gpu): a.state for a in e.alerts()}


def test_condition_goes_pending_then_firing_after_for_then_resolves() -> None:
    e = engine(HOT)
    assert e.evaluate(snap(T0, gpu(temperature_celsius=80)), T0) == []
    [change] = e.evaluate(snap(T0 + 1, gpu(temperature_celsius=90)), T0 + 1)
    assert (change.previous, change.alert.state) == ("inactive", "pending")
    assert change.alert.starts_at is None
    assert e.evaluate(snap(T0 + 30, gpu(temperature_celsius=91)), T0 + 30) == []
    [change] = e.evaluate(snap(T0 + 61, gpu(temperature_celsius=92)), T0 + 61)
    assert (change.previous, change.alert.state) == ("pending", "firing")
    assert change.alert.starts_at == T0 + 61
    assert change.alert.active_since == T0 + 1
    assert change.alert.value == 92
    [change] = e.evaluate(snap(T0 + 70, gpu(temperature_celsius=70)), T0 + 70)
    assert (change.previous, change.alert.state) == ("firing", "resolved")
    assert change.alert.ends_at == T0 + 70
    assert e.alerts() == []


def test_pending_alert_that_stops_holding_never_fires() -> None:
    e = engine(HOT)
    e.evaluate(snap(T0, gpu(temperature_celsius=90)), T0)
    [change] = e.evaluate(snap(T0 + 30, gpu(temperature_celsius=80)), T0 + 30)
    assert (change.previous, change.alert.state) == ("pending", "inactive")
    e.evaluate(snap(T0 + 40, gpu(temperature_celsius=90)), T0 + 40)
    e.evaluate(snap(T0 + 90, gpu(temperature_celsius=90)), T0 + 90)
    assert states(e) == {("GpuHot", "0"): "pending"}, "for restarts from the second crossing"


def test_for_zero_fires_on_the_first_poll() -> None:
    e = engine({**HOT, "for": 0})
    [change] = e.evaluate(snap(T0, gpu(temperature_celsius=90)), T0)
    assert (change.previous, change.alert.state) == ("inactive", "firing")


def test_one_alert_per_rule_and_gpu() -> None:
    e = engine({**HOT, "for": 0})
    e.evaluate(snap(T0, gpu(0, temperature_celsius=90), gpu(1, temperature_celsius=95)), T0)
    alerts = e.alerts()
    assert [(a.gpu, a.uuid) for a in alerts] == [("0", UUID0), ("1", UUID1)]
    assert len({a.fingerprint for a in alerts}) == 2
    e.evaluate(snap(T0 + 1, gpu(0, temperature_celsius=90), gpu(1, temperature_celsius=95)), T0 + 1)
    assert len(e.alerts()) == 2


def test_clear_threshold_keeps_firing_until_value_drops_below_it() -> None:
    e = engine({**HOT, "for": 0, "clear_threshold": 80})
    e.evaluate(snap(T0, gpu(temperature_celsius=90)), T0)
    assert e.evaluate(snap(T0 + 1, gpu(temperature_celsius=83)), T0 + 1) == []
    assert states(e) == {("GpuHot", "0"): "firing"}
    [change] = e.evaluate(snap(T0 + 2, gpu(temperature_celsius=80)), T0 + 2)
    assert change.alert.state == "resolved"


def test_clear_threshold_does_not_start_an_alert() -> None:
    e = engine({**HOT, "for": 0, "clear_threshold": 80})
    assert e.evaluate(snap(T0, gpu(temperature_celsius=83)), T0) == []


def test_keep_firing_for_holds_a_firing_alert_after_the_condition_ends() -> None:
    e = engine({**HOT, "for": 0, "keep_firing_for": "2m"})
    e.evaluate(snap(T0, gpu(temperature_celsius=90)), T0)
    assert e.evaluate(snap(T0 + 60, gpu(temperature_celsius=70)), T0 + 60) == []
    assert states(e) == {("GpuHot", "0"): "firing"}
    e.evaluate(snap(T0 + 100, gpu(temperature_celsius=90)), T0 + 100)
    assert e.evaluate(snap(T0 + 200, gpu(temperature_celsius=70)), T0 + 200) == []
    [change] = e.evaluate(snap(T0 + 221, gpu(temperature_celsius=70)), T0 + 221)
    assert change.alert.state == "resolved"
    assert change.alert.starts_at == T0, "the alert kept its start through the flap"


def test_unknown_value_counts_as_not_holding() -> None:
    e = engine({**HOT, "for": 0})
    e.evaluate(snap(T0, gpu(temperature_celsius=90)), T0)
    [change] = e.evaluate(snap(T0 + 1, gpu(temperature_celsius=None)), T0 + 1)
    assert change.alert.state == "resolved"


def test_gpu_that_vanishes_resolves_its_alerts() -> None:
    e = engine({**HOT, "for": 0})
    e.evaluate(snap(T0, gpu(0, temperature_celsius=90), gpu(1, temperature_celsius=90)), T0)
    changes = e.evaluate(snap(T0 + 1, gpu(0, temperature_celsius=90)), T0 + 1)
    assert [(c.alert.gpu, c.alert.state) for c in changes] == [("1", "resolved")]


def test_labels_and_annotations() -> None:
    e = engine(
        {
            **HOT,
            "for": 0,
            "severity": "critical",
            "labels": {"team": "ml"},
            "annotations": {"summary": "GPU {{ gpu }} ({{ uuid }}) on {{ host }}: {{ value }} > {{ threshold }}"},
        }
    )
    e.evaluate(snap(T0, gpu(temperature_celsius=91.5)), T0)
    [alert] = e.alerts()
    assert alert.labels == {
        "alertname": "GpuHot",
        "severity": "critical",
        "host": "node1",
        "gpu": "0",
        "uuid": UUID0,
        "team": "ml",
    }
    assert alert.annotations["summary"] == f"GPU 0 ({UUID0}) on node1: 91.5 > 85"
    assert alert.fingerprint == fingerprint(alert.labels)


def test_host_label_name_is_configurable() -> None:
    config = alerting({"builtin_rules": False, "rules": [{**HOT, "for": 0}]})
    e = AlertEngine(config.all_rules(), host="rack7-n3", host_label="instance_host")
    e.evaluate(snap(T0, gpu(temperature_celsius=91)), T0)
    assert e.alerts()[0].labels["instance_host"] == "rack7-n3"


def test_nvlink_down_is_one_alert_per_link_and_only_for_links_seen_up() -> None:
    e = engine({"name": "LinkDown", "kind": "nvlink_down"})
    e.evaluate(snap(T0, gpu(nvlink_up={"0": True, "1": True, "2": False})), T0)
    assert e.alerts() == [], "link 2 was never up: not an alert"
    e.evaluate(snap(T0 + 1, gpu(nvlink_up={"0": False, "1": False, "2": False})), T0 + 1)
    alerts = e.alerts()
    assert sorted(a.labels["link"] for a in alerts) == ["0", "1"]
    assert all(a.state == "firing" for a in alerts)
    changes = e.evaluate(snap(T0 + 2, gpu(nvlink_up={"0": True, "1": False, "2": False})), T0 + 2)
    assert [(c.alert.labels["link"], c.alert.state) for c in changes] == [("0", "resolved")]


def test_stale_snapshot_fires_from_the_timer_when_polls_stop() -> None:
    e = engine({"name": "Stale", "kind": "stale_snapshot", "threshold": 30})
    e.evaluate(snap(T0, gpu()), T0)
    assert e.tick(T0 + 20) == []
    [change] = e.tick(T0 + 31)
    assert change.alert.state == "firing"
    assert "gpu" not in change.alert.labels, "a host-level alert"
    assert change.alert.value == 31
    [change] = e.evaluate(snap(T0 + 40, gpu()), T0 + 40)
    assert change.alert.state == "resolved"


def test_stale_snapshot_fires_when_no_snapshot_ever_arrives() -> None:
    e = engine({"name": "Stale", "kind": "stale_snapshot", "threshold": 30}, started_at=T0)
    assert e.tick(T0 + 10) == []
    assert [c.alert.state for c in e.tick(T0 + 31)] == ["firing"]


XID_RULE = {"name": "Xid", "kind": "xid", "actions": ["reset_gpu", "reboot"], "hold": "5m"}


def xid(code: int, at: float, index: int = 0) -> XidEvent:
    return XidEvent(xid=code, timestamp_seconds=at, source="nvml", gpu_index=index, uuid=UUID0, message="Xid 79")


def test_xid_fires_at_once_and_resolves_after_hold() -> None:
    e = engine(XID_RULE, xid_action={79: "reboot", 13: "restart_app"}.get)  # type: ignore[arg-type]
    [change] = e.on_xid(xid(79, T0), T0)
    assert (change.previous, change.alert.state) == ("inactive", "firing")
    assert change.alert.labels["xid"] == "79"
    assert change.alert.starts_at == T0
    assert e.on_xid(xid(13, T0), T0) == [], "restart_app is not one of the rule's actions"
    assert e.tick(T0 + 299) == []
    [change] = e.tick(T0 + 300)
    assert change.alert.state == "resolved"


def test_xid_repeat_refreshes_the_hold_and_counts() -> None:
    e = engine(XID_RULE, xid_action=lambda code: "reboot")
    e.on_xid(xid(79, T0), T0)
    assert e.on_xid(xid(79, T0 + 200), T0 + 200) == [], "a repeat is not a new alert"
    assert e.tick(T0 + 400) == []
    [alert] = e.alerts()
    assert alert.value == 2 and alert.starts_at == T0
    assert [c.alert.state for c in e.tick(T0 + 500)] == ["resolved"]


def test_old_xid_from_the_kernel_log_does_not_fire() -> None:
    e = engine(XID_RULE, xid_action=lambda code: "reboot")
    assert e.on_xid(xid(79, T0 - 3600), T0) == []


def test_xid_actions_are_compared_loosely() -> None:
    e = engine(XID_RULE, xid_action=lambda code: "Reset GPU")
    assert len(e.on_xid(xid(48, T0), T0)) == 1


def test_burn_holds_back_only_rules_marked_for_it_and_only_on_its_gpus() -> None:
    e = engine(
        {**HOT, "for": 0},
        {"name": "Lost", "field": "up", "op": "==", "threshold": False},
    )
    burn = BurnHoldBack(pid=42, gpu_indices=frozenset({0}), uuids=frozenset({UUID0}), started_at=T0 - 60)
    e.evaluate(snap(T0, gpu(0, temperature_celsius=90), gpu(1, temperature_celsius=90)), T0, burn)
    held = {a.gpu: a.held_back for a in e.alerts()}
    assert held["1"] is None
    assert held["0"] is not None and held["0"].startswith("held back: gpumon burn running since")
    [alert0] = [a for a in e.alerts() if a.gpu == "0"]
    assert alert0.annotations["held_back"] == held["0"]
    e.evaluate(snap(T0 + 1, gpu(0, temperature_celsius=90), gpu(1, temperature_celsius=90)), T0 + 1, None)
    assert all(a.held_back is None for a in e.alerts())


def test_state_survives_export_and_restore() -> None:
    e = engine({**HOT, "for": 0}, {"name": "LinkDown", "kind": "nvlink_down"})
    e.evaluate(snap(T0, gpu(temperature_celsius=90)), T0)
    again = engine({**HOT, "for": 0}, {"name": "LinkDown", "kind": "nvlink_down"})
    again.restore_state(e.export_state())
    [alert] = again.alerts()
    assert alert.starts_at == T0 and alert.state == "firing"
    again.evaluate(snap(T0 + 1, gpu(nvlink_up={"0": False, "1": True})), T0 + 1)
    assert [a.labels.get("link") for a in again.alerts() if a.alertname == "LinkDown"] == ["0"]


def test_removing_a_rule_resolves_its_alerts() -> None:
    e = engine({**HOT, "for": 0})
    e.evaluate(snap(T0, gpu(temperature_celsius=90)), T0)
    [change] = e.set_rules([], T0 + 5)
    assert change.alert.state == "resolved" and change.alert.labels["severity"] == "warning"
    assert e.alerts() == []


def _counted(e: AlertEngine) -> dict[AlertCount, int]:
    """What counts() must give: alerts() counted by name, severity, state, GPU and hold-back."""
    out: dict[AlertCount, int] = {}
    for a in e.alerts():
        key = AlertCount(a.alertname, a.severity, a.state, a.gpu, a.uuid, a.held_back is not None)
        out[key] = out.get(key, 0) + 1
    return out


def test_alert_counts_for_the_metric_equal_the_alerts_counted_without_building_them() -> None:
    e = engine(
        {**HOT, "for": 0},
        {**HOT, "name": "GpuWarm", "threshold": 80, "for": "1m", "severity": "info"},
    )
    burn = BurnHoldBack(pid=42, gpu_indices=frozenset({0}), uuids=frozenset({UUID0}), started_at=T0 - 60)
    e.evaluate(snap(T0, gpu(0, temperature_celsius=90), gpu(1, temperature_celsius=90)), T0, burn)
    counts = e.counts()
    assert counts == _counted(e)
    assert counts[AlertCount("GpuHot", "warning", "firing", "0", UUID0, True)] == 1  # held back by the burn
    assert counts[AlertCount("GpuHot", "warning", "firing", "1", UUID1, False)] == 1
    assert counts[AlertCount("GpuWarm", "info", "pending", "1", UUID1, False)] == 1
