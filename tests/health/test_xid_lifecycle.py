"""XIDs with a lifecycle: a fatal XID stays until there is evidence of repair or an operator clears it."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumon.health.clears import Clear, add_clear
from gpumon.health.config import HealthConfig
from gpumon.health.service import HealthService
from gpumon.health.xid_lifecycle import XidLifecycle, XidPolicy
from gpumon.model.findings import CRITICAL, WARNING
from gpumon.model.snapshot import GpuSnapshot, HostSnapshot, Snapshot
from gpumon.model.xid import XidEvent
from gpumon.model.xid_catalog import Escalation, XidCatalog

DAY = 86400.0
T0 = 1_800_000_000.0


def xid(code: int, ts: float, gpu: int = 0) -> XidEvent:
    return XidEvent(xid=code, timestamp_seconds=ts, source="nvml", gpu_index=gpu, uuid=f"GPU-{gpu}")


def snap(*, up: bool = True, energy: float | None = 1000.0, driver: str = "580.1") -> Snapshot:
    gpu = GpuSnapshot(index=0, uuid="GPU-0", up=up, energy_joules_total=energy if up else None)
    return Snapshot(
        timestamp_seconds=T0, monotonic_seconds=0.0, nvml_up=True, host=HostSnapshot(driver_version=driver), gpus=(gpu,)
    )


@pytest.fixture()
def life() -> XidLifecycle:
    lc = XidLifecycle(XidCatalog.load())
    lc.observe(snap(), boot_id="boot-1")
    return lc


def states(lc: XidLifecycle, now: float = T0 + 10) -> list[tuple[str, str, str]]:
    return [(f.severity, f.action, f.summary) for f in lc.findings(now)]


def test_fatal_xid_needs_reboot_until_the_node_reboots(life: XidLifecycle) -> None:
    life.record(xid(79, T0))
    assert states(life) == [(CRITICAL, "reboot_node", "xid 79 fallen off the bus")]
    life.observe(snap(up=False), "boot-1")
    life.observe(snap(), "boot-1")  # back on the bus but the same boot: not enough for XID 79
    assert states(life, T0 + 5 * DAY)[0][0] == CRITICAL
    life.observe(snap(), "boot-2")
    assert states(life, T0 + 5 * DAY) == []
    assert life.resolved[-1]["resolved_by"] == "node rebooted (boot id changed)"


@pytest.mark.parametrize(
    ("evidence", "how"),
    [
        (lambda lc: (lc.observe(snap(up=False), "boot-1"), lc.observe(snap(), "boot-1")), "GPU reset"),
        (lambda lc: lc.observe(snap(energy=5.0), "boot-1"), "energy counter restarted"),
        (lambda lc: lc.observe(snap(driver="580.2"), "boot-1"), "driver reloaded"),
        (lambda lc: lc.observe(snap(), "boot-2"), "node rebooted"),
    ],
)
def test_needs_reset_clears_on_evidence_of_a_reset(life: XidLifecycle, evidence, how: str) -> None:  # type: ignore[no-untyped-def]
    life.record(xid(48, T0))
    assert states(life) == [(CRITICAL, "reset_gpu", "xid 48 double-bit ECC error in GPU memory")]
    life.observe(snap(), "boot-1")  # an ordinary poll changes nothing
    assert states(life)[0][0] == CRITICAL
    evidence(life)
    assert states(life) == []
    assert how in life.resolved[-1]["resolved_by"]


def test_three_double_bit_ecc_xids_in_a_day_escalate_to_replace(life: XidLifecycle) -> None:
    life.record(xid(48, T0))
    life.record(xid(48, T0 + 3600))
    assert states(life, T0 + 3600)[0][1] == "reset_gpu"
    life.record(xid(48, T0 + 7200))
    severity, action, summary = states(life, T0 + 7200)[0]
    assert (severity, action) == (CRITICAL, "replace")
    assert summary.endswith("(3 in a day)")
    # A reset no longer clears it: a GPU to replace needs an operator.
    life.observe(snap(energy=1.0), "boot-2")
    assert states(life, T0 + 7200)[0][1] == "replace"


def test_escalation_counts_only_within_the_window(life: XidLifecycle) -> None:
    for day in range(3):
        life.record(xid(48, T0 + day * 1.5 * DAY))
    assert states(life, T0 + 3 * DAY)[0][1] == "reset_gpu"


def test_escalation_is_configurable_per_code() -> None:
    lc = XidLifecycle(XidCatalog.load(), XidPolicy(escalations={13: Escalation(2, 3600, "reset_gpu")}))
    lc.record(xid(13, T0))
    assert states(lc) == [(WARNING, "restart_job", "xid 13 graphics engine exception")]
    lc.record(xid(13, T0 + 60))
    assert states(lc, T0 + 60)[0][:2] == (CRITICAL, "reset_gpu")


def test_xid_45_alone_is_cleanup_not_a_fault(life: XidLifecycle) -> None:
    life.record(xid(45, T0))
    assert states(life) == []


def test_an_xid_that_follows_another_defers_to_it(life: XidLifecycle) -> None:
    life.record(xid(79, T0))
    life.record(xid(154, T0 + 1))
    life.record(xid(45, T0 + 2))
    findings = life.findings(T0 + 10)
    assert [(f.evidence["xid"], f.action) for f in findings] == [(79, "reboot_node")]
    assert findings[0].evidence["followed_by"] == [154, 45]


def test_an_xid_that_follows_nothing_stands_on_its_own(life: XidLifecycle) -> None:
    life.record(xid(154, T0))  # no XID before it on this GPU
    assert states(life)[0][:2] == (CRITICAL, "reset_gpu")


def test_non_fatal_xids_warn_for_the_transient_window(life: XidLifecycle) -> None:
    life.record(xid(31, T0))
    life.record(xid(31, T0 + 1))
    assert states(life, T0 + 10) == [(WARNING, "restart_job", "xid 31 memory page fault (2 times)")]
    assert states(life, T0 + 3601 + 1) == []


def test_the_same_event_twice_counts_once(life: XidLifecycle) -> None:
    life.record(xid(48, T0))
    life.record(xid(48, T0))
    assert life.findings(T0 + 1)[0].evidence["count"] == 1


def test_operator_clear_resolves_and_the_old_events_do_not_come_back(life: XidLifecycle) -> None:
    life.record(xid(79, T0))
    life.apply_clears([Clear(gpu=0, reason="reseated", at_seconds=T0 + 60, user="ops")])
    assert states(life, T0 + 61) == []
    assert life.resolved[-1]["resolved_by"] == "cleared by operator ops: reseated"
    life.record(xid(79, T0))  # the kernel log read again after the clear
    assert states(life, T0 + 61) == []
    life.record(xid(79, T0 + 120))  # a new one is a new fault
    assert states(life, T0 + 121)[0][0] == CRITICAL


def test_an_xid_that_comes_after_a_clear_the_daemon_has_not_read_yet_is_a_fault_again(life: XidLifecycle) -> None:
    """The daemon reads clears when it next reports (up to 5 s later): an XID that came between the
    clear and that report is after the clear, so it is not cleared with the fault it repeats."""
    life.record(xid(79, T0))
    life.record(xid(79, T0 + 120))  # after the clear below, recorded before the clear was read
    life.apply_clears([Clear(gpu=0, reason="reseated", at_seconds=T0 + 60, user="ops")])
    assert life.resolved[-1]["resolved_by"] == "cleared by operator ops: reseated"
    found = life.findings(T0 + 121)
    assert [(f.severity, f.summary) for f in found] == [(CRITICAL, "xid 79 fallen off the bus")]
    assert found[0].evidence["count"] == 1  # the one after the clear


def test_a_service_reading_a_clear_late_gives_the_verdict_of_one_that_read_it_at_once(tmp_path: Path) -> None:
    config = HealthConfig(boot_id_path=tmp_path / "boot_id", sysfs_root=tmp_path / "nosys")
    verdicts = []
    for read_between in (True, False):
        state = tmp_path / str(read_between)
        state.mkdir()
        now = [T0]
        service = HealthService(state, XidCatalog.load(), config, clock=lambda now=now: now[0])
        service.on_snapshot(snap())
        service.on_xid(xid(79, T0 + 1))
        add_clear(state, Clear(gpu=0, reason="fixed", at_seconds=T0 + 2, user="ops"))
        if read_between:
            service.report()
        service.on_xid(xid(79, T0 + 3))
        now[0] = T0 + 4
        verdicts.append(service.report().status)
    assert verdicts == [CRITICAL, CRITICAL]


def test_the_state_survives_a_restart_and_clears_from_the_command_line(tmp_path: Path) -> None:
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n")
    config = HealthConfig(boot_id_path=boot, sysfs_root=tmp_path / "nosys")
    clock = iter(range(int(T0), int(T0) + 1000)).__next__
    first = HealthService(tmp_path, XidCatalog.load(), config, clock=lambda: float(clock()))
    first.on_snapshot(snap())
    first.on_xid(xid(48, T0))
    assert first.report().status == CRITICAL

    second = HealthService(tmp_path, XidCatalog.load(), config, clock=lambda: float(clock()))
    second.on_snapshot(snap())
    report = second.report()
    assert report.status == CRITICAL
    assert report.reason() == "GPU 0 xid 48 double-bit ECC error in GPU memory: reset GPU"
    add_clear(tmp_path, Clear(gpu=0, reason="reset by hand", at_seconds=T0 + 500))
    assert second.report().status == "OK"
    third = HealthService(tmp_path, XidCatalog.load(), config, clock=lambda: float(clock()))
    third.on_snapshot(snap())
    assert third.report().status == "OK"
