"""A bad ``engine`` section in the alert spool is never a reason not to start (issue 42 item 7): the
spool is kept aside for the operator (``spool.json.corrupt``), said in one line, the alert states start
afresh and the queued notifications still go out."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from gpumon.alerts.service import AlertService
from gpumon.exposition.registry import MetricsOf
from tests.alerts.helpers import alerting
from tests.helpers import DaemonProcess

pytestmark = pytest.mark.faults

QUEUED = {
    "fingerprint": "abc",
    "status": "firing",
    "labels": {"alertname": "GpuHot"},
    "annotations": {},
    "starts_at": 1_800_000_000.0,
}
BAD_ENGINES: dict[str, Any] = {
    "active is a number": {"active": 5},
    "active is a string": {"active": "xx"},
    "ecc baseline not numbers": {"active": [], "ecc_baseline": {"GPU-0": "many"}},
    "links not a list": {"active": [], "links_seen_up": {"GPU-0": 7}},
    "engine is a list": [1, 2],
    "engine is a number": 5,
}
URL = "http://127.0.0.1:9/"


def write_spool(state_dir: Path, engine: Any) -> Path:
    alerts = state_dir / "alerts"
    alerts.mkdir(parents=True)
    spool = alerts / "spool.json"
    spool.write_text(json.dumps({"version": 1, "engine": engine, "queues": {URL: [QUEUED]}}))
    return spool


@pytest.mark.parametrize("engine", BAD_ENGINES.values(), ids=BAD_ENGINES.keys())
def test_a_bad_engine_section_is_set_aside_and_the_queue_kept(
    tmp_path: Path, engine: Any, caplog: pytest.LogCaptureFixture
) -> None:
    spool = write_spool(tmp_path, engine)
    content = spool.read_bytes()
    with caplog.at_level(logging.ERROR):
        service = AlertService(alerting({"alertmanagers": [URL]}), tmp_path, host="node1")
    assert service.active_alerts() == []
    assert [r["queue_length"] for r in service.receivers()] == [1], "the queued notification is kept"
    assert (spool.parent / "spool.json.corrupt").read_bytes() == content
    assert len([r for r in caplog.records if "engine" in r.getMessage()]) == 1, "one line says so"
    registry = CollectorRegistry()
    registry.register(MetricsOf(service.collector()))
    assert "gpumon_alert_spool_damaged_total 1.0" in generate_latest(registry).decode().splitlines()


@settings(max_examples=200, deadline=None)
@given(
    engine=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["active", "ecc_baseline", "links_seen_up", "x"]), inner, max_size=3),
        max_leaves=8,
    )
)
def test_no_engine_section_keeps_the_alert_service_from_being_built(engine: Any) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        write_spool(Path(directory), engine)
        AlertService(alerting({"alertmanagers": [URL]}), Path(directory), host="node1")


def test_the_daemon_starts_on_a_spool_whose_engine_section_is_bad(tmp_path: Path) -> None:
    spool = write_spool(tmp_path / "state", {"active": 5})
    daemon = DaemonProcess(["--backend", "fake"], tmp_path)
    try:
        daemon.wait_ready(timeout=30)
        assert daemon.get("/api/alerts").status_code == 200
        assert "gpumon_alert_spool_damaged_total 1.0" in daemon.metrics().splitlines()
    finally:
        daemon.stop()
    assert (spool.parent / "spool.json.corrupt").exists()
