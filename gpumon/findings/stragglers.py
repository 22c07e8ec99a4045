"""Passive straggler detection: a busy GPU persistently slower than its same-model peers.

Pure: fed snapshots (and whether a burn runs), asked for findings and deviations at a time the
caller gives. Nothing here reads hardware or the clock.

Which GPUs are compared: those of one model that run the same job (the Slurm job, pod or
container of the process holding the most GPU memory on each GPU; the host when there is none),
at least two of them, all up and all busy (``utilization_ratio`` at or above the threshold).
A sample where any of them is idle, or where a burn runs, is not compared at all.

What fires (each against the median of the GPU's peers, the other GPUs of its group):

* ``sm_clock`` — a lower SM clock under the same load: the GPU does less work per second.
* ``compute_share`` — the busiest process's share of SM time (nvmlDeviceGetProcessUtilization) is
  lower: something else (another process) takes the GPU's time.

What is shown but never fires on its own: ``power`` (draw over the enforced limit), ``sm_active``
and ``tensor_active`` (GPM). In a synchronous job the peers of a slow GPU wait for it in the
collectives: they draw less power and their SMs are less active, so "lower than the peers" on
these would name the healthy GPUs. The slow GPU's clock events (thermal, power brake, hardware
slowdown, power cap) and extra processes are the evidence the finding gives.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpumon.findings.model import WARNING, Finding
from gpumon.snapshot import GpuSnapshot, Snapshot

FIRING_SIGNALS = ("sm_clock", "compute_share")
SHOWN_SIGNALS = ("power", "sm_active", "tensor_active")
SIGNALS = FIRING_SIGNALS + SHOWN_SIGNALS
REASONS = {
    "hw_thermal_slowdown": "thermal slowdown",
    "sw_thermal_slowdown": "software thermal slowdown",
    "hw_power_brake_slowdown": "power brake",
    "hw_slowdown": "hardware slowdown",
    "sw_power_cap": "power cap",
}
"""Clock-event reasons that slow a busy GPU, with the words a finding uses."""
SIGNAL_WORDS = {
    "sm_clock": "SM clocks",
    "compute_share": "SM time for its busiest process",
    "power": "power against its limit",
    "sm_active": "SM activity",
    "tensor_active": "tensor activity",
}


@dataclass(frozen=True)
class StragglerConfig:
    """``health.stragglers``."""

    enabled: bool = True
    window_seconds: float = 300.0
    """How far back GPUs are compared."""
    busy_utilization_ratio: float = 0.8
    """Every compared GPU must be at least this busy (utilization.gpu / 100) for a sample to count."""
    margin_ratio: float = 0.10
    """A GPU is below its peers in a sample when its value is under (1 - margin) × their median."""
    persistence_ratio: float = 0.8
    """It is a straggler when below in at least this share of the compared samples, and those
    samples span at least this share of the window."""


@dataclass(frozen=True)
class _Compared:
    """One GPU in one compared poll, already set against its peers (computed once, at observe)."""

    index: int
    uuid: str
    group: str
    deviations: Mapping[str, float]
    """Per signal: value / median of the peers' values - 1."""
    reasons: frozenset[str]
    peer_reason_shares: Mapping[str, float]
    """Per slowing reason: the share of the peers that had it active."""
    processes: int
    peer_processes: float
    peers: int


@dataclass(frozen=True)
class _Sample:
    t: float
    gpus: tuple[_Compared, ...]


@dataclass(frozen=True)
class Deviation:
    """One GPU's mean relative deviation from its peers' median over the window (-0.12: 12 % lower)."""

    index: int
    uuid: str
    signal: str
    ratio: float


def job_of(gpu: GpuSnapshot) -> str:
    """The job a GPU runs: the Slurm job, pod or container of its biggest process ('' for the host)."""
    procs = list(gpu.processes or ())
    if not procs:
        return ""
    top = max(procs, key=lambda p: p.used_memory_bytes or 0)
    if top.slurm_job_id:
        return f"slurm:{top.slurm_job_id}"
    if top.pod_uid:
        return f"pod:{top.pod_uid}"
    if top.container_id:
        return f"container:{top.container_id}"
    return ""


def _values(gpu: GpuSnapshot) -> dict[str, float]:
    out: dict[str, float] = {}
    sm = (gpu.clocks_hertz or {}).get("sm")
    if sm:
        out["sm_clock"] = float(sm)
    shares = [p.sm_utilization_ratio for p in gpu.processes or () if p.sm_utilization_ratio is not None]
    if shares:
        out["compute_share"] = max(shares)
    if gpu.power_watts is not None:
        limit = gpu.power_limit_watts
        out["power"] = gpu.power_watts / limit if limit else gpu.power_watts
    if gpu.sm_active_ratio is not None:
        out["sm_active"] = gpu.sm_active_ratio
    if gpu.tensor_active_ratio is not None:
        out["tensor_active"] = gpu.tensor_active_ratio
    return out


