"""The health collector builds its report once per change of what the report reads, not per scrape."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumon.health.clears import Clear, add_clear
from gpumon.health.config import HealthConfig
from gpumon.health.report_cache import REPORT_REUSE_SECONDS
from gpumon.health.service import HealthService
from gpumon.model.families import Family
from gpumon.model.snapshot import GpuSnapshot, HostSnapshot, Snapshot
from gpumon.model.xid import XidEvent
from gpumon.model.xid_catalog import XidCatalog

T0 = 1_700_000_000.0


def snap() -> Snapshot:
    gpu = GpuSnapshot(index=0, uuid="GPU-0", up=True, energy_joules_total=1000.0)
    return Snapshot(
        timestamp_seconds=T0,
        monotonic_seconds=0.0,
        nvml_up=True,
        host=HostSnapshot(driver_version="580.1"),
        gpus=(gpu,),
    )


class Service:
    """A HealthService with a settable monotonic clock, counting its report() calls."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mono = 100.0
        config = HealthConfig(boot_id_path=tmp_path / "boot_id", sysfs_root=tmp_path / "nosys")
        self.health = HealthService(
            tmp_path, XidCatalog.load(), config, clock=lambda: T0 + 10, monotonic=lambda: self.mono
        )
        self.reports = 0
        real = self.health.report

        def counted(*args: object, **kwargs: object) -> object:
            self.reports += 1
            return real(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(self.health, "report", counted)
        self.collector = self.health.collector()

    def node_status(self) -> tuple[str, float]:
        family = next(f for f in self.collector.families() if f.name == "gpumon_node_health_status")
        (labels, value), *_ = samples(family)
        return labels[0], value


def samples(family: Family) -> list[tuple[list[str], float]]:
    return [(list(s[0]), float(s[1])) for s in family.samples]


def test_two_scrapes_of_the_same_snapshot_build_the_report_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Service(tmp_path, monkeypatch)
    s.health.on_snapshot(snap())
    first = list(s.collector.families())
    second = list(s.collector.families())
    assert s.reports == 1
    assert [f.name for f in first] == [f.name for f in second]
    assert first[:3] == second[:3]  # the report's families are reused as they are
    s.health.on_snapshot(snap())  # a new snapshot: built again
    list(s.collector.families())
    assert s.reports == 2
    s.mono += REPORT_REUSE_SECONDS  # what only time changes is late by at most this
    list(s.collector.families())
    assert s.reports == 3


def test_an_xid_and_a_clear_show_at_the_next_scrape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Service(tmp_path, monkeypatch)
    s.health.on_snapshot(snap())
    assert s.node_status() == ("none", 0.0)
    s.health.on_xid(XidEvent(xid=48, timestamp_seconds=T0, source="nvml", gpu_index=0, uuid="GPU-0"))
    assert s.node_status() == ("reset_gpu", 2.0)  # same snapshot, same monotonic second
    add_clear(tmp_path, Clear(gpu=0, reason="reset by hand", at_seconds=T0 + 5))
    assert s.node_status() == ("none", 0.0)
    assert s.reports == 3


def test_what_lands_between_two_asks_of_one_snapshot_shows_at_the_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a scrape every second the poll thread's render-ahead asks first and the scrape again, for the same
    snapshot in the same second: a failed burn's results, another process's baseline and a running burn's
    marker written in between show in the scrape, as a clear does (the files are looked at every ask)."""
    import dataclasses
    import json
    import os

    from gpumon.health.inventory import inventory_of
    from tests.health.test_burn_findings import write_burn

    s = Service(tmp_path, monkeypatch)
    s.health.on_snapshot(snap())

    def kinds() -> list[str]:
        return [f.kind for f in s.health.current_report().findings]

    assert kinds() == []
    write_burn(tmp_path, T0, passed=False)
    assert kinds() == ["burn_failed"]
    other = inventory_of(snap(), T0, source="accepted")
    other = dataclasses.replace(other, driver_version="570.1")
    (tmp_path / "health" / "inventory.json").write_text(json.dumps(other.to_json()))
    assert sorted(kinds()) == ["burn_failed", "driver_changed"]
    marker = {"pid": os.getpid(), "gpus": [0], "uuids": ["GPU-0"], "started_at": T0}
    (tmp_path / "burn" / "running.json").write_text(json.dumps(marker))
    assert s.health.findings_of(frozenset({"*"})) == list(s.health.current_report().findings)
    assert s.reports == 4  # each one built again, none reused past a change
