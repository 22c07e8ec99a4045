"""One state directory, many gpumon processes: health checks that overlap (slurmd starts one every
HealthCheckInterval even while the last still runs) lose nothing, and a second daemon on the same state
directory does not start (exit 2, one line) while the first runs on."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import REPO, DaemonProcess, free_port, run_cli, wait_for

pytestmark = pytest.mark.faults

XID48_ON_GPU0 = "count: 2\ngpus:\n  - xid_events: [{tick: 0, xid: 48}]\n  - {}\n"


def test_five_overlapping_health_runs_each_recording_an_xid_keep_all_five(tmp_path: Path) -> None:
    """Each run plays the scenario once, so sees XID 48 on GPU 0 once (its own event): five runs at
    once make the fault's count 5 on disk, and a sixth run reports 6."""
    scenario = tmp_path / "xid48.yaml"
    scenario.write_text(XID48_ON_GPU0)
    state = tmp_path / "state"
    args = ["health", "--local", "--backend", f"fake:{scenario}", "--state-dir", str(state), "--json"]
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "gpumon", *args], cwd=str(REPO), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(5)
    ]
    for run in runs:
        _, err = run.communicate(timeout=120)
        assert run.returncode == 2, err  # CRITICAL
    [fault] = json.loads(next(state.rglob("xid.json")).read_text())["faults"]
    assert (fault["gpu"], fault["xid"], fault["count"]) == (0, 48, 5)
    sixth = run_cli(*args)
    [finding] = [f for f in json.loads(sixth.stdout)["findings"] if f["kind"] == "xid"]
    assert finding["evidence"]["count"] == 6


def test_a_second_daemon_on_the_same_state_directory_does_not_start(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    first = start_daemon("--backend", "fake")
    listen = f"127.0.0.1:{free_port()}"
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpumon",
            "run",
            "--listen",
            listen,
            "--backend",
            "fake",
            "--state-dir",
            str(first.state_dir),
        ],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        timeout=60,
    )
    assert second.returncode == 2
    [line] = second.stderr.splitlines()
    assert f"pid {first.proc.pid}" in line and str(first.state_dir) in line
    assert first.get("/ready").status_code == 200

    first.stop()  # the lock goes with the process: a daemon after it starts
    again = start_daemon("--backend", "fake")
    wait_for(lambda: again.get("/ready").status_code == 200, 15, what="the next daemon")
