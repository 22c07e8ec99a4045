"""Damaged health state files (``xid.json``, ``inventory.json``): the daemon starts all the same, with what
it can trust; the damaged file is moved aside (kept for the operator) and said in a log line, a metric and
a WARNING finding; /api/health answers and the health series stay on /metrics. A writer killed mid-write
leaves no temporary file behind once gpumon starts again."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from gpumon.util.state.files import health_dir
from tests.helpers import DaemonProcess, value, wait_for

pytestmark = pytest.mark.faults

DAMAGE: dict[str, bytes | None] = {
    "not UTF-8": b'{"version": 1, "faults": ["\xff\xfe"]}',
    "nested too deeply": b"[" * 100_000 + b"]" * 100_000,
    "wrong types": b'{"version": 1, "energy_joules": [1, 2]}',
    "a fault without its keys": b'{"version": 1, "faults": [{}]}',
    "a link to /dev/zero": None,
}
INVENTORY_DAMAGE: dict[str, bytes] = {
    "not UTF-8": b"\xff" * 10,
    "nested too deeply": b"{" * 50_000,
    "wrong types": b'{"version": 1, "gpus": [{"index": 0, "uuid": "GPU-x", "pcie_generation_max": "five"}]}',
}


def place(path: Path, content: bytes | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if content is None:
        path.symlink_to("/dev/zero")
    else:
        path.write_bytes(content)


def check(daemon: DaemonProcess, name: str) -> None:
    report = daemon.get("/api/health")
    assert report.status_code == 200
    [finding] = [f for f in report.json()["findings"] if f["kind"] == "state_damaged"]
    assert finding["severity"] == "WARNING" and name in finding["summary"]
    text = daemon.metrics()
    assert value(text, "gpumon_health_findings", kind="state_damaged", severity="WARNING") == 1.0
    assert "gpumon_node_health_status{" in text
    assert f"{name} is damaged" in daemon.log()


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_xid_state_is_moved_aside_and_the_daemon_starts(
    damage: str, start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    folder = health_dir(tmp_path / "state", "fake")
    place(folder / "xid.json", DAMAGE[damage])
    daemon = start_daemon("--backend", "fake")
    check(daemon, "xid.json")
    [kept] = folder.glob("xid.json.damaged-*")
    if DAMAGE[damage] is None:
        assert os.readlink(kept) == "/dev/zero"
    else:
        assert kept.read_bytes() == DAMAGE[damage]


@pytest.mark.parametrize("damage", list(INVENTORY_DAMAGE))
def test_a_damaged_inventory_is_moved_aside_and_recorded_again(
    damage: str, start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    folder = health_dir(tmp_path / "state", "fake")
    place(folder / "inventory.json", INVENTORY_DAMAGE[damage])
    daemon = start_daemon("--backend", "fake")
    check(daemon, "inventory.json")
    [kept] = folder.glob("inventory.json.damaged-*")
    assert kept.read_bytes() == INVENTORY_DAMAGE[damage]
    wait_for(lambda: (folder / "inventory.json").exists(), 10, what="a new baseline from the GPUs seen")


def test_temporary_files_of_a_killed_writer_are_removed_at_start(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    folder = health_dir(tmp_path / "state", "fake")
    left = [folder / ".xid.json.k3jd9x", folder / ".inventory.json.a8s7d6"]
    place(left[0], b'{"version": 1')
    place(left[1], b"")
    start_daemon("--backend", "fake")
    assert not [p for p in left if p.exists()]


def test_damaged_clears_are_said_and_the_verdict_still_answers(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """A deeply nested clears.json and a FIFO among the clears: /api/health answers (no 500, no hang), the
    health series stay on /metrics, and both show as clears that cannot be read."""
    folder = health_dir(tmp_path / "state", "fake")
    place(folder / "clears.json", b"[" * 100_000 + b"]" * 100_000)
    (folder / "clears.d").mkdir()
    os.mkfifo(folder / "clears.d" / "1-1-root.json")
    daemon = start_daemon("--backend", "fake")
    report = wait_for(lambda: (r := daemon.get("/api/health")).status_code == 200 and r.json(), 10, what="a verdict")
    assert report["status"] == "WARNING"
    assert [f["kind"] for f in report["findings"]] == ["clears_unreadable"]
    text = daemon.metrics()
    assert value(text, "gpumon_health_findings", kind="clears_unreadable", severity="WARNING") == 1.0
    [finding] = report["findings"]
    assert len(finding["evidence"]["unreadable"]) == 2
    assert "gpumon_node_health_status{" in text
