"""Profiling counters stuck: a busy GPU whose GPM readings stay 0, or stop changing, is a finding.

dcgm-exporter's users found its profiling metrics reading 0 at 99 % utilization (NVIDIA/dcgm-exporter#662):
a dashboard then says the GPU does nothing while it is full. gpumon reads the same counters through NVML
GPM (``sm_active_ratio``, ``sm_occupancy_ratio``, ``tensor_active_ratio``, ``dram_active_ratio``; a new
sample every ``GPM_SECONDS``). Over ``WINDOW_SECONDS`` in which the GPU was busy
(``utilization_ratio`` at or above ``BUSY_RATIO``) in every poll, readings that were all 0, or exactly the
same every poll, are ``profiling_stuck`` (WARNING, no action on the GPU: its work is fine, the counters
that describe it are not; restarting the profiling client or the driver usually brings them back).

Pure: fed snapshots, asked for findings at a time the caller gives. A GPU without GPM (older than Hopper,
or GPM not read) is never judged.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from operator import attrgetter

from gpumon.model.findings import WARNING, Finding
from gpumon.model.snapshot import GpuSnapshot, Snapshot

WINDOW_SECONDS = 300.0
"""How long the counters must be stuck: ten GPM samples at the daemon's 30 s."""
BUSY_RATIO = 0.9
"""utilization.gpu / 100 at or above this in every poll of the window: the GPU is busy."""
FIELDS = ("sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio", "dram_active_ratio")
"""The GPM readings looked at (those the GPU has)."""


class _Window:
    """One GPU's polls of the last window, oldest first, with what ``_stuck`` asks kept as counts while
    polls come and go (so a question costs no pass over the polls): how many were idle, how many had a
    reading other than 0, and how many times the readings differ from the poll before."""

    __slots__ = ("changes", "idle", "latest", "nonzero", "polls", "seen_in")

    def __init__(self) -> None:
        self.polls: deque[tuple[float, bool, tuple[float | None, ...], bool]] = deque()
        """(poll time, busy, the readings the GPU has, whether one is not 0), oldest first."""
        self.idle = 0
        self.nonzero = 0
        self.changes = 0
        self.latest: tuple[float | None, ...] = ()
        """The newest poll's readings, None where the GPU has none (the finding's evidence)."""
        self.seen_in = -1
        """The number of the last observe that saw the GPU."""

    def clear(self) -> None:
        self.polls.clear()
        self.idle = self.nonzero = self.changes = 0

    def add(self, at_seconds: float, busy: bool, readings: tuple[float | None, ...]) -> None:
        seen = readings if None not in readings else tuple(v for v in readings if v is not None)
        polls = self.polls
        if polls and polls[-1][2] != seen:
            self.changes += 1
        nonzero = any(seen)  # a reading other than 0 (NaN too, as ``v == 0`` is False for it)
        polls.append((at_seconds, busy, seen, nonzero))
        self.idle += not busy
        self.nonzero += nonzero
        self.latest = readings

    def drop_before(self, start_seconds: float) -> None:
        """Drop the oldest polls while the next one is at or before ``start_seconds`` (one stays before a window)."""
        polls = self.polls
        while len(polls) > 1 and polls[1][0] <= start_seconds:
            _at, busy, seen, nonzero = polls.popleft()
            self.idle -= not busy
            self.nonzero -= nonzero
            if seen != polls[0][2]:
                self.changes -= 1


class StuckProfiling:
    """Per GPU, the polls of the last ``WINDOW_SECONDS`` (and one before, so a window can be full), kept
    as they slide (``_Window``): a poll costs a few counts per GPU, a question none over the window."""

    def __init__(self, window_seconds: float = WINDOW_SECONDS, busy_ratio: float = BUSY_RATIO) -> None:
        self.window_seconds = window_seconds
        self.busy_ratio = busy_ratio
        self._polls: dict[tuple[int, str | None], _Window] = {}
        self._observed = 0
        """How many snapshots were observed (marks the windows each one saw)."""

    def observe(self, snapshot: Snapshot) -> None:
        self._observed += 1
        at, start, seen = snapshot.timestamp_seconds, snapshot.timestamp_seconds - self.window_seconds, 0
        for gpu in snapshot.gpus:
            key = (gpu.index, gpu.uuid)
            window = self._polls.get(key)
            if window is None:
                window = self._polls[key] = _Window()
            if window.seen_in != self._observed:
                window.seen_in, seen = self._observed, seen + 1
            if not gpu.up or gpu.sm_active_ratio is None:
                window.clear()  # no GPM now: a window starts again when it comes back
                continue
            window.add(at, self._busy(gpu), _readings(gpu))
            window.drop_before(start)
        if seen != len(self._polls):  # a GPU gone from the snapshot
            for gone in [k for k, w in self._polls.items() if w.seen_in != self._observed]:
                del self._polls[gone]

    def _busy(self, gpu: GpuSnapshot) -> bool:
        return gpu.utilization_ratio is not None and gpu.utilization_ratio >= self.busy_ratio

    def findings(self, now_seconds: float) -> list[Finding]:
        out = []
        for (index, uuid), window in sorted(self._polls.items(), key=lambda kv: kv[0][0]):
            stuck = self._stuck(window, now_seconds)
            if stuck is not None:
                out.append(
                    Finding(
                        kind="profiling_stuck",
                        severity=WARNING,
                        action="none",
                        summary=f"profiling counters {stuck} while busy for {self.window_seconds / 60:g} min",
                        gpu=index,
                        uuid=uuid,
                        evidence={
                            "readings": dict(zip(FIELDS, window.latest, strict=True)),
                            "window_seconds": self.window_seconds,
                            "busy_ratio": self.busy_ratio,
                            "polls": len(window.polls),
                        },
                    )
                )
        return out

    def _stuck(self, window: _Window, now_seconds: float) -> str | None:
        """``stuck at 0`` / ``not changing``, or None: busy throughout a full window that ends now."""
        polls = window.polls
        if not polls or polls[0][0] > now_seconds - self.window_seconds:
            return None  # not a full window yet
        if now_seconds - polls[-1][0] > self.window_seconds / 10 or window.idle:
            return None  # not read lately, or idle at some point: GPM is allowed to say little
        if not window.nonzero:
            return "stuck at 0"
        if not window.changes:
            return "not changing"
        return None


_readings: Callable[[GpuSnapshot], tuple[float | None, ...]] = attrgetter(*FIELDS)
"""A GPU's ``FIELDS``, in order."""
