"""Rules for the host link: each direction against the link the GPU has, its model's floor, and its peers.

A GPU alone (one GPU of its node at a time) must move, in each direction, at least
``PCIE_LINK_FRACTION`` of its link's rate (usable GB/s per lane of its PCIe generation × its width,
from NVML), at least its model's floor (thresholds), and no more than ``link_fraction`` below the
median of its same-model peers. All GPUs copying at once at under half their rate alone is a
shared switch or host bridge: a warning, since it is how the host is built, not a fault of a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumon.burn.verdict.judgement import GpuKey, Judgement, median
from gpumon.burn.verdict.thresholds import PCIE_LANE_GBPS, Thresholds

PCIE_LINK_FRACTION = 0.6
"""Share of the link's usable rate a pinned copy must reach in each direction (healthy: 0.8-0.9)."""
SHARED_FRACTION = 0.5
DIRECTIONS = {"h2d_bytes_per_second": "host-to-device", "d2h_bytes_per_second": "device-to-host"}


def judge_pcie(j: Judgement, res: Mapping[GpuKey, Any], nodes: list[dict[str, Any]], th: Thresholds) -> None:
    links = {(n["node"], int(g)): info for n in nodes for g, info in (n.get("pcie") or {}).items()}
    ran = {k: d for k, d in res.items() if d.get("alone")}
    for key, d in ran.items():
        j.gpus[key]["pcie"] = {"alone": d["alone"], "together": d["together"], "link": _link_name(links.get(key))}
    for direction, words in DIRECTIONS.items():
        for key, d in ran.items():
            peers = [o["alone"][direction] for k, o in ran.items() if k != key and o["model"] == d["model"]]
            _judge_direction(j, key, d, direction, words, links.get(key), peers, th)
    for key, d in ran.items():
        _judge_together(j, key, d)
        slow = [c["detail"] for c in j.checks if c["test"] == "pcie" and c["passed"] is False and _is(c, key)]
        if slow:
            uuid = j.gpus[key].get("uuid")
            where = j.name(key) + (f" ({uuid})" if uuid else "")
            j.faults.append(f"{where}: pcie: host link slow: " + "; ".join(slow))


def _is(check: Mapping[str, Any], key: GpuKey) -> bool:
    return (check["node"], check["gpu"]) == key


def _judge_direction(
    j: Judgement,
    key: GpuKey,
    d: Mapping[str, Any],
    direction: str,
    words: str,
    link: Mapping[str, Any] | None,
    peers: list[float],
    th: Thresholds,
) -> None:
    value = d["alone"][direction]
    limits: list[tuple[float, str]] = []
    rate = link_rate_bytes_per_second(link) if d.get("pinned") else None
    if rate is not None:
        limits.append((PCIE_LINK_FRACTION * rate, f"{PCIE_LINK_FRACTION:.0%} of its {_link_name(link)} link"))
    floor = th.pcie_floor_bytes_per_second(d["model"]) if d.get("pinned") else None
    if floor is not None:
        limits.append((floor, f"the {d['model']} floor"))
    peer_median = median(peers) if peers else None
    if peer_median:
        limits.append(((1 - th.link_fraction) * peer_median, f"{th.link_fraction:.0%} below its peers' median"))
    if not limits:
        j.add("pcie", key, direction.split("_")[0], None, f"{words} {value / 1e9:.1f} GB/s alone: nothing to judge by")
        return
    limit, why = max(limits)
    ok = value >= limit
    detail = f"{words} {value / 1e9:.1f} GB/s alone ({'limit' if ok else 'below'} {limit / 1e9:.1f}: {why}"
    if rate is not None:
        detail += f"; {_link_name(link)} link {rate / 1e9:.1f} GB/s, {value / rate:.0%} of it"
    if peer_median:
        detail += f"; peers' median {peer_median / 1e9:.1f}"
    j.add("pcie", key, direction.split("_")[0], ok, detail + ")", value, "bytes_per_second", limit, fault="")


def _judge_together(j: Judgement, key: GpuKey, d: Mapping[str, Any]) -> None:
    alone, together = d["alone"]["h2d_bytes_per_second"], d["together"]["h2d_bytes_per_second"]
    shared = alone > 0 and together < SHARED_FRACTION * alone
    detail = f"host-to-device {together / 1e9:.1f} GB/s with every GPU of the node copying, {alone / 1e9:.1f} alone"
    if shared:
        detail += ": its host link is shared (a PCIe switch or host bridge) (warning)"
    j.add("pcie", key, "together", True, detail, together, "bytes_per_second")


def link_rate_bytes_per_second(link: Mapping[str, Any] | None) -> float | None:
    """Usable bytes/s per direction of a PCIe link: GB/s per lane of its generation × its width."""
    if not link:
        return None
    lane = PCIE_LANE_GBPS.get(link.get("generation_max") or 0)
    width = link.get("width_max")
    return lane * width * 1e9 if lane is not None and isinstance(width, int) and width > 0 else None


def _link_name(link: Mapping[str, Any] | None) -> str:
    if not link or not link.get("generation_max") or not link.get("width_max"):
        return "unknown"
    return f"Gen{link['generation_max']} x{link['width_max']}"
