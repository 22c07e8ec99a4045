"""An XID in the kernel log reaches the health verdict whatever comes first at start-up (the kernel-log
backfill or the first poll that maps bus ids), and one XID counts once however often the daemon restarts
over the same kernel log, with its clock drifting between reads, whichever source saw it first.

The daemon runs in this process on a fake pynvml and a fake /dev/kmsg file; what is checked is what a
user sees: ``gpumon_xid_errors_total`` on /metrics and the verdict on /api/health."""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpumon import daemon as daemon_module
from gpumon.backends.nvml import NvmlBackend
from gpumon.config.file import Config
from gpumon.daemon import Daemon, default_alerting
from gpumon.events.kernel_follow import KernelLogFollower
from gpumon.health.config import HealthConfig
from tests.events.test_kernel_follow import BOOT, kmsg_line
from tests.fake_pynvml import FakeNvml, h200_pair
from tests.helpers import value, wait_for

pytestmark = pytest.mark.faults


def metric_xids(d: Daemon, gpu: str, xid: str) -> float:
    text = requests.get(f"http://127.0.0.1:{d.server.port}/metrics", timeout=5).text
    return value(text, "gpumon_xid_errors_total", gpu=gpu, xid=xid) or 0.0


def kernel_log_xids(d: Daemon) -> float | None:
    """gpumon_kernel_log_xids_total as served: the XIDs the daemon has read from the kernel log."""
    text = requests.get(f"http://127.0.0.1:{d.server.port}/metrics", timeout=5).text
    return value(text, "gpumon_kernel_log_xids_total")


def health(d: Daemon) -> dict[str, Any]:
    data: dict[str, Any] = requests.get(f"http://127.0.0.1:{d.server.port}/api/health", timeout=5).json()
    return data


def xid_fault(d: Daemon, gpu: int, xid: int) -> dict[str, Any] | None:
    for f in health(d)["findings"]:
        if f["kind"] == "xid" and f["gpu"] == gpu and f["evidence"].get("xid") == xid:
            return dict(f)
    return None


class Gate:
    """Holds a function until opened (the first NVML init, or the kernel log's start)."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.waiting = threading.Event()

    def hold(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def held(*args: Any, **kwargs: Any) -> Any:
            self.waiting.set()
            assert self.opened.wait(30), "gate never opened"
            return fn(*args, **kwargs)

        return held


@pytest.fixture
def kmsg(tmp_path: Path) -> Path:
    path = tmp_path / "kmsg"
    path.write_text("6,1,1000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  580.159.04\n")
    return path


@pytest.fixture
def boot_id(tmp_path: Path) -> Path:
    path = tmp_path / "boot_id"
    path.write_text("7d4c1e0a-0000-4000-8000-000000000001\n")
    return path


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    made: list[Daemon] = []
    yield made
    for d in made:
        if d.poll_job.scheduler.running:
            d.stop()


def make_daemon(
    made: list[Daemon],
    fake: FakeNvml,
    kmsg: Path,
    state: Path,
    boot_id: Path,
    monkeypatch: pytest.MonkeyPatch,
    boot_time: float = BOOT,
    follower_gate: Gate | None = None,
) -> Daemon:
    follower = functools.partial(KernelLogFollower, kmsg_path=kmsg, journal_command=None, boot_time=lambda: boot_time)
    if follower_gate is not None:
        real = follower

        def gated(*args: Any, **kwargs: Any) -> KernelLogFollower:
            made_follower = real(*args, **kwargs)
            start = made_follower.start
            made_follower.start = lambda: threading.Thread(target=follower_gate.hold(start), daemon=True).start()  # type: ignore[method-assign]
            return made_follower

        monkeypatch.setattr(daemon_module, "KernelLogFollower", gated)
    else:
        monkeypatch.setattr(daemon_module, "KernelLogFollower", follower)
    config = Config(
        listen="127.0.0.1:0",
        interval_seconds=0.1,
        state_dir=state,
        alerting=default_alerting(),
        health=HealthConfig(boot_id_path=boot_id),
    )
    d = Daemon(config, NvmlBackend(fake))
    d.start()
    made.append(d)
    return d


def test_an_xid_in_the_log_before_the_first_poll_reaches_the_verdict(
    kmsg: Path, boot_id: Path, tmp_path: Path, daemons: list[Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backfill is counted while no bus id is mapped yet (NVML's first init held back)."""
    kmsg.write_text(kmsg.read_text() + kmsg_line(2, xid=79, bus="0000:28:00"))
    fake = h200_pair()
    gate = Gate()
    fake.nvmlInit = gate.hold(fake.nvmlInit)  # type: ignore[method-assign]
    d = make_daemon(daemons, fake, kmsg, tmp_path / "state", boot_id, monkeypatch)
    wait_for(lambda: d.tracker.counts(None) == {"79": 1}, 10, what="the backfill counted before any GPU is known")
    gate.opened.set()
    wait_for(lambda: metric_xids(d, "1", "79") == 1.0, 10, what="the XID on GPU 1 in /metrics")
    fault = wait_for(lambda: xid_fault(d, 1, 79), 10, what="the XID in /api/health")
    assert fault["severity"] == "CRITICAL" and fault["action"] == "reboot_node"
    assert health(d)["status"] == "CRITICAL"


