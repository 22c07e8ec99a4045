"""What a new user sees in the first minute of `make run` (fake backend) is true."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpumon.alerts.builtin import builtin_rules_raw
from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.model.snapshot import ProcessSnapshot, Tier
from tests.alerts.helpers import gpu, snap
from tests.alerts.test_builtin import T0, pack
from tests.helpers import DaemonProcess, wait_for

GPM_METRICS = (
    "gpumon_sm_active_ratio",
    "gpumon_sm_occupancy_ratio",
    "gpumon_tensor_active_ratio",
    "gpumon_dram_active_ratio",
    "gpumon_fp16_active_ratio",
    "gpumon_fp32_active_ratio",
    "gpumon_fp64_active_ratio",
)


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(s.labels), float(s.value))
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name
    ]


def test_fake_backend_log_says_simulated_gpus_not_nvml(start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon("--backend", "fake", "--fake-gpus", "2")
    wait_for(lambda: "simulated GPU(s)" in daemon.log(), what="the backend's start line")
    log = daemon.log()
    assert "fake backend: 2 simulated GPU(s)" in log
    assert "NVML initialised" not in log, "no NVML is in use on the fake backend"


def test_default_fake_gpus_carry_gpm_profiling_for_the_panels(start_daemon: Callable[..., DaemonProcess]) -> None:
    # the profiling breakdown (SM occupancy, FP pipes, GPM throughput) is an opt-in of the series budget
    daemon = start_daemon(
        "--backend", "fake", "--fake-gpus", "2", "--compat", "dcgm", env={"GPUMON_EXPORTER_DETAIL": "profiling"}
    )  # fmt: skip
    text = daemon.metrics()
    for name in GPM_METRICS:
        assert sorted(labels["gpu"] for labels, _ in samples(text, name)) == ["0", "1"], name
        assert all(0.0 <= v <= 1.0 for _, v in samples(text, name)), name
    assert len(samples(text, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")) == 2, "the dcgm tensor panel has data"
    assert len(samples(text, "gpumon_gpm_throughput_bytes_per_second")) == 8


def test_fake_clocks_are_whole_megahertz() -> None:
    now = [0.0]
    backend = FakeBackend.plausible(2, clock=lambda: now[0])
    backend.init()
    for t in (0.0, 3.3, 17.77, 40.1, 123.456):
        now[0] = t
        for index in (0, 1):
            clocks = backend.read(index, Tier.FAST)["clocks_hertz"]
            assert all(hz % 1_000_000 == 0 for hz in clocks.values()), (t, clocks)


def test_host_cpu_share_is_absent_until_there_is_a_real_value() -> None:
    """psutil's first CPU share is a made-up 0.0: gpumon leaves the series out instead."""
    snapshot = Poller(FakeBackend.plausible(1), SnapshotStore()).poll()
    assert snapshot.host.cpu_utilization_ratio is None
    assert snapshot.host.memory_total_bytes is not None and snapshot.host.memory_total_bytes > 0


def test_host_cpu_share_appears_once_cpu_time_has_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpumon.collect import host_figures

    times = iter([(100.0, 300.0), (100.0, 300.0), (101.0, 302.0)])  # (busy-ish user, idle) seconds

    class CpuTimes(tuple[float, float]):
        user = property(lambda self: self[0])
        idle = property(lambda self: self[1])

    monkeypatch.setattr(host_figures.psutil, "cpu_times", lambda: CpuTimes(next(times)))
    read = host_figures.HostFigureReader()
    assert "cpu_utilization_ratio" not in read()
    assert "cpu_utilization_ratio" not in read(), "no CPU time passed: no share"
    assert read()["cpu_utilization_ratio"] == 0.3333  # 1 busy second of 3


def test_a_pending_idle_alert_does_not_claim_its_duration() -> None:
    engine = pack()
    idle = gpu(utilization_ratio=0.05, processes=(ProcessSnapshot(pid=7, used_memory_bytes=8 << 30),))
    engine.evaluate(snap(T0, idle), T0)
    engine.evaluate(snap(T0 + 10, idle), T0 + 10)
    [alert] = engine.alerts()
    assert (alert.alertname, alert.state) == ("GpuIdleWithMemoryHeld", "pending")
    for text in alert.annotations.values():
        assert not re.search(r"\b(for|since) \d+ (minutes?|seconds?|hours?)\b", text), text


def test_no_builtin_annotation_claims_a_duration() -> None:
    """Annotations are shown while an alert is pending too, and `for` can be overridden."""
    for rule in builtin_rules_raw():
        for key, text in (rule.get("annotations") or {}).items():
            assert not re.search(r"\bfor \d+ (minutes?|seconds?|hours?)\b", text), (rule["name"], key, text)


def test_the_values_of_one_simulated_read_come_from_one_moment() -> None:
    """Used and free memory add up to the card's memory, and the process holds what is used, even
    when the clock moves while the read is made (each value once asked the clock for itself)."""
    ticking = [0.0]

    def clock() -> float:
        ticking[0] += 7.0
        return ticking[0]

    backend = FakeBackend.plausible(1, clock=clock)
    backend.init()
    for _ in range(5):
        read = backend.read(0, Tier.FAST)
        assert read["memory_used_bytes"] + read["memory_free_bytes"] == (143771 - 550) * 2**20
        assert [p.used_memory_bytes for p in read["processes"]] in ([], [read["memory_used_bytes"]])
