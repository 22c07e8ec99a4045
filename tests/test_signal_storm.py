"""Signals are handled outside the handler (issue 42 item 6): SIGHUPs as fast as a loop sends them
neither kill nor deafen the daemon (they were a RecursionError within 2 s: the handler took a lock),
and SIGTERM after the storm still stops it with exit 0."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import DaemonProcess, wait_for


def flood(pid: int, stop: threading.Event, sent: list[int]) -> None:
    n = 0
    while not stop.is_set():
        try:
            os.kill(pid, signal.SIGHUP)
        except ProcessLookupError:
            break
        n += 1
    sent.append(n)


@pytest.mark.parametrize("storms", [1, 3])
def test_a_sighup_storm_neither_kills_nor_deafens_the_daemon_and_sigterm_stops_it(
    tmp_path: Path, storms: int
) -> None:
    daemon = DaemonProcess(["--backend", "fake"], tmp_path)
    try:
        daemon.wait_ready(timeout=30)
        for _ in range(storms):
            stop, sent = threading.Event(), []  # type: ignore[var-annotated]
            sender = threading.Thread(target=flood, args=(daemon.proc.pid, stop, sent))
            sender.start()
            try:
                answered = 0
                deadline = time.monotonic() + 3
                while time.monotonic() < deadline:
                    assert daemon.proc.poll() is None, f"gpumon died in a SIGHUP storm:\n{daemon.log()[-2000:]}"
                    answered += daemon.get("/metrics", timeout=10).status_code == 200
            finally:
                stop.set()
                sender.join()
            assert sent[0] > 1000, "a storm"
            assert answered >= 1, "scrapes answered during the storm"
        wait_for(lambda: daemon.get("/metrics").status_code == 200, 10, what="a scrape after the storm")
        daemon.signal(signal.SIGTERM)
        try:
            assert daemon.proc.wait(10) == 0
        except subprocess.TimeoutExpired:
            raise AssertionError(f"SIGTERM ignored after a SIGHUP storm:\n{daemon.log()[-2000:]}") from None
    finally:
        daemon.stop()
