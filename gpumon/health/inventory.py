"""The host's expected inventory and drift from it.

The baseline is recorded the first time gpumon sees every GPU up and every NVIDIA GPU on the PCI bus
listed by NVML (or accepted with ``gpumon health accept-inventory``). Drift findings:

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumon.events.kernel_log import normalize_bus_id
from gpumon.model.findings import CRITICAL, WARNING, Finding
from gpumon.model.snapshot import Snapshot

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")
"""PCI class prefixes of VGA-compatible and 3D controllers (NVSwitches and audio functions are other classes)."""


@dataclass(frozen=True)
class InventoryGpu:
    """One GPU as the baseline knows it."""

    index: int
    uuid: str
    name: str | None
    pci_bus_id: str | None
    vbios_version: str | None
    nvlinks_up: int
    pcie_generation_max: int | None
    pcie_width_max: int | None
    p2p_ok: tuple[str, ...]
    """``peer:capability`` pairs that worked, e.g. ``1:nvlink``."""
    pcie_width: int | None = None
    """The width the link trained at when accepted (None in a baseline recorded on its own): a link known
    narrow (a riser, a slot) and accepted is not reported again while it trains at least that wide."""


@dataclass(frozen=True)
class Inventory:
    driver_version: str | None
    gpus: tuple[InventoryGpu, ...]
    recorded_seconds: float
    source: str = "recorded"
    """``recorded`` (first run), ``accepted`` (gpumon health accept-inventory)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "driver_version": self.driver_version,
            "recorded_seconds": self.recorded_seconds,
            "source": self.source,
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "pci_bus_id": g.pci_bus_id,
                    "vbios_version": g.vbios_version,
                    "nvlinks_up": g.nvlinks_up,
                    "pcie_generation_max": g.pcie_generation_max,
                    "pcie_width_max": g.pcie_width_max,
                    "pcie_width": g.pcie_width,
                    "p2p_ok": list(g.p2p_ok),
                }
                for g in self.gpus
            ],
        }

    @classmethod
    def from_json(cls, raw: Any) -> Inventory | None:
        """None when ``raw`` is not a baseline this version wrote."""
        if not isinstance(raw, dict) or raw.get("version") != 1:
            return None
        if not _valid_inventory(raw):
            return None
        try:
            return cls(
                driver_version=raw.get("driver_version"),
                recorded_seconds=float(raw.get("recorded_seconds", 0.0)),
                source=str(raw.get("source", "recorded")),
                gpus=tuple(
                    InventoryGpu(
                        index=int(g["index"]),
                        uuid=str(g["uuid"]),
                        name=g.get("name"),
                        pci_bus_id=g.get("pci_bus_id"),
                        vbios_version=g.get("vbios_version"),
                        nvlinks_up=int(g.get("nvlinks_up", 0)),
                        pcie_generation_max=g.get("pcie_generation_max"),
                        pcie_width_max=g.get("pcie_width_max"),
                        pcie_width=g.get("pcie_width"),
                        p2p_ok=tuple(str(p) for p in g.get("p2p_ok") or []),
                    )
                    for g in raw.get("gpus") or []
                ),
            )
        except (KeyError, TypeError, ValueError):
            return None


def _valid_inventory(raw: dict[str, Any]) -> bool:
    """Every value of the types ``to_json`` writes (a file of other types would fail later comparisons)."""

    def text(v: Any) -> bool:
        return v is None or isinstance(v, str)

    def count(v: Any) -> bool:
        return v is None or (isinstance(v, int) and not isinstance(v, bool))

    gpus = raw.get("gpus") or []
    return (
        text(raw.get("driver_version"))
        and isinstance(raw.get("recorded_seconds", 0.0), (int, float))
        and isinstance(gpus, list)
        and all(
            isinstance(g, dict)
            and count(g.get("index"))
            and g.get("index") is not None
            and isinstance(g.get("uuid"), str)
            and all(text(g.get(k)) for k in ("name", "pci_bus_id", "vbios_version"))
            and all(count(g.get(k)) for k in ("nvlinks_up", "pcie_generation_max", "pcie_width_max", "pcie_width"))
            and isinstance(g.get("p2p_ok") or [], list)
            for g in gpus
        )
    )


