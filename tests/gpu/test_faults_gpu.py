"""Fault handling on a real GPU host: healthy GPUs are never taken for lost, and the kernel log is
followed alongside NVML's event thread.

Run with ``python3 -m pytest -m gpu tests/gpu/test_faults_gpu.py -s -v``."""

from __future__ import annotations

import os
import time

import pytest

from gpumon.backends.nvml import LIVENESS_READERS, NvmlBackend
from gpumon.events.kernel_follow import KernelLogFollower
from gpumon.events.tracker import XidTracker
from gpumon.events.xid_thread import XidEventThread
from gpumon.model.snapshot import Tier
from gpumon.model.xid import XidEvent

pytestmark = pytest.mark.gpu


def test_healthy_gpus_answer_their_liveness_reads_and_are_never_lost(backend: NvmlBackend) -> None:
    for index in range(backend.device_count()):
        backend.read(index, Tier.STATIC)
        backend.read(index, Tier.SLOW)
        for _ in range(30):
            got = backend.read(index, Tier.FAST)  # a GpuLostError here fails the test
            assert "memory_used_bytes" in got and "utilization_ratio" in got
    errors = backend.read_errors()
    print(f"\nreader errors after 30 fast reads of each GPU: {errors}")
    assert not [key for key in errors if key[2] in LIVENESS_READERS]


def test_the_kernel_log_is_followed_beside_nvml_events_and_stops_quickly(backend: NvmlBackend) -> None:
    tracker = XidTracker(live_since_seconds=time.time())
    seen: list[XidEvent] = []
    tracker.subscribe(seen.append)
    events = XidEventThread(backend, tracker.record, ready=lambda: True)
    follower = KernelLogFollower(tracker.record_all, tracker.record)
    events.start()
    follower.start()
    try:
        time.sleep(3.0)
    finally:
        began = time.monotonic()
        follower.stop(2)
        events.stop(0.1)  # nothing waits for an NVML event wait in progress (up to 5 s): the thread ends after it
    print(f"\nkernel log followed from {follower.source}; XIDs seen: {[(e.xid, e.gpu_index) for e in seen]}")
    assert time.monotonic() - began < 2.0
    if os.geteuid() == 0:
        assert follower.source == "/dev/kmsg", "root reads /dev/kmsg"
