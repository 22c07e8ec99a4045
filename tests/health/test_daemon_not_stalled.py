"""Nothing a one-shot command does may block the daemon's poll or its scrapes (issue 41, item 6): a
``gpumon health`` run holding the health folder's lock made /metrics take 9.5 s, /ready fail and polls be
skipped, because the daemon's save waited up to 30 s for that lock."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path

from gpumon.util.state.files import health_dir
from gpumon.util.state.lock import LOCK_NAME
from tests.helpers import DaemonProcess, wait_for

XID_LATER = """
count: 2
gpus:
  - {}
  - xid_events: [{tick: 15, xid: 79}]
"""


def test_a_one_shot_run_holding_the_health_lock_stalls_no_poll_and_no_scrape(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    scenario = tmp_path / "xid.yaml"
    scenario.write_text(XID_LATER)
    backend = f"fake:{scenario}"
    config = tmp_path / "gpumon.yaml"
    config.write_text(f"backend: '{backend}'\ninterval_seconds: 0.2\nstale_after_seconds: 1\n")
    daemon = start_daemon("--config", str(config))
    folder = health_dir(daemon.state_dir, backend)
    wait_for(lambda: (folder / "xid.json").exists(), 15, 0.1, "the daemon's first save")

    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a gpumon health run holds it
    try:
        first = daemon.get("/api/snapshot").json()["timestamp_seconds"]
        # while the lock is held: polls go on (new snapshots), /ready stays 200, /metrics answers, and the
        # XID of tick 15 (3 s in) reaches the verdict
        for _ in range(20):
            assert daemon.get("/ready", timeout=2).status_code == 200
            assert daemon.get("/metrics", timeout=2).status_code == 200
        wait_for(lambda: daemon.get("/api/snapshot").json()["timestamp_seconds"] > first + 1, 10, 0.1, "new polls")
        wait_for(lambda: daemon.get("/api/health").json()["status"] == "CRITICAL", 15, 0.1, "the XID in the verdict")
        assert daemon.get("/ready", timeout=2).status_code == 200
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    # released: what could not be saved meanwhile is saved at the next poll
    wait_for(
        lambda: any(f["xid"] == 79 for f in json.loads((folder / "xid.json").read_text())["faults"]),
        10,
        0.1,
        "the XID saved once the lock is free",
    )
