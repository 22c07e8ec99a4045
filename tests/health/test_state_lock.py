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

from gpumon.health.service import HealthService
from gpumon.model.xid import XidEvent
from gpumon.model.xid_catalog import XidCatalog
from tests.helpers import REPO, DaemonProcess, free_port, run_cli, wait_for

pytestmark = pytest.mark.faults

_XID48_TICKS = ", ".join(f"{{tick: {t}, xid: 48}}" for t in range(5))
XID48_EACH_TICK = f"count: 2\ngpus:\n  - xid_events: [{_XID48_TICKS}]\n  - {{}}\n"


def test_five_overlapping_health_runs_lose_no_xid_and_a_replay_counts_none_again(tmp_path: Path) -> None:
    """Run i plays the scenario to tick i (``--tick``), so sees XID 48 of ticks 0..i on GPU 0: five runs at
    once make the fault's count 5 on disk (none lost, none counted twice), and a sixth run of the whole
    scenario still reports 5: a scenario played again counts its XIDs once (issue 41, item 10)."""
    scenario = tmp_path / "xid48.yaml"
    scenario.write_text(XID48_EACH_TICK)
    state = tmp_path / "state"
    args = ["health", "--local", "--backend", f"fake:{scenario}", "--state-dir", str(state), "--json"]
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "gpumon", *args, "--tick", str(tick)],
            cwd=str(REPO),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for tick in range(5)
    ]
    for run in runs:
        _, err = run.communicate(timeout=120)
        assert run.returncode == 2, err  # CRITICAL
    [fault] = json.loads(next(state.rglob("xid.json")).read_text())["faults"]
    assert (fault["gpu"], fault["xid"], fault["count"]) == (0, 48, 5)
    sixth = run_cli(*args)
    [finding] = [f for f in json.loads(sixth.stdout)["findings"] if f["kind"] == "xid"]
    assert finding["evidence"]["count"] == 5


def test_two_services_that_read_the_state_before_either_wrote_keep_both_xids(tmp_path: Path) -> None:
    """A daemon and a gpumon health run on one state directory, each reading it before the other wrote:
    the second save takes the first one's XID in (read, then replay its own), so neither is lost."""
    first, second = (HealthService(tmp_path, XidCatalog.load(None)) for _ in range(2))
    first.on_xid(XidEvent(xid=48, timestamp_seconds=1000.0, source="nvml", gpu_index=0, uuid="GPU-0"))
    second.on_xid(XidEvent(xid=48, timestamp_seconds=1001.0, source="nvml", gpu_index=0, uuid="GPU-0"))
    [fault] = json.loads((tmp_path / "health" / "xid.json").read_text())["faults"]
    assert (fault["gpu"], fault["xid"], fault["count"]) == (0, 48, 2)


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
