"""A health state that cannot be written is said once, then summed up, then said to work again (issue 42,
item 16): on a read-only state directory the daemon logged 43 lines in 33 s, one per poll."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from gpumon.health.service import HealthService
from gpumon.model.xid import XidEvent
from gpumon.model.xid_catalog import XidCatalog
from tests.alerts.helpers import gpu, snap

T0 = 1_800_000_000.0


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_failing_health_state_writes_are_logged_once_then_summed_up_then_said_to_work_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "health").write_text("not a folder")  # every write fails (root ignores a read-only mode)
    now = [0.0]
    service = HealthService(state, XidCatalog.load(), clock=lambda: T0 + now[0], monotonic=lambda: now[0])
    caplog.set_level(logging.INFO, logger="gpumon")
    caplog.clear()  # the start-up's reads of the two files (once each) are not what this is about
    for second in range(60):  # a poll and an XID every second for a minute
        now[0] = float(second)
        service.on_snapshot(snap(now[0], gpu(0), gpu(1)))
        service.on_xid(XidEvent(xid=13, timestamp_seconds=T0 + second, source="nvml", gpu_index=0, uuid="GPU-0"))
    first_minute = errors(caplog)
    assert 1 <= len(first_minute) <= 2, first_minute  # the XID state's, and the baseline's
    assert all("further failures are summed up" in line for line in first_minute)

    now[0] = 400.0  # past the summary period: the next failure says how many there were
    service.on_xid(XidEvent(xid=13, timestamp_seconds=T0 + 400, source="nvml", gpu_index=0, uuid="GPU-0"))
    summary = errors(caplog)[len(first_minute) :]
    assert len(summary) == 1 and "XID lifecycle" in summary[0] and "more time" in summary[0], summary

    (state / "health").unlink()  # fixed: the next save works, and says so once
    shutil.rmtree(state / "health", ignore_errors=True)
    now[0] = 401.0
    service.on_xid(XidEvent(xid=13, timestamp_seconds=T0 + 401, source="nvml", gpu_index=0, uuid="GPU-0"))
    again = [r.getMessage() for r in caplog.records if "works again" in r.getMessage()]
    assert len(again) == 1 and "XID lifecycle" in again[0], again
    assert (state / "health" / "xid.json").is_file()


def test_the_baseline_is_said_recorded_only_when_it_was_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "health").write_text("not a folder")  # the baseline cannot be written
    now = [0.0]
    service = HealthService(state, XidCatalog.load(), clock=lambda: T0 + now[0], monotonic=lambda: now[0])
    caplog.set_level(logging.INFO, logger="gpumon")
    for second in range(3):
        now[0] = float(second)
        service.on_snapshot(snap(now[0], gpu(0), gpu(1)))
    said = [r.getMessage() for r in caplog.records]
    assert not [line for line in said if "recorded the inventory baseline" in line], said
    assert len([line for line in errors(caplog) if "inventory baseline" in line]) == 1, said

    (state / "health").unlink()  # fixed: a service started now records it, and says so
    caplog.clear()
    fresh = HealthService(state, XidCatalog.load(), clock=lambda: T0 + now[0], monotonic=lambda: now[0])
    fresh.on_snapshot(snap(now[0], gpu(0), gpu(1)))
    assert [r.getMessage() for r in caplog.records if "recorded the inventory baseline" in r.getMessage()]
    assert (state / "health" / "inventory.json").is_file()
