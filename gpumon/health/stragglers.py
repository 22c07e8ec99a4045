"""Passive straggler detection: a busy GPU persistently slower than its same-model peers.

Pure: fed snapshots (and whether a burn runs), asked for findings and deviations at a time the
caller gives. Nothing here reads hardware or the clock.

Which GPUs are compared: the busy ones (up, ``utilization_ratio`` at or above the threshold) of
one model that run the same job, at least two of them. A job is what runs together: the Slurm job,
pod or container of a process on the GPU, else the process that launched it (``launcher_pid``:
the ranks of one torchrun or multiprocessing job share it; jobs started one by one from a shell do
not). A GPU with processes of several jobs (another tenant's process beside a rank) is compared in
the job with the most busy GPUs. GPUs whose processes say nothing of their job (no /proc) are the
host's. An idle GPU is left out of its group's comparison (it neither hides nor fakes a straggler),
and nothing is compared while a burn runs.

What fires (each against the median of the GPU's peers, the other GPUs of its group):

* ``sm_clock`` — a lower SM clock under the same load: the GPU does less work per second.
* ``compute_share`` — the job's share of SM time on the GPU (nvmlDeviceGetProcessUtilization: its
  processes' shares; the busiest process's in the host's group) is lower: something else (another
  process) takes the GPU's time.

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
from types import MappingProxyType
from typing import Any

from gpumon.health.straggler_window import Compared, ComparedWindow, Track
from gpumon.model.findings import WARNING, Finding
from gpumon.model.snapshot import GpuSnapshot, ProcessSnapshot, Snapshot

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
class _Sample:
    t: float
    gpus: tuple[Compared, ...]


@dataclass(frozen=True)
class Deviation:
    """One GPU's mean relative deviation from its peers' median over the window (-0.12: 12 % lower)."""

    index: int
    uuid: str
    signal: str
    ratio: float


HOST = ""
"""The job of processes that say nothing of theirs, and of GPUs without processes."""


_CLAIM_PREFIX = {"slurm_job": "slurm", "pod": "pod", "container": "container"}


def job_key(process: ProcessSnapshot) -> str:
    """The job a process belongs to: its Slurm job, pod, container or launcher (HOST when unknown)."""
    claim = process.job_claim
    if claim is not None:
        return f"{_CLAIM_PREFIX[claim[0]]}:{claim[1]}"
    if process.launcher_pid is not None:
        return f"launcher:{process.launcher_pid}"
    return HOST


def jobs_of(gpu: GpuSnapshot) -> dict[str, tuple[ProcessSnapshot, ...]]:
    """The jobs running on a GPU, each with its processes there ({HOST: ()} for a GPU without any)."""
    out: dict[str, tuple[ProcessSnapshot, ...]] = {}
    for process in gpu.processes or ():
        key = job_key(process)
        out[key] = (*out.get(key, ()), process)
    return out or {HOST: ()}


def _values(gpu: GpuSnapshot, job: tuple[ProcessSnapshot, ...] | None = None) -> dict[str, float]:
    """The signals of ``gpu`` as run by ``job`` (its processes there; None for the host's group,
    whose ``compute_share`` is the busiest process's)."""
    out: dict[str, float] = {}
    sm = (gpu.clocks_hertz or {}).get("sm")
    if sm:
        out["sm_clock"] = float(sm)
    if job is not None:
        shares = [p.sm_utilization_ratio for p in job if p.sm_utilization_ratio is not None]
        if shares:
            out["compute_share"] = min(1.0, math.fsum(shares))
    else:
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


def _median_without(ordered: Sequence[float], value: float) -> float:
    """``statistics.median`` of ``ordered`` (sorted) with one occurrence of ``value`` left out."""
    skip = bisect.bisect_left(ordered, value)
    half = (len(ordered) - 1) // 2
    upper = ordered[half] if half < skip else ordered[half + 1]
    if (len(ordered) - 1) % 2:
        return upper
    lower = ordered[half - 1] if half - 1 < skip else ordered[half]
    return (lower + upper) / 2


_NO_REASONS: frozenset[str] = frozenset()
_NO_PEER_REASONS: Mapping[str, float] = MappingProxyType(dict.fromkeys(REASONS, 0.0))
"""The peer shares of a group in which no GPU has a slowing reason active (the most common case): one
mapping for all, as each GPU's would hold the same 0.0s."""


def _active_reasons(gpu: GpuSnapshot) -> frozenset[str]:
    """The clock-event reasons active on ``gpu`` (one empty set for all when none is)."""
    events = gpu.clock_events_active
    if not events or not any(events.values()):
        return _NO_REASONS
    return frozenset(r for r, on in events.items() if on)


def _compare(
    group: str, gpus: list[GpuSnapshot], jobs: Mapping[int, tuple[ProcessSnapshot, ...]] | None = None
) -> list[Compared]:
    """Each GPU against the median of its peers (the others of ``gpus``; ``jobs``: by GPU index, the
    group's processes on it, None for the host's group): sorted once per signal, so a group of n
    GPUs costs n log n, not n²."""
    values = {g.index: _values(g, None if jobs is None else jobs[g.index]) for g in gpus}
    reasons = {g.index: _active_reasons(g) for g in gpus}
    processes = {g.index: len(g.processes or ()) for g in gpus}
    peers = len(gpus) - 1
    ordered: dict[str, list[float]] = {}
    for signal in SIGNALS:
        column = [v[signal] for v in values.values() if signal in v]
        if len(column) == len(gpus):  # a signal counts only where every GPU of the group has it
            ordered[signal] = sorted(column)
    quiet = not any(reasons.values())
    reason_counts = {} if quiet else {r: sum(r in on for on in reasons.values()) for r in REASONS}
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
            Compared(
                index=gpu.index,
                uuid=gpu.uuid,
                group=group,
                deviations=deviations,
                reasons=mine,
                peer_reason_shares=_NO_PEER_REASONS
                if quiet
                else {r: (reason_counts[r] - (r in mine)) / peers for r in REASONS},
                processes=processes[gpu.index],
                peer_processes=_median_without(ordered_processes, processes[gpu.index]),
                peers=peers,
            )
        )
    return out


