"""How this GPU reaches its peers: P2P capability and topology level (static tier)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpumon.model.fields.spec import Metric, Sample, Tier, declare, declare_mapping, natural, zero

P2P_TOPOLOGY_SECONDS = 3600.0
"""The daemon (``gpumon run``) reads P2P status and topology at most this often, though the static
tier comes every 300 s: they cost ~22 ms and ~6 ms of CPU per GPU on an H100 and change only with
the hardware (a link that goes down shows at once in gpumon_nvlink_links_up)."""


@dataclass(frozen=True)
class P2pStatus:
    """Peer-to-peer capability between this GPU and ``peer_index`` (nvidia-smi topo -p2p)."""

    peer_index: int
    capability: str
    """One of read, write, nvlink, atomics."""
    ok: bool


def _p2p_samples(status: tuple[P2pStatus, ...]) -> Iterable[Sample]:
    return [((str(p.peer_index), p.capability), 1.0 if p.ok else 0.0) for p in status]


def _topology_samples(levels: Mapping[str, str]) -> Iterable[Sample]:
    return [((peer, level), 1.0) for peer, level in sorted(levels.items(), key=lambda kv: natural(kv[0]))]


@dataclass(frozen=True)
class TopologyFields:
    p2p_status: tuple[P2pStatus, ...] | None = declare(
        Tier.STATIC,
        "P2P capability per peer (nvidia-smi topo -p2p r|w|n|a)",
        nvml="nvmlDeviceGetP2PStatus(h, peer, 0..3), each index probed alone"
        " (the binding's READ constant is a tuple; a failing index is omitted)",
        conversion="status == OK",
        smi="topo -p2p r/w/n/a",
        metric=Metric(
            "gpumon_p2p_status",
            "gauge",
            "1 when peer-to-peer with peer_gpu works for the capability read|write|nvlink|atomics"
            " (nvidia-smi topo -p2p).",
            labels=("peer_gpu", "capability"),
            samples=_p2p_samples,
            detail="p2p",
            keep=zero,
            read_every_seconds=P2P_TOPOLOGY_SECONDS,
        ),
    )
    topology_level: Mapping[str, str] | None = declare_mapping(
        Tier.STATIC,
        "Topology level per peer GPU index: nvlink|internal|single|multiple|hostbridge|node|system (nvidia-smi topo -m)",
        nvml="\"nvlink\" when a link's nvmlDeviceGetNvLinkRemotePciInfo is the peer's bus id or P2P over NVLink"
        " is OK (NVSwitch); else nvmlDeviceGetTopologyCommonAncestor",
        conversion="internal/single/multiple/hostbridge/node/system",
        smi="topo -m (NV#, PIX, PXB, PHB, NODE, SYS)",
        metric=Metric(
            "gpumon_topology_info",
            "gauge",
            "Path to peer_gpu as level nvlink|internal|single|multiple|hostbridge|node|system (nvidia-smi topo -m).",
            labels=("peer_gpu", "level"),
            samples=_topology_samples,
            detail="topology",
            read_every_seconds=P2P_TOPOLOGY_SECONDS,
        ),
    )
