"""Following the kernel log: the records since boot once, then every new XID within a second,
from a fake /dev/kmsg (a file or a FIFO) or a fake journalctl; and each XID counted once when
NVML's event thread sees it too."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpumon.events.kernel_follow import KernelLogFollower
from gpumon.events.tracker import XidTracker
from gpumon.model.xid import XidEvent
from tests.helpers import wait_for

BOOT = 1_700_000_000.0
START = BOOT + 3600
GPUS = {"00000000:18:00.0": 0, "00000000:28:00.0": 1}


def kmsg_line(seq: int, xid: int = 79, bus: str = "0000:28:00", usec: int = 5_000_000) -> str:
    return f"4,{seq},{usec},-;NVRM: Xid (PCI:{bus}): {xid}, pid=1234, name=python, GPU has fallen off the bus.\n"


class Seen:
    def __init__(self) -> None:
        self.backfill: list[list[XidEvent]] = []
        self.live: list[XidEvent] = []
        self.lock = threading.Lock()

    def on_backfill(self, events: list[XidEvent]) -> None:
        self.backfill.append(events)

    def on_event(self, event: XidEvent) -> None:
        with self.lock:
            self.live.append(event)


@pytest.fixture
def seen() -> Seen:
    return Seen()


@pytest.fixture
def followers() -> Iterator[list[KernelLogFollower]]:
    made: list[KernelLogFollower] = []
    yield made
    for f in made:
        f.stop(2)


def follow(followers: list[KernelLogFollower], seen: Seen, **kw: object) -> KernelLogFollower:
    kw.setdefault("journal_command", None)
    f = KernelLogFollower(
        seen.on_backfill, seen.on_event, boot_time=lambda: BOOT, clock=lambda: START + 10, poll_seconds=0.05, **kw
    )  # type: ignore[arg-type]
    f.start()
    followers.append(f)
    return f


def test_records_since_boot_come_once_then_every_new_xid_as_it_is_written(
    tmp_path: Path, seen: Seen, followers: list[KernelLogFollower], caplog: pytest.LogCaptureFixture
) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,1,1000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n" + kmsg_line(2) + " SUBSYSTEM=pci\n"
    )
    caplog.set_level(logging.INFO)
    follower = follow(followers, seen, kmsg_path=kmsg)
    wait_for(lambda: seen.backfill, 5, what="the backfill")
    [[old]] = seen.backfill
    assert (old.xid, old.pci_bus_id, old.timestamp_seconds) == (79, "00000000:28:00.0", BOOT + 5.0)
    assert f"kernel log: 1 XID(s) since boot from {kmsg}; following it for new XIDs" in caplog.text
    with kmsg.open("a") as f:
        f.write(kmsg_line(3, xid=13, bus="0000:18:00", usec=7_000_000))
    [new] = wait_for(lambda: seen.live, 5, what="the XID written after start")
    assert (new.xid, new.pci_bus_id, new.source) == (13, "00000000:18:00.0", "kernel_log")
    assert new.timestamp_seconds == START + 10, "a live record is stamped when read"
    assert follower.source == str(kmsg) and follower.events_total == 2


def test_a_fifo_is_followed_and_a_line_split_across_writes_is_one_record(
    tmp_path: Path, seen: Seen, followers: list[KernelLogFollower]
) -> None:
    fifo = tmp_path / "kmsg-fifo"
    os.mkfifo(fifo)
    follow(followers, seen, kmsg_path=fifo)
    wait_for(lambda: seen.backfill == [[]], 5, what="an empty backfill")
    fd = os.open(fifo, os.O_WRONLY)
    try:
        line = kmsg_line(1, xid=48).encode()
        os.write(fd, line[:20])
        time.sleep(0.2)
        os.write(fd, line[20:] + kmsg_line(2, xid=94).encode())
        wait_for(lambda: len(seen.live) == 2, 5, what="two XIDs through the FIFO")
    finally:
        os.close(fd)
    assert [e.xid for e in seen.live] == [48, 94]


def test_stop_ends_the_follower_quickly(tmp_path: Path, seen: Seen) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    follower = KernelLogFollower(seen.on_backfill, seen.on_event, kmsg_path=kmsg, journal_command=None)
    follower.start()
    wait_for(lambda: seen.backfill, 5, what="the follower running")
    began = time.monotonic()
    follower.stop(2)
    assert time.monotonic() - began < 1.0, "well inside the daemon's 2 s SIGTERM promise"
    assert not follower._thread.is_alive()


def _journal(entries_now: list[dict[str, str]], entries_later: list[dict[str, str]]) -> list[str]:
    script = (
        "import sys, time\n"
        "now, later = sys.argv[1], sys.argv[2]\n"
        "for line in now.splitlines(): print(line, flush=True)\n"
        "time.sleep(0.5)\n"
        "for line in later.splitlines(): print(line, flush=True)\n"
        "time.sleep(60)\n"
    )
    lines = ["\n".join(json.dumps(e) for e in entries) for entries in (entries_now, entries_later)]
    return [sys.executable, "-c", script, *lines]


def test_journalctl_is_followed_when_kmsg_is_not_readable(
    tmp_path: Path, seen: Seen, followers: list[KernelLogFollower]
) -> None:
    old = {"MESSAGE": "NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=x, DBE", "__REALTIME_TIMESTAMP": "1700000005000000"}
    new = {"MESSAGE": "NVRM: Xid (PCI:0000:28:00): 79, off the bus", "__REALTIME_TIMESTAMP": "1700003700000000"}
    follower = follow(followers, seen, kmsg_path=tmp_path / "absent", journal_command=_journal([old], [new]))
    wait_for(lambda: seen.live, 10, what="the XID journalctl printed later")
    assert [[e.xid for e in b] for b in seen.backfill] == [[48]]
    assert [(e.xid, e.timestamp_seconds) for e in seen.live] == [(79, 1700003700.0)]
    assert follower.source == "journalctl"
    began = time.monotonic()
    follower.stop(2)
    assert time.monotonic() - began < 1.0, "journalctl is terminated at stop"


def test_one_clear_line_when_no_kernel_log_can_be_followed(
    tmp_path: Path, seen: Seen, followers: list[KernelLogFollower], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    follower = follow(followers, seen, kmsg_path=tmp_path / "absent", journal_command=["/nonexistent/journalctl"])
    wait_for(lambda: not follower._thread.is_alive(), 5, what="the follower giving up")
    lines = [r for r in caplog.records if r.name == "gpumon.events.kernel_follow"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert (
        lines[0]
        .getMessage()
        .startswith(
            f"kernel log not readable ({tmp_path / 'absent'}: does not exist; /nonexistent/journalctl: not installed)"
        )
    )


# ---- one XID, two sources: counted once ------------------------------------------------------
def nvml(xid: int, gpu: int, at: float) -> XidEvent:
    return XidEvent(xid=xid, timestamp_seconds=at, source="nvml", gpu_index=gpu, uuid=f"GPU-{gpu}")


def from_log(xid: int, bus: str, at: float) -> XidEvent:
    return XidEvent(xid=xid, timestamp_seconds=at, source="kernel_log", pci_bus_id=bus, message="NVRM: Xid ...")


def test_an_xid_written_after_start_is_counted_from_the_kernel_log_alone() -> None:
    tracker = XidTracker(live_since_seconds=START)
    tracker.set_gpus(GPUS)
    assert tracker.record(from_log(79, "00000000:28:00.0", START + 5)) is True
    assert tracker.counts(1) == {"79": 1}


@pytest.mark.parametrize("kernel_first", [True, False], ids=["kernel-log-first", "nvml-first"])
def test_an_xid_both_sources_see_is_counted_once_whichever_comes_first(kernel_first: bool) -> None:
    tracker = XidTracker(live_since_seconds=START)
    tracker.set_gpus(GPUS)
    pairs = [
        (from_log(13, "00000000:28:00.0", START + i * 0.01), nvml(13, 1, START + i * 0.01 + 0.3)) for i in range(3)
    ]
    for a, b in pairs:
        first, second = (a, b) if kernel_first else (b, a)
        assert tracker.record(first) is True
        assert tracker.record(second) is False
    assert tracker.counts(1) == {"13": 3}, "a burst seen by both sources counts each XID once"


def test_an_xid_only_the_kernel_log_saw_is_not_taken_for_a_later_nvml_one() -> None:
    tracker = XidTracker(live_since_seconds=START)
    tracker.set_gpus(GPUS)
    tracker.record(from_log(79, "00000000:28:00.0", START + 1))  # NVML was not up yet
    tracker.record(nvml(79, 1, START + 4))  # a second XID: NVML first ...
    tracker.record(from_log(79, "00000000:28:00.0", START + 4))  # ... then its kernel-log copy
    assert tracker.counts(1) == {"79": 2}


def test_after_a_read_error_the_log_is_reopened_and_no_record_is_counted_twice(
    tmp_path: Path, seen: Seen, followers: list[KernelLogFollower], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpumon.events import kernel_follow

    kmsg = tmp_path / "kmsg"
    kmsg.write_text(kmsg_line(1, xid=13))
    real_read = os.read
    fail = threading.Event()

    def flaky_read(fd: int, n: int) -> bytes:
        if fail.is_set():
            fail.clear()
            raise OSError(5, "Input/output error")
        return real_read(fd, n)

    monkeypatch.setattr(kernel_follow.os, "read", flaky_read)
    follow(followers, seen, kmsg_path=kmsg)
    wait_for(lambda: seen.backfill, 5, what="the backfill")
    with kmsg.open("a") as f:
        f.write(kmsg_line(2, xid=31))
    wait_for(lambda: len(seen.live) == 1, 5, what="the live XID")
    fail.set()
    wait_for(lambda: not fail.is_set(), 5, what="the read error")
    with kmsg.open("a") as f:
        f.write(kmsg_line(3, xid=94))
    wait_for(lambda: len(seen.live) == 2, 5, what="the XID after the reopen")
    time.sleep(0.3)
    assert [[e.xid for e in b] for b in seen.backfill] == [[13]]
    assert [e.xid for e in seen.live] == [31, 94], "records 1 and 2, read again after the reopen, are skipped"
