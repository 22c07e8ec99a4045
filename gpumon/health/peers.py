"""Links judged from the first poll on, without a baseline: against what the GPU's model is known to have,
and against its same-model peers on the host.

The baseline (gpumon.health.inventory) records what it first sees, so a node installed with a link down
would call that normal. These findings need no history:

* ``nvlink_down`` (CRITICAL, inspect the hardware): a GPU with fewer NVLinks up than its model has
  (MODEL_NVLINKS: SXM boards, whose every link goes to a peer or an NVSwitch) while at least one of its
  links is up (a GPU with none up may stand alone, e.g. one GPU of a board given to a VM), or fewer than
  the most any same-model peer on the host has up;
* ``pcie_degraded`` (WARNING, inspect the hardware): a PCIe maximum generation or width (what the GPU and
  its slot can negotiate; the current generation drops at idle and is not compared) below the highest of
  its same-model peers.

An accepted inventory (``gpumon health accept-inventory``) that knows the GPU with as few links, or as
low a maximum, silences these, as it silences drift. A GPU for which drift already reports the same kind
gets no second finding.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from gpumon.health.inventory import Inventory, InventoryGpu
from gpumon.model.bus_id import normalize_bus_id
from gpumon.model.findings import CRITICAL, WARNING, Finding
from gpumon.model.snapshot import GpuSnapshot, Snapshot

MODEL_NVLINKS: tuple[tuple[str, int], ...] = (
    (r"NVIDIA H200", 18),
    (r"NVIDIA H100 80GB HBM3|NVIDIA H100 SXM.*", 18),
    (r"NVIDIA A100-SXM.*", 12),
    (r"NVIDIA B200", 18),
)
"""NVLinks of GPU models (NVML's name, matched whole) on SXM boards: H200 and H100 SXM (NVLink 4), A100 SXM
(NVLink 3), B200 (NVLink 5). PCIe and NVL cards (bridged pairs) are not listed: how many of their links
are wired depends on the bridges."""


def model_nvlinks(name: str | None) -> int | None:
    """The NVLinks GPU model ``name`` has (MODEL_NVLINKS), None when not known."""
    for pattern, links in MODEL_NVLINKS:
        if name is not None and re.fullmatch(pattern, name.strip()):
            return links
    return None


def peer_findings(baseline: Inventory | None, snapshot: Snapshot, already: Sequence[Finding] = ()) -> list[Finding]:
    """NVLinks and PCIe maxima below the model's and the same-model peers' (the module's docstring);
    ``already``: the drift findings, whose (kind, GPU) get no second finding here."""
    if not snapshot.nvml_up:
        return []
    up = [g for g in snapshot.gpus if g.up]
    accepted = (
        {b.pci_bus_id: b for b in baseline.gpus} if baseline is not None and baseline.source == "accepted" else {}
    )
    said = {(f.kind, f.gpu) for f in already}
    out: list[Finding] = []
    for g in up:
        peers = [p for p in up if p.name == g.name and p.index != g.index]
        known = accepted.get(normalize_bus_id(g.pci_bus_id) if g.pci_bus_id else None)
        found = [*_nvlinks(g, peers, known), *_pcie(g, peers, known)]
        out += [f for f in found if (f.kind, f.gpu) not in said]
    return out


def _links_up(g: GpuSnapshot) -> int | None:
    return None if g.nvlink_up is None else sum(1 for v in g.nvlink_up.values() if v)


def _nvlinks(g: GpuSnapshot, peers: Sequence[GpuSnapshot], known: InventoryGpu | None) -> list[Finding]:
    """Fewer NVLinks up than the model has (some up), or than a same-model peer has up."""
    up = _links_up(g)
    if up is None or g.nvlink_up is None:
        return []
    model = model_nvlinks(g.name)
    peer_most = max((n for n in (_links_up(p) for p in peers) if n is not None), default=None)
    expected = [(model, f"its model ({g.name}) has {model}")] if model is not None and up > 0 else []
    if peer_most is not None:
        expected.append((peer_most, f"its same-model peers have up to {peer_most} up"))
    short = [(n, words) for n, words in expected if up < n]
    if not short or (known is not None and known.nvlinks_up <= up):
        return []
    most, words = max(short)
    down = sorted((k for k, v in g.nvlink_up.items() if not v), key=lambda k: int(k) if k.isdigit() else 0)
    summary = f"only {up} NVLinks up, {words} (down: {', '.join(down) or '?'})"
    evidence = {"up": up, "expected": most, "model": model, "peers_most": peer_most, "down": down}
    return [_finding(g, "nvlink_down", CRITICAL, summary, evidence)]


def _pcie(g: GpuSnapshot, peers: Sequence[GpuSnapshot], known: InventoryGpu | None) -> list[Finding]:
    """A PCIe maximum generation or width below the highest of the same-model peers."""
    out: list[Finding] = []
    for field, words, accepted in (
        ("pcie_link_generation_max", "PCIe max generation {}, its same-model peers {}", "pcie_generation_max"),
        ("pcie_link_width_max", "PCIe max width x{}, its same-model peers x{}", "pcie_width_max"),
    ):
        mine = getattr(g, field)
        best = max((v for v in (getattr(p, field) for p in peers) if v is not None), default=None)
        known_value = getattr(known, accepted) if known is not None else None
        if mine is None or best is None or mine >= best or (known_value is not None and known_value <= mine):
            continue
        out.append(_finding(g, "pcie_degraded", WARNING, words.format(mine, best), {field: mine, "peers_most": best}))
    return out


def _finding(g: GpuSnapshot, kind: str, severity: str, summary: str, evidence: Mapping[str, object]) -> Finding:
    return Finding(
        kind=kind,
        severity=severity,
        action="inspect_hardware",
        summary=summary,
        gpu=g.index,
        uuid=g.uuid,
        evidence=evidence,
    )
