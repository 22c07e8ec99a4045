"""The daemon's XID sources together: NVML's event thread (a fake pynvml) and the kernel log
(a fake /dev/kmsg file). An XID is counted within seconds whichever source sees it, including
while NVML's events are unsupported or NVML is not up yet, and once when both see it."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pynvml
import pytest
import requests

from gpumon import daemon as daemon_module
from gpumon.backends.nvml import NvmlBackend
from gpumon.config.file import Config
from gpumon.daemon import Daemon, default_alerting
from gpumon.events.kernel_follow import KernelLogFollower
from tests.events.test_kernel_follow import BOOT, kmsg_line
from tests.fake_pynvml import FakeNvml, h200_pair
from tests.helpers import value, wait_for

pytestmark = pytest.mark.faults  # the daemon under faults, as a user meets them: make test-faults


@pytest.fixture
def fake() -> FakeNvml:
    return h200_pair()


@pytest.fixture
def kmsg(tmp_path: Path) -> Path:
    path = tmp_path / "kmsg"
    path.write_text("6,1,1000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.159.04\n")
    return path


@pytest.fixture
def start(
    fake: FakeNvml, kmsg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[], Daemon]]:
    monkeypatch.setattr(
        daemon_module,
        "KernelLogFollower",
        functools.partial(KernelLogFollower, kmsg_path=kmsg, journal_command=None, boot_time=lambda: BOOT),
    )
    made: list[Daemon] = []

    def make() -> Daemon:
        config = Config(listen="127.0.0.1:0", interval_seconds=0.1, state_dir=tmp_path, alerting=default_alerting())
        d = Daemon(config, NvmlBackend(fake))
        d.start()
        made.append(d)
        return d

    yield make
    for d in made:
        if d.poll_job.scheduler.running:  # not stopped by the test itself
            d.stop()


def xids(d: Daemon, gpu: str, xid: str) -> float:
    text = requests.get(f"http://127.0.0.1:{d.server.port}/metrics", timeout=5).text
    return value(text, "gpumon_xid_errors_total", gpu=gpu, xid=xid) or 0.0


def write(kmsg: Path, line: str) -> None:
    with kmsg.open("a") as f:
        f.write(line)


def test_without_nvml_events_an_xid_in_the_kernel_log_is_counted_within_seconds(
    fake: FakeNvml, kmsg: Path, start: Callable[[], Daemon]
) -> None:
    for gpu in fake.gpus:
        gpu.supported_events = 0  # the kernel log is the only XID source
    d = start()
    wait_for(lambda: d.kernel_log is not None and d.kernel_log.source == str(kmsg), 5, what="the follower")
    write(kmsg, kmsg_line(2, xid=79, bus="0000:28:00"))
    wait_for(lambda: xids(d, "1", "79") == 1.0, 5, what="the XID counted from the kernel log")
    assert "GpuXidCritical" in {a["alertname"] for a in d.alerts.active_alerts()}


def test_an_xid_while_nvml_is_not_up_yet_is_counted_once(
    fake: FakeNvml, kmsg: Path, start: Callable[[], Daemon]
) -> None:
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    d = start()
    wait_for(lambda: d.kernel_log is not None and d.kernel_log.source == str(kmsg), 5, what="the follower")
    write(kmsg, kmsg_line(2, xid=48, bus="0000:18:00"))  # in the gap: NVML events are not registered
    wait_for(lambda: d.tracker.counts(None) == {"48": 1}, 5, what="the XID counted, its GPU not known yet")
    fake.init_error = None
    wait_for(lambda: xids(d, "0", "48") == 1.0, 15, what="the XID on GPU 0 once NVML is up")
    time.sleep(1.0)
    assert xids(d, "0", "48") == 1.0


def test_an_xid_both_sources_see_is_counted_once(fake: FakeNvml, kmsg: Path, start: Callable[[], Daemon]) -> None:
    d = start()
    wait_for(lambda: fake.calls["nvmlEventSetWait_v2"] > 0, 5, what="NVML events registered")
    wait_for(lambda: d.kernel_log is not None and d.kernel_log.source == str(kmsg), 5, what="the follower")
    fake.push_event(1, 79)
    write(kmsg, kmsg_line(2, xid=79, bus="0000:28:00"))
    wait_for(lambda: xids(d, "1", "79") >= 1.0, 5, what="the XID counted")
    time.sleep(1.0)  # both sources have reported it by now
    assert xids(d, "1", "79") == 1.0


def test_stop_with_the_follower_running_is_quick(start: Callable[[], Daemon]) -> None:
    d = start()
    wait_for(lambda: d.kernel_log is not None and d.kernel_log.source is not None, 5, what="the follower")
    began = time.monotonic()
    d.stop()
    assert time.monotonic() - began < 2.0
    assert d.kernel_log is not None and not d.kernel_log._thread.is_alive()


def test_an_idle_event_thread_wakes_once_in_five_seconds_and_a_stop_does_not_wait_for_it(
    fake: FakeNvml, start: Callable[[], Daemon]
) -> None:
    d = start()
    wait_for(lambda: fake.calls["nvmlEventSetWait_v2"] > 0, 5, what="NVML events registered")
    waits = fake.calls["nvmlEventSetWait_v2"]
    time.sleep(3.0)  # no XID comes
    assert fake.calls["nvmlEventSetWait_v2"] - waits <= 1
    fake.push_event(0, 48)  # an XID still ends the wait at once
    wait_for(lambda: xids(d, "0", "48") == 1.0, 2, what="the XID counted")
    began = time.monotonic()
    d.stop()
    assert time.monotonic() - began < 1.5


def test_nvml_gone_while_the_event_thread_waits_comes_back_and_xids_are_seen_again(
    fake: FakeNvml, start: Callable[[], Daemon]
) -> None:
    """The driver goes away under a running daemon while the event thread is inside its (long) wait:
    NVML is shut down after that wait, never under it, initialised again, and XIDs counted again."""
    d = start()
    wait_for(lambda: fake.calls["nvmlEventSetWait_v2"] > 0, 5, what="NVML events registered")
    for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage"):
        fake.failures[(name, None)] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    wait_for(lambda: nvml_up(d) == 0.0, 10, what="NVML seen gone")
    fake.failures.clear()
    # the event thread shuts NVML down as its wait ends (5 s at most); the poller's next try (1, 3, 7, 15 s
    # after the loss: its backoff) initialises it: 30 s leave room for a loaded box
    wait_for(lambda: nvml_up(d) == 1.0 and fake.calls["nvmlInit"] >= 2, 30, what="NVML initialised again")
    assert fake.calls["nvmlShutdown"] >= 1
    fake.push_event(1, 48)
    wait_for(lambda: xids(d, "1", "48") == 1.0, 10, what="an XID counted on the new event set")


def nvml_up(d: Daemon) -> float | None:
    text = requests.get(f"http://127.0.0.1:{d.server.port}/metrics", timeout=5).text
    return value(text, "gpumon_nvml_up")
