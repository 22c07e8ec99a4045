"""Topology between GPUs (nvidia-smi topo -m) and P2P capabilities (nvidia-smi topo -p2p)."""

from __future__ import annotations

import logging
from typing import Any

from gpumon.backends.nvml.codes import LOST_CODES, code_of
from gpumon.backends.nvml.nvlink import nvlink_count
from gpumon.backends.nvml.reader import Context, GpuState, ReaderSpec, text
from gpumon.model.fields.topology import P2P_TOPOLOGY_SECONDS
from gpumon.model.snapshot import P2pStatus, Tier

log = logging.getLogger(__name__)

P2P_CAPABILITIES = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3}  # NVML_P2P_CAPS_INDEX_*
P2P_STATUS_OK = 0
TOPOLOGY_LEVELS = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}


def bus_id(nv: Any, handle: Any) -> str | None:
    """nvmlDeviceGetPciInfo(handle).busId, or None when it fails."""
    try:
        return text(nv.nvmlDeviceGetPciInfo(handle).busId)
    except Exception as exc:
        log.debug("nvmlDeviceGetPciInfo failed: %s", exc)
        return None


def norm_bus_id(bus_id: str) -> str:
    """00000000:18:00.0 and 0000:18:00.0 (any case) -> 00000000:18:00.0."""
    bus_id = bus_id.strip().upper()
    domain, sep, rest = bus_id.partition(":")
    if not sep:
        return bus_id
    try:
        return f"{int(domain, 16):08X}:{rest}"
    except ValueError:
        return bus_id


def p2p_ok(nv: Any, h: Any, peer_handle: Any, capability: int) -> bool | None:
    """nvmlDeviceGetP2PStatus for one capability index; None when the call fails.

    Each index is probed on its own: DESIGN.md saw the read index raise an argument
    error with one binding (its NVML_P2P_CAPS_INDEX_READ constant is a tuple), so the
    plain integer is passed and any failure only omits that one capability.
    """
    try:
        return int(nv.nvmlDeviceGetP2PStatus(h, peer_handle, capability)) == P2P_STATUS_OK
    except Exception as exc:
        log.debug("nvmlDeviceGetP2PStatus(capability %d) failed: %s", capability, exc)
        return None


def read_p2p(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetP2PStatus per peer and capability read|write|nvlink|atomics (topo -p2p)."""
    peers = ctx.peers(g)
    if not peers:
        return
    statuses = []
    for peer in peers:
        for name, capability in P2P_CAPABILITIES.items():
            ok = p2p_ok(ctx.nv, h, peer.handle, capability)
            if ok is not None:
                statuses.append(P2pStatus(peer_index=peer.index, capability=name, ok=ok))
    if statuses:
        out["p2p_status"] = tuple(statuses)


def read_topology(ctx: Context, g: GpuState, h: Any, out: dict[str, Any]) -> None:
    """nvmlDeviceGetTopologyCommonAncestor per peer (nvidia-smi topo -m), "nvlink" when linked.

    A peer counts as reached through NVLink when one of this GPU's links ends at the
    peer's PCI bus id (nvmlDeviceGetNvLinkRemotePciInfo: direct links) or when NVML
    reports P2P over NVLink to it (NVSwitch systems, where links end at switches).
    """
    nv = ctx.nv
    peers = ctx.peers(g)
    if not peers:
        return
    remote_bus_ids = set()
    for link in range(nvlink_count(ctx, g)):
        try:
            if nv.nvmlDeviceGetNvLinkState(h, link):
                remote_bus_ids.add(norm_bus_id(text(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)))
        except Exception as exc:
            if code_of(exc) in LOST_CODES:
                raise
            log.debug("GPU %d link %d: remote PCI info failed: %s", g.index, link, exc)
    levels = {}
    for peer in peers:
        peer_bus_id = peer.pci_bus_id
        if peer_bus_id is None:
            peer_bus_id = bus_id(nv, peer.handle)
        if peer_bus_id is not None and norm_bus_id(peer_bus_id) in remote_bus_ids:
            levels[str(peer.index)] = "nvlink"
            continue
        if p2p_ok(nv, h, peer.handle, P2P_CAPABILITIES["nvlink"]):
            levels[str(peer.index)] = "nvlink"
            continue
        try:
            level = int(nv.nvmlDeviceGetTopologyCommonAncestor(h, peer.handle))
        except Exception as exc:
            if code_of(exc) in LOST_CODES:
                raise
            log.debug("GPU %d peer %d: topology failed: %s", g.index, peer.index, exc)
            continue
        levels[str(peer.index)] = TOPOLOGY_LEVELS.get(level, f"level_{level}")
    if levels:
        out["topology_level"] = levels


READERS = (
    ReaderSpec("p2p", Tier.STATIC, read_p2p, P2P_TOPOLOGY_SECONDS),
    ReaderSpec("topology", Tier.STATIC, read_topology, P2P_TOPOLOGY_SECONDS),
)
