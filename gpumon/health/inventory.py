"""The host's expected inventory: the baseline, what a snapshot shows of the host, and the NVIDIA GPUs on
the PCI bus.

The baseline is recorded the first time gpumon sees every GPU up and every NVIDIA GPU on the PCI bus
listed by NVML (or accepted with ``gpumon health accept-inventory``). Drift from it: gpumon.health.drift.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumon.model.bus_id import normalize_bus_id
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