def inventory_of(snapshot: Snapshot, now_seconds: float, source: str = "recorded") -> Inventory:
    """What ``snapshot`` shows of the host."""
    return Inventory(
        driver_version=snapshot.host.driver_version,
        recorded_seconds=now_seconds,
        source=source,
        gpus=tuple(
            InventoryGpu(
                index=g.index,
                uuid=g.uuid,
                name=g.name,
                pci_bus_id=normalize_bus_id(g.pci_bus_id) if g.pci_bus_id else None,
                vbios_version=g.vbios_version,
                nvlinks_up=sum(1 for up in (g.nvlink_up or {}).values() if up),
                pcie_generation_max=g.pcie_link_generation_max,
                pcie_width_max=g.pcie_link_width_max,
                pcie_width=g.pcie_link_width if source == "accepted" else None,  # narrow by choice, not at first sight
                p2p_ok=tuple(sorted(f"{p.peer_index}:{p.capability}" for p in g.p2p_status or () if p.ok)),
            )
            for g in snapshot.gpus
        ),
    )


def complete(snapshot: Snapshot) -> bool:
    """Worth recording as a baseline: NVML up, GPUs present, all up and their static tier read."""
    return bool(snapshot.nvml_up and snapshot.gpus and all(g.up and g.pci_bus_id is not None for g in snapshot.gpus))


def missing_from_nvml(snapshot: Snapshot, pci_bus_ids: Sequence[str] | None) -> list[str]:
    """Bus ids of NVIDIA GPUs on the PCI bus that NVML does not list (empty when NVML is down or PCI unknown)."""
    if pci_bus_ids is None or not snapshot.nvml_up:
        return []
    nvml_buses = {normalize_bus_id(g.pci_bus_id) for g in snapshot.gpus if g.pci_bus_id}
    return [bus for bus in pci_bus_ids if bus not in nvml_buses]


def pci_gpus(sysfs_root: Path) -> list[str]:
    """Bus ids (NVML form, 00000000:BB:DD.F) of NVIDIA GPUs on the PCI bus, read-only from sysfs."""
    devices = sysfs_root / "bus" / "pci" / "devices"
    out: list[str] = []
    try:
        entries = sorted(devices.iterdir())
    except OSError:
        return out
    for dev in entries:
        try:
            vendor = (dev / "vendor").read_text().strip().lower()
            klass = (dev / "class").read_text().strip().lower()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR and klass.startswith(GPU_CLASSES):
            driver = (dev / "driver").resolve().name if (dev / "driver").exists() else None
            if driver not in (None, "nvidia"):
                continue  # given to another driver on purpose (vfio-pci for a VM): not NVML's to list
            bus = normalize_bus_id(dev.name)
            if bus is not None:
                out.append(bus)
    return out


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
    out: list[Finding] = []
    nvml_buses = {normalize_bus_id(g.pci_bus_id) for g in snapshot.gpus if g.pci_bus_id}
    if pci_bus_ids is not None and snapshot.nvml_up:
        for bus in pci_bus_ids:
            if bus not in nvml_buses:
                out.append(
                    Finding(
                        kind="gpu_missing",
                        severity=CRITICAL,
                        action="reboot_node",
                        summary=f"GPU at PCI {bus} is on the PCI bus but NVML does not list it",
                        evidence={"pci_bus_id": bus, "source": "sysfs"},
                    )
                )
    expected = expected_gpu_count if expected_gpu_count is not None else (len(baseline.gpus) if baseline else None)
    seen = len(snapshot.gpus) if snapshot.nvml_up else 0
    if expected is not None and seen < expected:
        missing = []
        if baseline is not None:
            missing = sorted(g.pci_bus_id for g in baseline.gpus if g.pci_bus_id and g.pci_bus_id not in nvml_buses)
        listed = f" (missing: {', '.join(missing)})" if missing else ""
        reason = "" if snapshot.nvml_up else f"; NVML: {snapshot.nvml_error}"
        out.append(
            Finding(
                kind="gpu_count",
                severity=CRITICAL,
                action="reboot_node",
                summary=f"{seen} GPUs seen, {expected} expected{listed}{reason}",
                evidence={"seen": seen, "expected": expected, "missing": missing},
            )
        )
    accepted_width = {b.pci_bus_id: b.pcie_width for b in baseline.gpus} if baseline is not None else {}
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
    if baseline is None or not snapshot.nvml_up:
        return out
    if (
        baseline.driver_version
        and snapshot.host.driver_version
        and snapshot.host.driver_version != baseline.driver_version
    ):
        out.append(
            Finding(
                kind="driver_changed",
                severity=WARNING,
                action="none",
                summary=f"driver {snapshot.host.driver_version}, baseline {baseline.driver_version} "
                "(gpumon health accept-inventory if intended)",
                evidence={"driver_version": snapshot.host.driver_version, "baseline": baseline.driver_version},
            )
        )
    by_bus: Mapping[str | None, InventoryGpu] = {b.pci_bus_id: b for b in baseline.gpus}
    for g in snapshot.gpus:
        if not g.up:
            continue
        base = by_bus.get(normalize_bus_id(g.pci_bus_id) if g.pci_bus_id else None)
        if base is None:
            continue
        out.extend(_gpu_drift(base, g.index, g.uuid, g))
    return out


