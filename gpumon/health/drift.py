"""Drift from the host's expected inventory (gpumon.health.inventory). Drift findings:

* a GPU on the PCI bus (sysfs: vendor 0x10de, class 0x0300xx or 0x0302xx, bound to the nvidia
  driver or to none) that NVML does not list — it fell off the bus before gpumon started, so no XID
  and no lost-GPU state shows it (a GPU bound to another driver, vfio-pci for a VM, is not NVML's);
* fewer GPUs than the baseline (or than ``health.expected_gpu_count``);
* fewer NVLinks up on a GPU than in the baseline (a link that did not come up after a reboot);
* a PCIe link trained narrower than its maximum (and than the baseline's trained width, so an accepted
  narrow link is quiet), or a maximum generation/width lower than the baseline's (the current
  generation is not compared: idle GPUs lower it to save power);
* a P2P capability that worked in the baseline and does not now;
* the driver, a VBIOS or a GPU model changed.

An accepted inventory silences what differs from the baseline; it cannot silence a GPU on the PCI bus
that NVML does not list (repair it, or give it to another driver) nor fewer GPUs than
``health.expected_gpu_count`` (change the setting); XID faults and failed burns are cleared with
``gpumon health clear``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpumon.health.inventory import Inventory, InventoryGpu
from gpumon.model.bus_id import normalize_bus_id
from gpumon.model.findings import CRITICAL, WARNING, Finding
from gpumon.model.snapshot import Snapshot


def drift_inputs(snapshot: Snapshot) -> tuple[object, ...]:
    """Everything ``drift`` reads of ``snapshot``: two snapshots with equal inputs drift alike (a cache key;
    the snapshot changes every poll, these only when the hardware or its slow and static reads do)."""
    return (
        snapshot.nvml_up,
        snapshot.nvml_error,
        snapshot.host.driver_version,
        tuple(
            (
                g.index,
                g.uuid,
                g.up,
                g.pci_bus_id,
                g.pcie_link_width,
                g.pcie_link_width_max,
                g.pcie_link_generation_max,
                g.nvlink_up,
                g.p2p_status,
                g.vbios_version,
                g.name,
            )
            for g in snapshot.gpus
        ),
    )


def drift(
    baseline: Inventory | None,
    snapshot: Snapshot,
    pci_bus_ids: Sequence[str] | None,
    expected_gpu_count: int | None = None,
) -> list[Finding]:
    """Findings where the host differs from its baseline (and from the PCI bus)."""
    nvml_buses = {normalize_bus_id(g.pci_bus_id) for g in snapshot.gpus if g.pci_bus_id}
    out = _unlisted_on_pci(snapshot, pci_bus_ids, nvml_buses)
    out += _too_few_gpus(baseline, snapshot, nvml_buses, expected_gpu_count)
    out += _narrow_links(baseline, snapshot)
    if baseline is None or not snapshot.nvml_up:
        return out
    out += _driver_changed(baseline, snapshot)
    by_bus: Mapping[str | None, InventoryGpu] = {b.pci_bus_id: b for b in baseline.gpus}
    for g in snapshot.gpus:
        if not g.up:
            continue
        base = by_bus.get(normalize_bus_id(g.pci_bus_id) if g.pci_bus_id else None)
        if base is None:
            continue
        out.extend(_gpu_drift(base, g.index, g.uuid, g))
    return out


def _unlisted_on_pci(
    snapshot: Snapshot, pci_bus_ids: Sequence[str] | None, nvml_buses: set[str | None]
) -> list[Finding]:
    """A GPU on the PCI bus that NVML (up) does not list."""
    if pci_bus_ids is None or not snapshot.nvml_up:
        return []
    return [
        Finding(
            kind="gpu_missing",
            severity=CRITICAL,
            action="reboot_node",
            summary=f"GPU at PCI {bus} is on the PCI bus but NVML does not list it",
            evidence={"pci_bus_id": bus, "source": "sysfs"},
        )
        for bus in pci_bus_ids
        if bus not in nvml_buses
    ]


def _too_few_gpus(
    baseline: Inventory | None, snapshot: Snapshot, nvml_buses: set[str | None], expected_gpu_count: int | None
) -> list[Finding]:
    """Fewer GPUs seen than ``expected_gpu_count``, else than the baseline has."""
    expected = expected_gpu_count if expected_gpu_count is not None else (len(baseline.gpus) if baseline else None)
    seen = len(snapshot.gpus) if snapshot.nvml_up else 0
    if expected is None or seen >= expected:
        return []
    missing = []
    if baseline is not None:
        missing = sorted(g.pci_bus_id for g in baseline.gpus if g.pci_bus_id and g.pci_bus_id not in nvml_buses)
    listed = f" (missing: {', '.join(missing)})" if missing else ""
    reason = "" if snapshot.nvml_up else f"; NVML: {snapshot.nvml_error}"
    return [
        Finding(
            kind="gpu_count",
            severity=CRITICAL,
            action="reboot_node",
            summary=f"{seen} GPUs seen, {expected} expected{listed}{reason}",
            evidence={"seen": seen, "expected": expected, "missing": missing},
        )
    ]


def _narrow_links(baseline: Inventory | None, snapshot: Snapshot) -> list[Finding]:
    """PCIe links trained narrower than their maximum and than the width an accepted baseline knows."""
    accepted_width = {b.pci_bus_id: b.pcie_width for b in baseline.gpus} if baseline is not None else {}
    out: list[Finding] = []
    for g in snapshot.gpus:
        known = accepted_width.get(normalize_bus_id(g.pci_bus_id) if g.pci_bus_id else None)
        if (
            g.up
            and g.pcie_link_width is not None
            and g.pcie_link_width_max
            and g.pcie_link_width < g.pcie_link_width_max
            and (known is None or g.pcie_link_width < known)
        ):
            out.append(
                Finding(
                    kind="pcie_degraded",
                    severity=WARNING,
                    action="inspect_hardware",
                    summary=f"PCIe link trained at x{g.pcie_link_width} of x{g.pcie_link_width_max}",
                    gpu=g.index,
                    uuid=g.uuid,
                    evidence={"width": g.pcie_link_width, "width_max": g.pcie_link_width_max},
                )
            )
    return out


def _driver_changed(baseline: Inventory, snapshot: Snapshot) -> list[Finding]:
    """Another driver than the baseline's."""
    driver = snapshot.host.driver_version
    if not (baseline.driver_version and driver and driver != baseline.driver_version):
        return []
    return [
        Finding(
            kind="driver_changed",
            severity=WARNING,
            action="none",
            summary=f"driver {driver}, baseline {baseline.driver_version} (gpumon health accept-inventory if intended)",
            evidence={"driver_version": driver, "baseline": baseline.driver_version},
        )
    ]


