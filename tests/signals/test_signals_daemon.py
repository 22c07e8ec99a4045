"""The early signals through the whole daemon: /api/health, gpumon health, and the series on /metrics."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers import DaemonProcess, run_cli, wait_for

STRAGGLER_REASON = (
    "GPU 2 runs 45 % lower SM clocks than its 3 peers under the same load: "
    "hardware slowdown 100 % of the time: inspect hardware"
)


def config_file(tmp_path: Path, window_seconds: float = 3) -> Path:
    path = tmp_path / "gpumon.yaml"
    path.write_text(
        json.dumps(
            {
                "interval_seconds": 0.5,
                "slow_interval_seconds": 0.5,
                "health": {"stragglers": {"window_seconds": window_seconds}},
            }
        )
    )
    return path


def kinds(daemon: DaemonProcess) -> list[tuple[str, Any]]:
    return [(f["kind"], f["gpu"]) for f in daemon.get("/api/health").json()["findings"]]


def test_the_straggler_scenario_names_gpu_2_everywhere(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    daemon = start_daemon("--backend", "fake:straggler", "--config", str(config_file(tmp_path)))
    report = wait_for(
        lambda: (r := daemon.get("/api/health").json())["findings"] and r, 20, 0.2, f"a finding; {daemon.log()}"
    )
    assert report["status"] == "WARNING"
    assert [(f["kind"], f["gpu"], f["reason"]) for f in report["findings"]] == [("straggler", 2, STRAGGLER_REASON)]
    metrics = daemon.metrics()
    assert f'gpumon_health_status{{action="inspect_hardware",gpu="2",reason="{STRAGGLER_REASON}"' in metrics
    deviation = [
        line
        for line in metrics.splitlines()
        if line.startswith("gpumon_straggler_deviation_ratio{") and 'gpu="2"' in line
    ]
    sm = [line for line in deviation if 'signal="sm_clock"' in line]
    assert len(sm) == 1 and round(float(sm[0].split()[-1]), 3) == round(1.095 / 1.98 - 1, 3)
    asked = run_cli("health", "--daemon-url", f"{daemon.url}/api/health", "--state-dir", str(daemon.state_dir))
    assert asked.returncode == 1, asked.stdout + asked.stderr
    assert asked.stdout.splitlines()[0] == f"gpumon health: WARNING - {STRAGGLER_REASON} (from the daemon)"


def test_no_straggler_while_a_burn_runs(start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> None:
    marker = tmp_path / "state" / "burn" / "running.json"
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"pid": os.getpid(), "gpus": [0, 1, 2, 3], "uuids": [], "started_at": time.time()}))
    daemon = start_daemon("--backend", "fake:straggler", "--config", str(config_file(tmp_path, window_seconds=2)))
    time.sleep(5)  # more than twice the window
    assert kinds(daemon) == []
    marker.unlink()  # the burn ends: the job's imbalance is seen from then on
    wait_for(lambda: kinds(daemon) == [("straggler", 2)], 15, 0.2, "the straggler after the burn")


def test_a_healthy_busy_pair_never_shows_a_straggler(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    daemon = start_daemon("--backend", "fake:healthy", "--config", str(config_file(tmp_path, window_seconds=2)))
    for _ in range(10):
        time.sleep(0.5)
        assert kinds(daemon) == []
    assert 'gpumon_straggler_deviation_ratio{gpu="1",signal="sm_clock"' in daemon.metrics().replace(
        'uuid="GPU-fa4e0000-0000-4000-8000-000000000001",', ""
    )


_REPLAYS = [40, 40, 43, 46, 49, 52, 55, 58, 61, 64, 5, 8]
PCIE_REPLAYS = f"""
count: 2
gpus:
  - {{}}
  - values:
      pcie_replays_total: {[v for v in _REPLAYS for _ in range(3)]}
"""
"""Each value held for three polls: the slow tier is read every 0.5 s like the fast one, and a poll
a little early under load finds it not yet due, so a value held for one poll could be missed (and
the increase after the reset come out lower): the test failed 2 of 4 runs beside two busy cores."""


def test_pcie_replays_rising_warn_through_the_daemon_and_a_reset_is_no_negative_rate(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    scenario = tmp_path / "replays.yaml"
    scenario.write_text(PCIE_REPLAYS)
    daemon = start_daemon("--backend", f"fake:{scenario}", "--config", str(config_file(tmp_path)))
    finding = wait_for(
        lambda: [f for f in daemon.get("/api/health").json()["findings"] if f["kind"] == "pcie_replays_trend"],
        60,  # about 6 s alone; a loaded CI machine polls slower
        0.2,
        "the PCIe replay trend",
    )[0]
    assert finding["gpu"] == 1 and finding["severity"] == "WARNING" and finding["action"] == "inspect_hardware"
    assert finding["reason"].startswith("GPU 1 PCIe replays rising: ")
    # the counter drops from 64 to 5 (a driver reload): counted from 0, never negative
    wait_for(
        lambda: (
            'gpumon_error_trend_increase{counter="pcie_replays",gpu="1"' in (m := daemon.metrics())
            and _increase(m) == 24 + 8
        ),
        60,
        0.2,
        "the increase after the reset",
    )


def _increase(metrics: str) -> float:
    for line in metrics.splitlines():
        if line.startswith('gpumon_error_trend_increase{counter="pcie_replays",gpu="1"'):
            return float(line.split()[-1])
    return -1.0