def _mean(values: Sequence[float]) -> float:
    """``statistics.fmean(values)``, which is this; the daemon does not import statistics, whose
    fractions and decimal modules hold ~0.6 MiB."""
    return math.fsum(values) / len(values)


def _median_without(ordered: Sequence[float], value: float) -> float:
    """``statistics.median`` of ``ordered`` (sorted) with one occurrence of ``value`` left out."""
    skip = bisect.bisect_left(ordered, value)
    n = len(ordered) - 1

    def at(i: int) -> float:
        return ordered[i] if i < skip else ordered[i + 1]

    if n % 2:
        return at(n // 2)
    return (at(n // 2 - 1) + at(n // 2)) / 2


def _compare(group: str, gpus: list[GpuSnapshot]) -> list[_Compared]:
    """Each GPU against the median of its peers (the others of ``gpus``): sorted once per signal,
    so a group of n GPUs costs n log n, not n²."""
    values = {g.index: _values(g) for g in gpus}
    reasons = {g.index: frozenset(r for r, on in (g.clock_events_active or {}).items() if on) for g in gpus}
    processes = {g.index: len(g.processes or ()) for g in gpus}
    peers = len(gpus) - 1
    ordered: dict[str, list[float]] = {}
    for signal in SIGNALS:
        column = [v[signal] for v in values.values() if signal in v]
        if len(column) == len(gpus):  # a signal counts only where every GPU of the group has it
            ordered[signal] = sorted(column)
    reason_counts = {r: sum(r in on for on in reasons.values()) for r in REASONS}
    ordered_processes = sorted(processes.values())
    out = []
    for gpu in gpus:
        deviations = {}
        for signal, value in values[gpu.index].items():
            if signal not in ordered:
                continue
            median = _median_without(ordered[signal], value)
            if median > 0:
                deviations[signal] = value / median - 1.0
        mine = reasons[gpu.index]
        out.append(
            _Compared(
                index=gpu.index,
                uuid=gpu.uuid,
                group=group,
                deviations=deviations,
                reasons=mine,
                peer_reason_shares={r: (reason_counts[r] - (r in mine)) / peers for r in REASONS},
                processes=processes[gpu.index],
                peer_processes=_median_without(ordered_processes, processes[gpu.index]),
                peers=peers,
            )
        )
    return out


class StragglerDetector:
    """Keeps the compared samples of the last window (one per snapshot, a few hundred bytes each)."""

    def __init__(self, config: StragglerConfig) -> None:
        self.config = config
        self._samples: deque[_Sample] = deque()
        self._generation = 0
        """Bumped whenever the kept samples change: what is derived from them is cached until then."""
        self._derived: dict[str, tuple[int, Any]] = {}

    def observe(self, snapshot: Snapshot, burning: bool) -> None:
        """Take one snapshot; nothing is kept while ``burning`` or when no group is all busy."""
        self._prune(snapshot.timestamp_seconds)
        if burning or not snapshot.nvml_up or not self.config.enabled:
            return
        grouped: dict[str, list[GpuSnapshot]] = {}
        for gpu in snapshot.gpus:
            grouped.setdefault(f"{gpu.name or '?'}|{job_of(gpu)}", []).append(gpu)
        compared: list[_Compared] = []
        for key, gpus in sorted(grouped.items()):
            if len(gpus) >= 2 and all(self._busy(g) for g in gpus):
                compared += _compare(key, gpus)
        if compared:
            self._samples.append(_Sample(snapshot.timestamp_seconds, tuple(compared)))
            self._generation += 1

    def _busy(self, gpu: GpuSnapshot) -> bool:
        return (
            gpu.up and gpu.utilization_ratio is not None and gpu.utilization_ratio >= self.config.busy_utilization_ratio
        )

    def _prune(self, now: float) -> None:
        while self._samples and self._samples[0].t < now - self.config.window_seconds:
            self._samples.popleft()
            self._generation += 1

    def _cached(self, what: str, now: float, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per state of the kept samples (scrapes and reports ask often)."""
        self._prune(now)
        hit = self._derived.get(what)
        if hit is not None and hit[0] == self._generation:
            return hit[1]
        value = compute()
        self._derived[what] = (self._generation, value)
        return value

    # ---- output -------------------------------------------------------------
    def _per_gpu(self, now: float) -> dict[int, dict[str, Any]]:
        """Per GPU index: its compared polls' times, per signal (deviation, below) points, reason counts."""
        result: dict[int, dict[str, Any]] = self._cached("per_gpu", now, self._compute_per_gpu)
        return result

    def _compute_per_gpu(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for sample in self._samples:
            for gpu in sample.gpus:
                entry = out.get(gpu.index)
                if entry is None or entry["group"] != gpu.group:  # new, or it changed job: start over
                    entry = out[gpu.index] = {"group": gpu.group, "samples": [], "signals": {}, "reasons": {}}
                entry.update(uuid=gpu.uuid, peers=gpu.peers, processes=gpu.processes, peer_processes=gpu.peer_processes)
                entry["samples"].append(sample.t)
                for reason in REASONS:
                    mine = entry["reasons"].setdefault(reason, [0, 0.0])
                    mine[0] += reason in gpu.reasons
                    mine[1] += gpu.peer_reason_shares[reason]
                for signal, deviation in gpu.deviations.items():
                    entry["signals"].setdefault(signal, []).append((deviation, deviation < -self.config.margin_ratio))
        return out

    def deviations(self, now: float) -> list[Deviation]:
        """Each compared GPU's mean deviation per signal over the window (for the exported series)."""
        result: list[Deviation] = list(self._cached("deviations", now, lambda: self._deviations(now)))
        return result

    def _deviations(self, now: float) -> list[Deviation]:
        out = []
        for index, entry in sorted(self._per_gpu(now).items()):
            for signal, points in sorted(entry["signals"].items()):
                ratio = _mean([d for d, _ in points])
                out.append(Deviation(index=index, uuid=entry["uuid"], signal=signal, ratio=ratio))
        return out

    def findings(self, now: float) -> list[Finding]:
        """A WARNING ``straggler`` finding per GPU persistently below its peers on a firing signal."""
        result: list[Finding] = list(self._cached("findings", now, lambda: self._findings(now)))
        return result

    def _findings(self, now: float) -> list[Finding]:
        cfg = self.config
        found = []
        for index, entry in sorted(self._per_gpu(now).items()):
            times: Sequence[float] = entry["samples"]
            if len(times) < 2:
                continue
            covered = (times[-1] - times[0]) * len(times) / (len(times) - 1)  # each sample stands for one poll
            if covered < cfg.persistence_ratio * cfg.window_seconds:
                continue
            worst: tuple[float, str, int] | None = None
            for signal in FIRING_SIGNALS:
                points = entry["signals"].get(signal) or []
                if len(points) < 2:
                    continue
                below = sum(b for _, b in points)
                if below < cfg.persistence_ratio * len(points):
                    continue
                mean = _mean([d for d, _ in points])
                if worst is None or mean < worst[0]:
                    worst = (mean, signal, len(points))
            if worst is None:
                continue
            found.append(self._finding(index, entry, worst))
        return found

    def _finding(self, index: int, entry: Mapping[str, Any], worst: tuple[float, str, int]) -> Finding:
        mean, signal, n = worst
        peers = entry["peers"]
        count = len(entry["samples"])
        summary = (
            f"runs {abs(mean) * 100:.0f} % lower {SIGNAL_WORDS[signal]} than its {peers} "
            f"peer{'s' if peers != 1 else ''} under the same load"
        )
        shares = {
            reason: (on / count, peer_sum / count) for reason, (on, peer_sum) in entry["reasons"].items() if count
        }
        causes = sorted(
            ((mine, reason) for reason, (mine, theirs) in shares.items() if mine >= 0.1 and mine > theirs + 0.05),
            reverse=True,
        )
        details = [f"{REASONS[reason]} {share * 100:.0f} % of the time" for share, reason in causes]
        if entry["processes"] > entry["peer_processes"]:
            details.append(f"{entry['processes']} processes on it, {entry['peer_processes']:g} on each peer")
        if details:
            summary += ": " + ", ".join(details)
        deviations = {s: round(_mean([d for d, _ in pts]), 4) for s, pts in entry["signals"].items()}
        return Finding(
            kind="straggler",
            severity=WARNING,
            action="inspect_hardware" if causes else "none",
            summary=summary,
            gpu=index,
            uuid=entry["uuid"],
            evidence={
                "signal": signal,
                "deviation_ratio": round(mean, 4),
                "deviations": deviations,
                "peers": peers,
                "samples": n,
                "window_seconds": self.config.window_seconds,
                "margin_ratio": self.config.margin_ratio,
                "clock_event_shares": {r: round(s[0], 3) for r, s in shares.items() if s[0] > 0},
                "processes": entry["processes"],
                "source": "passive straggler detection",
            },
        )
