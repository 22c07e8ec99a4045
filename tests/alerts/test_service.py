"""AlertService: spool survival, burn hold-back, /api/alerts, metrics, reload, robustness."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpumon.alerts.config import AlertingConfig
from gpumon.alerts.service import AlertService
from gpumon.exposition.registry import MetricsOf
from gpumon.model.xid import XidEvent
from tests.alerts.helpers import UUID0, UUID1, FakeClock, TestReceiver, alerting, free_port, gpu, snap, wait_for

FAST_RETRY = {"initial_backoff": "50ms", "max_backoff": "200ms", "timeout": "500ms"}
HOT = {"name": "GpuHot", "field": "temperature_celsius", "op": ">", "threshold": 85, "for": 0}
T0 = 1_800_000_000.0


def config(**raw: Any) -> AlertingConfig:
    return alerting({"builtin_rules": False, "rules": [HOT], "retry": FAST_RETRY, **raw})


@pytest.fixture
def services() -> Iterator[list[AlertService]]:
    made: list[AlertService] = []
    yield made
    for s in made:
        s.stop(2)


def make(
    services: list[AlertService], cfg: AlertingConfig, state_dir: Path, start: bool = True, **kw: Any
) -> AlertService:
    kw.setdefault("clock", FakeClock(T0))
    service = AlertService(cfg, state_dir, host="node1", **kw)
    if start:
        service.start()
    services.append(service)
    return service


def test_firing_alert_and_queue_survive_a_restart_with_their_startsat(
    tmp_path: Path, services: list[AlertService]
) -> None:
    port = free_port()
    cfg = config(alertmanagers=[f"http://127.0.0.1:{port}"])
    clock = FakeClock(T0)
    first = make(services, cfg, tmp_path, clock=clock)
    first.on_snapshot(snap(T0, gpu(temperature_celsius=90)))
    assert first.sync(5), "spool written"
    first.stop(2)
    spool = json.loads((tmp_path / "alerts" / "spool.json").read_text())
    assert len(spool["queues"][f"http://127.0.0.1:{port}"]) == 1

    receiver = TestReceiver().start(port)
    try:
        clock.advance(600)
        second = make(services, cfg, tmp_path, clock=clock)
        [alert] = second.active_alerts()
        assert (alert["state"], alert["starts_at"]) == ("firing", T0)
        wait_for(lambda: receiver.alerts(), 10, what="the spooled alert delivered by the new instance")
        assert {a["startsAt"] for a in receiver.alerts()} == {"2027-01-15T08:00:00.000Z"}
        second.on_snapshot(snap(T0 + 600, gpu(temperature_celsius=92)))
        assert second.active_alerts()[0]["starts_at"] == T0, "still the same alert, not a new one"
    finally:
        receiver.stop()


def test_alert_that_resolved_while_gpumon_was_down_is_resolved_after_restart(
    receiver: TestReceiver, tmp_path: Path, services: list[AlertService]
) -> None:
    cfg = config(alertmanagers=[receiver.url])
    first = make(services, cfg, tmp_path)
    first.on_snapshot(snap(T0, gpu(temperature_celsius=90)))
    wait_for(lambda: len(receiver.alerts()) == 1, 5, what="the firing alert")
    first.stop(2)
    second = make(services, cfg, tmp_path, clock=FakeClock(T0 + 100))
    second.on_snapshot(snap(T0 + 100, gpu(temperature_celsius=60)))
    wait_for(
        lambda: any(a["endsAt"].startswith("2027-01-15T08:01:40") for a in receiver.alerts()),
        5,
        what="the resolution sent by the restarted instance",
    )


def test_a_corrupt_spool_is_moved_aside_and_gpumon_starts(tmp_path: Path, services: list[AlertService]) -> None:
    (tmp_path / "alerts").mkdir()
    (tmp_path / "alerts" / "spool.json").write_text("{not json")
    service = make(services, config(), tmp_path)
    assert service.active_alerts() == []
    assert (tmp_path / "alerts" / "spool.json.corrupt").exists()


KILL_SCRIPT = """
import sys, time
from pathlib import Path
from gpumon.alerts.config import parse
from gpumon.alerts.service import AlertService
from tests.alerts.helpers import gpu, snap
config, problems = parse({"builtin_rules": False, "alertmanagers": [sys.argv[2]],
    "rules": [{"name": "GpuHot", "field": "temperature_celsius", "op": ">", "threshold": 85}]})
