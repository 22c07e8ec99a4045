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


def _hold_check_lock(state: Path) -> subprocess.Popen[str]:
    """Another process inside a health run: it holds STATE_DIR/health/check.lock until its stdin closes."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; p = sys.argv[1]; os.makedirs(os.path.dirname(p), exist_ok=True); "
            "f = open(p, 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
            str(state / "health" / "check.lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_health_run_waits_for_the_one_still_running_on_its_state_directory(tmp_path: Path) -> None:
    """slurmd starts a check while the last still runs: the new one judges only after the old one ends."""
    state = tmp_path / "state"
    holder = _hold_check_lock(state)
    run = subprocess.Popen(
        [sys.executable, "-m", "gpumon", "health", "--local", "--backend", "fake", "--state-dir", str(state)],
        cwd=str(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            run.wait(timeout=3)  # the check before it still runs (the poll alone takes well under 3 s here)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 0, out + err  # judged, OK


def test_a_health_run_that_cannot_wait_long_enough_is_unknown(tmp_path: Path) -> None:
    """The run before holds on past this one's budget (poll timeout + Slurm timeout): UNKNOWN, said in one line."""
    state = tmp_path / "state"
    config = tmp_path / "gpumon.yaml"
    config.write_text("health:\n  poll_timeout_seconds: 1\n  slurm:\n    timeout_seconds: 1\n")
    holder = _hold_check_lock(state)
    try:
        done = run_cli(
            "health", "--local", "--backend", "fake", "--config", str(config), "--state-dir", str(state), timeout=60
        )
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "UNKNOWN" in done.stdout + done.stderr
