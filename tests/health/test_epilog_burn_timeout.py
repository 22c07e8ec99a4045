"""The epilog's burn past its time ends with every process it started: nothing is left
(issue 41, item 7: the burn's fork server and workers outlived it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpumon.commands import health_slurm
from gpumon.commands.health_slurm import BURN_TIMED_OUT, epilog_burn
from gpumon.config.file import Config
from gpumon.health.config import HealthConfig, SlurmConfig
from tests.helpers import wait_for

# A stand-in for a burn that hangs: a "fork server" child that ignores SIGTERM and a worker grandchild,
# each writing its pid, then all sleep.
HANGING_BURN = """
import os, signal, subprocess, sys, time
pids = sys.argv[1]
if len(sys.argv) > 2:  # the fork server: ignores SIGTERM, starts a worker
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(pids, "a").write(f"{worker.pid}\\n")
else:
    subprocess.Popen([sys.executable, sys.argv[0], pids, "server"])
open(pids, "a").write(f"{os.getpid()}\\n")
time.sleep(600)
"""


def _ended(pid: int) -> bool:
    """Gone, or a zombie waiting for a parent that reaps (it runs no more)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_a_burn_past_its_time_leaves_no_process_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "burn.py"
    script.write_text(HANGING_BURN)
    pids = tmp_path / "pids"
    monkeypatch.setattr(health_slurm, "burn_command", lambda *a: [sys.executable, str(script), str(pids)])
    config = Config(health=HealthConfig(slurm=SlurmConfig(enabled=True, epilog_burn=True)))
    failed = {"SLURM_JOB_EXIT_CODE": "1", "SLURM_JOB_ID": "7"}

    assert epilog_burn(config, tmp_path, failed, timeout_seconds=3) == BURN_TIMED_OUT

    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 3  # the burn, its fork server and a worker had started
    wait_for(lambda: all(_ended(p) for p in started), 10, 0.1, "every process the burn started to end")
