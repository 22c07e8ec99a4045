"""XID counts per GPU and code: live events, the kernel-log backfill, unknown buses."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from gpumon.events.kernel_log import read_boot_xids
from gpumon.events.tracker import XidTracker
from gpumon.model.xid import XidEvent

START = 1_700_000_000.0
GPUS = {"00000000:18:00.0": 0, "00000000:28:00.0": 1}


def live(xid: int, gpu: int, at: float) -> XidEvent:
    return XidEvent(xid=xid, timestamp_seconds=at, source="nvml", gpu_index=gpu, uuid=f"GPU-{gpu}")


def from_log(xid: int, bus: str, at: float) -> XidEvent:
    return XidEvent(xid=xid, timestamp_seconds=at, source="kernel_log", pci_bus_id=bus, message="NVRM: Xid ...")


def test_a_burst_of_the_same_xid_is_counted_not_overwritten() -> None:
    tracker = XidTracker(live_since_seconds=START)
    for i in range(5):
        tracker.record(live(13, 0, START + i))
    tracker.record(live(31, 0, START + 10))
    assert tracker.counts(0) == {"13": 5, "31": 1}
    assert tracker.last_timestamps(0) == {"13": START + 4, "31": START + 10}
    assert tracker.counts(1) == {}
    assert tracker.for_gpu(0) == ({"13": 5, "31": 1}, {"13": START + 4, "31": START + 10})


def test_kernel_log_lines_for_two_gpus_are_attributed_by_bus_id(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "4,1,5000000,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
        "4,2,6000000,-;NVRM: Xid (PCI:0000:28:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)\n"
        "4,3,7000000,-;NVRM: Xid (PCI:0000:28:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0)\n"
    )
    boot = START - 3600
    backfill = read_boot_xids(kmsg_path=kmsg, journal_command=None, boot_time=lambda: boot)
    tracker = XidTracker(live_since_seconds=START)
    tracker.set_gpus(GPUS)
    assert tracker.record_all(backfill.events) == 3
    assert tracker.counts(0) == {"79": 1}
    assert tracker.counts(1) == {"13": 2}
    assert tracker.last_timestamps(1) == {"13": pytest.approx(boot + 7.0)}


def test_bus_ids_in_any_form_match_the_gpus() -> None:
    tracker = XidTracker(live_since_seconds=START)
    tracker.set_gpus({"0000:18:00.0": 0})  # nvidia-smi's short form
    tracker.record(from_log(48, "00000000:18:00.0", START - 5))
    assert tracker.counts(0) == {"48": 1}


def test_a_kernel_log_copy_of_a_live_event_is_not_counted_twice() -> None:
    tracker = XidTracker(live_since_seconds=START)
    tracker.set_gpus(GPUS)
    tracker.record(live(79, 0, START + 2.0))
    assert tracker.record(from_log(79, "00000000:18:00.0", START + 2.0)) is False
    assert tracker.record(from_log(79, "00000000:18:00.0", START - 100)) is True  # before start: only in the log
    assert tracker.counts(0) == {"79": 2}


def test_events_of_an_unknown_bus_are_counted_without_a_gpu_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    tracker = XidTracker(live_since_seconds=START)
    tracker.set_gpus(GPUS)
    caplog.set_level(logging.WARNING)
    tracker.record(from_log(79, "00000000:AA:00.0", START - 1))
    assert tracker.counts(None) == {"79": 1}
    assert tracker.counts(0) == {} and tracker.counts(1) == {}
    assert "XID 79 on PCI 00000000:AA:00.0, which is none of the GPUs gpumon watches" in caplog.text


def test_backfill_logs_one_line_per_unknown_bus(caplog: pytest.LogCaptureFixture) -> None:
    tracker = XidTracker(live_since_seconds=START)
    tracker.set_gpus(GPUS)
    caplog.set_level(logging.WARNING)
    tracker.record_all([from_log(13, "00000000:AA:00.0", START - i) for i in range(1, 50)])
    assert tracker.counts(None) == {"13": 49}
    lines = [r.getMessage() for r in caplog.records if r.name == "gpumon.events.tracker"]
    assert lines == [
        "49 XID(s) in the kernel log on PCI 00000000:AA:00.0, which is none of the GPUs gpumon watches; "
        "counted without a GPU"
    ]


def test_unmatched_events_move_to_their_gpu_once_it_is_known() -> None:
    tracker = XidTracker(live_since_seconds=START)
    tracker.record_all([from_log(79, "00000000:28:00.0", START - 10), from_log(13, "00000000:AA:00.0", START - 9)])
    assert tracker.counts(None) == {"79": 1, "13": 1}
    tracker.set_gpus(GPUS)
    assert tracker.counts(1) == {"79": 1}
    assert tracker.counts(None) == {"13": 1}
    assert tracker.last_timestamps(None) == {"13": START - 9}


def test_listeners_get_events_with_the_gpu_filled_in() -> None:
    tracker = XidTracker(live_since_seconds=START)
    tracker.set_gpus(GPUS)
    seen: list[XidEvent] = []
    tracker.subscribe(seen.append)
    tracker.subscribe(lambda e: 1 / 0)  # a broken listener does not stop the others or the tracker
    tracker.record(from_log(74, "0000:28:00", START - 1))
    assert [(e.xid, e.gpu_index, e.pci_bus_id) for e in seen] == [(74, 1, "00000000:28:00.0")]


def test_counts_are_exact_under_concurrent_recording() -> None:
    tracker = XidTracker(live_since_seconds=START)

    def burst(gpu: int) -> None:
        for i in range(2000):
            tracker.record(live(13, gpu, START + i))

    threads = [threading.Thread(target=burst, args=(g % 2,)) for g in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tracker.counts(0) == {"13": 4000}
    assert tracker.counts(1) == {"13": 4000}


def test_gpus_are_learnt_from_published_snapshots() -> None:
    from gpumon.collect.store import SnapshotStore
    from gpumon.model.snapshot import GpuSnapshot, Snapshot

    tracker = XidTracker(live_since_seconds=START)
    tracker.record(from_log(79, "00000000:28:00.0", START - 10))
    store = SnapshotStore()
    store.subscribe(tracker.set_gpus_from_snapshot)
    gpus = tuple(GpuSnapshot(index=i, uuid=f"GPU-{i}", pci_bus_id=bus) for bus, i in GPUS.items())
    store.publish(Snapshot(timestamp_seconds=START, monotonic_seconds=1.0, nvml_up=True, gpus=gpus))
    assert tracker.counts(1) == {"79": 1}
    assert tracker.counts(None) == {}
    store.publish(Snapshot(timestamp_seconds=START + 1, monotonic_seconds=2.0, nvml_up=True, gpus=gpus))
    tracker.record(from_log(48, "00000000:28:00.0", START + 1))
    assert tracker.counts(1) == {"79": 1, "48": 1}, "the same GPUs poll after poll: still known"
    swapped = tuple(GpuSnapshot(index=1 - i, uuid=f"GPU-{i}", pci_bus_id=bus) for bus, i in GPUS.items())
    store.publish(Snapshot(timestamp_seconds=START + 2, monotonic_seconds=3.0, nvml_up=True, gpus=swapped))
    tracker.record(from_log(31, "00000000:28:00.0", START + 2))
    assert tracker.counts(0) == {"31": 1}, "a bus id that now names another GPU is learnt from the next snapshot"
    tracker.set_gpus({})
    store.publish(Snapshot(timestamp_seconds=START + 3, monotonic_seconds=4.0, nvml_up=True, gpus=swapped))
    tracker.record(from_log(31, "00000000:28:00.0", START + 3))
    assert tracker.counts(0) == {"31": 2}, "after set_gpus, the next snapshot's GPUs are learnt again"


def test_a_gpus_counts_handed_out_are_not_changed_by_later_events() -> None:
    """The poller keeps ``for_gpu``'s mappings in its snapshot without copying them: a later event gives new
    mappings and leaves those of earlier snapshots as they were."""
    tracker = XidTracker(live_since_seconds=START)
    assert tracker.for_gpu(0) == ({}, {})
    none0, none1 = tracker.for_gpu(0), tracker.for_gpu(1)
    assert none0[0] is none1[0] and none0[1] is none1[1], "no XIDs: the same objects every poll"
    tracker.record(XidEvent(xid=13, timestamp_seconds=START + 1, source="nvml", gpu_index=0))
    counts, last = tracker.for_gpu(0)
    assert tracker.for_gpu(0) == (counts, last)
    tracker.record(XidEvent(xid=13, timestamp_seconds=START + 2, source="nvml", gpu_index=0))
    tracker.record(XidEvent(xid=31, timestamp_seconds=START + 3, source="nvml", gpu_index=0))
    assert (counts, last) == ({"13": 1}, {"13": START + 1})
    assert tracker.for_gpu(0) == ({"13": 2, "31": 1}, {"13": START + 2, "31": START + 3})
    assert tracker.counts(0) == {"13": 2, "31": 1}
    assert tracker.for_gpu(1) == ({}, {})


def test_xids_read_before_the_first_poll_are_said_to_be_on_no_gpu_only_when_they_are(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Start-up reads the kernel log before the first poll names the GPUs: GPU 1's old XID is not logged
    as on "none of the GPUs gpumon watches" (issue 41, item 10); one on a bus no GPU has is, once known."""
    tracker = XidTracker(live_since_seconds=START)
    caplog.set_level(logging.WARNING)
    tracker.record_all([from_log(79, "00000000:28:00.0", START - 10), from_log(13, "00000000:AA:00.0", START - 9)])
    assert "none of the GPUs" not in caplog.text
    tracker.set_gpus(GPUS)
    tracker.set_gpus({**GPUS, "00000000:38:00.0": 2})  # GPUs known again: said once, not again
    lines = [r.getMessage() for r in caplog.records if "none of the GPUs" in r.getMessage()]
    assert lines == [
        "1 XID(s) in the kernel log on PCI 00000000:AA:00.0, which is none of the GPUs gpumon watches; "
        "counted without a GPU"
    ]