def test_an_xid_in_the_log_read_after_the_first_poll_reaches_the_verdict(
    kmsg: Path, boot_id: Path, tmp_path: Path, daemons: list[Daemon], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other order: the first poll maps the bus ids, then the kernel log is read."""
    kmsg.write_text(kmsg.read_text() + kmsg_line(2, xid=79, bus="0000:28:00"))
    gate = Gate()
    d = make_daemon(daemons, h200_pair(), kmsg, tmp_path / "state", boot_id, monkeypatch, follower_gate=gate)
    wait_for(lambda: d.store.latest() is not None and d.store.latest().nvml_up, 10, what="the first poll")  # type: ignore[union-attr]
    assert gate.waiting.wait(10)
    gate.opened.set()
    wait_for(lambda: metric_xids(d, "1", "79") == 1.0, 10, what="the XID on GPU 1 in /metrics")
    fault = wait_for(lambda: xid_fault(d, 1, 79), 10, what="the XID in /api/health")
    assert fault["severity"] == "CRITICAL" and fault["action"] == "reboot_node"


def counted_once(d: Daemon) -> tuple[int, str]:
    """After the backfill: (the fault's count, its action), once /metrics counts the XID once."""
    wait_for(lambda: kernel_log_xids(d) == 1.0, 10, what="the backfill")
    wait_for(lambda: metric_xids(d, "1", "79") == 1.0, 10, what="the XID counted")
    fault = wait_for(lambda: xid_fault(d, 1, 79), 10, what="the fault")
    return int(fault["evidence"]["count"]), str(fault["action"])


@pytest.mark.parametrize("nvml_first", [False, True], ids=["kernel-log-only", "nvml-event-first"])
def test_ten_restarts_over_the_same_kernel_log_count_one_xid_once(
    nvml_first: bool,
    kmsg: Path,
    boot_id: Path,
    tmp_path: Path,
    daemons: list[Daemon],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The XID is read live first (stamped with its read time), then from the backfill at every restart
    (stamped boot time + kernel time, the boot time drifting by 0.5 s between starts). XID 79 escalates to
    "inspect hardware" at its second count within a week: it must stay at one, "reboot node"."""
    state = tmp_path / "state"
    fake = h200_pair()
    if not nvml_first:
        for gpu in fake.gpus:
            gpu.supported_events = 0  # the kernel log is the only source
    d = make_daemon(daemons, fake, kmsg, state, boot_id, monkeypatch)
    wait_for(lambda: d.kernel_log is not None and d.kernel_log.source == str(kmsg), 10, what="the follower")
    if nvml_first:
        wait_for(lambda: fake.calls["nvmlEventSetWait_v2"] > 0, 10, what="NVML events registered")
        fake.push_event(1, 79)
        wait_for(lambda: metric_xids(d, "1", "79") == 1.0, 10, what="the NVML event counted")
    kmsg.write_text(kmsg.read_text() + kmsg_line(2, xid=79, bus="0000:28:00", usec=7_000_000))
    wait_for(lambda: kernel_log_xids(d) == 1.0, 10, what="the record read live")
    fault = wait_for(lambda: xid_fault(d, 1, 79), 10, what="the fault")
    assert fault["evidence"]["count"] == 1
    d.stop()
    for restart in range(10):
        drift = 0.5 if restart % 2 == 0 else -0.5
        fake = h200_pair()
        d = make_daemon(daemons, fake, kmsg, state, boot_id, monkeypatch, boot_time=BOOT + drift)
        assert counted_once(d) == (1, "reboot_node"), f"restart {restart + 1}"
        d.stop()
    [kept] = json.loads((state / "health" / "xid.json").read_text())["faults"]
    assert (kept["xid"], kept["count"], kept["action"]) == (79, 1, "reboot_node")


def test_the_first_start_after_an_upgrade_does_not_count_again_what_an_older_gpumon_recorded() -> None:
    """xid.json of a gpumon that named XIDs by their stamp: the kernel record read again at start (stamped
    0.4 s apart) is that XID, not a second one (XID 79 twice in a week escalates to inspect hardware);
    a new XID later still counts."""
    from gpumon.health.xid_lifecycle import XidLifecycle
    from gpumon.model.xid import XidEvent
    from gpumon.model.xid_catalog import XidCatalog

    t = BOOT + 5.0
    fault = {"gpu": 1, "xid": 79, "meaning": "fallen off the bus", "first_seconds": t, "last_seconds": t}
    fault.update(count=1, action="reboot_node", lifecycle="needs_reboot", source="kernel_log")
    older = {
        "version": 1,
        "faults": [fault],
        "recent": [{"gpu": 1, "uuid": None, "xid": 79, "ts": t, "deferred": False}],
        "seen": [f"1:79:{t:.3f}"],
    }
    life = XidLifecycle(XidCatalog.load())
    life.load(older)

    def record(ts: float, usec: int) -> None:
        event = XidEvent(79, ts, "kernel_log", gpu_index=1, pci_bus_id="00000000:28:00.0", kernel_usec=usec)
        life.record(event, "boot-1")

    record(t + 0.4, 5_000_000)
    [fault] = life.faults
    assert (fault["count"], fault["action"]) == (1, "reboot_node")
    record(t + 3600, 3_605_000_000)
    [fault] = life.faults
    assert (fault["count"], fault["action"]) == (2, "inspect_hardware")