service = AlertService(config, Path(sys.argv[1]), host="node1")
service.start()
service.on_snapshot(snap(time.time(), gpu(0, temperature_celsius=90), gpu(1, temperature_celsius=95)))
assert service.sync(10)
print("queued", flush=True)
time.sleep(600)
"""


def test_alerts_queued_when_gpumon_is_sigkilled_arrive_after_restart(
    tmp_path: Path, services: list[AlertService]
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, str(tmp_path), url],
        stdout=subprocess.PIPE,
        text=True,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "queued"
    finally:
        proc.kill()
        proc.wait(10)
    assert proc.returncode == -9
    receiver = TestReceiver().start(port)
    try:
        cfg = alerting(
            {
                "builtin_rules": False,
                "alertmanagers": [url],
                "retry": FAST_RETRY,
                "rules": [{"name": "GpuHot", "field": "temperature_celsius", "op": ">", "threshold": 85}],
            }
        )
        make(services, cfg, tmp_path, clock=time.time)
        wait_for(
            lambda: {a["labels"]["uuid"] for a in receiver.alerts()} == {UUID0, UUID1},
            10,
            what="both alerts queued before SIGKILL",
        )
    finally:
        receiver.stop()


def write_marker(state_dir: Path, pid: int, gpus: list[int], uuids: list[str]) -> None:
    (state_dir / "burn").mkdir(parents=True, exist_ok=True)
    marker = {"pid": pid, "gpus": gpus, "uuids": uuids, "started_at": T0 - 120}
    (state_dir / "burn" / "running.json").write_text(json.dumps(marker))


def test_burn_marker_holds_back_alerts_of_its_gpus(
    receiver: TestReceiver, tmp_path: Path, services: list[AlertService]
) -> None:
    clock = FakeClock(T0)
    service = make(services, config(alertmanagers=[receiver.url]), tmp_path, clock=clock, tick_seconds=3600)
    write_marker(tmp_path, os.getpid(), [0], [UUID0])
    service.on_snapshot(snap(T0, gpu(0, temperature_celsius=90), gpu(1, temperature_celsius=90)))
    wait_for(lambda: receiver.alerts(), 5, what="GPU 1's alert")
    time.sleep(0.2)
    assert [a["labels"]["gpu"] for a in receiver.alerts()] == ["1"], "GPU 0 is burning: held back"
    states = {a["gpu"]: a for a in service.active_alerts()}
    assert states["0"]["state"] == "suppressed"
    assert states["0"]["annotations"]["held_back"].startswith(
        "held back: gpumon burn running since 2027-01-15T07:58:00Z"
    )
    assert states["1"]["state"] == "firing"
    registry = CollectorRegistry()
    registry.register(MetricsOf(service.collector()))
    text = generate_latest(registry).decode()
    assert (
        f'gpumon_alerts{{alertname="GpuHot",gpu="0",severity="warning",state="suppressed",uuid="{UUID0}"}} 1.0' in text
    )
    assert f'gpumon_alerts_held_back{{gpu="0",uuid="{UUID0}"}} 1.0' in text

    (tmp_path / "burn" / "running.json").unlink()
    clock.advance(10)
    service.on_snapshot(snap(clock.now, gpu(0, temperature_celsius=90), gpu(1, temperature_celsius=90)))
    wait_for(lambda: "0" in {a["labels"]["gpu"] for a in receiver.alerts()}, 5, what="GPU 0's alert after the burn")
    [gpu0] = [a for a in receiver.alerts() if a["labels"]["gpu"] == "0"]
    assert gpu0["startsAt"] == "2027-01-15T08:00:00.000Z", "it fired when the GPU got hot, not when the burn ended"


def test_a_burn_started_while_no_alert_was_open_holds_back_the_next_poll_s_alert(
    receiver: TestReceiver, tmp_path: Path, services: list[AlertService]
) -> None:
    """The marker is read when an alert is open to hold back: a burn that began between two quiet polls
    holds back the alert that opens at the next one, as one read at every poll would."""
    clock = FakeClock(T0)
    service = make(services, config(alertmanagers=[receiver.url]), tmp_path, clock=clock, tick_seconds=3600)
    for _ in range(3):
        service.on_snapshot(snap(clock.now, gpu(0, temperature_celsius=50), gpu(1, temperature_celsius=50)))
        clock.advance(1)
    write_marker(tmp_path, os.getpid(), [0], [UUID0])
    service.on_snapshot(snap(clock.now, gpu(0, temperature_celsius=90), gpu(1, temperature_celsius=90)))
    wait_for(lambda: receiver.alerts(), 5, what="GPU 1's alert")
    assert {a["gpu"]: a["state"] for a in service.active_alerts()} == {"0": "suppressed", "1": "firing"}
    assert [a["labels"]["gpu"] for a in receiver.alerts()] == ["1"], "GPU 0 is burning: held back"


def test_stale_burn_marker_is_ignored(tmp_path: Path, services: list[AlertService]) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_marker(tmp_path, dead.pid, [0], [UUID0])
    service = make(services, config(), tmp_path)
    service.on_snapshot(snap(T0, gpu(0, temperature_celsius=90)))
    assert [a["state"] for a in service.active_alerts()] == ["firing"]


def test_burn_hold_back_can_be_turned_off(tmp_path: Path, services: list[AlertService]) -> None:
    write_marker(tmp_path, os.getpid(), [0], [UUID0])
    service = make(services, config(burn_hold_back=False), tmp_path)
    service.on_snapshot(snap(T0, gpu(0, temperature_celsius=90)))
    assert [a["state"] for a in service.active_alerts()] == ["firing"]


def test_stale_snapshot_fires_from_the_timer_thread(tmp_path: Path, services: list[AlertService]) -> None:
    clock = FakeClock(T0)
    cfg = alerting({"builtin_rules": False, "rules": [{"name": "Stale", "kind": "stale_snapshot", "threshold": 30}]})
    service = make(services, cfg, tmp_path, clock=clock, tick_seconds=0.02)
    service.on_snapshot(snap(T0, gpu()))
    clock.advance(31)  # no more snapshots: a hung poll
    wait_for(lambda: [a["alertname"] for a in service.active_alerts()] == ["Stale"], 5, what="the stale alert")


def test_xid_event_fires_through_the_service(
    receiver: TestReceiver, tmp_path: Path, services: list[AlertService]
) -> None:
    cfg = alerting({"alertmanagers": [receiver.url], "retry": FAST_RETRY})
    service = make(services, cfg, tmp_path, clock=time.time, xid_action=lambda code: "reboot")
    service.on_xid(XidEvent(xid=79, timestamp_seconds=time.time(), source="nvml", gpu_index=0, uuid=UUID0))
    wait_for(lambda: receiver.alerts(), 5, what="the XID alert")
    [alert] = receiver.alerts()
    assert alert["labels"]["alertname"] == "GpuXidCritical" and alert["labels"]["xid"] == "79"
    assert alert["labels"]["severity"] == "critical"


def test_api_alerts_route_and_metrics(tmp_path: Path, services: list[AlertService]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    service = make(services, config(alertmanagers=[url]), tmp_path)
    service.on_snapshot(snap(T0, gpu(0, temperature_celsius=90)))
    status, content_type, body = service.routes()["/api/alerts"]()
    assert (status, content_type) == (200, "application/json")
    data = json.loads(body)
    assert data["host"] == "node1"
    [alert] = data["alerts"]
    assert (alert["alertname"], alert["state"], alert["gpu"], alert["uuid"]) == ("GpuHot", "firing", "0", UUID0)
    assert data["receivers"][0]["name"] == url
    registry = CollectorRegistry()
    registry.register(MetricsOf(service.collector()))
    wait_for(lambda: service.receivers()[0]["notifications"]["failed"] >= 1, 5, what="a failed delivery")
    text = generate_latest(registry).decode()
    assert f'gpumon_alerts{{alertname="GpuHot",gpu="0",severity="warning",state="firing",uuid="{UUID0}"}} 1.0' in text
    assert f'gpumon_alert_queue_length{{receiver="{url}"}} 1.0' in text
    assert f'gpumon_alert_notifications_total{{outcome="failed",receiver="{url}"}}' in text
    assert "gpumon_alert_evaluation_errors_total 0.0" in text


def test_on_snapshot_never_raises(tmp_path: Path, services: list[AlertService]) -> None:
    service = make(services, config(), tmp_path)
    service.on_snapshot("not a snapshot")  # type: ignore[arg-type]
    service.on_xid("not an event")  # type: ignore[arg-type]
    registry = CollectorRegistry()
    registry.register(MetricsOf(service.collector()))
    assert "gpumon_alert_evaluation_errors_total 2.0" in generate_latest(registry).decode()


def test_reload_keeps_states_and_resolves_removed_rules(
    receiver: TestReceiver, tmp_path: Path, services: list[AlertService]
) -> None:
    cool = {"name": "GpuCool", "field": "temperature_celsius", "op": "<", "threshold": 100, "for": 0}
    clock = FakeClock(T0)
    cfg = alerting({"builtin_rules": False, "rules": [HOT, cool], "alertmanagers": [receiver.url], "retry": FAST_RETRY})
    service = make(services, cfg, tmp_path, clock=clock, tick_seconds=3600)
    service.on_snapshot(snap(T0, gpu(temperature_celsius=90)))
    wait_for(lambda: len(receiver.alerts()) == 2, 5, what="two alerts")
    clock.advance(30)
    service.reload(alerting({"builtin_rules": False, "rules": [HOT], "alertmanagers": [receiver.url]}))
    wait_for(lambda: len(receiver.alerts()) == 3, 5, what="GpuCool resolved")
    assert receiver.alerts()[2]["labels"]["alertname"] == "GpuCool"
    assert receiver.alerts()[2]["endsAt"] == "2027-01-15T08:00:30.000Z"
    [kept] = service.active_alerts()
    assert (kept["alertname"], kept["starts_at"]) == ("GpuHot", T0)
