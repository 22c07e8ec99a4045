"""A damaged alert spool never keeps the daemon from starting: whatever lies at
STATE_DIR/alerts/spool.json (bytes that are not UTF-8, JSON nested past Python's limit, a link to
/dev/zero, valid JSON of the wrong shape), the daemon starts, keeps the file aside for the operator and
begins with no saved alerts; temporary files a writer killed mid-write left behind are removed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import DaemonProcess

pytestmark = pytest.mark.faults

DAMAGED = {
    "not UTF-8": b'{"version": 1, "engine": "caf\xe9"}',
    "nested too deeply": b"[" * 200_000 + b"]" * 200_000,
    "wrong shape": b'["version", 1]',
}


@pytest.mark.parametrize("content", DAMAGED.values(), ids=DAMAGED.keys())
def test_a_damaged_spool_is_moved_aside_and_the_daemon_starts(tmp_path: Path, content: bytes) -> None:
    alerts = tmp_path / "state" / "alerts"
    alerts.mkdir(parents=True)
    (alerts / "spool.json").write_bytes(content)
    (alerts / ".spool-abc123.tmp").write_text('{"half": ')  # a writer killed before its rename
    daemon = DaemonProcess(["--backend", "fake"], tmp_path)
    try:
        daemon.wait_ready(timeout=30)
        assert daemon.get("/api/alerts").status_code == 200
    finally:
        daemon.stop()
    assert (alerts / "spool.json.corrupt").read_bytes() == content
    assert not (alerts / ".spool-abc123.tmp").exists()


def test_a_spool_that_is_a_link_to_dev_zero_is_not_read(tmp_path: Path) -> None:
    alerts = tmp_path / "state" / "alerts"
    alerts.mkdir(parents=True)
    os.symlink("/dev/zero", alerts / "spool.json")
    daemon = DaemonProcess(["--backend", "fake"], tmp_path)
    try:
        daemon.wait_ready(timeout=30)
    finally:
        daemon.stop()
    assert (alerts / "spool.json.corrupt").is_symlink()
