"""The findings of some kinds, as the alert tick's finding rules ask for them, are the whole report's of those kinds.

The tick asks the health service only for the kinds its finding rules name (``findings_of``), and the service
works out only the report's parts that can give them (gpumon.health.report_parts). Over random sequences of
polls (GPUs busy, slow, lost, hot, with a row remap or page retirement pending, a recovery asked for, a
fabric not ready, a PCIe link narrowed, error counters rising, a process stuck), driver changes against
the baseline, XIDs, operator clears, a failed burn and a hung poll, what it answers for any kind names
(each kind the report holds alone, rule-like patterns with ``*``, kinds that nothing gives) equals the
findings of those kinds in the whole report at that moment, in its order; asked when a report is kept
(a scrape's) it equals that report's. Every kind a report holds is one its part declares.
"""

from __future__ import annotations

import dataclasses
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumon.health.config import HealthConfig
from gpumon.health.poll_watch import IDLE, PollProgress, PollWatch
from gpumon.health.report_parts import part_kinds
from gpumon.health.service import HealthService
from gpumon.model.findings import Finding
from gpumon.model.snapshot import GpuSnapshot, Snapshot
from gpumon.model.xid_catalog import XidCatalog
from tests.health.test_burn_findings import write_burn
from tests.health.test_report_asked_often import T0, Inputs, config, happen, step

CATALOG = XidCatalog.load()
FAULTS: dict[str, dict[str, Any]] = {
    "row_remap_pending": {"row_remap_pending": True},
    "row_remap_failure": {"row_remap_failure": True, "row_remap_bank_availability": {"none": 2}},
    "banks": {"row_remap_bank_availability": {"none": 1}},
    "hot": {"temperature_celsius": 95.0, "temperature_slowdown_threshold_celsius": 90.0},
    "retired": {"retired_pages_pending": True, "ecc_errors_total": {"uncorrected_volatile": 2}},
    "recovery": {"recovery_action": "gpu_reset"},
    "fabric": {"fabric_state": "in_progress"},
    "narrow": {"pcie_link_width": 8, "pcie_link_width_max": 16},
    "vbios": {"vbios_version": "96.00.99"},
    "model": {"name": "NVIDIA H100"},
}
extra = st.fixed_dictionaries(
    {
        "faults": st.dictionaries(st.integers(0, 2), st.sampled_from(sorted(FAULTS)), max_size=2),
        "driver": st.sampled_from(["580.1", "580.1", "580.2"]),
        "burn": st.sampled_from([None, None, "failed", "passed"]),
        "poll": st.sampled_from(["ok", "ok", "ok", "hung_gpu", "hung", "stale", "nvml_down"]),
    }
)
KIND_NAMES = sorted(set().union(*part_kinds(config(Path("/")).trends.rules).values()))
PATTERNS = [*KIND_NAMES, "*", "*_trend", "gpu_*", "row_remap_*", "no_such_kind", "XID"]


def with_faults(snapshot: Snapshot, faults: dict[int, str], driver: str) -> Snapshot:
    """The snapshot with each GPU's PCI bus id and VBIOS (a baseline is recorded), ``faults`` on GPUs that are up."""

    def gpu(g: GpuSnapshot) -> GpuSnapshot:
        fields = {"pci_bus_id": f"00000000:{0x18 + g.index:02X}:00.0", "vbios_version": "96.00.01"}
        fields.update(FAULTS.get(faults.get(g.index, ""), {}) if g.up else {})
        return dataclasses.replace(g, **fields)

    host = dataclasses.replace(snapshot.host, driver_version=driver)
    return dataclasses.replace(snapshot, gpus=tuple(gpu(g) for g in snapshot.gpus), host=host)


def matching(findings: tuple[Finding, ...] | list[Finding], names: frozenset[str]) -> list[Finding]:
    return [f for f in findings if any(fnmatchcase(f.kind, n) for n in names)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(step, extra), min_size=8, max_size=16),
    st.lists(st.sets(st.sampled_from(PATTERNS), max_size=4), min_size=3, max_size=3),
)
def test_the_findings_of_the_kinds_asked_are_the_whole_reports_findings_of_those_kinds(
    tmp_path_factory: Any, steps: list[tuple[Any, dict[str, Any]]], name_sets: list[set[str]]
) -> None:
    root = tmp_path_factory.mktemp("kinds")
    clock = [T0]
    progress, late = [IDLE], [0.0]
    watch = PollWatch(lambda: progress[0], lambda: 5.0, lambda: clock[0] - T0 + late[0])
    cfg = dataclasses.replace(config(root), expected_gpu_count=3)
    service = HealthService(
        root, CATALOG, cfg, clock=lambda: clock[0], monotonic=lambda: clock[0] - T0, poll_watch=watch
    )
    declared = set().union(*part_kinds(cfg.trends.rules).values())
    inputs = Inputs()
    for (seconds, changes, happening), more in steps:
        snapshot = with_faults(inputs.advance(seconds, changes), more["faults"], more["driver"])
        poll = more["poll"]
        if poll == "nvml_down":
            snapshot = dataclasses.replace(snapshot, nvml_up=False, nvml_error="NVML_ERROR_UNKNOWN", gpus=())
        clock[0] = snapshot.timestamp_seconds
        service.on_snapshot(snapshot)
        happen(service, root, snapshot, happening)
        if more["burn"] is not None:
            write_burn(root, clock[0] - 1, passed=more["burn"] == "passed")
        hung = {"hung_gpu": 1, "hung": None}
        progress[0] = PollProgress(clock[0] - T0 - 10, hung[poll]) if poll in hung else IDLE
        late[0] = 10.0 if poll == "stale" else 0.0
        whole = service.report().findings
        assert {f.kind for f in whole} <= declared, "a kind its part does not declare: no alert would see it"
        asked = [frozenset({f.kind}) for f in whole] + [frozenset(n) for n in name_sets]
        for names in asked:
            assert service.findings_of(names) == matching(whole, names), sorted(names)
        kept = service.current_report().findings  # a scrape's report, kept: the tick takes its findings
        for names in asked:
            assert service.findings_of(names) == matching(kept, names), sorted(names)


def test_a_service_asked_for_no_kind_a_part_gives_works_out_nothing(tmp_path: Path) -> None:
    service = HealthService(tmp_path, CATALOG, HealthConfig(boot_id_path=tmp_path / "boot_id"), clock=lambda: T0)
    assert service.findings_of(frozenset({"no_such_kind"})) == []
    assert [f.kind for f in service.findings_of(frozenset({"no_*", "xid"}))] == ["no_data"]


def test_a_damaged_state_file_shows_to_the_rules_that_name_it(tmp_path: Path) -> None:
    (tmp_path / "health").mkdir()
    (tmp_path / "health" / "xid.json").write_text("{not json")
    service = HealthService(tmp_path, CATALOG, HealthConfig(boot_id_path=tmp_path / "boot_id"), clock=lambda: T0)
    [damaged] = service.findings_of(frozenset({"state_*"}))
    assert damaged == next(f for f in service.report().findings if f.kind == "state_damaged")
