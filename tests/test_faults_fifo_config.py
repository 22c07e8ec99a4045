"""A FIFO, a device or a huge file where a config should be never wedges the daemon (issue 36, item 7).

Only regular files are read, bounded in size, and the web config is re-read off the HTTP event loop:
SIGHUP with the config replaced by a FIFO is rejected at once and SIGTERM still stops the daemon;
a web config replaced by a FIFO or a 4.2 MB file leaves every scrape answered."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import DaemonProcess, run_cli, value, wait_for

pytestmark = pytest.mark.faults


def _replace_with_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _scrapes_answered(daemon: DaemonProcess, seconds: float) -> None:
    """Every scrape for ``seconds`` is answered within 2 s (a scrape takes milliseconds)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert daemon.get("/metrics", timeout=2).status_code == 200
        time.sleep(0.1)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("replacement", ["fifo", "/dev/zero"])
def test_sighup_with_the_config_replaced_by_a_fifo_or_device_is_rejected_and_sigterm_still_stops(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path, replacement: str
) -> None:
    config = tmp_path / "gpumon.yaml"
    config.write_text("interval_seconds: 0.5\n")
    daemon = start_daemon("--backend", "fake", "--fake-gpus", "1", "--config", str(config))
    if replacement == "fifo":
        _replace_with_fifo(config)
    else:
        config.unlink()
        config.symlink_to("/dev/zero")
    daemon.signal(signal.SIGHUP)
    wait_for(
        lambda: value(daemon.metrics(), "gpumon_config_last_reload_successful") == 0.0,
        timeout=10,
        what="the reload rejected",
    )
    assert sum("reload rejected" in line for line in daemon.log().splitlines()) == 1
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(10) == 0
    assert time.monotonic() - started < 5, "SIGTERM answered"
    assert "Traceback" not in daemon.log()


def _web_daemon(start_daemon: Callable[..., DaemonProcess], tmp_path: Path) -> tuple[DaemonProcess, Path]:
    web = tmp_path / "web-config.yml"
    web.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    daemon = start_daemon("--backend", "fake", "--fake-gpus", "1", "--web-config-file", str(web))
    assert daemon.get("/metrics").headers["X-Frame-Options"] == "deny"
    return daemon, web


@pytest.mark.timeout(60)
def test_a_web_config_replaced_by_a_fifo_leaves_every_scrape_answered(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    daemon, web = _web_daemon(start_daemon, tmp_path)
    _replace_with_fifo(web)
    _scrapes_answered(daemon, 4.0)  # the watcher looks at the file every second
    wait_for(lambda: "web config" in daemon.log() and " ERROR " in daemon.log(), what="the FIFO refused in the log")
    assert daemon.get("/metrics").headers["X-Frame-Options"] == "deny", "the previous web config stays in force"
    daemon.signal(signal.SIGHUP)  # a forced re-read on SIGHUP does not wait on it either
    _scrapes_answered(daemon, 2.0)
    started = time.monotonic()
    daemon.signal(signal.SIGTERM)
    assert daemon.proc.wait(10) == 0
    assert time.monotonic() - started < 5


@pytest.mark.timeout(60)
def test_a_huge_web_config_leaves_every_scrape_answered(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    daemon, web = _web_daemon(start_daemon, tmp_path)
    lines = [f"    X-Padding-{i}: {'v' * 40}\n" for i in range(70_000)]  # about 4.2 MB
    web.write_text("http_server_config:\n  headers:\n" + "".join(lines))
    assert web.stat().st_size > 4_000_000
    _scrapes_answered(daemon, 4.0)
    wait_for(lambda: " ERROR " in daemon.log(), what="the huge web config refused in the log")
    assert daemon.get("/metrics").headers["X-Frame-Options"] == "deny", "the previous web config stays in force"


def test_a_fifo_as_config_or_web_config_is_one_line_and_exit_2(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.yml"
    os.mkfifo(fifo)
    config = tmp_path / "gpumon.yaml"
    config.write_text(f"web_config_file: {fifo}\n")
    for args in (("check-config", str(fifo)), ("check-config", str(config)), ("once", "--config", str(fifo))):
        done = run_cli(*args, timeout=30)
        assert done.returncode == 2, (args, done.stderr)
        assert "Traceback" not in done.stderr
        problems = [line for line in done.stderr.splitlines() if line.startswith("  - ")]
        assert len(problems) == 1 and str(fifo) in problems[0], done.stderr
