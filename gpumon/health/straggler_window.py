"""The straggler detector's window, kept per GPU as it slides: what a finding or a deviation series needs,
without going over every kept poll of every GPU each time one is asked for.

Each compared poll of a GPU (``Compared``) is added to that GPU's ``Track`` when the poll is taken and
taken off the track when the poll leaves the window, so a poll costs O(GPUs × signals), and a question
(the alert tick's findings every 5 s, a scrape's deviation series) costs one ``math.fsum`` per GPU and
signal. The figures are those of a pass over the kept polls, exactly: a track starts over when its GPU
changes group (job), each signal's mean is the ``fsum`` of the same deviations, and what only a finding
shows (its clock-event shares, the order of its deviations) is worked out from the track's own polls,
in their order, for the GPUs that have one.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Compared:
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


class Track:
    """One GPU's compared polls in the window since it last changed group, oldest first, with each
    signal's deviations and how many of them are below the margin."""

    def __init__(self, group: str, margin_ratio: float) -> None:
        self.group = group
        self._margin = margin_ratio
        self.polls: deque[tuple[float, Compared]] = deque()
        """(poll time, the GPU in it), oldest first."""
        self._deviations: dict[str, deque[float]] = {}
        self._below: dict[str, int] = {}
        self._slowed = 0
        """How many of the polls had a slowing reason active on the GPU or a peer (``reason_counts`` is all 0 without)."""

    @property
    def latest(self) -> Compared:
        """The GPU in its newest compared poll (uuid, peers, processes)."""
        return self.polls[-1][1]

    def add(self, t: float, compared: Compared) -> None:
        self.polls.append((t, compared))
        self._slowed += _slowed(compared)
        for signal, deviation in compared.deviations.items():
            points = self._deviations.get(signal)
            if points is None:
                points = self._deviations[signal] = deque()
                self._below[signal] = 0
            points.append(deviation)
            self._below[signal] += deviation < -self._margin

    def drop_oldest(self) -> None:
        _t, compared = self.polls.popleft()
        self._slowed -= _slowed(compared)
        for signal in compared.deviations:
            deviation = self._deviations[signal].popleft()
            self._below[signal] -= deviation < -self._margin
            if not self._deviations[signal]:
                del self._deviations[signal], self._below[signal]

    def signals(self) -> Iterable[str]:
        """The signals with a deviation in the window (any order)."""
        return self._deviations.keys()

    def points(self, signal: str) -> int:
        """How many deviations ``signal`` has in the window (0: none)."""
        points = self._deviations.get(signal)
        return 0 if points is None else len(points)

    def below(self, signal: str) -> int:
        """How many of ``signal``'s deviations are under -margin."""
        return self._below.get(signal, 0)

    def mean(self, signal: str) -> float:
        """The mean deviation of ``signal`` (``math.fsum`` of its points over their count)."""
        points = self._deviations[signal]
        return math.fsum(points) / len(points)

    def signals_in_order(self) -> list[str]:
        """The signals in the order their first deviation in the window came (as a pass over the polls sees them)."""
        seen: dict[str, None] = {}
        for _t, compared in self.polls:
            seen.update(dict.fromkeys(compared.deviations))
            if len(seen) == len(self._deviations):
                break
        return list(seen)

    def reason_counts(self, reasons: Iterable[str]) -> dict[str, tuple[int, float]]:
        """Per reason: in how many of the polls it was active on this GPU, and the sum of its peers'
        shares over them (summed in poll order; no pass over the polls when none had one active)."""
        if not self._slowed:
            return dict.fromkeys(reasons, (0, 0.0))
        out = {}
        for reason in reasons:
            on, peer_sum = 0, 0.0
            for _t, compared in self.polls:
                on += reason in compared.reasons
                peer_sum += compared.peer_reason_shares[reason]
            out[reason] = (on, peer_sum)
        return out


def _slowed(compared: Compared) -> bool:
    """Whether a slowing reason was active on the GPU or one of its peers in this poll."""
    return bool(compared.reasons) or any(compared.peer_reason_shares.values())


class ComparedWindow:
    """Every GPU's track: compared polls added as they come and dropped as they leave the window."""

    def __init__(self, margin_ratio: float) -> None:
        self._margin = margin_ratio
        self.tracks: dict[int, Track] = {}
        """By GPU index."""

    def add(self, t: float, gpus: Iterable[Compared]) -> None:
        for gpu in gpus:
            track = self.tracks.get(gpu.index)
            if track is None or track.group != gpu.group:  # new, or it changed job: start over
                track = self.tracks[gpu.index] = Track(gpu.group, self._margin)
            track.add(t, gpu)

    def drop(self, gpus: Iterable[Compared]) -> None:
        """The oldest kept poll, ``gpus``, leaves the window (a GPU's track that started over since keeps its polls)."""
        for gpu in gpus:
            track = self.tracks.get(gpu.index)
            if track is None or not track.polls or track.polls[0][1] is not gpu:
                continue
            track.drop_oldest()
            if not track.polls:
                del self.tracks[gpu.index]
