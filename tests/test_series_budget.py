"""The series budget (issue 31): what /metrics serves per GPU by default, and what each opt-in of
``exporter.detail`` adds. A row that says something happened (a link down, a link with errors, a
P2P capability that fails, a clock event reason active) is always served."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from gpumon.backends.fake import FakeBackend
from gpumon.collect.poller import Poller
from gpumon.collect.store import SnapshotStore
from gpumon.config.file import ConfigError, load
from gpumon.exposition.collector import GpumonCollector
from gpumon.health.service import HealthService
from gpumon.model.fields.spec import DETAILS
from gpumon.model.poll_intervals import PollIntervals
from gpumon.model.xid_catalog import XidCatalog
from tests.alerts.helpers import gpu, snap
from tests.helpers import DaemonProcess, wait_for
from tests.test_exporter import samples

BUDGET_PER_GPU = 60
"""Series per GPU on a simulated 8-GPU NVLink host with default settings (docs/benchmarks.md)."""

LINKS = 18


def series(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def render(backend: FakeBackend, detail: frozenset[str] = frozenset()) -> str:
    store = SnapshotStore()
    Poller(backend, store).poll()
    return GpumonCollector(store, PollIntervals(), monotonic=lambda: 5.0, detail=detail).render().decode()


def test_an_8_gpu_nvlink_host_serves_at_most_60_series_per_gpu_by_default(
    start_daemon: Any,
) -> None:
    daemon: DaemonProcess = start_daemon("--backend", "fake", "--fake-gpus", "8")
    # the health service's series come after the first polls: wait for them, then count
    wait_for(lambda: "gpumon_health_status{" in daemon.metrics(), 30, 0.2, "the health series")
    text = daemon.metrics()
    assert len(samples(text, "gpumon_gpu_up")) == 8
    per_gpu = len(series(text)) / 8
    assert per_gpu <= BUDGET_PER_GPU, f"{per_gpu:.1f} series per GPU"


def test_every_opt_in_adds_series_on_an_8_gpu_nvlink_host() -> None:
    default = len(series(render(FakeBackend.plausible(8, clock=lambda: 0.0))))
    for detail in DETAILS:
        more = len(series(render(FakeBackend.plausible(8, clock=lambda: 0.0), frozenset({detail}))))
        assert more > default, detail


def _nvlink_host(**values: Any) -> FakeBackend:
    healthy = {str(link): {"replay": 0, "recovery": 0, "crc": 0} for link in range(LINKS)}
    base = {"nvlink_up": {str(link): True for link in range(LINKS)}, "nvlink_errors_total": healthy}
    return FakeBackend.from_mapping({"gpus": [{"values": {**base, **values}}, {"values": base}]})


def test_a_link_down_or_with_errors_keeps_its_own_series_and_healthy_links_are_summed_per_gpu() -> None:
    errors = {str(link): {"replay": 0, "recovery": 0, "crc": 0} for link in range(LINKS)}
    errors["5"] = {"replay": 7, "recovery": 0, "crc": 2}
    up = {str(link): link != 3 for link in range(LINKS)}
    text = render(_nvlink_host(nvlink_up=up, nvlink_errors_total=errors))

    link_up = {(labels["gpu"], labels["link"]): v for labels, v in samples(text, "gpumon_nvlink_link_up")}
    assert link_up == {("0", "3"): 0.0}
    link_errors = {
        (labels["gpu"], labels["link"], labels["type"]): v
        for labels, v in samples(text, "gpumon_nvlink_link_errors_total")
    }
    assert link_errors == {("0", "5", "replay"): 7.0, ("0", "5", "crc"): 2.0}
    up_count = {labels["gpu"]: v for labels, v in samples(text, "gpumon_nvlink_links_up")}
    assert up_count == {"0": 17.0, "1": 18.0}
    assert {labels["gpu"]: v for labels, v in samples(text, "gpumon_nvlink_links")} == {"0": 18.0, "1": 18.0}
    by_type = {(labels["gpu"], labels["type"]): v for labels, v in samples(text, "gpumon_nvlink_errors_total")}
    assert by_type == {
        ("0", "replay"): 7.0,
        ("0", "recovery"): 0.0,
        ("0", "crc"): 2.0,
        ("1", "replay"): 0.0,
        ("1", "recovery"): 0.0,
        ("1", "crc"): 0.0,
    }


def test_nvlink_per_link_serves_every_links_rows() -> None:
    text = render(_nvlink_host(), frozenset({"nvlink_per_link"}))
    assert len(samples(text, "gpumon_nvlink_link_up")) == 2 * LINKS
    assert len(samples(text, "gpumon_nvlink_link_errors_total")) == 2 * LINKS * 3


def test_only_p2p_capabilities_that_fail_are_series_unless_opted_in() -> None:
    statuses = [
        {"peer_index": 1, "capability": c, "ok": c != "atomics"} for c in ("read", "write", "nvlink", "atomics")
    ]
    backend = lambda: FakeBackend.from_mapping({"gpus": [{"values": {"p2p_status": statuses}}, {}]})  # noqa: E731
    failing = [
        (labels["peer_gpu"], labels["capability"], v) for labels, v in samples(render(backend()), "gpumon_p2p_status")
    ]
    assert failing == [("1", "atomics", 0.0)]
    every = samples(render(backend(), frozenset({"p2p"})), "gpumon_p2p_status")
    assert len([1 for labels, _ in every if labels["gpu"] == "0"]) == 4


def test_a_clock_event_reason_is_a_series_while_active() -> None:
    backend = lambda: FakeBackend.from_mapping(  # noqa: E731
        {"gpus": [{"values": {"clock_events_active": {"hw_slowdown": True, "gpu_idle": False, "sw_power_cap": False}}}]}
    )
    active = [(labels["reason"], v) for labels, v in samples(render(backend()), "gpumon_clock_event_active")]
    assert active == [("hw_slowdown", 1.0)]
    every = samples(render(backend(), frozenset({"zero_rows"})), "gpumon_clock_event_active")
    assert sorted(labels["reason"] for labels, _ in every) == ["gpu_idle", "hw_slowdown", "sw_power_cap"]


def test_an_error_trend_that_did_not_rise_is_no_series(tmp_path: Path) -> None:
    service = HealthService(tmp_path, XidCatalog.load(), clock=lambda: 1_800_000_000.0)
    service.on_snapshot(snap(1_800_000_000.0, gpu(pcie_replays_total=5)))
    service.on_snapshot(snap(1_800_000_001.0, gpu(pcie_replays_total=5)))
    trends = [f for f in service.collector().families() if f.name == "gpumon_error_trend_increase"]
    assert all(not f.samples for f in trends)
    service.on_snapshot(snap(1_800_000_002.0, gpu(pcie_replays_total=9)))
    trends = [f for f in service.collector().families() if f.name == "gpumon_error_trend_increase"]
    rows = [(labels[2], value) for f in trends for labels, value in f.samples]
    assert rows == [("pcie_replays", 4.0)]


def test_exporter_detail_is_checked_and_all_means_every_opt_in(tmp_path: Path) -> None:
    config = tmp_path / "gpumon.yaml"
    config.write_text("exporter:\n  detail: [all]\n")
    assert load(config, env={}).exporter.detail == DETAILS
    assert load(None, env={"GPUMON_EXPORTER_DETAIL": "p2p,topology"}).exporter.detail == ("p2p", "topology")
    config.write_text("exporter:\n  detail: [nvlink, p2p]\n")
    with pytest.raises(ConfigError) as error:
        load(config, env={})
    assert any("exporter.detail" in p and "nvlink" in p for p in error.value.problems)


def test_a_reload_with_other_opt_ins_changes_what_the_next_scrape_serves() -> None:
    store = SnapshotStore()
    poller = Poller(_nvlink_host(), store)
    poller.poll()
    collector = GpumonCollector(store, PollIntervals(), monotonic=lambda: 5.0)
    assert not samples(collector.render().decode(), "gpumon_nvlink_link_up")
    collector.set_options(PollIntervals(), processes=False, detail=frozenset({"nvlink_per_link"}))
    assert len(samples(collector.render().decode(), "gpumon_nvlink_link_up")) == 2 * LINKS


@pytest.mark.parametrize("gpus", [1, 8])
def test_docs_fleet_md_gives_the_series_per_gpu_a_daemon_serves(gpus: int, start_daemon: Any) -> None:
    """docs/fleet.md's figures for a 1-GPU and an 8-GPU host are what a daemon serves (within 8 %)."""
    text = " ".join((Path(__file__).resolve().parent.parent / "docs" / "fleet.md").read_text().split())
    claims = {
        8: float(re.search(r"about (\d+) series per GPU on an 8-GPU", text).group(1)),  # type: ignore[union-attr]
        1: float(re.search(r"(\d+) per GPU on a 1-GPU host", text).group(1)),  # type: ignore[union-attr]
    }
    daemon: DaemonProcess = start_daemon("--backend", "fake", "--fake-gpus", str(gpus))
    wait_for(lambda: "gpumon_health_status{" in daemon.metrics(), 30, 0.2, "the health series")
    per_gpu = len(series(daemon.metrics())) / gpus
    assert abs(per_gpu - claims[gpus]) <= 0.08 * per_gpu, f"docs/fleet.md says {claims[gpus]:g}, served {per_gpu:.1f}"
