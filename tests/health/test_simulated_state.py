"""A demo on simulated GPUs leaves the node's own state alone: ``gpumon run --backend fake:xid-storm``
keeps its XIDs and its inventory in a folder of its own, so the node's next health check (here a
healthy simulated node of another scenario, and the service over the node's own state as a real
backend reads it) says OK."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.health.config import HealthConfig
from gpumon.health.service import HealthService
from gpumon.model.xid_catalog import XidCatalog
from tests.helpers import DaemonProcess, run_cli, wait_for

pytestmark = pytest.mark.faults


def test_a_simulated_scenario_run_leaves_the_nodes_verdict_ok(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    demo = start_daemon("--backend", "fake:xid-storm")
    wait_for(lambda: demo.get("/api/health").json()["status"] == "CRITICAL", 20, 0.1, "the storm's CRITICAL")
    wait_for(lambda: any(demo.state_dir.rglob("inventory.json")), 10, what="the storm's baseline")
    demo.stop()
    state = demo.state_dir

    # the node's own health folder holds nothing of the demo, and the log says where the demo's went
    node = state / "health"
    for name in ("xid.json", "inventory.json"):
        assert not (node / name).exists(), f"the demo wrote {node / name}"
    assert "simulated GPUs (fake:xid-storm)" in demo.log_path.read_text()

    other = run_cli("health", "--local", "--backend", "fake", "--state-dir", str(state))
    assert other.returncode == 0, other.stdout + other.stderr
    assert other.stdout.startswith("gpumon health: OK")

    # the node's own (non-simulated) service over the same state directory: OK, no inventory drift
    (tmp_path / "sys").mkdir()
    config = HealthConfig(sysfs_root=tmp_path / "sys", boot_id_path=tmp_path / "boot_id")
    real = HealthService(state, XidCatalog.load(), config)
    real.on_snapshot(Poller(FakeBackend.plausible(1), SnapshotStore()).poll())
    report = real.report(source="local")
    assert report.status == "OK", json.dumps(report.to_json())
