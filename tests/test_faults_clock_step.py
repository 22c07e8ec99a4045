"""A step of the wall clock neither stops polling nor fires or silences an alert (issue 36, item 1).

The daemon runs with a wall clock the test steps (tests/fault_inject/sitecustomize.py: ``time.time``
and APScheduler's ``datetime.now`` read an offset from a file; the monotonic clock runs on, as when
NTP steps a VM's clock after a pause). No real clock is changed."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.alerts.helpers import TestReceiver, receiver
from tests.helpers import DaemonProcess, value, wait_for

pytestmark = pytest.mark.faults
__all__ = ["receiver"]  # the fixture

FAULT_INJECT = Path(__file__).resolve().parent / "fault_inject"
DAY = 86400.0


def _alerts(daemon: DaemonProcess) -> dict[str, str]:
    """alertname -> state, from /api/alerts."""
    return {a["alertname"]: a["state"] for a in json.loads(daemon.get("/api/alerts").text)["alerts"]}


def _polls_go_on(daemon: DaemonProcess, seconds: float) -> None:
    """For ``seconds``: the served snapshot stays fresh (polls every 0.2 s) and /ready answers 200."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        age = value(daemon.metrics(), "gpumon_snapshot_age_seconds")
        assert age is not None and age < 2.0, f"snapshot {age} s old: polling stopped"
        assert daemon.get("/ready").status_code == 200
        time.sleep(0.2)


@pytest.mark.timeout(120)
def test_wall_clock_steps_neither_stop_polls_nor_fire_early_nor_silence_the_stale_alert(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path, receiver: TestReceiver
) -> None:
    offset = tmp_path / "wall-offset"
    offset.write_text("0")
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("gpus: [{hang_at_tick: 75, hang_seconds: 600}]\n")
    config = tmp_path / "gpumon.yaml"
    rules: list[dict[str, Any]] = [
        {"name": "LongHot", "field": "temperature_celsius", "op": ">", "threshold": -1000, "for": "10m"},
        {"name": "Stale", "kind": "stale_snapshot", "threshold": 2},
    ]
    retry = {"initial_backoff": "50ms", "max_backoff": "200ms", "timeout": "1s"}
    alerting = {"builtin_rules": False, "webhooks": [receiver.url], "retry": retry, "rules": rules}
    config.write_text(json.dumps({"interval_seconds": 0.2, "slow_interval_seconds": 1, "alerting": alerting}))
    env = {
        "FAULT_WALL_OFFSET_FILE": str(offset),
        "PYTHONPATH": os.pathsep.join([str(FAULT_INJECT), os.environ.get("PYTHONPATH", "")]),
    }
    daemon = start_daemon("--backend", f"fake:{scenario}", "--config", str(config), env=env)
    wait_for(lambda: _alerts(daemon).get("LongHot") == "pending", what="LongHot pending")

    offset.write_text("-120")  # the wall clock steps back 2 minutes
    _polls_go_on(daemon, 3.0)

    offset.write_text(str(DAY))  # ... then forward a day: `for: 10m` has not passed
    _polls_go_on(daemon, 3.0)
    assert _alerts(daemon).get("LongHot") == "pending"

    wait_for(  # the scenario's poll hangs at tick 75 (15 s in)
        lambda: (value(daemon.metrics(), "gpumon_snapshot_age_seconds") or 0) > 1.0, timeout=30, what="the hang"
    )
    offset.write_text("-120")  # back again by a day and 2 minutes, while no snapshot comes
    wait_for(lambda: _alerts(daemon).get("Stale") == "firing", timeout=15, what="the stale snapshot alert firing")
    wait_for(
        lambda: "Stale" in {a["labels"]["alertname"] for a in receiver.alerts()}, timeout=10, what="Stale delivered"
    )
    assert "LongHot" not in {a["labels"]["alertname"] for a in receiver.alerts()}
    stale = next(a for a in receiver.alerts() if a["labels"]["alertname"] == "Stale")
    assert stale["startsAt"].startswith(time.strftime("%Y-", time.gmtime(time.time() - 120)))  # a wall time
