"""The verdict being built: ``Judgement`` (every check, the faults, per-GPU summaries) and the rules shared by tests."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

GpuKey = tuple[int, int]
"""(node, gpu index on that node)."""


@dataclass
class Judgement:
    checks: list[dict[str, Any]] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    cannot_run: list[str] = field(default_factory=list)
    gpus: dict[GpuKey, dict[str, Any]] = field(default_factory=dict)
    multi_node: bool = False
    busy: set[GpuKey] = field(default_factory=set)
    """GPUs other compute processes used when the burn started (run with --force), sw test or not."""

    node_names: dict[int, str] = field(default_factory=dict)
    """Node index -> its name (the Slurm node or host name), when every node's name differs."""

    def name(self, key: GpuKey) -> str:
        node, gpu = key
        if not self.multi_node:
            return f"GPU {gpu}"
        named = f" ({self.node_names[node]})" if node in self.node_names else ""
        return f"node {node}{named} GPU {gpu}"

    def add(
        self,
        test: str,
        key: GpuKey | None,
        check: str,
        passed: bool | None,
        detail: str,
        value: float | None = None,
        unit: str | None = None,
        threshold: float | None = None,
        peer: int | None = None,
        fault: str | None = None,
        group: list[GpuKey] | None = None,
    ) -> None:
        """Record a check; a failed one adds ``fault`` (or a line built from it) to the faults.

        ``group``: a result of several GPUs together (``key`` None): it counts for each of them.
        """
        row: dict[str, Any] = {
            "test": test,
            "check": check,
            "passed": passed,
            "detail": detail,
            "node": key[0] if key else None,
            "gpu": key[1] if key else None,
            "uuid": self.gpus.get(key, {}).get("uuid") if key else None,
            "rank": self.gpus.get(key, {}).get("rank") if key else None,
            "value": value,
            "unit": unit,
            "threshold": threshold,
        }
        if peer is not None:
            row["peer_gpu"] = peer
        if group is not None:
            row["group"] = [list(k) for k in group]
        self.checks.append(row)
        if passed is False and fault != "":
            where = self.name(key) if key else "host"
            if key and self.gpus.get(key, {}).get("uuid"):
                where += f" ({self.gpus[key]['uuid']})"
            self.faults.append(fault if fault is not None else f"{where}: {test}: {detail}")


def median(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def peer_check(
    j: Judgement,
    test: str,
    check: str,
    items: Mapping[GpuKey, float],
    group_of: Mapping[GpuKey, str],
    fraction: float,
    unit: str,
    scale: float,
    label: str,
) -> None:
    """Each value against the median of its group (same model): more than ``fraction`` below fails."""
    groups: dict[str, list[GpuKey]] = {}
    for key in items:
        groups.setdefault(group_of[key], []).append(key)
    for group, keys in groups.items():
        med = median(items[k] for k in keys)
        for key in keys:
            value = items[key]
            if len(keys) < 2 or med is None:
                j.add(test, key, check, None, f"no same-model peer to compare with ({group})", value, unit)
                continue
            limit = (1 - fraction) * med
            below = 1 - value / med if med else 0.0
            ok = value >= limit
            detail = (
                (
                    f"{value / scale:.1f} {label}, {below * 100:.0f}% below the median {med / scale:.1f} of "
                    f"{len(keys)} {group} GPUs (straggler limit {fraction * 100:.0f}%)"
                )
                if not ok
                else (f"{value / scale:.1f} {label} vs median {med / scale:.1f} of {len(keys)} {group} GPUs")
            )
            j.add(test, key, check, ok, detail, value, unit, limit)


def slow_gpus(pairs: list[tuple[GpuKey, GpuKey, bool]]) -> set[GpuKey]:
    """The GPUs whose every pair is slow while most other pairs (more than half) are fine: the evidence
    names them. One other pair measured slow too (a noisy link, a loaded host) does not hide the GPU."""
    gpus = {k for a, b, _ in pairs for k in (a, b)}
    bad = set()
    for g in gpus:
        mine = [slow for a, b, slow in pairs if g in (a, b)]
        others = [slow for a, b, slow in pairs if g not in (a, b)]
        if mine and all(mine) and others and 2 * sum(others) < len(others):
            bad.add(g)
    return bad


def upper_quartile(values: Iterable[float]) -> float | None:
    """The value three quarters of the way up (nearest rank, rounded up): what the fine pairs reach when
    one GPU is in up to half of them (two pairs of three with 3 GPUs, three of six with 4), where the
    median would be a slow pair or fall between the slow and the fine ones."""
    vals = sorted(v for v in values if v is not None)
    return vals[math.ceil(0.75 * (len(vals) - 1))] if vals else None


def blame_links(
    j: Judgement,
    test: str,
    pairs: list[tuple[GpuKey, GpuKey, bool, dict[str, Any]]],
    named: Mapping[GpuKey, str] | None = None,
) -> list[str]:
    """A GPU whose every pair is slow (while other pairs are fine) is blamed; otherwise the links.

    Each slow pair's check (the dict) gets ``link`` (its two GPUs) and ``charged_to``: the GPU blamed
    when one of its ends is; else the one end that other tests name (``named``: GPU -> why, e.g. with
    two GPUs, whose one link is slow in both directions, and a straggler among them); else both ends.
    A GPU's verdict counts a link's failure only where it is charged to it; the other end passes with
    a note (``judge``)."""
    bad_gpus = slow_gpus([(a, b, slow) for a, b, slow, _ in pairs])
    named = named or {}
    lines = []
    for g in sorted(bad_gpus):
        lines.append(f"{j.name(g)}: {test}: every link of this GPU is slow while most other links are fine")
    for a, b, slow, check in pairs:
        if not slow:
            continue
        check["link"] = [list(a), list(b)]
        ends = [k for k in (a, b) if k in bad_gpus] or [k for k in (a, b) if k in named]
        check["charged_to"] = [list(k) for k in ends] if len(ends) == 1 else [list(a), list(b)]
        if a in bad_gpus or b in bad_gpus:
            continue
        low, high = sorted((a, b))  # one line per link, whichever way the copy went
        line = f"link {j.name(low)} <-> {j.name(high)}: {test}: slow"
        if len(ends) == 1:
            line += f"; likely cause: {j.name(ends[0])} ({named[ends[0]]})"
        if line not in lines:
            lines.append(line)
    return lines


def named_by_other_tests(j: Judgement, test: str) -> dict[GpuKey, str]:
    """GPUs that failed checks of other tests than ``test`` so far -> "failed matmul, memory"."""
    out: dict[GpuKey, list[str]] = {}
    for c in j.checks:
        if c["passed"] is False and c["test"] != test and c["gpu"] is not None and "charged_to" not in c:
            tests = out.setdefault((c["node"], c["gpu"]), [])
            if c["test"] not in tests:
                tests.append(c["test"])
    return {k: "failed " + ", ".join(v) for k, v in out.items()}
