"""Smaller faults of issue 36, item 9: a SIGHUP while the daemon starts, /api/snapshot with process
metrics off, a state directory that cannot be written."""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import DaemonProcess, wait_for

pytestmark = pytest.mark.faults


def _caught_signals(pid: int) -> int:
    """The process's caught-signal mask (bit n-1: signal n has a handler)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return int(line.split()[1], 16)
    return 0


@pytest.mark.timeout(60)
def test_sighup_while_the_daemon_starts_is_a_reload_not_its_end(
    start_daemon: Callable[..., DaemonProcess],
) -> None:
    daemon = start_daemon("--backend", "fake", "--fake-gpus", "1", wait=False)
    # from the moment gpumon's first line takes SIGHUP (before it, any process dies of one), then on
    # through every import and the whole start-up; waiting a fixed 50 ms after Python's own SIGINT
    # handler was not enough on a loaded machine (the imports before gpumon's first line took longer)
    wait_for(lambda: _caught_signals(daemon.proc.pid) & (1 << (signal.SIGHUP - 1)), timeout=20, interval=0.002)
    sent = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and daemon.proc.poll() is None:
        daemon.signal(signal.SIGHUP)  # a service manager reloading, over and over, while gpumon starts
        sent += 1
        try:
            if daemon.get("/ready", timeout=0.2).status_code == 200:
                break
        except Exception:
            time.sleep(0.02)
    assert daemon.proc.poll() is None, f"gpumon died of SIGHUP {sent} while starting:\n{daemon.log()}"
    daemon.wait_ready()
    wait_for(lambda: "configuration reloaded" in daemon.log(), what="the early SIGHUP taken as a reload")
    assert daemon.stop() == 0


def _scenario_with_processes(tmp_path: Path) -> Path:
    scenario = tmp_path / "scenario.yaml"
    process = {"pid": 4242, "used_memory_bytes": 1 << 30, "name": "secret-training-job", "user": "alice"}
    scenario.write_text(json.dumps({"gpus": [{"values": {"processes": [process]}}]}))
    return scenario


@pytest.mark.parametrize("processes_on", [False, True])
def test_api_snapshot_shows_who_runs_what_only_with_process_metrics_on(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path, processes_on: bool
) -> None:
    flags = ["--processes"] if processes_on else []
    daemon = start_daemon("--backend", f"fake:{_scenario_with_processes(tmp_path)}", *flags)
    [gpu] = json.loads(daemon.get("/api/snapshot").text)["gpus"]
    [process] = gpu["processes"]
    assert process["used_memory_bytes"] == 1 << 30  # memory in use is shown either way
    text = daemon.get("/api/snapshot").text
    if processes_on:
        assert process["pid"] == 4242 and process["name"] == "secret-training-job" and process["user"] == "alice"
    else:
        assert "4242" not in text and "secret-training-job" not in text and "alice" not in text
        assert "pid" not in process and "name" not in process and "user" not in process


def _error_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if " ERROR " in line]


@pytest.mark.timeout(60)
def test_a_state_directory_that_cannot_be_written_is_logged_once_not_once_a_second(
    start_daemon: Callable[..., DaemonProcess],
) -> None:
    daemon = start_daemon("--backend", "fake:gpu-lost")
    wait_for(lambda: ") lost: " in daemon.log(), what="the GPU lost (alerts and XID state change)")
    time.sleep(1.0)
    before = len(_error_lines(daemon.log()))
    for sub in ("alerts", "health"):  # the state directory's folders become unwritable (files in their place)
        path = daemon.state_dir / sub
        shutil.rmtree(path, ignore_errors=True)
        path.write_text("")
    time.sleep(6.0)  # six seconds of writes that fail (the writers try about once a second)
    new = _error_lines(daemon.log())[before:]
    assert len(new) <= 2, new  # one line per writer that fails, then a summary once a minute