def _gpu_drift(base: InventoryGpu, index: int, uuid: str, g: Any) -> list[Finding]:
    """Where one GPU differs from its baseline: its links, then its identity (VBIOS, model)."""
    return _link_drift(base, index, uuid, g) + _identity_drift(base, index, uuid, g)


def _gpu_finding(
    index: int, uuid: str, kind: str, severity: str, action: str, summary: str, **evidence: Any
) -> Finding:
    return Finding(
        kind=kind, severity=severity, action=action, summary=summary, gpu=index, uuid=uuid, evidence=evidence
    )


def _link_drift(base: InventoryGpu, index: int, uuid: str, g: Any) -> list[Finding]:
    """Fewer NVLinks up, a lower PCIe maximum generation or width, lost P2P capabilities."""
    out: list[Finding] = []
    up = sum(1 for v in (g.nvlink_up or {}).values() if v) if g.nvlink_up is not None else None
    if up is not None and up < base.nvlinks_up:
        down = sorted((k for k, v in (g.nvlink_up or {}).items() if not v), key=lambda k: int(k) if k.isdigit() else 0)
        summary = f"{up} of {base.nvlinks_up} NVLinks up (down: {', '.join(down) or '?'})"
        out.append(
            _gpu_finding(
                index,
                uuid,
                "nvlink_down",
                CRITICAL,
                "inspect_hardware",
                summary,
                up=up,
                baseline=base.nvlinks_up,
                down=down,
            )
        )
    generation = g.pcie_link_generation_max
    if generation is not None and base.pcie_generation_max and generation < base.pcie_generation_max:
        summary = f"PCIe max generation {generation}, baseline {base.pcie_generation_max}"
        out.append(
            _gpu_finding(
                index,
                uuid,
                "pcie_degraded",
                WARNING,
                "inspect_hardware",
                summary,
                generation_max=generation,
                baseline=base.pcie_generation_max,
            )
        )
    width = g.pcie_link_width_max
    if width is not None and base.pcie_width_max and width < base.pcie_width_max:
        summary = f"PCIe max width x{width}, baseline x{base.pcie_width_max}"
        out.append(
            _gpu_finding(
                index,
                uuid,
                "pcie_degraded",
                WARNING,
                "inspect_hardware",
                summary,
                width_max=width,
                baseline=base.pcie_width_max,
            )
        )
    if g.p2p_status is not None:
        now_ok = {f"{p.peer_index}:{p.capability}" for p in g.p2p_status if p.ok}
        lost = sorted(set(base.p2p_ok) - now_ok)
        if lost:
            summary = f"P2P no longer works: {', '.join(lost)}"
            out.append(_gpu_finding(index, uuid, "p2p_lost", WARNING, "inspect_hardware", summary, lost=lost))
    return out


def _identity_drift(base: InventoryGpu, index: int, uuid: str, g: Any) -> list[Finding]:
    """Another VBIOS or GPU model than the baseline's."""
    out: list[Finding] = []
    if g.vbios_version and base.vbios_version and g.vbios_version != base.vbios_version:
        summary = f"VBIOS {g.vbios_version}, baseline {base.vbios_version} (gpumon health accept-inventory if intended)"
        out.append(
            _gpu_finding(
                index,
                uuid,
                "vbios_changed",
                WARNING,
                "none",
                summary,
                vbios_version=g.vbios_version,
                baseline=base.vbios_version,
            )
        )
    if g.name and base.name and g.name != base.name:
        summary = f"model {g.name}, baseline {base.name}"
        out.append(
            _gpu_finding(index, uuid, "model_changed", WARNING, "none", summary, name=g.name, baseline=base.name)
        )
    return out