def _main_job(model: str, jobs: Mapping[str, tuple[ProcessSnapshot, ...]], sizes: Mapping[str, int]) -> str:
    """Of a GPU's several jobs, the one it is compared in (``StragglerDetector._groups``)."""
    return max(
        sorted(jobs),
        key=lambda j: (
            j != HOST and sizes[f"{model}|{j}"] >= 2,
            sizes[f"{model}|{j}"],
            sum(p.used_memory_bytes or 0 for p in jobs[j]),
        ),
    )


class StragglerDetector:
    """Keeps the compared samples of the last window (one per snapshot, a few hundred bytes each)."""

    def __init__(self, config: StragglerConfig) -> None:
        self.config = config
        self._samples: deque[_Sample] = deque()
        self._window = ComparedWindow(config.margin_ratio)
        """The kept samples per GPU, as they slide (gpumon.health.straggler_window)."""
        self._generation = 0
        """Bumped whenever the kept samples change: what is derived from them is cached until then."""
        self._derived: dict[str, tuple[int, Any]] = {}

    def observe(self, snapshot: Snapshot, burning: bool) -> None:
        """Take one snapshot; nothing is kept while ``burning`` or when no group has two busy GPUs."""
        self._prune(snapshot.timestamp_seconds)
        if burning or not snapshot.nvml_up or not self.config.enabled:
            return
        compared: list[Compared] = []
        for key, gpus in sorted(self._groups(snapshot).items()):
            if len(gpus) >= 2:
                jobs = None if key.endswith("|" + HOST) else {g.index: job for g, job in gpus}
                compared += _compare(key, [g for g, _job in gpus], jobs)
        if compared:
            self._samples.append(_Sample(snapshot.timestamp_seconds, tuple(compared)))
            self._window.add(snapshot.timestamp_seconds, compared)
            self._generation += 1

    def _groups(self, snapshot: Snapshot) -> dict[str, list[tuple[GpuSnapshot, tuple[ProcessSnapshot, ...]]]]:
        """The busy GPUs by job (and model), each with the job's processes on it. A GPU in several
        jobs goes to a known job with other busy GPUs before the host's, then to the one with the
        most busy GPUs, then the most memory on it, then the key."""
        threshold = self.config.busy_utilization_ratio
        busy = [
            (gpu, jobs_of(gpu))
            for gpu in snapshot.gpus
            if gpu.up and gpu.utilization_ratio is not None and gpu.utilization_ratio >= threshold
        ]
        sizes: dict[str, int] = {}
        for gpu, jobs in busy:
            for job in jobs:
                key = f"{gpu.name or '?'}|{job}"
                sizes[key] = sizes.get(key, 0) + 1
        out: dict[str, list[tuple[GpuSnapshot, tuple[ProcessSnapshot, ...]]]] = {}
        for gpu, jobs in busy:
            model = gpu.name or "?"
            job = next(iter(jobs)) if len(jobs) == 1 else _main_job(model, jobs, sizes)
            out.setdefault(f"{model}|{job}", []).append((gpu, jobs[job]))
        return out

    def _prune(self, now: float) -> None:
        while self._samples and self._samples[0].t < now - self.config.window_seconds:
            self._window.drop(self._samples.popleft().gpus)
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
    def _per_gpu(self, now: float) -> dict[int, Track]:
        """Per GPU index: its compared polls in the window since it last changed group."""
        self._prune(now)
        return self._window.tracks

    def deviations(self, now: float) -> list[Deviation]:
        """Each compared GPU's mean deviation per signal over the window (for the exported series)."""
        result: list[Deviation] = list(self._cached("deviations", now, lambda: self._deviations(now)))
        return result

    def _deviations(self, now: float) -> list[Deviation]:
        out = []
        for index, track in sorted(self._per_gpu(now).items()):
            uuid = track.latest.uuid
            for signal in sorted(track.signals()):
                out.append(Deviation(index=index, uuid=uuid, signal=signal, ratio=track.mean(signal)))
        return out

    def findings(self, now: float) -> list[Finding]:
        """A WARNING ``straggler`` finding per GPU persistently below its peers on a firing signal."""
        result: list[Finding] = list(self._cached("findings", now, lambda: self._findings(now)))
        return result

    def _findings(self, now: float) -> list[Finding]:
        cfg = self.config
        found = []
        for index, track in sorted(self._per_gpu(now).items()):
            count = len(track.polls)
            if count < 2:
                continue
            first, last = track.polls[0][0], track.polls[-1][0]
            covered = (last - first) * count / (count - 1)  # each sample stands for one poll
            if covered < cfg.persistence_ratio * cfg.window_seconds:
                continue
            worst: tuple[float, str, int] | None = None
            for signal in FIRING_SIGNALS:
                points = track.points(signal)
                if points < 2 or track.below(signal) < cfg.persistence_ratio * points:
                    continue
                mean = track.mean(signal)
                if worst is None or mean < worst[0]:
                    worst = (mean, signal, points)
            if worst is None:
                continue
            found.append(self._finding(index, track, worst))
        return found

    def _finding(self, index: int, track: Track, worst: tuple[float, str, int]) -> Finding:
        mean, signal, n = worst
        latest = track.latest
        peers = latest.peers
        count = len(track.polls)
        summary = (
            f"runs {abs(mean) * 100:.0f} % lower {SIGNAL_WORDS[signal]} than its {peers} "
            f"peer{'s' if peers != 1 else ''} under the same load"
        )
        shares = {
            reason: (on / count, peer_sum / count) for reason, (on, peer_sum) in track.reason_counts(REASONS).items()
        }
        causes = sorted(
            ((mine, reason) for reason, (mine, theirs) in shares.items() if mine >= 0.1 and mine > theirs + 0.05),
            reverse=True,
        )
        details = [f"{REASONS[reason]} {share * 100:.0f} % of the time" for share, reason in causes]
        if latest.processes > latest.peer_processes:
            details.append(f"{latest.processes} processes on it, {latest.peer_processes:g} on each peer")
        if details:
            summary += ": " + ", ".join(details)
        deviations = {s: round(track.mean(s), 4) for s in track.signals_in_order()}
        return Finding(
            kind="straggler",
            severity=WARNING,
            action="inspect_hardware" if causes else "none",
            summary=summary,
            gpu=index,
            uuid=latest.uuid,
            evidence={
                "signal": signal,
                "deviation_ratio": round(mean, 4),
                "deviations": deviations,
                "peers": peers,
                "samples": n,
                "window_seconds": self.config.window_seconds,
                "margin_ratio": self.config.margin_ratio,
                "clock_event_shares": {r: round(s[0], 3) for r, s in shares.items() if s[0] > 0},
                "processes": latest.processes,
                "source": "passive straggler detection",
            },
        )
