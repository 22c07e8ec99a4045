"""The daemon's view: /api/health, gpumon_health_status on /metrics, state across restarts, clears."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from gpumon.util.state.files import health_dir
from tests.helpers import DaemonProcess, run_cli, wait_for

REASON = "GPU 1 xid 79 fallen off the bus: reboot node"


def test_fault_seen_by_the_daemon_survives_a_restart_until_cleared(
    start_daemon: Callable[..., DaemonProcess], xid79_scenario: Path
) -> None:
    daemon = start_daemon("--backend", f"fake:{xid79_scenario}")
    report = wait_for(
        lambda: (r := daemon.get("/api/health").json())["status"] == "CRITICAL" and r, 15, 0.1, "CRITICAL"
    )
    assert report["reason"] == REASON
    assert report["findings"][0]["evidence"]["lifecycle"] == "needs_reboot"
    metrics = daemon.metrics()
    assert f'gpumon_node_health_status{{action="reboot_node",reason="{REASON}"}} 2.0' in metrics
    assert (
        'gpumon_health_status{action="none",gpu="0",reason="ok",uuid="GPU-fa4e0000-0000-4000-8000-000000000000"} 0.0'
        in metrics
    )
    assert f'gpumon_health_status{{action="reboot_node",gpu="1",reason="{REASON}"' in metrics
    daemon.stop()

    # Restarted with GPUs that look fine (the same simulated node, its scenario file now without the XID):
    # the XID's state survives (same boot, no repair seen).
    xid79_scenario.write_text("count: 2\n")
    daemon = start_daemon("--backend", f"fake:{xid79_scenario}")
    asked = run_cli("health", "--daemon-url", f"{daemon.url}/api/health", "--state-dir", str(daemon.state_dir))
    assert asked.returncode == 2, asked.stdout + asked.stderr
    assert asked.stdout.splitlines()[0] == f"gpumon health: CRITICAL - {REASON} (from the daemon)"

    cleared = run_cli(
        "health", "clear", "--gpu", "1", "--reason", "reseated", "--state-dir", str(daemon.state_dir),
        "--backend", f"fake:{xid79_scenario}",
    )  # fmt: skip
    assert cleared.returncode == 0
    wait_for(lambda: daemon.get("/api/health").json()["status"] == "OK", 10, 0.1, "OK after the clear")
    assert 'gpumon_node_health_status{action="none",reason="all GPUs healthy"} 0.0' in daemon.metrics()
    xid_state = json.loads((health_dir(daemon.state_dir, f"fake:{xid79_scenario}") / "xid.json").read_text())
    assert xid_state["resolved"][-1]["resolved_by"].endswith(": reseated")
