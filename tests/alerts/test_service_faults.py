"""AlertService when the state directory cannot be written: the alerts go on, the log says it
once and then sums it up, instead of one line a second."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from gpumon.alerts.service import AlertService
from gpumon.exposition.registry import MetricsOf
from tests.alerts.helpers import FakeClock, alerting, gpu, snap, wait_for

T0 = 1_800_000_000.0

pytestmark = pytest.mark.faults  # the daemon under faults, as a user meets them: make test-faults


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[AlertService, FakeClock, Path]]:
    blocked = tmp_path / "state" / "alerts"  # a file where the spool's directory should be: every write fails
    blocked.parent.mkdir()
    blocked.write_text("not a directory")
    clock = FakeClock(T0)
    hot = {"name": "GpuHot", "field": "temperature_celsius", "op": ">", "threshold": 85, "for": 0}
    svc = AlertService(alerting({"builtin_rules": False, "rules": [hot]}), tmp_path / "state", "node1", clock=clock)
    svc.start()
    yield svc, clock, blocked
    svc.stop(2)


def spool_errors(svc: AlertService) -> float:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MetricsOf(svc.collector()))
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith("gpumon_alert_spool_write_errors_total "):
            return float(line.split()[1])
    raise AssertionError("no gpumon_alert_spool_write_errors_total")


def spool_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "alert spool" in r.getMessage()]


def test_an_unwritable_state_directory_is_logged_once_then_summed_up_each_minute(
    service: tuple[AlertService, FakeClock, Path], caplog: pytest.LogCaptureFixture
) -> None:
    svc, clock, blocked = service
    caplog.set_level(logging.WARNING)
    svc.on_snapshot(snap(T0, gpu(0, temperature_celsius=90)))
    assert [a["labels"]["alertname"] for a in svc.active_alerts()] == ["GpuHot"], "alerts go on without a spool"
    wait_for(lambda: spool_errors(svc) >= 3, timeout=10, what="three failed writes (one a second)")
    lines = spool_lines(caplog)
    assert len(lines) == 1, lines
    assert "writing the alert spool" in lines[0] and "failed" in lines[0]

    clock.advance(61)
    errors = spool_errors(svc)
    wait_for(lambda: spool_errors(svc) > errors, timeout=5, what="another failed write")
    lines = spool_lines(caplog)
    assert len(lines) == 2, lines
    assert "more time(s) in the last 61 s" in lines[1]

    blocked.unlink()  # space again
    wait_for(lambda: len(spool_lines(caplog)) == 3, timeout=5, what="the recovery line")
    assert "works again" in spool_lines(caplog)[2]
    assert (blocked / "spool.json").exists()