def _gpu_drift(base: InventoryGpu, index: int, uuid: str, g: Any) -> list[Finding]:
    out: list[Finding] = []

    def add(kind: str, severity: str, action: str, summary: str, **evidence: Any) -> None:
        out.append(
            Finding(
                kind=kind, severity=severity, action=action, summary=summary, gpu=index, uuid=uuid, evidence=evidence
            )
        )

    up = sum(1 for v in (g.nvlink_up or {}).values() if v) if g.nvlink_up is not None else None
    if up is not None and up < base.nvlinks_up:
        down = sorted((k for k, v in (g.nvlink_up or {}).items() if not v), key=lambda k: int(k) if k.isdigit() else 0)
        add(
            "nvlink_down",
            CRITICAL,
            "inspect_hardware",
            f"{up} of {base.nvlinks_up} NVLinks up (down: {', '.join(down) or '?'})",
            up=up,
            baseline=base.nvlinks_up,
            down=down,
        )
    if (
        g.pcie_link_generation_max is not None
        and base.pcie_generation_max
        and g.pcie_link_generation_max < base.pcie_generation_max
    ):
        add(
            "pcie_degraded",
            WARNING,
            "inspect_hardware",
            f"PCIe max generation {g.pcie_link_generation_max}, baseline {base.pcie_generation_max}",
            generation_max=g.pcie_link_generation_max,
            baseline=base.pcie_generation_max,
        )
    if g.pcie_link_width_max is not None and base.pcie_width_max and g.pcie_link_width_max < base.pcie_width_max:
        add(
            "pcie_degraded",
            WARNING,
            "inspect_hardware",
            f"PCIe max width x{g.pcie_link_width_max}, baseline x{base.pcie_width_max}",
            width_max=g.pcie_link_width_max,
            baseline=base.pcie_width_max,
        )
    if g.p2p_status is not None:
        now_ok = {f"{p.peer_index}:{p.capability}" for p in g.p2p_status if p.ok}
        lost = sorted(set(base.p2p_ok) - now_ok)
        if lost:
            add("p2p_lost", WARNING, "inspect_hardware", f"P2P no longer works: {', '.join(lost)}", lost=lost)
    if g.vbios_version and base.vbios_version and g.vbios_version != base.vbios_version:
        add(
            "vbios_changed",
            WARNING,
            "none",
            f"VBIOS {g.vbios_version}, baseline {base.vbios_version} (gpumon health accept-inventory if intended)",
            vbios_version=g.vbios_version,
            baseline=base.vbios_version,
        )
    if g.name and base.name and g.name != base.name:
        add("model_changed", WARNING, "none", f"model {g.name}, baseline {base.name}", name=g.name, baseline=base.name)
    return out
