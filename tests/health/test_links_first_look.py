"""A link down at the first look is a finding from the first check (issue 41, item 3): NVLinks judged against
what the GPU model has and against its same-model peers, PCIe maxima against the peers' (docs/health.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gpumon.health.inventory import inventory_of
from gpumon.health.peers import peer_findings
from gpumon.model.snapshot import GpuSnapshot, Snapshot
from tests.helpers import run_cli


def _links(count: int, down: tuple[int, ...] = ()) -> dict[str, bool]:
    return {str(link): link not in down for link in range(count)}


def _gpu(index: int, name: str = "NVIDIA H200", links: dict[str, bool] | None = None, **values: object) -> GpuSnapshot:
    return GpuSnapshot(
        index=index,
        uuid=f"GPU-{index}",
        up=True,
        name=name,
        pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        nvlink_up=_links(18) if links is None else links,
        **{"pcie_link_generation_max": 5, "pcie_link_width_max": 16, **values},  # type: ignore[arg-type]
    )


def _snapshot(*gpus: GpuSnapshot) -> Snapshot:
    return Snapshot(timestamp_seconds=1e9, monotonic_seconds=1.0, nvml_up=True, gpus=gpus)


def test_fresh_state_a_scenario_with_a_link_down_from_the_start_is_critical(tmp_path: Path) -> None:
    """The issue's check: fake:nvlink-degraded (link 3 of both H200s down) on a fresh state directory."""
    done = run_cli(
        "health", "--local", "--backend", "fake:nvlink-degraded", "--json", "-", "--state-dir", str(tmp_path / "s")
    )
    assert done.returncode == 2, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "CRITICAL"
    links = [f for f in report["findings"] if f["kind"] == "nvlink_down"]
    assert [(f["gpu"], f["evidence"]["down"]) for f in links] == [(0, ["3"]), (1, ["3"])]


def test_a_gpu_of_a_model_gpumon_does_not_know_is_judged_against_its_peers() -> None:
    gpus = [_gpu(i, "Some Future GPU", _links(12, down=(7,) if i == 2 else ())) for i in range(4)]
    [finding] = peer_findings(None, _snapshot(*gpus))
    assert (finding.kind, finding.severity, finding.gpu) == ("nvlink_down", "CRITICAL", 2)
    assert finding.evidence["expected"] == 12 and finding.evidence["down"] == ["7"]


def test_a_pcie_maximum_below_the_peers_is_a_warning() -> None:
    gpus = [_gpu(0), _gpu(1, pcie_link_width_max=8), _gpu(2, pcie_link_generation_max=4)]
    found = {(f.gpu, f.kind, f.severity, f.summary) for f in peer_findings(None, _snapshot(*gpus))}
    assert found == {
        (1, "pcie_degraded", "WARNING", "PCIe max width x8, its same-model peers x16"),
        (2, "pcie_degraded", "WARNING", "PCIe max generation 4, its same-model peers 5"),
    }


def test_an_accepted_inventory_that_knows_the_missing_link_silences_it() -> None:
    snapshot = _snapshot(_gpu(0, links=_links(18, down=(3,))), _gpu(1))
    assert peer_findings(inventory_of(snapshot, 0.0, source="accepted"), snapshot) == []
    assert len(peer_findings(inventory_of(snapshot, 0.0, source="recorded"), snapshot)) == 1  # recorded: no


def test_no_finding_without_evidence_of_a_missing_link() -> None:
    alone_unlinked = _snapshot(_gpu(0, links=_links(18, down=tuple(range(18)))))  # one board GPU given to a VM
    pcie_cards = _snapshot(*(_gpu(i, "NVIDIA H100 PCIe", links=None) for i in range(2)))
    pcie_cards = replace(pcie_cards, gpus=tuple(replace(g, nvlink_up=None) for g in pcie_cards.gpus))
    mixed_models = _snapshot(_gpu(0), _gpu(1, "NVIDIA L40S", links=_links(0), pcie_link_generation_max=4))
    for snapshot in (alone_unlinked, pcie_cards, mixed_models):
        assert peer_findings(None, snapshot) == []


@given(st.lists(st.integers(0, 18), min_size=1, max_size=8))
def test_a_gpu_is_named_exactly_when_it_has_fewer_links_up_than_its_model_or_a_peer(ups: list[int]) -> None:
    gpus = [_gpu(i, links=_links(18, down=tuple(range(up, 18)))) for i, up in enumerate(ups)]
    named = {f.gpu for f in peer_findings(None, _snapshot(*gpus)) if f.kind == "nvlink_down"}
    assert named == {i for i, up in enumerate(ups) if (0 < up < 18) or up < max(ups)}
