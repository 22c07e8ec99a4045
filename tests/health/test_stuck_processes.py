"""Stuck processes (leptonai/gpud#1299): a process that holds a GPU and has been in uninterruptible sleep
(D state) longer than ``health.stuck_process_seconds`` is a finding naming the process and the GPU."""

from __future__ import annotations

from pathlib import Path

from gpumon.collect.processes import ProcessEnricher
from gpumon.health.config import HealthConfig, parse_health
from gpumon.health.service import HealthService
from gpumon.health.stuck_processes import StuckProcesses
from gpumon.model.findings import WARNING
from gpumon.model.snapshot import GpuSnapshot, HostSnapshot, ProcessSnapshot, Snapshot
from gpumon.model.xid_catalog import XidCatalog

T0 = 1_800_000_000.0


def snap(at: float, **states: str) -> Snapshot:
    """GPU 0 runs pid 4242 (python3) and GPU 1 pid 5151 (train), in the states given by name."""
    gpus = (
        GpuSnapshot(
            index=0,
            uuid="GPU-0",
            up=True,
            processes=(ProcessSnapshot(4242, 1 << 30, "python3", "ana", state=states.get("a", "R")),),
        ),
        GpuSnapshot(
            index=1,
            uuid="GPU-1",
            up=True,
            processes=(ProcessSnapshot(5151, 1 << 30, "train", "bob", state=states.get("b", "S")),),
        ),
    )
    return Snapshot(timestamp_seconds=at, monotonic_seconds=at - T0, nvml_up=True, host=HostSnapshot(), gpus=gpus)


def test_a_process_in_d_state_longer_than_configured_is_a_finding_naming_it_and_its_gpu() -> None:
    detector = StuckProcesses(stuck_seconds=120)
    for t in range(0, 181, 10):
        detector.observe(snap(T0 + t, b="D"))
    found = detector.findings(T0 + 180)
    assert [(f.gpu, f.severity, f.kind, f.action) for f in found] == [(1, WARNING, "stuck_process", "reboot_node")]
    assert found[0].summary.startswith("process 5151 (train, user bob) in uninterruptible sleep (D) for 3 min")
    assert found[0].evidence["pid"] == 5151 and found[0].uuid == "GPU-1"


def test_a_short_d_state_or_one_interrupted_by_running_is_no_finding() -> None:
    detector = StuckProcesses(stuck_seconds=120)
    for t in range(0, 181, 10):
        detector.observe(snap(T0 + t, a="R" if t == 100 else "D"))
    assert detector.findings(T0 + 180) == []  # D since t=110: 70 s
    detector.observe(snap(T0 + 240, a="D"))
    assert [f.gpu for f in detector.findings(T0 + 240)] == [0]
    detector.observe(snap(T0 + 250))  # it ran again
    assert detector.findings(T0 + 250) == []


def test_the_state_is_read_from_proc_every_poll(tmp_path: Path) -> None:
    stat = tmp_path / "4242" / "stat"
    stat.parent.mkdir()
    (stat.parent / "comm").write_text("python3\n")
    (stat.parent / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\n")
    (stat.parent / "cgroup").write_text("0::/user.slice\n")

    def write(state: str) -> None:
        fields = [state, "1", "4242", "4242"] + ["0"] * 15 + ["777"]  # field 22: start time
        stat.write_text("4242 (python3) " + " ".join(fields) + "\n")

    enricher = ProcessEnricher(proc_root=tmp_path, cgroup_root=None)
    write("S")
    assert enricher.enrich([ProcessSnapshot(4242)])[0].state == "S"
    write("D")
    assert enricher.enrich([ProcessSnapshot(4242)])[0].state == "D"  # cached facts, state fresh


def test_the_verdict_shows_it_after_the_configured_time(tmp_path: Path) -> None:
    config, problems = parse_health({"stuck_process_seconds": 60, "sysfs_root": str(tmp_path / "sys")})
    assert problems == []
    clock = [T0]
    service = HealthService(tmp_path, XidCatalog.load(), config, clock=lambda: clock[0])
    for t in range(0, 91, 10):
        clock[0] = T0 + t
        service.on_snapshot(snap(T0 + t, a="D"))
    report = service.report()
    assert report.status == WARNING and [f.kind for f in report.findings] == ["stuck_process"]
    assert "process 4242 (python3" in report.reason() or "process 4242" in report.findings[0].summary
    _, bad = parse_health({"stuck_process_seconds": -1})
    assert len(bad) == 1 and "stuck_process_seconds" in bad[0]
    assert HealthConfig().stuck_process_seconds == 300
