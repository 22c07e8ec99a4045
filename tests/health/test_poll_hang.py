"""A GPU whose reads do not return under a running daemon: the verdict names it (CRITICAL) once the poll
has been stuck longer than the daemon's ``stale_after_seconds``; a reading grown old for another reason
is UNKNOWN, never OK (docs/health.md, "A poll that hangs")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gpumon.health.config import HealthConfig
from gpumon.health.poll_watch import IDLE, PollProgress, PollWatch, hang_findings
from gpumon.health.service import HealthService
from gpumon.model.snapshot import GpuSnapshot, Snapshot
from gpumon.model.xid_catalog import XidCatalog
from tests.helpers import DaemonProcess, run_cli, wait_for

HUNG_GPU1 = """
count: 2
gpus:
  - {}
  - hang_at_tick: 3
"""


def _snapshot(at_monotonic: float) -> Snapshot:
    gpus = tuple(GpuSnapshot(index=i, uuid=f"GPU-{i}", up=True, pci_bus_id=f"00000000:0{i}:00.0") for i in range(2))
    return Snapshot(timestamp_seconds=1e9 + at_monotonic, monotonic_seconds=at_monotonic, nvml_up=True, gpus=gpus)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _service(tmp_path: Path, progress: Callable[[], PollProgress], clock: Clock) -> HealthService:
    watch = PollWatch(progress, lambda: 5.0, clock)
    return HealthService(
        tmp_path / "state",
        XidCatalog.load(None),
        HealthConfig(sysfs_root=tmp_path / "nosys"),
        monotonic=clock,
        poll_watch=watch,
    )


def test_a_read_stuck_past_the_bound_makes_its_gpu_critical_and_the_others_stay_ok(tmp_path: Path) -> None:
    clock = Clock()
    progress = IDLE
    service = _service(tmp_path, lambda: progress, clock)
    service.on_snapshot(_snapshot(clock.now))
    assert service.report().status == "OK"

    progress = PollProgress(running_since_seconds=clock.now + 1, gpu_index=1)  # the next poll enters GPU 1
    clock.now += 5.5  # stuck 4.5 s: within the bound
    assert service.report().status == "OK"
    clock.now += 1.0  # stuck 5.5 s
    report = service.report()
    assert report.status == "CRITICAL"
    assert [(g.index, g.status) for g in report.gpus] == [(0, "OK"), (1, "CRITICAL")]
    hung = report.findings[0]
    assert (hung.kind, hung.gpu, hung.uuid, hung.action) == ("nvml_hang", 1, "GPU-1", "reboot_node")


def test_a_reading_grown_old_without_a_poll_running_is_unknown_never_ok(tmp_path: Path) -> None:
    clock = Clock()
    service = _service(tmp_path, lambda: IDLE, clock)
    service.on_snapshot(_snapshot(clock.now))
    clock.now += 30
    report = service.report()
    assert report.status == "UNKNOWN"
    assert report.findings[0].kind == "stale_reading"


def test_a_poll_stuck_outside_any_gpu_read_is_the_nodes_fault(tmp_path: Path) -> None:
    clock = Clock()
    started = PollProgress(clock.now, None)  # the first poll, inside NVML's initialisation
    service = _service(tmp_path, lambda: started, clock)
    clock.now += 6
    report = service.report()
    assert report.status == "CRITICAL" and report.findings[0].kind == "nvml_hang"
    assert report.findings[0].gpu is None


@given(
    age=st.floats(min_value=0, max_value=1e6),
    stuck=st.one_of(st.none(), st.floats(min_value=0, max_value=1e6)),
    gpu=st.one_of(st.none(), st.integers(0, 1)),
    bound=st.floats(min_value=0.1, max_value=1e4),
)
def test_never_ok_once_the_reading_or_the_poll_in_progress_is_older_than_the_bound(
    age: float, stuck: float | None, gpu: int | None, bound: float
) -> None:
    now = 2e6
    progress = PollProgress(None if stuck is None else now - stuck, gpu)
    findings = hang_findings(_snapshot(now - age), progress, now, bound)
    age = now - (now - age)  # as the clock sees it
    stuck = None if stuck is None else now - (now - stuck)
    if stuck is None:
        assert [f.severity for f in findings] == (["UNKNOWN"] if age > bound else [])
    elif stuck > bound:
        assert [(f.severity, f.gpu) for f in findings] == [("CRITICAL", gpu)]
    else:
        assert findings == []


def test_gpumon_health_asking_the_daemon_names_the_hung_gpu(
    start_daemon: Callable[..., DaemonProcess], tmp_path: Path
) -> None:
    """The issue's scenario: GPU 1's reads hang from the 4th poll. /ready fails, and gpumon health (which
    asks the daemon) says CRITICAL naming GPU 1, within the bound (stale_after_seconds, 1 s here)."""
    scenario = tmp_path / "hung.yaml"
    scenario.write_text(HUNG_GPU1)
    config = tmp_path / "gpumon.yaml"
    config.write_text(f"backend: 'fake:{scenario}'\ninterval_seconds: 0.2\nstale_after_seconds: 1\n")
    daemon = start_daemon("--config", str(config), wait=False)

    def asked() -> bool:
        done = run_cli("health", "--daemon-url", daemon.url, "--state-dir", str(daemon.state_dir))
        return done.returncode == 2 and done

    done = wait_for(asked, 30, 0.2, "gpumon health to say CRITICAL")
    first = done.stdout.splitlines()[0]
    assert first.startswith("gpumon health: CRITICAL - GPU 1 ") and "(from the daemon)" in first, done.stdout
    assert daemon.get("/ready").status_code == 503
