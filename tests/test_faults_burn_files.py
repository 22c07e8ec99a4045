"""What is put in place of the burn's files cannot stop the daemon (issue 42, item 3).

``burn/running.json`` and ``burn/last.json`` are read by every scrape and by the alert and health services.
A FIFO there used to make ``/metrics`` never answer (and the daemon outlive SIGTERM) while the systemd
watchdog was still fed; a link to /dev/zero grew the daemon by gigabytes; JSON nested too deeply gave a
traceback. Each is now read only as a regular file of bounded size, and the watchdog is fed only while
scrapes are answered."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from gpumon.collect.store import SnapshotStore
from gpumon.http.server import STALLED_SCRAPE_SECONDS, MetricsServer
from gpumon.util.state.files import health_dir
from tests.helpers import DaemonProcess, RenderedBytes, value, wait_for

pytestmark = pytest.mark.faults


def planted(state: Path, kind: str) -> None:
    """``kind`` in place of both burn files, the node's (the alert and health services read its marker)
    and the simulated GPUs' own (the scrape reads those of the backend it serves)."""
    for burn in (state / "burn", health_dir(state, "fake").parent / "burn"):
        _plant(burn, kind)


def _plant(burn: Path, kind: str) -> None:
    burn.mkdir(parents=True)
    for name in ("running.json", "last.json"):
        if kind == "fifo":
            os.mkfifo(burn / name)
        elif kind == "dev-zero":
            os.symlink("/dev/zero", burn / name)
        else:
            (burn / name).write_text("[" * 200_000 + "]" * 200_000)


def resident_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "nested"])
def test_scrapes_are_answered_and_sigterm_stops_the_daemon_whatever_is_in_place_of_the_burn_files(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path, kind: str
) -> None:
    planted(tmp_path / "state", kind)
    daemon = start_daemon("--backend", "fake", "--fake-gpus", "1", "--interval", "0.2", wait=False)
    daemon.wait_ready(timeout=30)
    for _ in range(3):
        text = daemon.get("/metrics", timeout=10).text
        assert value(text, "gpumon_gpu_up", gpu="0") == 1.0
        assert "gpumon_burn_last_run_exit_code" not in text
    assert resident_kib(daemon.proc.pid) < 1 << 20  # under 1 GiB (a /dev/zero read whole grew it by ~12 GB)
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(20) == 0
    assert "Traceback" not in daemon.log()


def test_a_scrape_whose_body_is_not_made_stops_the_watchdog_and_one_that_is_made_feeds_it_again() -> None:
    now = [1000.0]
    release = threading.Event()
    entered = threading.Event()

    def render() -> bytes:
        entered.set()
        release.wait(30)
        return b"x 1.0\n"

    server = MetricsServer(
        ("127.0.0.1", 0), RenderedBytes(render), SnapshotStore(), stale_after_seconds=5, monotonic=lambda: now[0]
    )
    server.start()
    try:
        scrape = threading.Thread(
            target=lambda: requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=30), daemon=True
        )
        scrape.start()
        assert entered.wait(10), "the scrape asks for its body"
        assert server.serving_problem() is None
        now[0] += STALLED_SCRAPE_SECONDS + 1
        assert "/metrics" in (server.serving_problem() or "")
        release.set()
        scrape.join(30)
        wait_for(lambda: server.serving_problem() is None, what="the watchdog fed again")
    finally:
        release.set()
        server.stop()
